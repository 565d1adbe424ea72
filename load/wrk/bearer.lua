-- wrk script: GET PATH with "Authorization: Bearer TOKEN" (a gateway's caller), formatted once.
-- usage: wrk ... -s bearer.lua URL -- TOKEN [PATH]
function init(args)
  req = wrk.format("GET", args[2] or "/", { ["Authorization"] = "Bearer " .. args[1] })
end

function request()
  return req
end

function done(summary, latency, requests)
  io.write(string.format('{"requests":%d,"duration_us":%d,"non2xx":%d,"p50_us":%d,"p99_us":%d}\n',
    summary.requests, summary.duration, summary.errors.status, latency:percentile(50), latency:percentile(99)))
end
