-- refresh: reset the TTL of the exclusive locks KEYS[1..n] held with a token,
-- all or none.
--
-- ARGV[1] token (unused: see held), ARGV[2] request token of the caller's
-- acquisition (see held), ARGV[3] TTL in ms
--
-- Returns 0 when every key was held by the caller and got the new TTL (a
-- re-entered or shared lock is only extended, see expire), or i when
-- KEYS[i] was not (then nothing is changed), -i when ForceRelease ended
-- the caller's hold there (see forced).
local req, ttl = ARGV[2], ARGV[3]
local shared = {}
for i = 1, #KEYS do
  local ok, count, attached = held(KEYS[i], req)
  if not ok then return forced(KEYS[i], req, ARGV[1]) and -i or i end
  shared[i] = count > 1 or attached
end
for i = 1, #KEYS do
  expire(KEYS[i], ttl, shared[i])
end
return 0
