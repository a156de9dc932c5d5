-- force_release: free the name whose base key is KEYS[1], whoever holds it,
-- and wake its waiters (waiter set KEYS[3]). KEYS[2] is its fence counter,
-- which stays, so that fences keep growing; KEYS[4..6] are its holds,
-- pending acquires and arrival queue, removed with the base key by the
-- kinds that have them. Returns what was removed; see describe.
local was = describe(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
if was.err then return was end
local kind = was[1]
if kind == '' then return was end
if kind == 'lock' then
  redis.call('DEL', KEYS[1])
  wake(KEYS[3], KEYS[1])
  return was
end
if kind == 'rwlock' then
  if queued_any(KEYS[6]) then
    redis.call('DEL', KEYS[1], KEYS[4], KEYS[5], KEYS[6])
  else
    redis.call('DEL', KEYS[1], KEYS[4], KEYS[5])
  end
else
  redis.call('DEL', KEYS[1], KEYS[4])
end
wake_all(KEYS[3], KEYS[1])
return was
