-- wrk script: GET /v1/verify/<token>, walking a token file round-robin (each thread from its
-- own offset), identified as a receiver with a publishable key.
-- usage: wrk ... -s verify.lua URL -- TOKENS_FILE PK_KEY
local threads = {}
local next_id = 0

function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

function init(args)
  tokens = {}
  for line in io.lines(args[1]) do tokens[#tokens + 1] = line end
  headers = { ["Authorization"] = "Bearer " .. args[2] }
  i = (id * math.floor(#tokens / 8)) % #tokens
end

function request()
  i = i % #tokens + 1
  return wrk.format("GET", "/v1/verify/" .. tokens[i], headers)
end

function done(summary, latency, requests)
  local non2xx = summary.errors.status
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"non2xx":%d,"socket_errors":%d,"verify_ok":%d,"p50_us":%d,"p99_us":%d}\n',
    summary.requests, summary.duration, non2xx,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.requests - non2xx, latency:percentile(50), latency:percentile(99)))
end
