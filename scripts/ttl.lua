-- ttl: what the holder of the exclusive locks KEYS[1..n] knows of them.
--
-- ARGV[1] token (unused: see held), ARGV[2] request token of the caller's
-- acquisition (see held), ARGV[3] an owner id to find the hold by instead
-- ('' for none: only Attach with WithOwner sends one), if the acquisition
-- that made the hold still holds it, and holds every key with the token it
-- holds KEYS[1] with; ARGV[4] '1' when a Lock attaches: the holds are then
-- shared with another Lock, and only ever extended from then on (see
-- expire).
--
-- Returns {pttl, metadata, fence_1, ..., fence_n, token} with the smallest
-- remaining TTL in ms (-1 when no key has an expiry) and the token KEYS[1]
-- is held with, or {-2} when any key is not held by the caller ({-3} when
-- ForceRelease ended the caller's hold there, see forced). Attaching, fails with DLOCK_KIND i and the
-- kind found (see kind_error) when KEYS[i] is held by another kind of
-- lock, and with DLOCK_WRONGTYPE i when it holds data dlock did not write.
local req, owner, attach = ARGV[2], ARGV[3] or '', ARGV[4] == '1'
local least, first = -1, nil
for i = 1, #KEYS do
  local ok = held(KEYS[i], req)
  if not ok and owner ~= '' then
    -- Found by owner: the hold's own acquisition (its request token is
    -- the token) must still be held, as the Lock will stand for it.
    local cur = read_lock(KEYS[i], 'req')
    ok = cur and cur[2] and cur[2] ~= '' and cur[3] == owner and cur[5] == cur[2] and (i == 1 or cur[2] == first)
    if ok and i == 1 then first = cur[2] end
  end
  if not ok then
    -- Attaching to a name another kind of lock uses, or whose key holds
    -- data dlock did not write, is a mistake to name.
    if attach then
      local kind = redis.pcall('HGET', KEYS[i], 'kind')
      if foreign(kind) or (not kind and redis.call('EXISTS', KEYS[i]) == 1) then
        return redis.error_reply('DLOCK_WRONGTYPE ' .. i)
      end
      if kind and kind ~= 'lock' then return kind_error(i, KEYS[i], kind) end
    end
    if forced(KEYS[i], req, ARGV[1]) then return {-3} end
    return {-2}
  end
  -- A key with no expiry (-1, an operator's PERSIST) counts only when
  -- none has one.
  local p = redis.call('PTTL', KEYS[i])
  if p >= 0 and (least < 0 or p < least) then least = p end
end
if attach then
  for i = 1, #KEYS do redis.call('HSET', KEYS[i], 's', '1') end
end
local out = {least, redis.call('HGET', KEYS[1], 'meta')}
for i = 1, #KEYS do
  out[#out + 1] = tonumber(redis.call('HGET', KEYS[i], 'fence'))
end
out[#out + 1] = redis.call('HGET', KEYS[1], 'token')
return out
