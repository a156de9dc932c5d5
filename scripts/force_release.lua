-- force_release: free the name whose base key is KEYS[1], whoever holds it,
-- and wake its waiters (waiter set KEYS[3]). KEYS[2] is its fence counter,
-- which stays, so that fences keep growing; KEYS[4..6] are its holds,
-- pending acquires and arrival queue, removed with the base key by the
-- kinds that have them, KEYS[7] its release marker, where a read/write
-- lock's or a semaphore's holds are recorded as ended (see record_forced),
-- and KEYS[8] the key of an exclusive lock's clean-ups' record (see
-- late_key).
-- Returns what was removed; see describe.
--
-- An exclusive lock's hash stays for a minute, free, as a released lock's
-- does (see release), with its fence, its release records ('rel' to
-- 'rel4' and 'late', see held), the mark of its waiters and
-- 'forced': the ended hold's token and its first acquisition's request
-- token, after those of the holds it ended before, so that the hold's
-- Locks learn how it was lost (see held). The record stays with the hash,
-- held by others or not, until trimmed; a hold of a token given again
-- takes it out (see acquire, grant). The request token of the hold's first
-- acquisition ('req') goes to 'late' too, as a clean-up's does, so that a
-- late copy of its acquire does not take the name back for the Lock that
-- the force release ended. (Not those of re-entries, which only a read of
-- every field would find, a command the ACL line does not grant.)

-- forced_kept is how much of 'forced' stays: the tokens of the last
-- holds ended, cut at a space.
local forced_kept = 1023

late_keys[KEYS[1]] = KEYS[8]

local was = describe(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
if was.err then return was end
local kind = was[1]
if kind == '' then return was end
allow_oom(KEYS[1])
if kind == 'lock' then
  local f = redis.call('HMGET', KEYS[1], 'token', 'req', 'fence', 'w', 'forced', 'late', unpack(rel_fields))
  local token, words = f[1] or '', {}
  local late = f[6]
  if f[2] and f[2] ~= '' then
    local word, now = rel_word(f[2]), clock()
    late = late_add(late, word, now)
    -- Apart too, as a clean-up's (see late_key): the hash of the next
    -- holder may run out before a late copy of that acquire comes.
    keep_late(KEYS[1], word, now)
  end
  if f[5] and f[5] ~= '' then words[1] = f[5] end
  if f[2] and f[2] ~= '' and f[2] ~= token then words[#words + 1] = f[2] end
  words[#words + 1] = token
  local forced = table.concat(words, ' ')
  if #forced > forced_kept then
    local cut = string.find(forced, ' ', #forced - forced_kept, true)
    forced = cut and string.sub(forced, cut + 1) or token
  end
  redis.call('DEL', KEYS[1])
  local kept = {'kind', 'lock', 'token', '', 'req', '', 'owner', '', 'meta', '', 'count', '0', 'fence', f[3] or '', 'forced', forced}
  for i, field in ipairs(rel_fields) do
    if f[6 + i] then kept[#kept + 1], kept[#kept + 2] = field, f[6 + i] end
  end
  if late then kept[#kept + 1], kept[#kept + 2] = 'late', late end
  redis.call('HSET', KEYS[1], unpack(kept))
  -- Clients still wait: the next release looks for them. (The requests
  -- they left for grants go: each leaves its own again as it is refused.)
  if f[4] then redis.call('HSET', KEYS[1], 'w', '1') end
  redis.call('PEXPIRE', KEYS[1], '60000')
  waking().wake(KEYS[3], KEYS[1])
  return was
end
-- The arrival queue is read before the first write: a read Redis refuses
-- fails the script with nothing written (see foreign).
local queued = kind == 'rwlock' and queued_any(KEYS[6])
record_forced(KEYS[1], KEYS[4], KEYS[7], clock())
if kind == 'rwlock' then
  if queued then
    redis.call('DEL', KEYS[1], KEYS[4], KEYS[5], KEYS[6])
  else
    redis.call('DEL', KEYS[1], KEYS[4], KEYS[5])
  end
else
  redis.call('DEL', KEYS[1], KEYS[4])
end
waking().wake_all(KEYS[3], KEYS[1])
return was
