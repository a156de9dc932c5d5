-- wake: shared by the scripts that register waiting clients or free a
-- lock; dlock puts it in front of each of them.
--
-- A lock k has a waiter set wk: a sorted set of the waiting clients'
-- channels, scored by when their registration expires (ms, server clock).
-- A waiter set's key that holds other data is never written: a waiting
-- client is refused (see register), and a release wakes no one there.
-- A client that listens on shard channels (on a Redis Cluster) registers as
-- 's|' and its id: its channel for k is k .. ':w:' .. id, in k's own slot,
-- and it is told by SPUBLISH, which reaches only the shard that owns it.
-- An id holds no ':', and a client's own channel (the prefix, 'client:' and
-- its id) does: one whose prefix starts with 's|' is no shard member.
--
-- A registration's score is a whole number of ms, plus a half when the
-- server saw the client listening on its channel for k as it registered
-- (see register): such a client that nobody listens for at a release has
-- lost its connection, as a client that died does (see deaf). A client
-- the server did not see listening (its subscription on another node of a
-- cluster, or not yet confirmed, or behind a proxy) is never taken for
-- dead.
--
-- The helpers are made by waking, when a script first needs one, and
-- called through it (waking().wake(wk, k), say): Lua makes a closure of
-- every function a script defines each time the script runs, and an
-- uncontended acquire or release, which needs none of them, would pay for
-- them all.

-- wake_tries bounds how many clients found deaf a release takes out of a
-- waiter set before it gives up looking for one that listens.
local wake_tries = 32

