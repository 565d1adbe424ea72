-- wrk script: GET /health with a key (the organization's "other" bucket, not the 20/min
-- anonymous one). usage: wrk ... -s health.lua URL -- KEY
-- The request is formatted once, as verify.lua's are.
function init(args)
  req = wrk.format("GET", "/health", { ["Authorization"] = "Bearer " .. args[1] })
end

function request()
  return req
end

function done(summary, latency, requests)
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"non2xx":%d,"socket_errors":%d,"verify_ok":0,"p50_us":%d,"p99_us":%d}\n',
    summary.requests, summary.duration, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99)))
end
