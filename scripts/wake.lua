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

-- tell sends a waiting client the notice that lock k may be free, or the
-- message given (see grant), and returns how many clients the server sent
-- it to, or nil when it could not be sent (a server without SPUBLISH): the
-- waiter also wakes by its timers, and the release must not fail for it.
local function tell(member, k, message)
  if string.sub(member, 1, 2) == 's|' then
    local n = redis.pcall('SPUBLISH', k .. ':w:' .. string.sub(member, 3), message or k)
    if type(n) == 'number' then return n end
    return nil
  end
  return redis.call('PUBLISH', member, message or k)
end

-- listeners returns how many clients listen on the channel of a waiting
-- client for lock k, without sending anything (nil when the server cannot
-- tell).
local function listeners(member, k)
  local r
  if string.sub(member, 1, 2) == 's|' then
    r = redis.pcall('PUBSUB', 'SHARDNUMSUB', k .. ':w:' .. string.sub(member, 3))
  else
    r = redis.pcall('PUBSUB', 'NUMSUB', member)
  end
  if type(r) == 'table' and type(r[2]) == 'number' then return r[2] end
  return nil
end

-- in_cluster is nil until deaf looks it up.
local in_cluster

-- deaf reports whether a waiting client surely does not listen here, n
-- being how many clients on this server a notice to it reached (or would,
-- see listeners): its subscription's connection closed, as a client's does
-- when it dies. A count of 0 says so for a shard channel, which the
-- shard's primary serves (drivers subscribe there), and for a plain channel
-- off a cluster; on a cluster, a plain channel's subscribers on other nodes
-- are not counted (nor where INFO is denied), so it says nothing there.
local function deaf(member, n)
  if n ~= 0 then return false end
  if string.sub(member, 1, 2) == 's|' then return true end
  if in_cluster == nil then
    local info = redis.pcall('INFO', 'cluster')
    in_cluster = type(info) ~= 'string' or not string.find(info, 'cluster_enabled:0', 1, true)
  end
  return not in_cluster
end

-- wrote reports whether r, the reply of a write made by redis.pcall,
-- succeeded: false when the key holds another type of data. Any other
-- error (READONLY on a replica, OOM at maxmemory) is raised as it is: the
-- caller may retry, and a script's first write is the one that fails, so
-- nothing has been written.
local function wrote(r)
  if type(r) ~= 'table' or not r.err then return true end
  if string.sub(r.err, 1, 9) == 'WRONGTYPE' then return false end
  error(r)
end

-- lock_free reports whether lock k, whose 'kind' and 'token' fields cur holds
-- (an HMGET reply), is free: a released exclusive lock's hash, or no key.
local function lock_free(k, cur)
  return (cur[1] == 'lock' and cur[2] == '') or (not cur[1] and redis.call('EXISTS', k) == 0)
end

-- register puts a waiting client, known by its channel, at the back of
-- waiter set wk for lease ms from now_ms. It returns false, having written
-- nothing, when wk holds data that is not a sorted set.
local function register(wk, channel, now_ms, lease)
  if not wrote(redis.pcall('ZADD', wk, now_ms + lease, channel)) then return false end
  redis.call('PEXPIRE', wk, lease)
  return true
end

-- wake_tries bounds how many waiting clients a release looks at: those
-- found deaf (see deaf) are taken out of the set, and the next is tried.
local wake_tries = 3

-- waiters returns the wake_tries clients registered longest ago in waiter
-- set wk whose registrations have not expired, in order (none when wk
-- holds other data), and the server's TIME reply it read.
local function waiters(wk)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local ms = redis.pcall('ZRANGEBYSCORE', wk, now, '+inf', 'LIMIT', 0, wake_tries)
  if ms.err then return {}, t end
  return ms, t
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
  for _, m in ipairs((waiters(wk))) do
    local gone = deaf(m, tell(m, k))
    if gone or unregister then redis.call('ZREM', wk, m) end
    if not gone then return end
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
  if all.err then return end
  for _, ch in ipairs(all) do
    tell(ch, k)
  end
end

