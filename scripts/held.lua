-- held: shared by the scripts that act on a lock already taken; dlock puts
-- it in front of each of them.
--
-- read_lock(k, ...) reads the exclusive lock hash k: 'kind', 'token',
-- 'owner', 'count', then the fields named; nil when k is no lock hash.
-- (See acquire for the fields.) A read Redis refuses (the ACL user may not
-- run HMGET) fails the script, rather than read as no lock (see foreign).
local function read_lock(k, ...)
  local cur = redis.pcall('HMGET', k, 'kind', 'token', 'owner', 'count', ...)
  if foreign(cur) or cur[1] ~= 'lock' then return nil end
  return cur
end

-- listed reports whether the space-separated words of list (a field of a
-- lock's release records, see rel_fields; false when absent) include word.
local function listed(list, word)
  if not list or word == '' then return false end
  local at = 1
  while true do
    local i, j = string.find(list, word, at, true)
    if not i then return false end
    if (i == 1 or string.byte(list, i - 1) == 32) and (j == #list or string.byte(list, j + 1) == 32) then
      return true
    end
    at = i + 1
  end
end

-- A lock hash keeps the records of its last releases (see release) in the
-- fields rel_fields, newest first: space-separated words, release ids and
-- the first rel_word characters of request tokens, up to rel_room bytes a
-- field. So a field stays within Redis's compact encoding of a small hash
-- (hash-max-listpack-value, 64 by default), which one field holding every
-- record left past a lock's second release (about 750 bytes a hash where
-- 300 do). A field holds two releases' ids and request tokens, so the five
-- keep at least the last eight releases' (see rel_add in release).
local rel_fields, rel_room = {'rel', 'rel1', 'rel2', 'rel3', 'rel4'}, 64

-- rel_word returns the word that records request token req: its first 11
-- characters, 66 random bits of dlock's tokens (a release id is 64 bits, 11
-- characters too).
local function rel_word(req)
  return string.sub(req, 1, 11)
end

-- in_rel reports whether the release records of a lock hash, read into
-- cur from its a-th element on (rel_fields, in order), include word. The
-- fields are written in order, so the first one absent ends them.
local function in_rel(cur, a, word)
  for i = a, a + #rel_fields - 1 do
    if not cur[i] then return false end
    if listed(cur[i], word) then return true end
  end
  return false
end

