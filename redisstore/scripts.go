package redisstore

// A record is one hash at prefix+key:
//
//	f  fingerprint          s  state: P (processing) or D (done)
//	t  fencing token        l  lease end (P only)
//	e  end of the window    c, h, b  status, header (internal/wire), body (D only)
//
// Times are 20-digit strings, 11 digits of Unix seconds and 9 of
// nanoseconds, so that Lua compares them exactly as strings: its numbers
// are doubles, which cannot hold Unix nanoseconds. A tombstone is the hash
// with only t left (after Release or Delete), so that the next claim's
// token is still larger; it keeps the record's TTL.
//
// Every script takes the time as two arguments, seconds and nanoseconds;
// an empty seconds argument means "use the server's TIME" (ServerClock).
const luaPrelude = `
local T = redis.call('TIME')
local function clock(a, b)
  if a == '' then return tonumber(T[1]), tonumber(T[2]) * 1000, true end
  return tonumber(a), tonumber(b), false
end
` + luaFuncs

// luaFuncs are the prelude's functions. nexttok reads the server's time
// from a local T that the script declares before them.
const luaFuncs = `local function ts(s, n) return string.format('%011d%09d', s, n) end
local function add(s, n, ds, dn)
  s = s + ds
  n = n + dn
  if n >= 1000000000 then s = s + 1; n = n - 1000000000 end
  return s, n
end
local function split(t) return tonumber(string.sub(t, 1, 11)), tonumber(string.sub(t, 12)) end
-- Tokens: larger than the previous one and than the server's time in
-- microseconds, so a key that vanished (expired) still gets a larger one.
local function nexttok(prev)
  local t = tonumber(T[1]) * 1000000 + tonumber(T[2])
  if prev then
    local p = tonumber(prev) + 1
    if p > t then t = p end
  end
  return string.format('%d', t)
end
-- gc sets the key's TTL to cover the window end ex. It is only garbage
-- collection: liveness is judged by the fields. By the caller's clock the
-- TTL is relative to the given now and never shortened (callers' clocks
-- differ); by the server's clock it is PEXPIREAT ex.
local function gc(k, ex, ns, nn, server)
  local es, en = split(ex)
  if server then
    redis.call('PEXPIREAT', k, es * 1000 + math.ceil(en / 1000000))
    return
  end
  local ms = (es - ns) * 1000 + math.ceil((en - nn) / 1000000)
  if ms < 1 then ms = 1 end
  if redis.call('PTTL', k) < ms then redis.call('PEXPIRE', k, ms) end
end
`

// ARGV: fingerprint, now s, now ns, lease s, lease ns, retention s, retention ns.
// Reply: {code, fingerprint, state, token, lease end, window end, status,
// header, body}; code 1 claimed, 0 existing record, 2 conflict.
//
// The answers that write nothing (replay, conflict, in flight: a replay is
// the common one) come first, before the functions are made and with one
// clock reading; a claim then reads the server's time for its token.
var beginScript = newScript(`
local k, fp = KEYS[1], ARGV[1]
local r = redis.call('HMGET', k, 'f', 's', 't', 'l', 'e', 'c', 'h', 'b')
local T, ns, nn, server
if ARGV[2] == '' then
  T = redis.call('TIME')
  ns, nn, server = tonumber(T[1]), tonumber(T[2]) * 1000, true
else
  ns, nn, server = tonumber(ARGV[2]), tonumber(ARGV[3]), false
end
local now = string.format('%011d%09d', ns, nn)
local live = r[2] and now < r[5]
if live then
  if r[1] ~= fp then return {2, r[1], '', '', '', r[5]} end
  if r[2] == 'D' then return {0, r[1], 'D', r[3], '', r[5], r[6], r[7], r[8]} end
  if now < r[4] then return {0, r[1], 'P', r[3], r[4], r[5]} end
end
if not T then T = redis.call('TIME') end
`+luaFuncs+`
local lu = ts(add(ns, nn, tonumber(ARGV[4]), tonumber(ARGV[5])))
if live then
  local t = nexttok(r[3])
  local ex = r[5]
  if ex < lu then ex = lu end
  redis.call('HSET', k, 't', t, 'l', lu, 'e', ex)
  gc(k, ex, ns, nn, server)
  return {1, fp, 'P', t, lu, ex}
end
local t = nexttok(r[3])
local ex = ts(add(ns, nn, tonumber(ARGV[6]), tonumber(ARGV[7])))
if r[3] then redis.call('DEL', k) end
redis.call('HSET', k, 'f', fp, 's', 'P', 't', t, 'l', lu, 'e', ex)
gc(k, ex, ns, nn, server)
return {1, fp, 'P', t, lu, ex}
`, true)

// ARGV: token, now s, now ns, retention s, retention ns, status, header
// (empty for none), has body (1 or 0), body. Reply: 1 done, 0 lease lost.
var completeScript = newScript(luaPrelude+`
local k = KEYS[1]
local r = redis.call('HMGET', k, 's', 't')
if r[1] ~= 'P' or r[2] ~= ARGV[1] then return 0 end
local ns, nn, server = clock(ARGV[2], ARGV[3])
local ex = ts(add(ns, nn, tonumber(ARGV[4]), tonumber(ARGV[5])))
redis.call('HDEL', k, 'l')
redis.call('HSET', k, 's', 'D', 'e', ex, 'c', ARGV[6])
if ARGV[7] ~= '' then redis.call('HSET', k, 'h', ARGV[7]) end
if ARGV[8] == '1' then redis.call('HSET', k, 'b', ARGV[9]) end
gc(k, ex, ns, nn, server)
return 1
`, true)

// ARGV: token, now s, now ns, lease s, lease ns. Reply: 1 renewed, 0 lost.
var extendScript = newScript(luaPrelude+`
local k = KEYS[1]
local r = redis.call('HMGET', k, 's', 't', 'e')
if r[1] ~= 'P' or r[2] ~= ARGV[1] then return 0 end
local ns, nn, server = clock(ARGV[2], ARGV[3])
local lu = ts(add(ns, nn, tonumber(ARGV[4]), tonumber(ARGV[5])))
local ex = r[3]
if ex < lu then ex = lu end
redis.call('HSET', k, 'l', lu, 'e', ex)
gc(k, ex, ns, nn, server)
return 1
`, true)

// ARGV: token. Reply: 1 released (a tombstone is left), 0 lease lost.
var releaseScript = newScript(`
local k = KEYS[1]
local r = redis.call('HMGET', k, 's', 't')
if r[1] ~= 'P' or r[2] ~= ARGV[1] then return 0 end
redis.call('HDEL', k, 'f', 's', 'l', 'e', 'c', 'h', 'b')
return 1
`, true)

// ARGV: now s, now ns. Reply: {} when not live, else the fields as
// beginScript's reply with code 0.
var getScript = newScript(luaPrelude+`
local ns, nn = clock(ARGV[1], ARGV[2])
local r = redis.call('HMGET', KEYS[1], 'f', 's', 't', 'l', 'e', 'c', 'h', 'b')
if not r[2] or not (ts(ns, nn) < r[5]) then return {} end
return {0, r[1], r[2], r[3], r[4] or '', r[5], r[6], r[7], r[8]}
`, false)

// recordFields are the fields Delete removes; t stays as the tombstone.
var recordFields = []string{"f", "s", "l", "e", "c", "h", "b"}
