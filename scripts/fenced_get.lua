-- fenced_get: read a resource that fenced_set writes.
--
-- KEYS[1] the resource: a hash with fields 'value' and 'fence'
--
-- Returns {value, fence}, or {} when KEYS[1] does not exist. Fails with
-- DLOCK_WRONGTYPE 1 when KEYS[1] holds other data, as fenced_set does.

local cur = fenced_read(KEYS[1])
if not cur then
  return redis.error_reply('DLOCK_WRONGTYPE 1')
end
if not cur[1] then
  return {}
end
return {cur[3] or '', cur[1]}
