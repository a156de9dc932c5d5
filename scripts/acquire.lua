-- acquire: obtain the exclusive locks KEYS[1..n] for one holder, all or none.
--
-- KEYS[1..n]       lock hashes
-- KEYS[n+1..2n]    their waiter sets (see wake)
-- KEYS[2n+1..3n]   their fence counters (strings kept for a day, see fence)
-- ARGV[1] request token (fresh per acquisition), ARGV[2] TTL in ms,
-- ARGV[3] metadata, ARGV[4] owner id ('' for none),
-- ARGV[5] the waiting client's channel ('' or absent when not waiting),
-- ARGV[6] for each of the locks, in order, '1' when more of that client's
-- callers wait for it and the client stays registered there for them, else
-- '0' (the callers behind an exclusive lock on one name try as soon as the
-- caller of this attempt leaves the client's line: see moreAt in wait.go),
-- ARGV[7] how long a waiter's registration lasts, in ms,
-- ARGV[8] the attempt's number when the waiting caller asks to be granted
-- the lock (see grant; one name only), '' or absent when not,
-- ARGV[9] the client channel with which an earlier attempt of the caller
-- asked, when this one does not register ('' or absent when none),
-- ARGV[10] '1' when the request token was given by the caller (WithToken),
-- who may use it again after its acquisition ended (see release), '' or
-- absent when dlock made it,
-- ARGV[11] how long a fence counter is kept after its last fence, in ms
-- ('0' for none, '' or absent for a day; see keep_fences),
-- ARGV[12] '1' to have the reply say which names the request joined as a
-- repeat (see below), '' or absent when not
--
-- A lock hash holds 'kind' ('lock'), 'token' (the holder's token, '' once
-- released), 'req' (the request token of the acquire that made the hold,
-- '' once that acquisition was released), 'owner', 'count' (acquisitions
-- not yet released), 'meta', 'fence', 'since' (ms, server clock), 'rel'
-- to 'rel4' (the ids of its last releases and the request tokens of the
-- acquisitions that ended, see rel_fields and release), 'late' (those of
-- the acquisitions cleaned up of late, see late_floor), 's' ('1' once another Lock
-- shares the hold, see expire), 'w' (set once a client
-- registered as its waiter, so that a release looks for waiters only
-- then), and the requests waiting clients left (see grant). Each re-entry
-- by the owner adds a field 'h:' .. its request token, whose value is the
-- token it joined. So every acquisition is known by its
-- own request token: a release or a clean-up undoes exactly that one, once,
-- and an acquire sent again after its reply was lost finds itself. A
-- record whose value is not the current token is left from an earlier
-- holder and counts for nothing. A hold released before its minimum hold
-- has passed keeps its token with no request token, owner or count (see
-- release): still taken, it is nobody's to join.
-- A released lock keeps its hash for a minute, free, so that the next
-- holder finds its fence and a repeated release its id in one read. A
-- free hash has an empty owner and metadata (see release), so a holder
-- with neither writes only the fields that change.
--
-- A waiting client that is refused registers in the blocking lock's waiter
-- set, so that the release wakes it, and leaves its request there when it
-- asks to be granted the lock, or clears the one it left before; refused
-- for a lock on several names, it leaves the other names' sets (see
-- leave_others). Once it obtains the locks, it leaves the sets, or, when
-- more of its callers wait (as ARGV[6] says), registers again at the back,
-- and clears its request.
--
-- Returns {1, token, fence_1, ..., fence_n} when obtained. The token is the
-- request token, or the held token when the request re-enters a lock of the
-- same owner or repeats an acquire whose reply was lost. With ARGV[12],
-- one more element follows: a string of n characters, '1' for a name held
-- with the request token before (a repeat: with a given token, maybe by
-- another Lock of that token), '0' for the others; a lock taken part by
-- part gives back only the others when a later part refuses it. A lock held more
-- than once is only ever extended (see expire), never shortened.
-- Returns {0, pttl, i} when KEYS[i] is held by another holder, or when its
-- release records say the acquisition of this request token has ended (see
-- release).
-- Fails with DLOCK_WRONGTYPE i and the suffix of the key at fault (see
-- wrongtype) when a key of the name holds data dlock did not write, or
-- with DLOCK_KIND i and the kind found (see kind_error) when KEYS[i] is
-- another kind of lock; nothing is written then.
local n = #KEYS / 3
local req, ttl, meta, owner = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local waiter, more, lease = ARGV[5] or '', ARGV[6], tonumber(ARGV[7])
local attempt, asked = ARGV[8] or '', ARGV[9] or ''
local given = ARGV[10] == '1'
keep_fences(ARGV[11])

