-- wrk script: GET a status list (public, no key), as receivers fetch it.
-- usage: wrk ... -s status.lua URL -- PATH
function init(args)
  req = wrk.format("GET", args[1], { ["Accept"] = "application/statuslist+jwt" })
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
