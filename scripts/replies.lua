-- replies: shared by every script; dlock puts it in front of each, first.
--
-- The scripts read and write the keys of a name with redis.pcall where a
-- key may hold data dlock did not write: the command's error then says so,
-- and the script refuses the name (DLOCK_WRONGTYPE) or leaves that key
-- alone. Only a WRONGTYPE error means that. Any other error (the ACL user
-- may not run the command, READONLY on a replica, OOM at maxmemory) is
-- raised as it is, so that the caller gets Redis's own error rather than
-- an innocent key blamed for it, or a lock taken for free.

-- foreign reports whether r, the reply of a read made by redis.pcall, is
-- the error of a key that holds another type of data; false when r is no
-- error. Any other error is raised as it is. The scripts use it for the
-- reads they make before their first write, so that nothing has been
-- written then; a read after writes (the waiters a release wakes, say)
-- takes any error for none instead, so that a script never fails half
-- done for it.
local function foreign(r)
  if type(r) ~= 'table' or not r.err then return false end
  if string.sub(r.err, 1, 9) == 'WRONGTYPE' then return true end
  error(r)
end

-- expire_or_drop gives key k, which the script just wrote, a TTL of ms.
-- Refused (an ACL user without PEXPIRE), it deletes k if k is left
-- without one (the key would otherwise stay in Redis for good, a new lock
-- held for good), and returns the refusal; nil when k got its TTL.
local function expire_or_drop(k, ms)
  local r = redis.pcall('PEXPIRE', k, ms)
  if type(r) == 'table' and r.err then
    if redis.call('PTTL', k) == -1 then redis.pcall('DEL', k) end
    return r
  end
end

-- wrote reports whether r, the reply of a write made by redis.pcall,
-- succeeded: false when the key holds another type of data. Any other
-- error (READONLY on a replica, OOM at maxmemory) is raised as it is: the
-- caller may retry, and a script's first write is the one that fails, so
-- nothing has been written.
local function wrote(r)
  return not foreign(r)
end

-- kind_error is the error that refuses the i-th name because its hash k
-- is used as another kind of lock, kind ('lock', 'rwlock' or
-- 'semaphore'): DLOCK_KIND i, then that kind, a read/write lock's with its
-- fairness ('rwlock:1' fair, 'rwlock:0' preferring writers), which the
-- error names.
local function kind_error(i, k, kind)
  if kind == 'rwlock' then
    local fair = redis.pcall('HGET', k, 'fair')
    if type(fair) == 'string' then kind = kind .. ':' .. fair end
  end
  return redis.error_reply('DLOCK_KIND ' .. i .. ' ' .. kind)
end
