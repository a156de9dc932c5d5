-- ttl: what the holder of the exclusive locks KEYS[1..n] knows of them.
--
-- ARGV[1] token, ARGV[2] owner id ('' for none)
--
-- Returns {pttl, metadata, fence_1, ..., fence_n} with the smallest
-- remaining TTL in ms, or {-2} when any key is not held by the caller.
local token, owner = ARGV[1], ARGV[2]
local least = -1
for i = 1, #KEYS do
  if not held(KEYS[i], token, owner) then return {-2} end
  local p = redis.call('PTTL', KEYS[i])
  if least < 0 or p < least then least = p end
end
local out = {least, redis.call('HGET', KEYS[1], 'meta')}
for i = 1, #KEYS do
  out[#out + 1] = tonumber(redis.call('HGET', KEYS[i], 'fence'))
end
return out
