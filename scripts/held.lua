-- held: shared by the scripts that act on a lock already taken; dlock puts
-- it in front of each of them.
--
-- read_lock(k, ...) reads the exclusive lock hash k: 'kind', 'token',
-- 'owner', 'count', then the fields named; nil when k is no lock hash.
local function read_lock(k, ...)
  local cur = redis.pcall('HMGET', k, 'kind', 'token', 'owner', 'count', ...)
  if type(cur) ~= 'table' or cur.err or cur[1] ~= 'lock' then return nil end
  return cur
end

-- holds reports whether the lock read as cur is held by the caller: its
-- token, or its non-empty owner id, matches. A released lock's hash has an
-- empty token: no one holds it.
local function holds(cur, token, owner)
  return cur[2] and cur[2] ~= '' and (cur[2] == token or (owner ~= '' and cur[3] == owner))
end

-- held(k, token, owner) reports whether the exclusive lock k is held by the
-- caller and, if so, its re-entry count.
local function held(k, token, owner)
  local cur = read_lock(k)
  if cur and holds(cur, token, owner) then return true, tonumber(cur[4]) end
  return false
end
