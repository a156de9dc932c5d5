-- held: shared by the scripts that act on a lock already taken; dlock puts
-- it in front of each of them.
--
-- held(k, token, owner) reports whether the exclusive lock k is held by the
-- caller (its token, or its non-empty owner id, matches) and, if so, its
-- re-entry count. A released lock's hash has an empty token: no one holds
-- it.
local function held(k, token, owner)
  local cur = redis.pcall('HMGET', k, 'kind', 'token', 'owner', 'count')
  if type(cur) ~= 'table' or cur.err or cur[1] ~= 'lock' or not cur[2] or cur[2] == '' then return false end
  if cur[2] == token or (owner ~= '' and cur[3] == owner) then
    return true, tonumber(cur[4])
  end
  return false
end
