-- holds_ttl: what the holder of a hold of a read/write lock or a semaphore
-- knows of it.
--
-- KEYS[1] base hash, KEYS[2] holds (see holds), KEYS[3] the release
-- marker (see holds_release; absent: not read)
-- ARGV[1] token, ARGV[2] the request token of the Lock's acquisition (see
-- find_hold), ARGV[3] mode
--
-- Returns {pttl, metadata, fence}, or {-2} when the caller holds nothing
-- ({-3} when ForceRelease ended its hold, see record_forced).
-- Fails with DLOCK_MODE 1 when the token holds the name in another mode.
local now = clock()
local tok, d, exp = find_hold(KEYS[1], KEYS[2], now, ARGV[1], ARGV[2], ARGV[3])
if not tok then
  if d then return d end
  if was_forced(KEYS[3], ARGV[1], now) then return {-3} end
  return {-2}
end
return {exp - now, d.d, tonumber(d.f)}
