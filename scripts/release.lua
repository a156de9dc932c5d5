-- release: give up the exclusive locks KEYS[1..n] held with a token.
--
-- KEYS[n+1..2n] the locks' waiter sets (see wake)
-- ARGV[1] token, ARGV[2] owner id ('' for none)
--
-- A held key whose re-entry count is above one is decremented; otherwise it
-- is deleted and its next waiter is woken. Keys not held by the caller are
-- left alone. Returns the number of keys that were not held by the caller.
local token, owner = ARGV[1], ARGV[2]
local n = #KEYS / 2
local missing = 0
for i = 1, n do
  local ok, count = held(KEYS[i], token, owner)
  if not ok then
    missing = missing + 1
  elseif count > 1 then
    redis.call('HINCRBY', KEYS[i], 'count', -1)
  else
    redis.call('DEL', KEYS[i])
    wake(KEYS[n + i], KEYS[i])
  end
end
return missing
