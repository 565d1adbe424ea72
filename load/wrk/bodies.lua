-- wrk script: POST to PATH one body per line of a file, in turn, with a content type and,
-- when given, an API key (a body that is good once, such as a DPoP proof's or a client
-- assertion's, must not come round again: the file must hold more lines than the run sends).
-- usage: wrk ... -s bodies.lua URL -- PATH CONTENT_TYPE BODIES_FILE [KEY]
function init(args)
  formatted = {}
  local headers = { ["Content-Type"] = args[2] }
  if args[4] then
    headers["Authorization"] = "Bearer " .. args[4]
  end
  for line in io.lines(args[3]) do
    formatted[#formatted + 1] = wrk.format("POST", args[1], headers, line)
  end
  i = 0
end

function request()
  i = i % #formatted + 1
  return formatted[i]
end

function done(summary, latency, requests)
  io.write(string.format('{"requests":%d,"non2xx":%d,"p50_us":%d,"p99_us":%d}\n',
    summary.requests, summary.errors.status, latency:percentile(50), latency:percentile(99)))
end
