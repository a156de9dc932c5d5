-- release: give up the exclusive locks KEYS[1..n] held with a token.
--
-- KEYS[n+1..2n]  the locks' waiter sets (see wake)
-- ARGV[1] token, ARGV[2] owner id ('' for none), ARGV[3] this release's id
-- ('' for the cleanup after a failed acquire)
--
-- A held key whose re-entry count is above one is decremented; otherwise it
-- is freed: its hash stays for a minute with an empty token (see acquire),
-- and its next waiter is woken. Keys not held by the caller are left alone.
-- The hash's 'rel' is the id of its last release: a release whose id it
-- already holds ran before (its reply was lost and the client sent it
-- again), changes nothing and counts as done. Returns the number of keys
-- that were not held by the caller.
local token, owner, id = ARGV[1], ARGV[2], ARGV[3]
local n = #KEYS / 2
local missing = 0
for i = 1, n do
  local k = KEYS[i]
  local cur = read_lock(k, 'rel', 'w', 'req')
  if not cur then
    missing = missing + 1
  elseif id == '' or cur[5] ~= id then
    -- Without an id, this is the cleanup after an acquire whose outcome is
    -- unknown, sent with its request token: if that acquire re-entered an
    -- owner's lock ('req' names it), its count goes, once.
    local mine = holds(cur, token, owner)
    local taken = holds(cur, cur[2], '') -- held by anyone
    local rejoined = not mine and taken and id == '' and cur[7] == token
    if not mine and not rejoined then
      missing = missing + 1
    elseif tonumber(cur[4]) > 1 then
      redis.call('HINCRBY', k, 'count', -1)
      if rejoined then
        redis.call('HSET', k, 'req', '')
      elseif id ~= '' then
        redis.call('HSET', k, 'rel', id)
      end
    else
      redis.call('HSET', k, 'token', '', 'owner', '', 'meta', '', 'rel', id)
      redis.call('PEXPIRE', k, 60000)
      if cur[6] then wake(KEYS[n + i], k, true) end
    end
  end
end
return missing
