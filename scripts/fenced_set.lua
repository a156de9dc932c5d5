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

local cur = redis.pcall('HMGET', KEYS[1], 'fence', 'kind', 'value')
-- Another type of key, a 'fence' that is not a decimal integer, a lock,
-- or a hash with fields other than 'fence' and 'value' (or none of
-- them): not a resource SetFenced wrote.
local other = foreign(cur)
local newest = not other and cur[1]
if other or (newest and not string.match(newest, '^%d+$'))
    or cur[2] == 'lock' or cur[2] == 'rwlock' or cur[2] == 'semaphore'
    or (newest and redis.call('HLEN', KEYS[1]) ~= (cur[3] and 2 or 1))
    or (not newest and redis.call('EXISTS', KEYS[1]) == 1) then
  return redis.error_reply('DLOCK_WRONGTYPE 1')
end
if newest and less(ARGV[1], newest) then
  return {0, newest}
end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2])
return {1}
