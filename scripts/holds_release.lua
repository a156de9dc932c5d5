-- holds_release: give up a hold of a read/write lock or a semaphore, or
-- take back an acquisition whose outcome its client does not know.
--
-- KEYS[1] base hash, KEYS[2] holds (see holds), KEYS[3] waiter set of the
-- waiting clients (see wake); for a read/write lock also KEYS[4] pending
-- acquires and KEYS[5] arrival queue (see rw_acquire); last, the name's
-- release marker: a sorted set of the ids of its recent releases, scored by
-- when each is forgotten
-- ARGV[1] token, ARGV[2] the request token of the Lock's acquisition (''
-- for a clean-up), ARGV[3] mode,
-- ARGV[4] this release's id ('' for none), ARGV[5] '1' when an acquire
-- that failed takes back what it may have left: then ARGV[1] is its
-- request token, and what goes is the acquisition recorded by it (see
-- holds), in whichever hold it made or joined, and the pending acquire it
-- recorded, ARGV[6] '1' when the acquisition ends with this release or
-- clean-up and its request token is its own (not given with WithToken)
--
-- A release gives up one count of the live hold of the token in the mode
-- that records the releasing Lock's acquisition (see find_hold): the hold's
-- count goes down by one, and it forgets that record, then its oldest
-- records beyond that count (see holds; a hold written before records were
-- kept has none). A
-- taken-back acquisition gives up the count it added, and its record. A hold whose count reaches zero is
-- removed, with the name's keys once nothing live is left in them (but the
-- waiter set, which expires with its registrations); so are a read/write
-- lock's keys when a taken-back acquisition that holds nothing finds
-- nothing live left in them. A freed permit wakes
-- the next waiting client; a read/write lock left without holders wakes
-- every waiting client, as several may get in. A pending acquire taken
-- back wakes every waiting client too, as it may have kept them out. A
-- plain release never touches pending acquires: another Lock may share the
-- token of a waiter's grant (a re-entry into a grant whose reply was
-- lost). A release whose id the marker holds ran before (its reply was
-- lost and the client sent it again): it changes nothing and counts as
-- done. The marker is kept for a minute after each release, and keeps the
-- newest marker_cap entries of releases (see remember); a string there
-- that expires within a minute is the marker of an exclusive lock of an
-- older dlock, which this one replaces. Any other data there, which dlock
-- did not write, is left alone: the release fails. An acquisition that
-- ends (ARGV[6]) leaves its request token in the marker too, as the member
-- 'r:' .. request token, held or not: a late copy of its acquire (sent
-- again by a client library, or slow on a connection since closed) then
-- takes nothing (see rw_acquire), where it would have held a hold, for
-- nobody, until its TTL. A clean-up records it only in a marker dlock
-- wrote, and does not fail for one it did not.
-- Returns 0 when released or taken back, 1 when the caller held nothing,
-- -1 when ForceRelease ended its hold (see record_forced).
-- A release fails with DLOCK_MODE 1 when the token holds the name in
-- another mode, and with DLOCK_WRONGTYPE 1 :released when the marker holds data
-- dlock did not write, having changed nothing.
local k, hk = KEYS[1], KEYS[2]
local token, req, mode = ARGV[1], ARGV[2], ARGV[3]
local id, marker, rw, undo = ARGV[4], KEYS[#KEYS], #KEYS > 4, ARGV[5] == '1'
local ends = ARGV[6] == '1'
local now = clock()
local marked = false -- what the marker is: 'ids' (this script's), 'old' (see above), false for none
if id ~= '' then
  local until_
  marked, until_ = read_marker(marker, id)
  if marked == nil then return wrongtype(#KEYS) end
  if until_ and tonumber(until_) > now then return 0 end
end
if ends and id == '' then
  local left = redis.call('PTTL', marker)
  if left >= 0 and left <= 60000 and not foreign(redis.pcall('ZCARD', marker)) then
    marked = 'ids'
  elseif left ~= -2 then
    ends = false -- not a marker dlock wrote
  end
end
-- marker_cap bounds the entries of the marker: room for the ids and
-- request tokens of the last 64 releases, where a name released thousands
-- of times a second kept hundreds of thousands, tens of MB, for its minute
-- (and the server then freed them all at once); within Redis's compact
-- encoding of a sorted set (zset-max-listpack-entries, 128 by default).
-- Past it, the oldest go, but those written in the last marker_floor ms:
-- a release sent again, or a late copy of an acquire, comes that late
-- (a client library's resend, a connection slow to deliver, Release's own
-- tries), so a name released more than 32 times a second keeps its last
-- two seconds' entries instead, past the compact encoding. One whose record
-- went is treated as one that comes after the marker's minute. A force
-- release's records (see record_forced) stay their minute: while 500 or
-- more of them are the oldest entries, the releases find none of theirs
-- among the first 500 to take out, and the marker grows as before until
-- they go.
local marker_cap, marker_floor = 128, 2000

-- remember records for a minute this release's id (with_id) and, when the
-- acquisition ends, its request token, having made room for them: the
-- marker keeps at most marker_cap entries, or those of the last
-- marker_floor ms when they are more, besides a force release's records.
local function remember(with_id)
  local until_, add = str(now + 60000), {}
  if with_id and id ~= '' then add[1], add[2] = until_, id end
  if ends then add[#add + 1], add[#add + 2] = until_, 'r:' .. (undo and token or req) end
  if #add == 0 then return end
  if marked == 'old' then
    redis.call('DEL', marker)
  elseif marked == 'ids' then
    redis.call('ZREMRANGEBYSCORE', marker, '-inf', now)
  end
  -- Room is made first: a sorted set past Redis's compact encoding's
  -- bound keeps the larger one.
  local over = (marked and redis.call('ZCARD', marker) or 0) + #add / 2 - marker_cap
  if over > 0 then
    -- The oldest, written before the floor, but a force release's records,
    -- at most 500 at a time (so that a marker an older dlock let grow
    -- shrinks over its next releases).
    local old, gone = redis.call('ZRANGEBYSCORE', marker, '-inf', '(' .. str(now + 60000 - marker_floor),
      'LIMIT', 0, math.min(over, 500)), {}
    for _, m in ipairs(old) do
      if string.sub(m, 1, 2) ~= 'f:' then gone[#gone + 1] = m end
    end
    if #gone > 0 then redis.call('ZREM', marker, unpack(gone)) end
  end
  redis.call('ZADD', marker, unpack(add))
  expire_or_drop(marker, 60000)
end
-- unqueue takes back the pending acquire of a failed acquire; it reports
-- whether there was one.
local function unqueue()
  if not undo or not rw then return false end
  local member = string.sub(mode, 1, 1) .. token
  if redis.pcall('ZREM', KEYS[4], member) ~= 1 then return false end
  redis.pcall('ZREM', KEYS[5], member) -- left alone if it holds other data
  return true
end
local tok, d, at
if undo then
  tok, d, at = acquisition(k, hk, now, token, mode)
else
  tok, d = find_hold(k, hk, now, token, req, mode)
  if not tok and d then return d end
end
local queued = unqueue()
if not tok then
  if undo and rw and redis.pcall('HGET', k, 'kind') == 'rwlock' then
    -- A read/write lock left with no live hold and no live pending
    -- acquire (a waiter that gave up last, after the last release) loses
    -- its keys, as at the last release: its base hash would otherwise
    -- keep the name's fairness until it expired.
    local after = '(' .. now
    if redis.pcall('ZCOUNT', hk, after, '+inf') == 0 and redis.pcall('ZCOUNT', KEYS[4], after, '+inf') == 0 then
      local gone = {k, hk, KEYS[4]}
      if queued_any(KEYS[5]) then gone[4] = KEYS[5] end
      redis.call('DEL', unpack(gone))
    end
  end
  if queued then waking().wake_all(KEYS[3], k) end
  allow_oom(k)
  remember(false) -- not the id: a release sent again must say again that it held nothing
  if not undo and was_forced(marker, token, now) then return -1 end
  return 1
end
if d.c > 1 then
  d.c = d.c - 1
  local gone = {}
  if undo then
    table.remove(d.a, at)
    if token ~= tok then gone[1] = 'a:' .. token end
  else
    -- This Lock's own record goes; then, so that the records never
    -- outnumber the count, the oldest (a hold written before records
    -- were kept has fewer).
    local own = req ~= '' and recorded(d, req)
    if own then
      table.remove(d.a, own)
      if req ~= tok then gone[1] = 'a:' .. req end
    end
    while #d.a > d.c do
      local r = table.remove(d.a, 1)
      if r ~= tok then gone[#gone + 1] = 'a:' .. r end
    end
  end
  allow_oom(k) -- the last hold's release writes a DEL or HDEL first instead
  redis.call('HSET', k, 'h:' .. tok, encode(d))
  if #gone > 0 then redis.call('HDEL', k, unpack(gone)) end
  remember(true)
  if queued then waking().wake_all(KEYS[3], k) end
  return 0
end
-- The last count: the hold goes, and with it the name's keys when no other
-- hold is alive (this one is) and, for a read/write lock, nobody waits.
local after = '(' .. now
local free = redis.call('ZCOUNT', hk, after, '+inf') <= 1
if free and (not rw or redis.call('ZCOUNT', KEYS[4], after, '+inf') == 0) then
  local gone = {k, hk}
  if rw then
    gone[3] = KEYS[4]
    if queued_any(KEYS[5]) then gone[4] = KEYS[5] end
  end
  redis.call('DEL', unpack(gone))
else
  redis.call('HDEL', k, unpack(forget(k, tok, d, true)))
  redis.call('ZREM', hk, tok)
end
remember(true)
if not rw then
  waking().wake(KEYS[3], k, false, true)
elseif free or queued then
  waking().wake_all(KEYS[3], k)
end
return 0
