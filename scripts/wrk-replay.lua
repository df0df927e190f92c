-- wrk script for scripts/bench-proxy.sh: POSTs that reuse a small set of
-- keys (WRK_KEYS of them, default 64, named replay-<WRK_RUN>-<i>), which the
-- script executed once beforehand with the same body, so a proxy in front
-- answers each from its store (the "replay" path) without the upstream.
local run = os.getenv("WRK_RUN") or "0"
local keys = tonumber(os.getenv("WRK_KEYS") or "64")
local n = 0
local body = '{"sku":"A-1","qty":2,"note":"bench"}'

function request()
  n = n + 1
  local key = string.format('"replay-%s-%d"', run, n % keys)
  return wrk.format("POST", "/orders", {
    ["Idempotency-Key"] = key,
    ["Content-Type"] = "application/json",
  }, body)
end
