-- acquire: obtain the exclusive locks KEYS[1..n] for one holder, all or none.
--
-- KEYS[1..n]       lock hashes
-- KEYS[n+1..2n]    their fence counters (strings kept for a day, see fence)
-- KEYS[2n+1..3n]   their waiter sets (see wake)
-- ARGV[1] request token (fresh per acquisition), ARGV[2] TTL in ms,
-- ARGV[3] metadata, ARGV[4] owner id ('' for none),
-- ARGV[5] the waiting client's channel ('' when not waiting),
-- ARGV[6] '1' when more of that client's callers wait for these locks,
-- ARGV[7] how long a waiter's registration lasts, in ms
--
-- A waiting client that is refused registers in the blocking lock's waiter
-- set, so that the release wakes it. Once it obtains the locks, it leaves
-- the sets, or, when more of its callers wait, registers again at the back.
--
-- Returns {1, token, fence_1, ..., fence_n} when obtained. The token is the
-- request token, or the held token when the request re-enters a lock of the
-- same owner or repeats an acquire whose reply was lost.
-- Returns {0, pttl, i} when KEYS[i] is held by another holder.
-- Fails with DLOCK_WRONGTYPE i or DLOCK_KIND i when KEYS[i] holds data that
-- is not an exclusive lock; nothing is written then.
local n = #KEYS / 3
local req, ttl, meta, owner = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local waiter, more, lease = ARGV[5], ARGV[6], tonumber(ARGV[7])

local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- First look at every key, so that a refusal leaves everything untouched.
local state, token = {}, req
for i = 1, n do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    local cur = redis.pcall('HMGET', KEYS[i], 'kind', 'token', 'req', 'owner')
    if cur.err or not cur[1] then return redis.error_reply('DLOCK_WRONGTYPE ' .. i) end
    if cur[1] ~= 'lock' then return redis.error_reply('DLOCK_KIND ' .. i) end
    if cur[3] == req then
      state[i], token = 'repeat', cur[2]
    elseif owner ~= '' and cur[4] == owner then
      state[i], token = 'reenter', cur[2]
    else
      if waiter ~= '' then register(KEYS[2 * n + i], waiter, math.floor(now() / 1000), lease) end
      return {0, redis.call('PTTL', KEYS[i]), i}
    end
  end
end

local now_us = now()

-- Fences next (see next_fence), so that a fence counter holding other data
-- stops the acquire before any lock is written (skipping a number is
-- harmless).
local fences = {}
for i = 1, n do
  if state[i] then
    fences[i] = tonumber(redis.call('HGET', KEYS[i], 'fence'))
  else
    fences[i] = next_fence(KEYS[n + i], now_us)
    if not fences[i] then return redis.error_reply('DLOCK_WRONGTYPE ' .. i) end
  end
end

local out = {1, token}
for i = 1, n do
  local k = KEYS[i]
  if state[i] == 'reenter' then
    redis.call('HINCRBY', k, 'count', 1)
    redis.call('HSET', k, 'req', req)
  elseif not state[i] then
    redis.call('HSET', k, 'kind', 'lock', 'token', token, 'req', req, 'owner', owner, 'count', 1,
      'meta', meta, 'fence', string.format('%.0f', fences[i]), 'since', string.format('%.0f', now_us / 1000))
  end
  redis.call('PEXPIRE', k, ttl)
  if waiter ~= '' then
    if more == '1' then
      register(KEYS[2 * n + i], waiter, math.floor(now_us / 1000), lease)
    else
      redis.call('ZREM', KEYS[2 * n + i], waiter)
    end
  end
  out[#out + 1] = fences[i]
end
return out
