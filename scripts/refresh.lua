-- refresh: reset the TTL of the exclusive locks KEYS[1..n] held with a token,
-- all or none.
--
-- ARGV[1] token, ARGV[2] owner id ('' for none), ARGV[3] TTL in ms
--
-- Returns 0 when every key was held by the caller and got the new TTL, or i
-- when KEYS[i] was not (then nothing is changed).
local token, owner, ttl = ARGV[1], ARGV[2], ARGV[3]
for i = 1, #KEYS do
  if not held(KEYS[i], token, owner) then return i end
end
for i = 1, #KEYS do
  redis.call('PEXPIRE', KEYS[i], ttl)
end
return 0
