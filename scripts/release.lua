-- release: give up one acquisition of the exclusive locks KEYS[1..n].
--
-- KEYS[n+1..2n]  the locks' waiter sets (see wake)
-- KEYS[2n+1..3n] their fence counters (see grant)
-- KEYS[3n+1..4n] for a clean-up (ARGV[2] ''), the keys of their
--                clean-ups' records (see late_keys); not for a release
-- ARGV[1] the request token of the acquisition given up, ARGV[2] this
-- release's id ('' for the clean-up after a failed acquire), and for a
-- clean-up ARGV[3] the client channel with which it may have left its
-- request for a grant ('' or absent when not; see grant), which goes, and
-- ARGV[4] the fence of the hold to give up ('' or absent for any): a key
-- held with another fence counts as not held, and ARGV[5] the holder's
-- minimum hold in ms ('' or absent for none; see keep_for), and ARGV[6]
-- '1' when the acquisition ends with this release or clean-up and its
-- request token is its own (not given with WithToken), '' or absent when
-- not (see below), and ARGV[7] the token of the hold the acquisition was
-- part of, when the caller knows it ('' or absent when not), by which a
-- re-entry learns that ForceRelease ended that hold (see forced), and
-- ARGV[8] how long a fence counter is kept after the fence of a grant
-- (see keep_fences). The number a refresh of the acquisition recorded
-- (see refresh) goes with the acquisition, whichever of its Locks gives
-- it up.
--
-- The acquisition is found by its request token (see acquire): the one
-- that made the current hold ('req') or a re-entry into it ('h:' .. request
-- token, valued the current token). So the caller needs no token (a
-- clean-up does not know it, and the parts of a lock on several slots may
-- be held with different tokens), and can give up only its own
-- acquisition. It is taken away once; a lock with no acquisition left is
-- freed: its hash stays for a minute with an empty token, and its next
-- waiter is woken, or granted the lock if it left its request (see
-- grant). Only a lock its holder must keep for a minimum hold is kept
-- instead, until then (see keep_for). Keys the acquisition does not hold are left alone. The
-- hash's release records (see rel_fields) hold the ids of its last releases (see record): a
-- release whose id they hold ran before (its reply was lost and the client
-- sent it again), changes nothing and counts as done. An acquisition that
-- ends (ARGV[6]) leaves its request token there too, on every key, held
-- or not (a key with nothing there gets a free lock hash, kept a minute):
-- a late copy of its acquire (sent again by a client library, or slow on a
-- connection since closed) then takes nothing (see acquire), where it would
-- have held the name, for nobody, until its TTL. A clean-up leaves it in
-- 'late' as well, where it stays two seconds from the last clean-up (the
-- last 64), however often the name is released meanwhile, and in a key of
-- its own for those two seconds, as the hash may run out first (see
-- late_key). Returns the number of keys
-- that were not held by the acquisition, negated when ForceRelease ended
-- its hold on any of them (see forced).
local req, id, asked, only = ARGV[1], ARGV[2], ARGV[3] or '', ARGV[4] or ''
local min_hold = tonumber(ARGV[5] or '')
local ends = ARGV[6] == '1'
keep_fences(ARGV[8])
local hold = 'h:' .. req

-- released reports whether the release records of lock hash cur (read by
-- read_lock below, from its eleventh element on) include id.
local function released(cur)
  return id ~= '' and in_rel(cur, 11, id)
end

-- legacy_room is how long an older dlock lets 'rel' grow: it kept every
-- record there, ids of up to 20 digits and whole request tokens (see
-- rel_add).
local legacy_room = 351

