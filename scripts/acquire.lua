-- acquire: obtain the exclusive locks KEYS[1..n] for one holder, all or none.
--
-- KEYS[1..n]     lock hashes
-- KEYS[n+1..2n]  their fence counters (strings without a TTL)
-- ARGV[1] request token (fresh per acquisition), ARGV[2] TTL in ms,
-- ARGV[3] metadata, ARGV[4] owner id ('' for none)
--
-- Returns {1, token, fence_1, ..., fence_n} when obtained. The token is the
-- request token, or the held token when the request re-enters a lock of the
-- same owner or repeats an acquire whose reply was lost.
-- Returns {0, pttl, i} when KEYS[i] is held by another holder.
-- Fails with DLOCK_WRONGTYPE i or DLOCK_KIND i when KEYS[i] holds data that
-- is not an exclusive lock; nothing is written then.
local n = #KEYS / 2
local req, ttl, meta, owner = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

-- First look at every key, so that a refusal leaves everything untouched.
local state, token = {}, req
for i = 1, n do
  local cur = redis.pcall('HMGET', KEYS[i], 'kind', 'token', 'req', 'owner')
  if cur.err then return redis.error_reply('DLOCK_WRONGTYPE ' .. i) end
  if cur[1] then
    if cur[1] ~= 'lock' then return redis.error_reply('DLOCK_KIND ' .. i) end
    if cur[3] == req then
      state[i], token = 'repeat', cur[2]
    elseif owner ~= '' and cur[4] == owner then
      state[i], token = 'reenter', cur[2]
    else
      return {0, redis.call('PTTL', KEYS[i]), i}
    end
  elseif redis.call('EXISTS', KEYS[i]) == 1 then
    return redis.error_reply('DLOCK_WRONGTYPE ' .. i)
  end
end

local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local out = {1, token}
for i = 1, n do
  local k = KEYS[i]
  if state[i] then
    if state[i] == 'reenter' then
      redis.call('HINCRBY', k, 'count', 1)
      redis.call('HSET', k, 'req', req)
    end
    redis.call('PEXPIRE', k, ttl)
    out[#out + 1] = tonumber(redis.call('HGET', k, 'fence'))
  else
    -- The fence never goes backwards: one more than the last, and at least
    -- the server's clock in microseconds, so a counter increment lost in a
    -- failover is still overtaken.
    local last = redis.pcall('GET', KEYS[n + i])
    if type(last) == 'table' then return redis.error_reply('DLOCK_WRONGTYPE ' .. i) end
    local f = (tonumber(last) or 0) + 1
    if f < now_us then f = now_us end
    local fs = string.format('%.0f', f)
    redis.call('SET', KEYS[n + i], fs)
    redis.call('HSET', k, 'kind', 'lock', 'token', token, 'req', req, 'owner', owner,
      'count', 1, 'meta', meta, 'fence', fs, 'since', string.format('%.0f', now_us / 1000))
    redis.call('PEXPIRE', k, ttl)
    out[#out + 1] = f
  end
end
return out
