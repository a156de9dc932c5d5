-- release: give up the exclusive locks KEYS[1..n] held with a token.
--
-- ARGV[1] token, ARGV[2] owner id ('' for none)
--
-- A held key whose re-entry count is above one is decremented; otherwise it
-- is deleted and a notice is published on a channel named like the key,
-- which wakes its waiters. Keys not held by the caller are left alone.
-- Returns the number of keys that were not held by the caller.
local token, owner = ARGV[1], ARGV[2]
local missing = 0
for i = 1, #KEYS do
  local ok, count = held(KEYS[i], token, owner)
  if not ok then
    missing = missing + 1
  elseif count > 1 then
    redis.call('HINCRBY', KEYS[i], 'count', -1)
  else
    redis.call('DEL', KEYS[i])
    redis.call('PUBLISH', KEYS[i], 'released')
  end
end
return missing