-- tail returns the last of the space-separated words that fit in room
-- bytes.
local function tail(words, room)
  if #words <= room then return words end
  local cut = string.find(words, ' ', #words - room, true)
  return cut and string.sub(words, cut + 1) or ''
end

-- rel_add returns the fields and values that add the words add (nil for
-- none) to the release records of lock hash cur, read from its a-th
-- element on: to the newest field while they fit in it, else to a new
-- newest field, the others moving down one and the oldest's words going.
-- While the newest field holds words longer than dlock's (an older
-- dlock's, whose clients read that field alone, during a rolling
-- upgrade), the words are added to it as that dlock does, the oldest
-- going past legacy_room, so that those clients still find theirs.
local function rel_add(cur, a, add)
  if not add then return {} end
  local rel = cur[a]
  if not rel or rel == '' then return {rel_fields[1], add} end
  local joined = rel .. ' ' .. add
  if #joined <= rel_room then return {rel_fields[1], joined} end
  if string.find(rel, '%S%S%S%S%S%S%S%S%S%S%S%S') then return {rel_fields[1], tail(joined, legacy_room)} end
  local out = {rel_fields[1], add}
  for i = 2, #rel_fields do
    local older = cur[a + i - 2]
    if i == 2 then older = tail(older, rel_room) end -- an older dlock's field, once its words went
    if older then out[#out + 1], out[#out + 2] = rel_fields[i], older end
  end
  return out
end

-- record returns the fields and values that add, to the release records of
-- lock hash cur, id (when with_id), and the request token when the
-- acquisition ends, for a clean-up (no id) only when they do not hold it
-- yet (a clean-up sent again would add it each time, pushing older records
-- out; a release sent again finds its id first); see rel_add. A clean-up
-- adds the request token to 'late' too (see late_add); another release
-- empties 'late' once its time is up. None when there is nothing to add.
local function record(cur, with_id)
  local add, word = with_id and id ~= '' and id or nil, rel_word(req)
  if ends and (id ~= '' or not in_rel(cur, 11, word)) then add = add and add .. ' ' .. word or word end
  local out = rel_add(cur, 11, add)
  local late = cur[10]
  if (ends and id == '') or (late and late ~= '') then
    local now = math.floor(clock_us(redis.call('TIME')) / 1000)
    if ends and id == '' then
      out[#out + 1], out[#out + 2] = 'late', late_add(late, word, now)
    elseif lapse(late) < now then
      out[#out + 1], out[#out + 2] = 'late', ''
    end
  end
  return out
end

-- keep_for returns how many ms lock k, whose last acquisition is being given
-- up, must still be kept to have been held for the minimum hold since its
-- hold began ('since'), or nil when it need not be. A hold kept stays taken
-- (its token is left) with no acquisition (request token, owner and count
-- cleared): nobody can refresh, join or release it, and it runs out then.
local function keep_for(k)
  if not min_hold then return nil end
  local since = tonumber(redis.call('HGET', k, 'since'))
  if not since then return nil end
  local left = since + min_hold - math.floor(clock_us(redis.call('TIME')) / 1000)
  if left > 0 then return left end
  return nil
end

local n = #KEYS / 3
if id == '' then
  n = #KEYS / 4
  for i = 1, n do late_keys[KEYS[i]] = KEYS[3 * n + i] end
end
-- Keys of a whole number of names, or a caller of another count: refused
-- before anything is written.
if n % 1 ~= 0 then return redis.error_reply('ERR dlock: release given ' .. #KEYS .. ' keys') end
local missing, ended_by_force = 0, false
-- A clean-up's time, in ms, for its word kept apart (see below).
local late_now = ends and id == '' and math.floor(clock_us(redis.call('TIME')) / 1000)
-- The record of a refresh that fenced (see refresh) goes with the
-- acquisition, whichever of its Locks gives it up (one attached to it,
-- say): read with the hold, after the release records, and taken away
-- below, when there, with the path's first write, which adds no memory.
local fenced = 'q:' .. req
local reads = {'w', 'req', hold, 'fence', 'forced', 'late', unpack(rel_fields)}
reads[#reads + 1] = fenced
local fenced_at = #reads + 4 -- its element in what read_lock returns
for i = 1, n do
  local k = KEYS[i]
  local cur = read_lock(k, unpack(reads))
  if cur and asked ~= '' then
    local g = redis.call('HGET', k, 'g:' .. asked)
    local ok, d = false, nil
    if g then ok, d = pcall(cjson.decode, g) end
    if ok and type(d) == 'table' and d[1] == req then redis.call('HDEL', k, 'g:' .. asked) end
  end
  local live = cur and cur[2] and cur[2] ~= '' and (only == '' or cur[8] == only)
  local first = live and cur[6] == req
  local again = live and not first and cur[7] == cur[2]
  if cur and released(cur) then
    -- Ran before: done.
  elseif not first and not again then
    missing = missing + 1
    ended_by_force = ended_by_force or (cur and forced(k, req, ARGV[7], cur[9]))
    if ends then
      -- Not its id: a release sent again must say again that it held
      -- nothing. At maxmemory (by EVALSHA), the server refuses these
      -- writes when they are the script's first, and nothing is recorded.
      if cur then
        -- A free hash's minute may be almost over: it is made to last a
        -- minute from now, for the record (PEXPIRE first: see below).
        if not cur[2] or cur[2] == '' then redis.pcall('PEXPIRE', k, '60000') end
        local rec = record(cur, false)
        if #rec > 0 then redis.pcall('HSET', k, unpack(rec)) end
      elseif redis.call('EXISTS', k) == 0 and type(redis.pcall('HSET', k, 'kind', 'lock', 'token', '', 'req', '',
          'owner', '', 'meta', '', 'count', '0', unpack(record({}, false)))) == 'number' then
        expire_or_drop(k, '60000')
      end
    end
  elseif tonumber(cur[4]) > 1 then
    -- The first write of each path below may not add memory (HDEL,
    -- PEXPIRE): at maxmemory, Redis refuses only a script's first write
    -- that may (HSET), and the writes after it then run, so that a release
    -- frees the lock on a full server too. (For the first acquisition, hold
    -- is no field: nothing goes.)
    if cur[fenced_at] then redis.call('HDEL', k, hold, fenced) else redis.call('HDEL', k, hold) end
    redis.call('HINCRBY', k, 'count', -1)
    if first then
      redis.call('HSET', k, 'req', '', unpack(record(cur, true)))
    else
      local rec = record(cur, true)
      if #rec > 0 then redis.call('HSET', k, unpack(rec)) end
    end
  else
    if cur[fenced_at] then
      redis.call('HDEL', k, hold, fenced) -- for the first acquisition, hold is no field
    elseif again then
      redis.call('HDEL', k, hold)
    end
    local rel = record(cur, true)
    local keep = keep_for(k)
    if keep then
      redis.call('PEXPIRE', k, keep)
      redis.call('HSET', k, 'req', '', 'owner', '', 'count', '0', 's', '', unpack(rel))
      -- The next waiter's timer follows the TTL it was refused with: told,
      -- it tries again and sleeps until this one.
      if cur[5] then waking().wake(KEYS[n + i], k, true) end
    elseif not (cur[5] and pass(k, KEYS[n + i], KEYS[2 * n + i], cur[8], rel, cur[9])) then
      redis.call('PEXPIRE', k, '60000')
      redis.call('HSET', k, 'token', '', 'req', '', 'owner', '', 'meta', '', 'count', '0', unpack(rel))
    end
  end
  if late_now then
    -- A clean-up: its word is kept apart too, whatever it found (see
    -- late_key). After the path's own writes: at maxmemory by EVALSHA, a
    -- write that may add memory runs only once the script has written
    -- (see above), so as the script's first it would be refused.
    keep_late(k, rel_word(req), late_now)
  end
end
if ended_by_force then return -missing end
return missing
