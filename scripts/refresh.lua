-- refresh: reset the TTL of the exclusive locks KEYS[1..n] held with a token,
-- all or none.
--
-- ARGV[1] token (unused: see held), ARGV[2] request token of the caller's
-- acquisition (see held), ARGV[3] TTL in ms, ARGV[4] the refresh's number
-- among its Lock's ('' or absent for none), ARGV[5] '1' when it fences off
-- the earlier ones ('' or absent when not)
--
-- A refresh that got no answer may still reach Redis, held up on a
-- connection its client gave up on, after a later one of its Lock has run,
-- and cut the TTL that one set, which its Lock counts on, short. So the
-- Lock's refreshes after one that got no answer fence it off, and so does
-- one to a longer TTL than an earlier one's (whose copy the client library
-- may have sent again, answered, while the first is held up): each key
-- records the number of the last of them, in the field 'q:' .. request
-- token (which the release takes away), and a refresh numbered lower that
-- runs after it only ever extends the lock (see expire). Costs nothing
-- until then: the field is read with the hold.
--
-- Returns 0 when every key was held by the caller and got the new TTL (a
-- re-entered or shared lock is only extended, see expire), or i when
-- KEYS[i] was not (then nothing is changed), -i when ForceRelease ended
-- the caller's hold there (see forced).
local req, ttl = ARGV[2], ARGV[3]
local n, fences = tonumber(ARGV[4] or ''), ARGV[5] == '1'
local shared, late = {}, {}
for i = 1, #KEYS do
  local ok, count, attached, last = held(KEYS[i], req)
  if not ok then return forced(KEYS[i], req, ARGV[1]) and -i or i end
  late[i] = n and last and n < last
  shared[i] = count > 1 or attached or late[i]
end
-- At maxmemory (by EVALSHA) Redis refuses a script's first write that
-- may add memory: the HSET below, when expire wrote nothing (a shared
-- lock that has more left). A write of no effect first lets it run.
if fences then redis.pcall('ZREMRANGEBYSCORE', KEYS[1], 1, 0) end
for i = 1, #KEYS do
  expire(KEYS[i], ttl, shared[i])
  if fences and not late[i] then redis.call('HSET', KEYS[i], 'q:' .. req, ARGV[4]) end
end
return 0
