-- holds: shared by the scripts of the primitives that several may hold at
-- once, read/write locks and semaphores; dlock puts it in front of each,
-- after wake.
--
-- The base key k of a name is a hash: 'kind', then per hold a field
-- 'h:'..token with the hold in JSON (m mode, o owner id, c hold count, a
-- the request tokens of its recorded acquisitions, oldest first, absent
-- when none; d metadata, s since in ms, f fence; s and f as strings; x 1
-- once it is shared, see extend), per
-- hold with an owner a field 'o:'..mode..':'..owner naming its token, and
-- per recorded acquisition that joined a hold of another token (a
-- re-entry) a field 'a:'..request token naming that token. The holds key
-- hk is a sorted set of the holds' tokens scored by when each expires, in
-- ms of the server's clock: a hold is alive while its score is above the
-- server's time, and only then (a field of the hash proves nothing). Every
-- key of a name lives, by its Redis TTL, as long as the longest-lived
-- entry written to it, and the holds key as long as the hash, so that a
-- name whose holders all died disappears by itself; the scripts forget
-- dead holds as they meet them.
--
-- Every acquisition is recorded by its request token in the hold it made
-- or joined, so that the same request sent again (its reply was lost) is
-- known and changes nothing, and the cleanup after an acquire whose
-- outcome is unknown takes back exactly what that acquire added (see
-- holds_release). A release names its Lock's acquisition by its request
-- token and forgets that record; then, while the hold has more records
-- than the count left (a hold's records from before they were kept, or a
-- Lock attached by token), the oldest, as the acquisitions whose outcome a
-- client may not know yet are the latest.

-- clock returns the server's time in ms and in µs.
local function clock()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
end

-- str formats a number as a Redis argument without losing digits.
local function str(x) return string.format('%.0f', x) end

-- allow_oom lets the writes that follow run on a server at its maxmemory,
-- for the scripts that end or extend holds, so that a full server neither
-- keeps a hold given up nor takes one from its holder. Redis refuses there
-- a script's write that may add memory (HSET, ZADD), unless the script
-- wrote already: this first write, of no effect (an empty range) on key k,
-- whatever k holds, counts as one.
local function allow_oom(k)
  redis.pcall('ZREMRANGEBYSCORE', k, 1, 0)
end

