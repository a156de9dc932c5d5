-- holds_release: give up a hold of a read/write lock or a semaphore.
--
-- KEYS[1] base hash, KEYS[2] holds (see holds), KEYS[3] waiter set of the
-- waiting clients (see wake); for a read/write lock also KEYS[4] pending
-- acquires and KEYS[5] arrival queue (see rw_acquire)
-- ARGV[1] token, ARGV[2] owner id ('' for none), ARGV[3] mode, ARGV[4] '1'
-- when an acquire that failed takes back what it may have left: then
-- ARGV[1] is its request token, and a pending acquire it recorded goes too
--
-- A hold whose count is above one is decremented; otherwise it is removed,
-- with the name's keys once nothing live is left in them (but the waiter
-- set, which expires with its registrations). A freed permit wakes the
-- next waiting client; a read/write lock left without holders wakes every
-- waiting client, as several may get in. A pending acquire taken back
-- wakes every waiting client too, as it may have kept them out. A plain
-- release never touches pending acquires: another Lock may share the token
-- of a waiter's grant (a re-entry into a grant whose reply was lost).
-- Returns 0 when released, 1 when the caller held nothing. Fails with
-- DLOCK_MODE 1 when the token holds the name in another mode, having
-- changed nothing.
local k, hk = KEYS[1], KEYS[2]
local token, owner, mode = ARGV[1], ARGV[2], ARGV[3]
local now = clock()
local tok, d = held(k, hk, now, token, owner, mode)
if not tok then
  if d then return d end
  if ARGV[4] == '1' and #KEYS > 3 then
    local member = string.sub(mode, 1, 1) .. token
    if redis.pcall('ZREM', KEYS[4], member) == 1 then
      redis.call('ZREM', KEYS[5], member)
      wake_all(KEYS[3], k)
    end
  end
  return 1
end
if d.c > 1 then
  d.c = d.c - 1
  redis.call('HSET', k, 'h:' .. tok, cjson.encode(d))
  return 0
end
local fields = {'h:' .. tok}
if d.o ~= '' then fields[2] = owned(d.m, d.o) end
if d.m == 'write' then fields[#fields + 1] = 'writer' end
redis.call('HDEL', k, unpack(fields))
redis.call('ZREM', hk, tok)
local after = '(' .. now
local free = redis.call('ZCOUNT', hk, after, '+inf') == 0
if free and (#KEYS == 3 or redis.call('ZCOUNT', KEYS[4], after, '+inf') == 0) then
  redis.call('DEL', k, hk, unpack(KEYS, 4))
end
if #KEYS == 3 then
  wake(KEYS[3], k)
elseif free then
  wake_all(KEYS[3], k)
end
return 0
