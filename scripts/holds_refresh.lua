-- holds_refresh: reset the TTL of a hold of a read/write lock or a
-- semaphore.
--
-- KEYS[1] base hash, KEYS[2] holds (see holds), KEYS[3] the release
-- marker (see holds_release; absent: not read)
-- ARGV[1] token, ARGV[2] the request token of the Lock's acquisition (see
-- find_hold), ARGV[3] TTL in ms, ARGV[4] mode, ARGV[5] the refresh's number
-- among its Lock's ('' or absent for none), ARGV[6] '1' when it fences off
-- the earlier ones ('' or absent when not)
--
-- As for an exclusive lock (see refresh), a refresh numbered lower than
-- the last that fenced, run after it, only ever extends the hold: the
-- hold's JSON records the request token and number of that one ('q',
-- "req:number"), and goes with the hold.
--
-- Returns 0 when the caller held it and it got the new TTL (a hold counted
-- more than once, or shared, is only extended: see extend), 1 when the
-- caller held nothing, -1 when ForceRelease ended its hold (see
-- record_forced). Fails with DLOCK_MODE 1 when the token holds the
-- name in another mode, having changed nothing.
local k, hk = KEYS[1], KEYS[2]
local token, req, ttl, mode = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local now = clock()
local tok, d, exp = find_hold(k, hk, now, token, req, mode)
if not tok then
  if d then return d end
  if was_forced(KEYS[3], token, now) then return -1 end
  return 1
end
allow_oom(k)
local n, fences = tonumber(ARGV[5] or ''), ARGV[6] == '1'
local by, last = string.match(type(d.q) == 'string' and d.q or '', '^(.*):(%d+)$')
local late = n and by == req and n < tonumber(last)
-- A record of another acquisition of the hold (one of its owner's, which
-- fenced after this one did, and overwrote its record; perhaps released
-- since): this one's own record may be gone, so it only extends too.
local foreign = by ~= nil and by ~= req
if not ((late or foreign) and exp >= now + ttl) then extend(hk, tok, now, ttl, d, exp) end -- late: only extended
if fences and not late then
  d.q = req .. ':' .. ARGV[5]
  redis.call('HSET', k, 'h:' .. tok, encode(d))
end
keep(k, ttl, hk)
return 0