-- wrongtype is the error of a script that refuses the name because its key
-- KEYS[j] (KEYS[1], the base key, when j is nil) holds data dlock did not
-- write: DLOCK_WRONGTYPE 1, then that key's suffix to the base key (':fence',
-- say; none for the base key), which names it in the error.
local function wrongtype(j)
  return redis.error_reply('DLOCK_WRONGTYPE 1 ' .. string.sub(KEYS[j or 1], #KEYS[1] + 1))
end

-- read_marker reads a name's release marker (see holds_release): it returns
-- 'ids' and the score of member (false when absent) for the sorted set
-- dlock writes there, 'old' for the marker of an exclusive lock of an
-- older dlock (a string that expires within a minute), which a release
-- replaces, false when there is none, and nil for data dlock did not write:
-- no expiry, a longer one, or another type.
local function read_marker(marker, member)
  local left = redis.call('PTTL', marker)
  if left == -2 then return false end
  if left < 0 or left > 60000 then return nil end
  local score = redis.pcall('ZSCORE', marker, member)
  if not foreign(score) then return 'ids', score end
  local old = redis.pcall('GET', marker)
  if not foreign(old) and old then return 'old' end
  return nil
end

-- queued_any reports whether a read/write lock's arrival queue qk (see
-- rw_acquire) holds entries, to be deleted with the name's other keys;
-- false when it holds data dlock did not write, which a lock that is not
-- fair never reads, so that nothing else refused it.
local function queued_any(qk)
  local n = redis.pcall('ZCARD', qk)
  return type(n) == 'number' and n > 0 -- read after writes: any error is none
end

-- A hold that ForceRelease ended is recorded in the name's release marker
-- (see holds_release) as the member 'f:' .. its token, for a minute, so
-- that the Locks of the hold learn how it was lost; and so are its
-- acquisitions, as those a release ends are ('r:' .. request token), so
-- that a late copy of one of their acquires does not take the name back
-- for a Lock the force release ended.

-- record_forced records the live holds of holds key hk (their records in
-- base hash k) in release marker mk, at now. A marker holding data dlock
-- did not write (with no expiry, or a longer one than a marker's minute,
-- or not a sorted set: an older dlock's string) gets nothing, as a release
-- leaves it alone.
local function record_forced(k, hk, mk, now)
  local left = redis.call('PTTL', mk)
  if left == -1 or left > 60000 then return end
  local toks = redis.pcall('ZRANGEBYSCORE', hk, '(' .. now, '+inf')
  if foreign(toks) or #toks == 0 then return end
  local members = {}
  for _, tok in ipairs(toks) do
    members[#members + 1] = 'f:' .. tok
    members[#members + 1] = 'r:' .. tok -- its first acquisition's
    local h = redis.pcall('HGET', k, 'h:' .. tok) -- its JSON: 'a' lists its acquisitions
    local ok, d = false, nil
    if type(h) == 'string' then ok, d = pcall(cjson.decode, h) end
    if ok and type(d) == 'table' and type(d.a) == 'table' then
      for _, r in ipairs(d.a) do
        if r ~= tok then members[#members + 1] = 'r:' .. r end
      end
    end
  end
  local score = str(now + 60000)
  for i = 1, #members, 500 do
    local args = {}
    for j = i, math.min(i + 499, #members) do
      args[#args + 1] = score
      args[#args + 1] = members[j]
    end
    if type(redis.pcall('ZADD', mk, unpack(args))) ~= 'number' then return end
  end
  expire_or_drop(mk, 60000)
end

-- unrecord_forced takes token out of release marker mk, where a force
-- release may have recorded an earlier hold of it: a hold of a token given
-- again (WithToken) is not the one that was ended.
local function unrecord_forced(mk, token)
  if mk then redis.pcall('ZREM', mk, 'f:' .. token) end
end

-- was_forced reports whether ForceRelease ended the hold of token, by
-- release marker mk (absent: no).
local function was_forced(mk, token, now)
  if not mk then return false end
  local until_ = redis.pcall('ZSCORE', mk, 'f:' .. token)
  return type(until_) == 'string' and tonumber(until_) > now -- read after writes: any error is none
end

-- owned returns the field naming the token that owner holds in mode, or ''
-- without an owner (no such field exists).
local function owned(mode, owner)
  if owner == '' then return '' end
  return 'o:' .. mode .. ':' .. owner
end

-- open reads the base hash k of a name used as kind: 'kind' (false when the
-- name is free), then the given fields. It returns nil and an error reply
-- when k holds data dlock did not write or is used as another kind. A
-- released exclusive lock's hash (see acquire) is a free name: it goes.
local function open(k, kind, ...)
  local cur = redis.pcall('HMGET', k, 'kind', ...)
  if foreign(cur) then return nil, wrongtype() end
  if not cur[1] then
    if redis.call('EXISTS', k) == 1 then return nil, wrongtype() end
  elseif cur[1] ~= kind then
    local tok = cur[1] == 'lock' and redis.call('HGET', k, 'token')
    if tok ~= '' then return nil, kind_error(1, k, cur[1]) end
    redis.call('DEL', k)
    for i = 1, #cur do cur[i] = false end
  end
  return cur
end

-- decode reads a hold's JSON. A hold written before acquisitions were
-- recorded has no records, and 'r' (its last request token) instead.
local function decode(h)
  local d = cjson.decode(h)
  if type(d.a) ~= 'table' then d.a = {} end
  d.r = nil
  return d
end

-- encode writes a hold's JSON. cjson writes an empty list as an object:
-- a hold without records has no 'a'.
local function encode(d)
  local a = d.a
  if #a == 0 then d.a = nil end
  local h = cjson.encode(d)
  d.a = a
  return h
end

-- recorded returns where hold d records the acquisition with request token
-- req, or nil.
local function recorded(d, req)
  for i, r in ipairs(d.a) do
    if r == req then return i end
  end
end

-- mine reports whether hold d counts the acquisition with request token
-- req among its own: it records it, or records none (a hold written before
-- acquisitions were recorded). The acquisitions of one owner share the
-- hold's token, so the token alone does not do: one that was released (its
-- refresh sent before its release and run after it, its release sent again
-- once the marker forgot it) must not act on the others' hold.
local function mine(d, req)
  return #d.a == 0 or recorded(d, req) ~= nil
end

-- chunked runs a variadic command on key with args, a few at a time, as
-- Lua's unpack cannot take a long list at once.
local function chunked(cmd, key, args)
  for i = 1, #args, 500 do
    redis.call(cmd, key, unpack(args, i, math.min(i + 499, #args)))
  end
end

-- alive returns when hold tok of holds key hk expires, or nil when it is
-- dead: expired, or gone from hk (forgotten, or hk itself expired).
local function alive(hk, tok, now)
  local exp = tonumber(redis.call('ZSCORE', hk, tok))
  if exp and exp > now then return exp end
end

-- forget returns the fields of k that hold tok, decoded as d, leaves
-- behind, for HDEL: its own, its records', and its owner's and the
-- writer's. Those two are checked to still name it (a later hold may have
-- taken them over) unless live is set: a live hold has them.
local function forget(k, tok, d, live)
  local fields = {'h:' .. tok}
  for _, r in ipairs(d.a) do
    if r ~= tok then fields[#fields + 1] = 'a:' .. r end
  end
  local of = owned(d.m, d.o)
  local cur = {tok, tok}
  if not live then cur = redis.call('HMGET', k, of ~= '' and of or 'h:' .. tok, 'writer') end
  if of ~= '' and cur[1] == tok then fields[#fields + 1] = of end
  if d.m == 'write' and cur[2] == tok then fields[#fields + 1] = 'writer' end
  return fields
end

-- prune forgets the holds of k that expired by now; it returns false when
-- hk holds data dlock did not write.
local function prune(k, hk, now)
  local dead = redis.pcall('ZRANGEBYSCORE', hk, '-inf', now)
  if foreign(dead) then return false end
  if #dead == 0 then return true end
  local fields = {}
  for _, tok in ipairs(dead) do
    local h = redis.call('HGET', k, 'h:' .. tok)
    if h then
      for _, f in ipairs(forget(k, tok, decode(h))) do fields[#fields + 1] = f end
    end
  end
  if #fields > 0 then chunked('HDEL', k, fields) end
  redis.call('ZREMRANGEBYSCORE', hk, '-inf', now)
  return true
end

-- ghost forgets hold tok of k, decoded as d, that is dead but was never
-- pruned: its fields outlived its entry in hk (hk expired before the
-- hash, as happened before the scripts kept the two alive together).
local function ghost(k, tok, d)
  redis.call('HDEL', k, unpack(forget(k, tok, d)))
end

-- keep makes k, and the other keys given, live at least ttl ms more.
-- Refused (an ACL user without PEXPIRE), it deletes those of them left
-- without a TTL, which this script made, so that the name does not stay
-- in Redis for good, and raises the refusal.
local function keep(k, ttl, ...)
  local left = redis.call('PTTL', k)
  local env = math.max(left, ttl + 1) -- 1 ms for the time the script takes
  local refused
  if env > left then refused = expire_or_drop(k, env) end
  for _, key in ipairs({...}) do refused = expire_or_drop(key, env) or refused end
  if refused then error(refused) end
end

-- extend sets the expiry of hold tok of hk, d decoded, alive until exp, to
-- ttl ms from now. A hold counted more than once, or shared (d.x: asked
-- for again with its token, so perhaps by another Lock of that token,
-- WithToken), is only ever extended: each of its acquisitions was promised
-- its own TTL, and one must not cut the others' short. A hold counted
-- once may be shortened.
local function extend(hk, tok, now, ttl, d, exp)
  if (d.c > 1 or d.x) and exp >= now + ttl then return end
  redis.call('ZADD', hk, str(now + ttl), tok)
end

-- settle is what a waiting client does once it obtained a hold on k: leave
-- the waiter set ck, or, when more of its callers wait (more is '1'), register
-- again at the back. channel is '' for a caller that did not register. A
-- waiter set holding data dlock did not write is left alone: the hold is
-- obtained, and the client's other callers wake by their timers.
local function settle(k, ck, channel, more, now, lease)
  if channel == '' then return end
  if more == '1' then
    waking().register(ck, k, channel, now, lease)
  else
    redis.pcall('ZREM', ck, channel)
  end
end

-- grant gives the caller a new hold: its request token req becomes the
-- hold's token. fields are more field-value pairs for the base hash (the
-- kind of a new name, …). It returns an error reply when hk holds data
-- dlock did not write; nothing is written then.
local function grant(k, hk, now, ttl, req, mode, owner, meta, fence, fields)
  if not wrote(redis.pcall('ZADD', hk, str(now + ttl), req)) then return wrongtype(2) end
  local h = cjson.encode({m = mode, o = owner, c = 1, a = {req}, d = meta, s = str(now), f = str(fence)})
  fields[#fields + 1] = 'h:' .. req
  fields[#fields + 1] = h
  if owner ~= '' then
    fields[#fields + 1] = owned(mode, owner)
    fields[#fields + 1] = req
  end
  redis.call('HSET', k, unpack(fields))
end

-- rejoin handles an acquire by a caller who already holds the name, after
-- prune. The same request again (its reply was lost: its token is a
-- hold's, or a hold records it) changes nothing; a re-entry by the owner
-- of a live hold in the same mode adds one to its count and records the
-- request. Both extend the hold (see extend). h is the hold of the request
-- token, at the token of a hold that records the request and ot the token
-- the owner holds (false for none), as read before prune; a hold that is
-- not alive is not joined (and forgotten, if prune did not). given is set
-- when the caller gave the request token (WithToken). It returns the
-- acquire's reply (a refusal, {0, ms, 1, 0}, when the hold the request made
-- no longer counts it: see mine), an error reply when the request token
-- holds the name in another mode, or nil when the acquire is new.
local function rejoin(k, hk, now, ttl, req, mode, h, at, ot, given)
  -- live decodes hold tok (h, or read now) and returns its expiry if it
  -- is alive.
  local function live(tok, h)
    h = h or redis.call('HGET', k, 'h:' .. tok)
    if not h then return nil end
    local d, exp = decode(h), alive(hk, tok, now)
    if exp then return d, exp end
    ghost(k, tok, d)
  end
  local tok, d, exp = req, nil, nil
  local again = false
  if h then
    d, exp = live(req, h)
    again = d and true
    -- The hold this request made, which no longer counts it: released, and
    -- kept by re-entries of its owner. Refused, changing nothing; but its
    -- owner, giving the token again, re-enters it, as an exclusive lock's
    -- (a late copy of the released request cannot be told from that one:
    -- it re-enters too, and its count lasts until the hold runs out).
    if d and not mine(d, req) then
      if not (given and ot == req) then return {0, math.max(exp - now, 0), 1, 0} end
      again = false
    end
  end
  if not d and at then
    tok, d, exp = at, live(at)
    if d and not recorded(d, req) then d = nil end
    again = d and true
  end
  if not d and ot and ot ~= req then
    tok = ot
    d, exp = live(ot)
  end
  if not d then return nil end
  if d.m ~= mode then return redis.error_reply('DLOCK_MODE 1') end
  if not again then
    d.c = d.c + 1
    d.a[#d.a + 1] = req
    if req == tok then
      redis.call('HSET', k, 'h:' .. tok, encode(d))
    else
      redis.call('HSET', k, 'h:' .. tok, encode(d), 'a:' .. req, tok)
    end
  elseif not d.x then
    -- Another Lock may hold it with this token now (WithToken): shared.
    d.x = 1
    redis.call('HSET', k, 'h:' .. tok, encode(d))
  end
  extend(hk, tok, now, ttl, d, exp)
  keep(k, ttl, hk)
  return {1, tok, tonumber(d.f)}
end

-- acquisition finds the live hold that records the acquisition in mode
-- with request token req. It returns its token, the decoded hold and where
-- it records req; nil when none does.
local function acquisition(k, hk, now, req, mode)
  local cur = redis.pcall('HMGET', k, 'h:' .. req, 'a:' .. req)
  if foreign(cur) then return nil end
  local tok, h = req, cur[1]
  if not h and cur[2] then tok, h = cur[2], redis.call('HGET', k, 'h:' .. cur[2]) end
  if not h or not alive(hk, tok, now) then return nil end
  local d = decode(h)
  local i = recorded(d, req)
  if not i or d.m ~= mode then return nil end
  return tok, d, i
end

-- find_hold finds the live hold of token in mode that counts the Lock's
-- acquisition, with request token req, among its own (see mine). It
-- returns its token, the decoded hold and its expiry; nil when the caller
-- holds nothing; nil and an error reply when token holds the name in
-- another mode. Owner ids play no part: every acquisition of a hold has
-- its token (a re-entry is granted the held one), and a Lock whose hold
-- expired must not act on the next hold of the same owner.
local function find_hold(k, hk, now, token, req, mode)
  local h = redis.pcall('HGET', k, 'h:' .. token)
  if foreign(h) or not h then return nil end -- k holds other data, or none
  local exp = alive(hk, token, now)
  if not exp then return nil end
  local d = decode(h)
  if d.m ~= mode then return nil, redis.error_reply('DLOCK_MODE 1') end
  if not mine(d, req) then return nil end
  return token, d, exp
end
