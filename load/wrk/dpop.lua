-- wrk script: POST /v1/verify with a token and its DPoP proof, one JSON body per line of a
-- file (each proof is good once: the file must hold more lines than the run sends),
-- identified as a receiver with a publishable key.
-- usage: wrk ... -s dpop.lua URL -- BODIES_FILE PK_KEY
function init(args)
  formatted = {}
  local headers = { ["Authorization"] = "Bearer " .. args[2], ["Content-Type"] = "application/json" }
  for line in io.lines(args[1]) do
    formatted[#formatted + 1] = wrk.format("POST", "/v1/verify", headers, line)
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