-- waking returns the helpers below, by name, which it makes at its first
-- call in a run of the script.
local helpers
local function waking()
  if helpers then return helpers end

  -- sharded reports whether waiting client member listens on shard
  -- channels.
  local function sharded(member)
    return string.sub(member, 1, 2) == 's|' and not string.find(member, ':', 3, true)
  end

  -- channel_of returns the channel of waiting client member for lock k.
  local function channel_of(member, k)
    if sharded(member) then return k .. ':w:' .. string.sub(member, 3) end
    return member
  end

  -- tell sends a waiting client the notice that lock k may be free, or the
  -- message given (see grant), and returns how many clients the server sent
  -- it to, or nil when it could not be sent (a server without SPUBLISH): the
  -- waiter also wakes by its timers, and the release must not fail for it.
  local function tell(member, k, message)
    if sharded(member) then
      local n = redis.pcall('SPUBLISH', channel_of(member, k), message or k)
      if type(n) == 'number' then return n end
      return nil
    end
    return redis.call('PUBLISH', member, message or k)
  end

  -- listeners returns how many clients listen on the channel of waiting
  -- client member for lock k, without sending anything (nil when the server
  -- cannot tell, or the user may not ask).
  local function listeners(member, k)
    local r
    if sharded(member) then
      r = redis.pcall('PUBSUB', 'SHARDNUMSUB', channel_of(member, k))
    else
      r = redis.pcall('PUBSUB', 'NUMSUB', member)
    end
    if type(r) == 'table' and type(r[2]) == 'number' then return r[2] end
    return nil
  end

  -- deaf reports whether waiting client w (see next_waiter), seen listening
  -- when it registered, has nobody listening for it now, n being how many
  -- clients a notice to it reached (which counts pattern subscribers too), or
  -- would (see listeners).
  local function deaf(w, n)
    return w.heard and n == 0
  end

  -- died reports whether waiting client w, seen listening when it
  -- registered, died since: nobody listens on its channel now. It asks the
  -- server before the notice is sent, as what a notice reached counts the
  -- clients subscribed to a pattern that matches (a monitoring tool's
  -- PSUBSCRIBE *, say) too, which would hide a dead client.
  local function died(w, k)
    return w.heard and deaf(w, listeners(w.member, k))
  end

  -- lock_free reports whether lock k, whose 'kind' and 'token' fields cur holds
  -- (an HMGET reply), is free: a released exclusive lock's hash, or no key.
  local function lock_free(k, cur)
    return (cur[1] == 'lock' and cur[2] == '') or (not cur[1] and redis.call('EXISTS', k) == 0)
  end

  -- forget_expired takes the clients whose registrations expired (by now, in ms)
  -- out of waiter set wk of lock k, at most limit of them (all with nil),
  -- with the requests they left in k (see grant): their clients died, or
  -- register again, asking again. A set kept alive by the clients still
  -- waiting (a lock held all along, waited for all along) would otherwise
  -- keep those of clients that died for good, and k their requests.
  local function forget_expired(wk, k, now, limit)
    local bound = '(' .. string.format('%.0f', now)
    local gone
    if limit then
      gone = redis.pcall('ZRANGEBYSCORE', wk, '-inf', bound, 'LIMIT', 0, limit)
    else
      gone = redis.pcall('ZRANGEBYSCORE', wk, '-inf', bound)
    end
    if type(gone) ~= 'table' or gone.err or #gone == 0 then return end
    for i = 1, #gone, 1000 do
      local fields = {}
      for j = i, math.min(i + 999, #gone) do fields[#fields + 1] = 'g:' .. gone[j] end
      redis.pcall('HDEL', k, unpack(fields))
    end
    if limit then
      redis.pcall('ZREM', wk, unpack(gone))
    else
      redis.pcall('ZREMRANGEBYSCORE', wk, '-inf', bound)
    end
  end

  -- forgotten bounds how many expired registrations (see forget_expired) each
  -- registration takes out: more than clients die between two attempts of
  -- one still waiting.
  local forgotten = 16

  -- register puts waiting client member at the back of waiter set wk of
  -- lock k for lease ms from now_ms, marked as heard when the server sees it
  -- listening for k, and forgets registrations that expired. It returns
  -- false, having written nothing, when wk holds data that is not a sorted
  -- set.
  local function register(wk, k, member, now_ms, lease)
    local score = now_ms + lease
    if (listeners(member, k) or 0) > 0 then score = score + 0.5 end
    if not wrote(redis.pcall('ZADD', wk, score, member)) then return false end
    expire_or_drop(wk, lease)
    -- After the ZADD: at maxmemory, the script's first write that may add
    -- memory is the one refused, before anything is written.
    forget_expired(wk, k, now_ms, forgotten)
    return true
  end

  -- next_waiter returns the client registered longest ago in waiter set wk
  -- whose registration has not expired, as {member, heard, score}, or nil when none
  -- (or when wk holds other data); t is the server's TIME reply, read when
  -- nil.
  local function next_waiter(wk, t)
    t = t or redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local r = redis.pcall('ZRANGEBYSCORE', wk, now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    -- Read after the caller's writes: any error (other data, a command the
    -- user may not run) is no waiter, so that a release never fails half done.
    if type(r) ~= 'table' or r.err or not r[1] then return nil, t end
    return {member = r[1], heard = string.find(r[2], '.', 1, true) ~= nil, score = r[2]}, t
  end

  -- pop_waiter takes the client next_waiter would return out of waiter
  -- set wk, in one command where next_waiter and a ZREM take two, and
  -- returns it as next_waiter does, with its score (see put_back);
  -- registrations that expired go with it. The clock is read (when t is
  -- nil) only once a client is found: a lock once waited for keeps its
  -- mark (see acquire), and its releases find no waiter set most of the
  -- time. A server without ZPOPMIN (before Redis 5), or a user who may not
  -- run it, is served by next_waiter and ZREM.
  local function pop_waiter(wk, t, k)
    for _ = 1, 2 do
      local r = redis.pcall('ZPOPMIN', wk)
      if type(r) ~= 'table' then return nil, t end
      if r.err then
        if string.sub(r.err, 1, 9) == 'WRONGTYPE' then return nil, t end
        local w
        w, t = next_waiter(wk, t)
        if w then redis.call('ZREM', wk, w.member) end
        return w, t
      end
      if not r[1] then return nil, t end
      t = t or redis.call('TIME')
      local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      if tonumber(r[2]) >= now then
        return {member = r[1], heard = string.find(r[2], '.', 1, true) ~= nil, score = r[2]}, t
      end
      -- Expired, and so may be the registrations after it: they go at once,
      -- with the requests they left in k.
      redis.pcall('HDEL', k, 'g:' .. r[1])
      forget_expired(wk, k, now)
    end
    return nil, t
  end

  -- put_back puts waiting client w, taken out of waiter set wk by
  -- pop_waiter (which read t, the server's TIME reply), back in its place.
  -- Taken out as the set's last member, w took the set with it, which
  -- comes back without the expiry it had: it gets that of w's
  -- registration, so that a client that never comes back is forgotten
  -- with it, as before.
  local function put_back(wk, w, t)
    if redis.pcall('ZADD', wk, w.score, w.member) == 1 and redis.call('PTTL', wk) == -1 then
      local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      redis.pcall('PEXPIRE', wk, string.format('%.0f', math.max(math.ceil(tonumber(w.score)) - now, 1)))
    end
  end

  -- drop takes waiting client w, found deaf, out of waiter set wk of lock k,
  -- with the request it may have left there (see grant); popped, w is out
  -- of the set already.
  local function drop(wk, k, w, popped)
    if not popped then redis.call('ZREM', wk, w.member) end
    redis.pcall('HDEL', k, 'g:' .. w.member)
  end

  -- wake tells the next client waiting for lock k that it may be free: the
  -- one registered longest ago that has not expired gets a message on its
  -- channel naming k. One client is woken, not all of them; a client whose
  -- registration expires is skipped, and so is one that is deaf (it died
  -- since its last attempt: it leaves the set). marked says the caller knows
  -- that clients registered (see acquire), which spares looking first. With
  -- unregister, the client woken leaves the set, so that the next release
  -- wakes the next client (for a semaphore, whose permits may be freed one
  -- right after the other): the client registers again if its attempt is
  -- refused.
  local function wake(wk, k, marked, unregister)
    if not marked and redis.call('EXISTS', wk) == 0 then return end
    local w, t = next_waiter(wk)
    for try = 1, wake_tries do
      if not w then return end
      if not died(w, k) and not deaf(w, tell(w.member, k)) then
        if unregister then redis.call('ZREM', wk, w.member) end
        return
      end
      drop(wk, k, w)
      if try < wake_tries then w = next_waiter(wk, t) end
    end
  end

  -- wake_all tells every client waiting for k that it may be free: for the
  -- primitives that several may hold at once, when a change may let several
  -- waiters in.
  local function wake_all(wk, k)
    if redis.call('EXISTS', wk) == 0 then return end
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local all = redis.pcall('ZRANGEBYSCORE', wk, now, '+inf')
    if type(all) ~= 'table' or all.err then return end -- as in next_waiter
    for _, ch in ipairs(all) do
      tell(ch, k)
    end
  end

  -- leave takes waiting client member out of waiter set wk of exclusive
  -- lock k when the lock is free and none of the client's callers left a
  -- request there (see grant), and tells the next waiter in its place: a
  -- client that waits for other names of a lock, which the release of k
  -- told, cannot use the notice. Any error reading k leaves it be. It
  -- returns whether the client is out of wk now.
  local function leave(wk, k, member)
    local cur = redis.pcall('HMGET', k, 'kind', 'token', 'g:' .. member)
    if cur.err or cur[3] or not lock_free(k, cur) then
      return redis.pcall('ZSCORE', wk, member) == false
    end
    if redis.pcall('ZREM', wk, member) == 1 then wake(wk, k) end
    return true
  end

  helpers = {lock_free = lock_free, register = register, wake = wake, wake_all = wake_all, leave = leave,
    tell = tell, deaf = deaf, died = died, next_waiter = next_waiter, pop_waiter = pop_waiter, put_back = put_back,
    drop = drop}
  return helpers
end
