-- rw_acquire: obtain a read or the write hold of the read/write lock of a
-- name.
--
-- KEYS[1] base hash, KEYS[2] holds (see holds), KEYS[3] waiter set of the
-- waiting clients (see wake), KEYS[4] pending acquires, KEYS[5] arrival
-- queue, KEYS[6] fence counter, KEYS[7] release marker (see holds_release;
-- absent: not used)
-- ARGV[1] request token, ARGV[2] TTL in ms, ARGV[3] metadata, ARGV[4]
-- owner id ('' for none), ARGV[5] the waiting client's channel ('' when
-- not registering), ARGV[6] '1' when more of that client's callers wait,
-- ARGV[7] how long a registration lasts in ms, ARGV[8] mode ('read' or
-- 'write'), ARGV[9] '1' when the caller will wait if refused, ARGV[10] '1'
-- for a fair lock, '0' for one that prefers writers, ARGV[11] '1' when the
-- request token was given by the caller (WithToken): a new hold of it
-- takes it out of the marker's record of holds force-released (see
-- record_forced) and is not refused for having ended (see below),
-- ARGV[12] how long the fence counter is kept after a writer's fence, in
-- ms ('0' for none, '' or absent for a day; see keep_fences)
--
-- The base hash also holds 'fair' and, while a writer holds, 'writer' (its
-- token). A pending acquire is the member 'r'..req or 'w'..req of KEYS[4],
-- scored by when it expires; a waiting caller renews it with every
-- attempt, so one that died stops counting after a TTL. By default only
-- writers record one, and a live one refuses new readers: writers go
-- first. In a fair lock every waiting caller records one, and KEYS[5]
-- scores them by arrival: a reader is refused while a writer is ahead of
-- it, a writer while anyone is; a caller that is not queued has every
-- pending acquire ahead of it.
--
-- A waiting client that is refused registers in the waiter set, so that a
-- release wakes it. Once it obtains a hold, it leaves the set, or, when
-- more of its callers wait, registers again at the back; a caller that
-- obtains one, also by joining a hold it re-enters or by repeating an
-- acquire, takes back its pending acquire.
--
-- Returns {1, token, fence} when obtained (fence 0 for a read hold), the
-- token being the request token, or the held one when the request repeats
-- an acquire or re-enters a hold of the same owner and mode. Returns {0,
-- ms, 1, queued} when refused: ms is how long until a blocker expires, or
-- less when the caller's pending acquire needs renewing (for a late copy
-- of an ended acquisition's request, until the marker forgets it), and
-- queued is 1 when the caller has one. Fails with DLOCK_WRONGTYPE 1 and a
-- key's suffix (see wrongtype), DLOCK_KIND 1 and the kind found (another
-- kind, or the other fairness; see kind_error) or DLOCK_MODE 1 (the
-- request token holds the other mode), having changed nothing; a waiting caller that is
-- refused fails with DLOCK_WRONGTYPE 1 :waiters too when its waiter set holds data
-- dlock did not write (a caller that obtains a hold leaves such a set
-- alone).
local k, hk, ck, pk, qk, fk = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local req, ttl, meta, owner = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local channel, more, lease = ARGV[5], ARGV[6], tonumber(ARGV[7])
local mode, waits, fair, given = ARGV[8], ARGV[9] == '1', ARGV[10], ARGV[11] == '1'
keep_fences(ARGV[12])
local now, now_us = clock()
-- The acquisition of this request token has ended (see holds_release):
-- this is a late copy of its request, whose caller is gone. Refused,
-- changing nothing. A release marker holding data dlock did not write is
-- refused as the other keys are: the hold could not be released.
local marked, ended = false, false
if KEYS[7] then marked, ended = read_marker(KEYS[7], 'r:' .. req) end
if marked == nil then return wrongtype(7) end
if not given and ended and tonumber(ended) > now then return {0, tonumber(ended) - now, 1, 0} end
local cur, err = open(k, 'rwlock', 'fair', 'writer', 'h:' .. req, 'a:' .. req, owned(mode, owner))
if err then return err end
local member = string.sub(mode, 1, 1) .. req
local records = waits and (fair == '1' or mode == 'write')

