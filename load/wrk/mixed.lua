-- wrk script: the mixed scenario. Of every 20 requests: 16 verify (round-robin over a token
-- file), 2 register, 2 revoke (round-robin over pre-registered agents; a repeated revoke is
-- answered 200 and changes nothing). Verify answers are counted from their bodies.
-- usage: wrk ... -s mixed.lua URL -- TOKENS_FILE AGENTS_FILE SK_KEY PK_KEY
local threads = {}
local next_id = 0

function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

function init(args)
  tokens, agents = {}, {}
  for line in io.lines(args[1]) do tokens[#tokens + 1] = line end
  for line in io.lines(args[2]) do agents[#agents + 1] = line end
  issuer = { ["Authorization"] = "Bearer " .. args[3], ["Content-Type"] = "application/json" }
  receiver = { ["Authorization"] = "Bearer " .. args[4] }
  n = 0
  t = (id * 997) % #tokens
  a = (id * 131) % #agents
  verify_ok = 0
end

function request()
  n = n + 1
  local slot = n % 20
  if slot == 0 or slot == 10 then
    return wrk.format("POST", "/v1/agents/register", issuer,
      '{"name":"load","issuer_domain":"load.example","scopes":["read:load"]}')
  elseif slot == 5 or slot == 15 then
    a = a % #agents + 1
    return wrk.format("POST", "/v1/agents/" .. agents[a] .. "/revoke", issuer, '{"reason":"load test"}')
  end
  t = t % #tokens + 1
  return wrk.format("GET", "/v1/verify/" .. tokens[t], receiver)
end

function response(status, headers, body)
  if status == 200 and string.sub(body, 1, 8) == '{"valid"' then
    verify_ok = verify_ok + 1
  end
end

function done(summary, latency, requests)
  local ok = 0
  for _, thread in ipairs(threads) do ok = ok + thread:get("verify_ok") end
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"non2xx":%d,"socket_errors":%d,"verify_ok":%d,"p50_us":%d,"p99_us":%d}\n',
    summary.requests, summary.duration, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    ok, latency:percentile(50), latency:percentile(99)))
end