local hold = 'h:' .. req

-- wrongtype is the error that refuses the i-th name because its key
-- KEYS[j] holds data dlock did not write: DLOCK_WRONGTYPE i, then the
-- key's suffix to the lock's key (':waiters' or ':fence'; none for the
-- lock's own), which names it in the error.
local function wrongtype(i, j)
  return redis.error_reply('DLOCK_WRONGTYPE ' .. i .. ' ' .. string.sub(KEYS[j], #KEYS[i] + 1))
end

-- now returns the server's clock in microseconds, as a number and as text.
local function now()
  return clock_us(redis.call('TIME'))
end

-- marked[i] is set when the hash of KEYS[i] already says a client waits;
-- left[i] when it holds a request the waiting client left (see grant).
-- forced_by[i] is the 'forced' record of KEYS[i] (see force_release).
local marked, left, forced_by = {}, {}, {}
local grant = 'g:' .. waiter

-- waits and leave_others serve a waiting client (waiter), and are made
-- only for one: an acquire that does not wait runs without them.
local waits, leave_others
if waiter ~= '' then
  -- waits registers the waiting client in the waiter set of KEYS[i] and marks
  -- the lock as waited for; false when the waiter set's key holds other data
  -- (then nothing is written). With ask, it leaves the caller's request
  -- (see grant), made at now_us (now_text as text); without, it clears the
  -- client's earlier one (an attempt on one name only).
  function waits(i, now_us, now_text, ask)
    if not waking().register(KEYS[n + i], KEYS[i], waiter, math.floor(now_us / 1000), lease) then return false end
    local k = KEYS[i]
    if ask then
      local g = cjson.encode({req, ttl, owner, meta, attempt, now_text})
      if marked[i] then
        redis.call('HSET', k, grant, g)
      else
        redis.call('HSET', k, 'w', '1', grant, g)
      end
      return true
    end
    if not marked[i] then redis.call('HSET', k, 'w', '1') end
    -- A lock on several names never asks: the request there is another
    -- caller's of the client, waiting for this name alone, and stays.
    if left[i] and n == 1 then redis.call('HDEL', k, grant) end
    return true
  end

  -- leave_others takes a waiting client that KEYS[i] refused out of the
  -- waiter sets of the lock's other names that are free, where an earlier
  -- attempt of it registered: the release that freed such a name told it,
  -- first, and it cannot use the notice, while the callers of other clients
  -- waiting for that name alone sleep; the next waiter there is told in its
  -- place (as unwait does). It stays where more of its callers wait (as the
  -- request, more, or a grant request there says), and where the name is
  -- held: the release will tell it.
  function leave_others(i)
    for j = 1, n do
      if j ~= i and string.sub(more or '', j, j) ~= '1' then
        waking().leave(KEYS[n + j], KEYS[j], waiter)
      end
    end
  end
end

-- First look at every key, so that a refusal leaves everything untouched.
-- state[i] is 'repeat' or 'reenter' for a lock the request joins, 'free'
-- for a released lock's hash, nil for no hash; last[i] is the free hash's
-- fence, joined[i] the token of the hold it joins. The holds an owner's
-- lock on several names joins may have different tokens (taken by
-- separate acquisitions): each re-entry records its own hold's token, as
-- a lock split by slot does for its parts, and the names it takes anew
-- get the token of one of them, the one replied.
local state, last, joined, token = {}, {}, {}, req
for i = 1, n do
  local cur = redis.pcall('HMGET', KEYS[i], 'kind', 'token', 'req', 'owner', 'fence', 'w', hold, grant, 'forced',
    'late', unpack(rel_fields))
  if foreign(cur) then return wrongtype(i, i) end
  marked[i], left[i], forced_by[i] = cur[6], cur[8], cur[9]
  if not cur[1] then
    -- No hash: free, unless a clean-up kept its words apart as the hash
    -- ran out (see late_key); one command for both while there is neither.
    if redis.call('EXISTS', KEYS[i], late_key(KEYS[i])) > 0 then
      if redis.call('EXISTS', KEYS[i]) == 1 then return wrongtype(i, i) end
      if not given and late_for(KEYS[i], rel_word(req)) then
        -- A late copy of a request cleaned up (see below).
        return {0, redis.call('PTTL', late_key(KEYS[i])), i}
      end
    end
  elseif cur[1] ~= 'lock' then
    return kind_error(i, KEYS[i], cur[1])
  elseif not given and (in_rel(cur, 11, rel_word(req)) or
      (listed(cur[10], rel_word(req)) and lapse(cur[10]) >= math.floor(now() / 1000))) then
    -- The acquisition of this request token has ended (see release and
    -- late_floor): this is a late copy of its request, whose caller is
    -- gone. Refused, changing nothing. So is one of an acquisition a
    -- force release ended, for two seconds (see force_release): a caller
    -- that still waits (for a grant whose notice it missed) takes the
    -- lock once they are up.
    return {0, redis.call('PTTL', KEYS[i]), i}
  elseif (not cur[2] or cur[2] == '' or owner ~= '' and cur[4] == owner and cur[3] ~= req and cur[7] ~= cur[2]) and
      not given and late_for(KEYS[i], rel_word(req)) then
    -- A late copy of a request cleaned up, which would take the free
    -- name or join its owner's hold, the hash's own record gone with an
    -- earlier hash (see late_key).
    return {0, redis.call('PTTL', KEYS[i]), i}
  elseif not cur[2] or cur[2] == '' then
    state[i], last[i] = 'free', tonumber(cur[5])
  elseif cur[3] == req or cur[7] == cur[2] then
    state[i], token = 'repeat', cur[2]
  elseif owner ~= '' and cur[4] == owner then
    state[i], token, joined[i] = 'reenter', cur[2], cur[2]
  else
    if waiter ~= '' then
      local now_us, now_text = now()
      if not waits(i, now_us, now_text, attempt ~= '' and n == 1) then return wrongtype(i, n + i) end
      if n > 1 then leave_others(i) end
    end
    return {0, redis.call('PTTL', KEYS[i]), i}
  end
end

local now_us, now_text = now()
local since = string.sub(now_text, 1, -4) -- ms

-- Fences next (see next_fence), so that a fence counter holding other data
-- stops the acquire before any lock is written (skipping a number is
-- harmless). A released lock's hash still has its fence, the counter's
-- value, which spares reading the counter.
local fences, texts = {}, {}
for i = 1, n do
  if state[i] == 'repeat' or state[i] == 'reenter' then
    fences[i] = tonumber(redis.call('HGET', KEYS[i], 'fence'))
  else
    fences[i], texts[i] = next_fence(KEYS[2 * n + i], now_us, last[i], now_text)
    if not fences[i] then return wrongtype(i, 2 * n + i) end
  end
end

local out = {1, token}
for i = 1, n do
  local k = KEYS[i]
  if state[i] == 'reenter' then
    redis.call('HINCRBY', k, 'count', '1')
    redis.call('HSET', k, hold, joined[i])
    expire(k, ttl, true)
  elseif state[i] == 'repeat' then
    -- Another Lock may hold it with this token now (WithToken): shared.
    redis.call('HSET', k, 's', '1')
    expire(k, ttl, true)
  elseif state[i] == 'free' and owner == '' and meta == '' then
    redis.call('HSET', k, 'token', token, 'req', req, 'count', '1', 'fence', texts[i], 'since', since, 's', '')
    redis.call('PEXPIRE', k, ttl)
  else
    redis.call('HSET', k, 'kind', 'lock', 'token', token, 'req', req, 'owner', owner, 'count', '1',
      'meta', meta, 'fence', texts[i], 'since', since, 's', '')
    local refused = expire_or_drop(k, ttl)
    if refused then return refused end
  end
  if forced_by[i] and state[i] ~= 'repeat' and state[i] ~= 'reenter' and listed(forced_by[i], token) then
    -- A token given again after its hold was force-released: the record
    -- is for the Locks of that hold, not of this one.
    redis.call('HSET', k, 'forced', unlisted(forced_by[i], token))
  end
  if waiter ~= '' then
    -- A waiter set holding other data is left alone: the lock is obtained,
    -- and this client's other callers wake by their timers.
    if string.sub(more or '', i, i) == '1' then
      waits(i, now_us, now_text, false)
    else
      redis.pcall('ZREM', KEYS[n + i], waiter)
      -- A new hash has lost the mark: others may still wait.
      if not marked[i] then redis.call('HSET', k, 'w', '1') end
      if left[i] then redis.call('HDEL', k, grant) end
    end
  elseif asked ~= '' then
    -- Obtained without registering (the client lost its notices) after
    -- an attempt that asked: its request goes.
    redis.call('HDEL', k, 'g:' .. asked)
  end
  out[#out + 1] = fences[i]
end
if ARGV[12] == '1' then
  local joins = {}
  for i = 1, n do joins[i] = state[i] == 'repeat' and '1' or '0' end
  out[#out + 1] = table.concat(joins)
end
return out
