-- unwait: a client stops waiting for lock KEYS[1] (waiter set KEYS[2])
-- without having obtained it. Its registration goes, and if the lock is
-- free (no key, or a released exclusive lock's hash), or is a semaphore
-- whose release may have told this client alone (and taken it out of the
-- set, see wake), the next waiter is woken in its place, so that a notice
-- it may have received and not used is not lost. (A read/write lock's
-- releases tell every waiter.)
--
-- ARGV[1] the client's channel. The request it may have left for a grant
-- (see grant) goes too. Keys holding other data are left as they are.
-- The lock is read first, so that a read Redis refuses fails the script
-- before it writes (see foreign).
--
-- With ARGV[2] '1', the client leaves only if the exclusive lock is free
-- and none of its callers left a request there (see leave in wake), as
-- acquire's leave_others does: a waiter of a lock split by slot that
-- another of its names refused. It then returns 1 when the client is out
-- of the waiter set (it left, or was not in it), 0 when it stays.
if ARGV[2] == '1' then
  return waking().leave(KEYS[2], KEYS[1], ARGV[1]) and 1 or 0
end
local cur = redis.pcall('HMGET', KEYS[1], 'kind', 'token')
local other = foreign(cur)
redis.pcall('ZREM', KEYS[2], ARGV[1])
redis.pcall('HDEL', KEYS[1], 'g:' .. ARGV[1])
if other then return 0 end
if cur[1] == 'semaphore' then
  waking().wake(KEYS[2], KEYS[1], false, true)
elseif waking().lock_free(KEYS[1], cur) then
  waking().wake(KEYS[2], KEYS[1])
end
return 0
