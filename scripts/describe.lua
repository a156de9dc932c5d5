-- describe: shared by the scripts that report on a lock; dlock puts it in
-- front of each of them.
--
-- describe(k, fk) returns what the name whose lock key is k and fence
-- counter fk holds, flat for the reply:
--   {kind, newest fence, number of holders, then per holder:
--    owner, metadata, hold count, since (ms, server clock), ttl (ms), fence}
-- kind is '' when the name is free, and the holders are then none.
local function describe(k, fk)
  local newest = redis.pcall('GET', fk)
  if type(newest) ~= 'string' then newest = '0' end
  local kind = redis.pcall('HGET', k, 'kind')
  if type(kind) == 'table' then return redis.error_reply('DLOCK_WRONGTYPE 1') end
  if not kind then
    if redis.call('EXISTS', k) == 1 then return redis.error_reply('DLOCK_WRONGTYPE 1') end
    return {'', newest, 0}
  end
  local h = redis.call('HMGET', k, 'owner', 'meta', 'count', 'since', 'fence')
  return {kind, newest, 1, h[1], h[2], h[3], h[4], redis.call('PTTL', k), h[5]}
end

