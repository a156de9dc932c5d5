-- fenced_set: write a value to a resource only for a holder whose fencing
-- token is not older than the newest the resource has seen.
--
-- KEYS[1] the resource: a hash with fields 'value' and 'fence'
-- ARGV[1] the writer's fence, ARGV[2] the value
--
-- Returns {1} when written, or {0, newest} when the fence is stale. Fails
-- with DLOCK_WRONGTYPE 1, writing nothing, when KEYS[1] holds other data,
-- a lock of dlock's own among them: its fence is the lock's.

-- less reports whether the decimal integer a is smaller than b. Fences are
-- compared as digit strings: Lua's numbers lose digits past 2^53.
local function less(a, b)
  a, b = (string.gsub(a, '^0+', '')), (string.gsub(b, '^0+', ''))
  if #a ~= #b then return #a < #b end
  return a < b
end

local cur = fenced_read(KEYS[1])
if not cur then
  return redis.error_reply('DLOCK_WRONGTYPE 1')
end
local newest = cur[1]
if newest and less(ARGV[1], newest) then
  return {0, newest}
end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2])
return {1}
