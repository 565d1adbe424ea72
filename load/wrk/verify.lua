-- wrk script: GET /v1/verify/<token>, walking a token file round-robin (each thread from its
-- own offset), identified as a receiver with a publishable key: PK_KEY, or the key after the
-- token on its line ("TOKEN KEY", for tokens of several organizations).
-- usage: wrk ... -s verify.lua URL -- TOKENS_FILE PK_KEY
local threads = {}
local next_id = 0

function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

-- Every request is formatted once, here: formatting a ~500-byte request in Lua on each call
-- costs wrk ~1.4 µs a verify, on cores it may share with the server, which `/health`'s short
-- request does not pay.
function init(args)
  formatted = {}
  for line in io.lines(args[1]) do
    local token, key = line:match("^(%S+)%s*(%S*)$")
    if key == "" then key = args[2] end
    local headers = { ["Authorization"] = "Bearer " .. key }
    formatted[#formatted + 1] = wrk.format("GET", "/v1/verify/" .. token, headers)
  end
  i = (id * math.floor(#formatted / 8)) % #formatted
end

function request()
  i = i % #formatted + 1
  return formatted[i]
end

function done(summary, latency, requests)
  local non2xx = summary.errors.status
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"non2xx":%d,"socket_errors":%d,"verify_ok":%d,"p50_us":%d,"p99_us":%d}\n',
    summary.requests, summary.duration, non2xx,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.requests - non2xx, latency:percentile(50), latency:percentile(99)))
end