-- A lock hash also keeps the words of the acquisitions whose clean-up ran
-- (see release) in the field 'late': "lapse word ...", lapse the server's
-- clock in ms when they may go, late_floor ms after the last clean-up
-- (each clean-up, also one sent again, sets it anew; so does a force
-- release, for the first acquisition of the hold it ended), then the words,
-- oldest first, the last late_most of them; the first release after the
-- lapse empties it. The release records keep a clean-up's word for the
-- next eight releases or so only: a few ms on a name released hundreds of
-- times a second, where a late copy of its acquire can come 100 ms after
-- it and more. Up to four words keep the field within a compact hash's 64
-- bytes.
-- A clean-up keeps its word in the string k .. ':late' too (see
-- late_key), for late_floor ms (and so does a force release, for the first
-- acquisition of the hold it ended): the hash may run out before a late copy
-- of the acquire comes (a dead holder's hold, one kept for its minimum
-- hold), taking 'late' with it, or be made anew without it (by a release
-- that finds no key, or an older dlock). An acquire that could take or
-- join the name (no hash, a free one, its owner's hold) reads it.
local late_floor, late_most = 2000, 64

-- late_keys maps each lock hash of a script that writes the words of its
-- 'late' (see late_floor), a clean-up or a force release, to the key that
-- keeps them apart, which the script names among its keys, as those
-- scripts set it: while a slot moves, the node its keys go to would make
-- a second copy of a key it does not have yet, which stops the move
-- (MIGRATE fails with BUSYKEY), and the node they leave would refuse to
-- write one it no longer has. The scripts that only read it (an acquire,
-- a release that grants) do not name it, so that they are not refused
-- (TRYAGAIN) for as long as the slot moves while no such key is there,
-- which is most of the time: read on the node the slot leaves once the
-- key has moved, or on the node it goes to before, it is not found, and
-- the name is read as one no clean-up left a record for.
local late_keys = {}

-- late_key returns the key that keeps the words of 'late' apart from lock
-- hash k, in k's slot: k .. ':late' (see late_keys).
local function late_key(k)
  return late_keys[k] or (k .. ':late')
end

-- lapse returns when the words of 'late' (see late_floor), read as late,
-- may go: the server's clock in ms (0 for none).
local function lapse(late)
  return late and tonumber(string.match(late, '^%d+')) or 0
end

-- late_add returns the field 'late' of a lock hash (see late_floor), late
-- (false when absent), with word added when not there yet (a clean-up sent
-- again), all kept late_floor ms from now (ms): with the words of the
-- clean-ups before it whose time is not up.
local function late_add(late, word, now)
  local words, has = {}, false
  if lapse(late) >= now then
    for w in string.gmatch(late, '%S+') do
      words[#words + 1] = w
      has = has or w == word
    end
    table.remove(words, 1)
  end
  if not has then words[#words + 1] = word end
  return string.format('%.0f', now + late_floor) .. ' ' .. table.concat(words, ' ', math.max(1, #words - late_most + 1))
end

-- keep_late adds word to the late key of lock hash k (see late_key), kept
-- late_floor ms from now (ms), unless that key holds data dlock did not
-- write.
local function keep_late(k, word, now)
  local lk = late_key(k)
  local old = redis.pcall('GET', lk)
  if not old or (type(old) == 'string' and string.match(old, '^%d+ ')) then
    redis.pcall('SET', lk, late_add(old, word, now), 'PX', late_floor)
  end
end

-- late_for returns whether the late key of lock hash k lists word (an
-- acquisition cleaned up of late, see late_key); the key expires with the
-- time of its words, so no clock is read.
local function late_for(k, word)
  local late = redis.pcall('GET', late_key(k))
  return type(late) == 'string' and listed(late, word)
end

-- unlisted returns list without word.
local function unlisted(list, word)
  local out = {}
  for w in string.gmatch(list, '%S+') do
    if w ~= word then out[#out + 1] = w end
  end
  return table.concat(out, ' ')
end

-- forced reports whether an operator's ForceRelease ended the hold of lock
-- k that the acquisition of request token req was part of, known by that
-- request token or by the hold's token when given (see force_release:
-- only the first acquisition's request token is recorded).
-- f is the record when the caller has read it (false when absent).
local function forced(k, req, token, f)
  if f == nil then
    f = redis.pcall('HGET', k, 'forced')
    if foreign(f) then return false end
  end
  return type(f) == 'string' and (listed(f, req) or listed(f, token or ''))
end

-- held(k, req) reports whether the exclusive lock k is held by the caller
-- and, if so, its hold count. The caller is a Lock: it holds k when its
-- acquisition, known by its request token req, is one of the current
-- hold's (see acquire; the parts of a lock on several slots may be held
-- with different tokens). The token alone does not do: the acquisitions of
-- one owner share it, and one that was released (its refresh sent before
-- its release and run after it, say) must not act on the others' hold.
-- Nor do owner ids: a Lock of an earlier hold of the same owner, since
-- released, must not act on the next.
--
-- It also reports whether the hold is shared with another Lock of the same
-- acquisition (one attached to it, or one that acquired it again with its
-- token: field 's'), which only ever extends it (see expire), and the
-- number of the acquisition's last refresh that fenced off the earlier
-- ones (field 'q:' .. req, see refresh), nil when none did.
local function held(k, req)
  local cur = read_lock(k, 'req', 'h:' .. req, 's', 'q:' .. req)
  if not cur or not cur[2] or cur[2] == '' then return false end
  if cur[5] == req or cur[6] == cur[2] then return true, tonumber(cur[4]), cur[7] == '1', tonumber(cur[8]) end
  return false
end

-- expire sets the TTL of lock k to ttl ms; when shared (held by several
-- acquisitions of its owner, asked for again with its token, or attached),
-- it only extends it: each Lock was promised its own TTL, and one must not
-- cut another's short.
local function expire(k, ttl, shared)
  if shared and redis.call('PTTL', k) >= tonumber(ttl) then return end
  redis.call('PEXPIRE', k, ttl)
end
