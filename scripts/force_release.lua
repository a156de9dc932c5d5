-- force_release: free the name whose lock key is KEYS[1] and fence counter
-- is KEYS[2], whoever holds it, and wake its next waiter (waiter set
-- KEYS[3]). The fence counter stays, so fences keep growing. Returns what
-- was removed; see describe.
local was = describe(KEYS[1], KEYS[2])
if was.err then return was end
if was[1] ~= '' then
  redis.call('DEL', KEYS[1])
  wake(KEYS[3], KEYS[1])
end
return was
