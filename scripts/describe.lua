-- describe: shared by the scripts that report on a name; dlock puts it in
-- front of each of them, after holds.
--
-- describe(k, fk, wk, hk, pk) returns what the name whose base key is k
-- holds, fk being its fence counter, wk its waiter set (see wake), hk its
-- holds and pk its pending acquires (see holds and rw_acquire), flat for
-- the reply:
--   {kind, newest fence, permits, waiters, 1 if a writer waits else 0,
--    1 if fair else 0, waiting clients, number of holders, then per holder:
--    mode, owner, metadata, hold count, since (ms, server clock), ttl (ms),
--    fence}
-- kind is '' when the name is free, and the holders are then none. Waiting
-- clients are the clients whose registration in wk has not expired, each
-- for one caller or more; a waiter set holding other data counts none.
local function describe(k, fk, wk, hk, pk)
  local newest = redis.pcall('GET', fk)
  local uncounted = newest == false
  if foreign(newest) or not newest then newest = '0' end
  local cur = redis.pcall('HMGET', k, 'kind', 'permits', 'fair')
  if foreign(cur) then return wrongtype() end
  local now = clock()
  local clients = redis.pcall('ZCOUNT', wk, now, '+inf')
  if foreign(clients) then clients = 0 end
  local kind = cur[1]
  if not kind then
    if redis.call('EXISTS', k) == 1 then return wrongtype() end
    return {'', newest, 0, 0, 0, 0, clients, 0}
  end
  if kind ~= 'lock' and kind ~= 'rwlock' and kind ~= 'semaphore' then return wrongtype() end
  if kind == 'lock' then
    local h = redis.call('HMGET', k, 'owner', 'meta', 'count', 'since', 'fence', 'token')
    -- No counter (a client that keeps none, see keep_fences): the hash
    -- keeps the newest fence.
    if uncounted and h[5] then newest = h[5] end
    if h[6] == '' then return {'', newest, 0, 0, 0, 0, clients, 0} end -- released (see acquire)
    return {kind, newest, 0, 0, 0, 0, clients, 1, 'exclusive', h[1], h[2], h[3], h[4], redis.call('PTTL', k), h[5]}
  end
  local after = '(' .. now
  local live = redis.pcall('ZRANGEBYSCORE', hk, after, '+inf', 'WITHSCORES')
  local waiting = {}
  if kind == 'rwlock' then waiting = redis.pcall('ZRANGEBYSCORE', pk, after, '+inf') end
  if foreign(live) then return wrongtype(4) end
  if foreign(waiting) then return wrongtype(5) end
  -- The permit count as stored, text: a Lua number would round a count
  -- above 2^53.
  local out = {kind, newest, cur[2] or '0', #waiting, 0, cur[3] == '1' and 1 or 0, clients, 0}
  for _, m in ipairs(waiting) do
    if string.sub(m, 1, 1) == 'w' then
      out[5] = 1
      break
    end
  end
  for i = 1, #live, 2 do
    local h = redis.call('HGET', k, 'h:' .. live[i])
    if h then
      local d, n = cjson.decode(h), #out
      out[n + 1], out[n + 2], out[n + 3], out[n + 4] = d.m, d.o, d.d, d.c
      out[n + 5], out[n + 6], out[n + 7] = d.s, tonumber(live[i + 1]) - now, d.f
      out[8] = out[8] + 1
    end
  end
  return out
end

