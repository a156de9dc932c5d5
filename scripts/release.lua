-- release: give up one acquisition of the exclusive locks KEYS[1..n].
--
-- KEYS[n+1..2n]  the locks' waiter sets (see wake)
-- KEYS[2n+1..3n] their fence counters (see grant)
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
-- (see keep_fences)
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
-- hash's 'rel' holds the ids of its last releases (see record): a
-- release whose id it holds ran before (its reply was lost and the client
-- sent it again), changes nothing and counts as done. An acquisition that
-- ends (ARGV[6]) leaves its request token there too, on every key, held
-- or not (a key with nothing there gets a free lock hash, kept a minute):
-- a late copy of its acquire (sent again by a client library, or slow on a
-- connection since closed) then takes nothing (see acquire), where it would
-- have held the name, for nobody, until its TTL. Returns the number of keys
-- that were not held by the acquisition, negated when ForceRelease ended
-- its hold on any of them (see forced).
local req, id, asked, only = ARGV[1], ARGV[2], ARGV[3] or '', ARGV[4] or ''
local min_hold = tonumber(ARGV[5] or '')
local ends = ARGV[6] == '1'
keep_fences(ARGV[8])
local hold = 'h:' .. req

-- kept is how much of 'rel' a release keeps: room for the last eight
-- releases' ids (64-bit numbers in decimal, up to 20 digits) and request
-- tokens (22 characters), a space after each, so that the releases of
-- other holders made while a lost reply is sent again do not push this
-- one's out.
local kept = 8 * (21 + 23) - 1

-- released reports whether the ids rel (space-separated, latest last)
-- include id.
local function released(rel)
  return id ~= '' and listed(rel, id)
end

-- record returns rel with id added (when with_id), and the request token
-- when the acquisition ends, less the oldest words when they no longer fit
-- in kept: it cuts at the first space from the end's kept characters on,
-- so at least the last eight releases' stay.
local function record(rel, with_id)
  local add = with_id and id ~= '' and id or nil
  if ends then add = add and add .. ' ' .. req or req end
  if not add then return rel or '' end
  if not rel or rel == '' then return add end
  rel = rel .. ' ' .. add
  if #rel > kept then
    local cut = string.find(rel, ' ', #rel - kept, true)
    rel = cut and string.sub(rel, cut + 1) or add
  end
  return rel
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
local missing, ended_by_force = 0, false
for i = 1, n do
  local k = KEYS[i]
  local cur = read_lock(k, 'rel', 'w', 'req', hold, 'fence', 'forced')
  if cur and asked ~= '' then
    local g = redis.call('HGET', k, 'g:' .. asked)
    local ok, d = false, nil
    if g then ok, d = pcall(cjson.decode, g) end
    if ok and type(d) == 'table' and d[1] == req then redis.call('HDEL', k, 'g:' .. asked) end
  end
  local live = cur and cur[2] and cur[2] ~= '' and (only == '' or cur[9] == only)
  local first = live and cur[7] == req
  local again = live and not first and cur[8] == cur[2]
  if cur and released(cur[5]) then
    -- Ran before: done.
  elseif not first and not again then
    missing = missing + 1
    ended_by_force = ended_by_force or (cur and forced(k, req, ARGV[7], cur[10]))
    if ends then
      -- Not its id: a release sent again must say again that it held
      -- nothing. At maxmemory (by EVALSHA), the server refuses these
      -- writes when they are the script's first, and nothing is recorded.
      if cur then
        -- A free hash's minute may be almost over: it is made to last a
        -- minute from now, for the record (PEXPIRE first: see below).
        if not cur[2] or cur[2] == '' then redis.pcall('PEXPIRE', k, '60000') end
        redis.pcall('HSET', k, 'rel', record(cur[5], false))
      elseif redis.call('EXISTS', k) == 0 and type(redis.pcall('HSET', k, 'kind', 'lock', 'token', '', 'req', '',
          'owner', '', 'meta', '', 'count', '0', 'rel', req)) == 'number' then
        expire_or_drop(k, '60000')
      end
    end
  elseif tonumber(cur[4]) > 1 then
    -- The first write of each path below may not add memory (HDEL,
    -- PEXPIRE): at maxmemory, Redis refuses only a script's first write
    -- that may (HSET), and the writes after it then run, so that a release
    -- frees the lock on a full server too. (For the first acquisition, hold
    -- is no field: nothing goes.)
    redis.call('HDEL', k, hold)
    redis.call('HINCRBY', k, 'count', -1)
    if first then
      redis.call('HSET', k, 'req', '', 'rel', record(cur[5], true))
    elseif id ~= '' or ends then
      redis.call('HSET', k, 'rel', record(cur[5], true))
    end
  else
    if again then redis.call('HDEL', k, hold) end
    local rel = record(cur[5], true)
    local keep = keep_for(k)
    if keep then
      redis.call('PEXPIRE', k, keep)
      redis.call('HSET', k, 'req', '', 'owner', '', 'count', '0', 'rel', rel, 's', '')
      -- The next waiter's timer follows the TTL it was refused with: told,
      -- it tries again and sleeps until this one.
      if cur[6] then waking().wake(KEYS[n + i], k, true) end
    elseif not (cur[6] and pass(k, KEYS[n + i], KEYS[2 * n + i], cur[9], rel, cur[10])) then
      redis.call('PEXPIRE', k, '60000')
      redis.call('HSET', k, 'token', '', 'req', '', 'owner', '', 'meta', '', 'count', '0', 'rel', rel)
    end
  end
end
if ended_by_force then return -missing end
return missing