-- take grants the hold; fields are more for the base hash.
local function take(fields)
  local fence = 0
  if mode == 'write' then
    fence = next_fence(fk, now_us)
    if not fence then return wrongtype(6) end
    fields[#fields + 1] = 'writer'
    fields[#fields + 1] = req
  end
  err = grant(k, hk, now, ttl, req, mode, owner, meta, fence, fields)
  if err then return err end
  if given then unrecord_forced(KEYS[7], req) end
  keep(k, ttl, hk)
  settle(k, ck, channel, more, now, lease)
  return {1, req, fence}
end

if not cur[1] then
  return take({'kind', 'rwlock', 'fair', fair})
end
if cur[2] ~= fair then return kind_error(1, k, 'rwlock') end
if not prune(k, hk, now) then return wrongtype(2) end
local again = rejoin(k, hk, now, ttl, req, mode, cur[4], cur[5], cur[6], given)
if again then
  if again[1] == 1 then
    if records then
      -- A waiter that joined a hold takes back its pending acquire. Nobody
      -- is woken: a hold keeps out whoever a waiter of its mode did.
      redis.pcall('ZREM', pk, member)
      if fair == '1' then redis.pcall('ZREM', qk, member) end
    end
    settle(k, ck, channel, more, now, lease)
  end
  return again
end

-- Holders first: when the first blocker found expires.
local blocked
if mode == 'read' then
  if cur[3] then blocked = redis.call('ZSCORE', hk, cur[3]) end -- nil if prune forgot the writer
else
  blocked = redis.call('ZRANGE', hk, 0, 0, 'WITHSCORES')[2]
end

-- Then waiters.
local queued = false
if fair == '1' then
  local gone = redis.pcall('ZRANGEBYSCORE', pk, '-inf', now)
  if foreign(gone) then return wrongtype(4) end
  local q = redis.pcall('ZRANGE', qk, 0, -1)
  if foreign(q) then return wrongtype(5) end
  if #gone > 0 then
    chunked('ZREM', pk, gone)
    chunked('ZREM', qk, gone)
    local set = {}
    for _, m in ipairs(gone) do set[m] = true end
    local live = {}
    for _, m in ipairs(q) do
      if not set[m] then live[#live + 1] = m end
    end
    q = live
  end
  for _, m in ipairs(q) do
    if m == member then
      queued = true
      break
    end
    if not blocked and (mode == 'write' or string.sub(m, 1, 1) == 'w') then
      blocked = redis.call('ZSCORE', pk, m)
    end
  end
elseif mode == 'read' and not blocked then
  local w = redis.pcall('ZRANGEBYSCORE', pk, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if foreign(w) then return wrongtype(4) end
  blocked = w[2]
end

if blocked then
  local ms = math.max(tonumber(blocked) - now, 0)
  if records and fair ~= '1' and not wrote(redis.pcall('ZREMRANGEBYSCORE', pk, '-inf', now)) then
    return wrongtype(4)
  end
  -- A waiter set holding other data refuses a waiting caller before
  -- anything is recorded: it could not be told of a release.
  if channel ~= '' and not waking().register(ck, k, channel, now, lease) then return wrongtype(3) end
  if records then
    if fair == '1' and not queued then redis.call('ZADD', qk, redis.call('HINCRBY', k, 'seq', 1), member) end
    redis.call('ZADD', pk, str(now + ttl), member)
    -- The holds key lives as long as the hash: a hash that outlived it
    -- would keep the fields of holds it no longer knows.
    if fair == '1' then keep(k, ttl, hk, pk, qk) else keep(k, ttl, hk, pk) end
    ms = math.min(ms, math.floor(ttl / 3))
  end
  if records then return {0, ms, 1, 1} end
  return {0, ms, 1, 0}
end

if records then
  if fair == '1' then
    if queued then
      redis.call('ZREM', pk, member)
      redis.call('ZREM', qk, member)
    end
  else
    redis.pcall('ZREM', pk, member)
  end
end
return take({})
