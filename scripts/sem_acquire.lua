-- sem_acquire: obtain a permit of the semaphore of a name.
--
-- KEYS[1] base hash, KEYS[2] holds (see holds), KEYS[3] waiter set of the
-- waiting clients (see wake), KEYS[4] release marker (see holds_release;
-- absent: not used)
-- ARGV[1] request token, ARGV[2] TTL in ms, ARGV[3] metadata, ARGV[4]
-- owner id ('' for none), ARGV[5] the waiting client's channel ('' when
-- not registering), ARGV[6] '1' when more of that client's callers wait,
-- ARGV[7] how long a registration lasts in ms, ARGV[8] mode ('permit'),
-- ARGV[9] permits: how many may hold at once, the caller included, ARGV[10]
-- '1' when the request token was given by the caller (see rw_acquire),
-- who may use it again after its acquisition ended
--
-- The base hash also holds 'permits', the count of the last acquire that
-- took a permit, for inspection. A waiting client registers and leaves
-- the waiter set as in rw_acquire.
--
-- Returns {1, token, 0} when obtained, the token being the request token,
-- or the held one when the request repeats an acquire or re-enters a
-- permit of the same owner. Returns {0, ms, 1} when every permit is taken,
-- ms being how long until the first of them expires. Fails with
-- DLOCK_WRONGTYPE 1 and a key's suffix (see wrongtype) or DLOCK_KIND 1
-- and the kind found (see kind_error), having changed nothing; a waiting
-- caller that is refused fails with DLOCK_WRONGTYPE 1 :waiters too when its
-- waiter set holds data dlock did not write (see rw_acquire).
local k, hk, ck = KEYS[1], KEYS[2], KEYS[3]
local req, ttl, meta, owner = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local channel, more, lease = ARGV[5], ARGV[6], tonumber(ARGV[7])
local mode, permits = ARGV[8], ARGV[9]
local now = clock()
-- A late copy of the request of an acquisition that ended takes nothing,
-- and a release marker holding data dlock did not write is refused (see
-- rw_acquire).
local marked, ended = false, false
if KEYS[4] then marked, ended = read_marker(KEYS[4], 'r:' .. req) end
if marked == nil then return wrongtype(4) end
if ARGV[10] ~= '1' and ended and tonumber(ended) > now then return {0, tonumber(ended) - now, 1} end
local cur, err = open(k, 'semaphore', 'h:' .. req, 'a:' .. req, owned(mode, owner))
if err then return err end
local fields = {'permits', permits}
if not cur[1] then
  fields[3], fields[4] = 'kind', 'semaphore'
else
  if not prune(k, hk, now) then return wrongtype(2) end
  local again = rejoin(k, hk, now, ttl, req, mode, cur[2], cur[3], cur[4], ARGV[10] == '1')
  if again then
    if again[1] == 1 then settle(k, ck, channel, more, now, lease) end
    return again
  end
  if redis.call('ZCARD', hk) >= tonumber(permits) then
    local first = redis.call('ZRANGE', hk, 0, 0, 'WITHSCORES')
    if channel ~= '' and not waking().register(ck, k, channel, now, lease) then return wrongtype(3) end
    return {0, math.max(tonumber(first[2]) - now, 0), 1}
  end
end
err = grant(k, hk, now, ttl, req, mode, owner, meta, 0, fields)
if err then return err end
if ARGV[10] == '1' then unrecord_forced(KEYS[4], req) end
keep(k, ttl, hk)
settle(k, ck, channel, more, now, lease)
return {1, req, 0}
