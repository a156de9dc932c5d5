-- fenced: shared by the scripts of a resource that SetFenced writes, a
-- hash of the fields 'value' and 'fence' only.

-- fenced_read reads resource key as {fence, kind, value} (nil where a field
-- is missing), or returns nil when key holds other data: another type of
-- key, a 'fence' that is not a decimal integer, a lock of dlock's own
-- (its fence is the lock's), or a hash with fields other than 'fence' and
-- 'value' (or none of them). A key that does not exist reads as {}.
local function fenced_read(key)
  local cur = redis.pcall('HMGET', key, 'fence', 'kind', 'value')
  if foreign(cur) then return nil end
  local fence = cur[1]
  if (fence and not string.match(fence, '^%d+$'))
      or cur[2] == 'lock' or cur[2] == 'rwlock' or cur[2] == 'semaphore'
      or (fence and redis.call('HLEN', key) ~= (cur[3] and 2 or 1))
      or (not fence and redis.call('EXISTS', key) == 1) then
    return nil
  end
  return cur
end
