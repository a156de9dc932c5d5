-- release: give up the exclusive locks KEYS[1..n] held with a token.
--
-- KEYS[n+1..2n]  the locks' waiter sets (see wake)
-- KEYS[2n+1..3n] the locks' release markers: the id of the last release,
--                kept for a minute (SET replaces the marker a read/write
--                lock or semaphore of the name may have left)
-- ARGV[1] token, ARGV[2] owner id ('' for none), ARGV[3] this release's id
-- ('' for none)
--
-- A held key whose re-entry count is above one is decremented; otherwise it
-- is deleted and its next waiter is woken. Keys not held by the caller are
-- left alone. A release whose id the marker already holds ran before (its
-- reply was lost and the client sent it again): it changes nothing and
-- counts as done. Returns the number of keys that were not held by the
-- caller.
local token, owner, id = ARGV[1], ARGV[2], ARGV[3]
local n = #KEYS / 3
local missing = 0
for i = 1, n do
  local k, marker = KEYS[i], KEYS[2 * n + i]
  if id == '' or redis.pcall('GET', marker) ~= id then
    local ok, count = held(k, token, owner)
    if not ok then
      missing = missing + 1
    else
      if count > 1 then
        redis.call('HINCRBY', k, 'count', -1)
      else
        redis.call('DEL', k)
        wake(KEYS[n + i], k)
      end
      if id ~= '' then redis.call('SET', marker, id, 'PX', 60000) end
    end
  end
end
return missing
