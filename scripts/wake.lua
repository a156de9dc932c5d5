-- wake: shared by the scripts that free a lock; dlock puts it in front of
-- each of them.
--
-- wake(wk, k) tells the next client waiting for lock k that it may be free:
-- wk is a sorted set of the waiting clients' channels, scored by when their
-- registration expires, and the one registered longest ago that has not
-- expired gets a message on its channel naming k. One client is woken, not
-- all of them; a client whose registration expires (it died) is skipped.
local function wake(wk, k)
  if redis.call('EXISTS', wk) == 0 then return end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local next = redis.call('ZRANGEBYSCORE', wk, now, '+inf', 'LIMIT', 0, 1)
  if next[1] then redis.call('PUBLISH', next[1], k) end
end

