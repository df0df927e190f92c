-- wrk script for scripts/bench-proxy.sh: every request is a POST with an
-- Idempotency-Key never used before, so a proxy in front runs each one
-- upstream (the "new key" path). Keys are unique across threads (a thread
-- number set in setup) and across runs (WRK_RUN, else the start time).
local threads = 0

function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end

local run = os.getenv("WRK_RUN") or tostring(os.time())
local n = 0
local body = '{"sku":"A-1","qty":2,"note":"bench"}'

function request()
  n = n + 1
  local key = string.format('"new-%s-%d-%d"', run, tid or 0, n)
  return wrk.format("POST", "/orders", {
    ["Idempotency-Key"] = key,
    ["Content-Type"] = "application/json",
  }, body)
end
