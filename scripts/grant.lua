-- grant: shared by the scripts that free an exclusive lock; dlock puts it
-- in front of each of them, after wake and fence.
--
-- A waiting client may leave its request with its registration: the lock
-- hash's field 'g:' .. its channel holds the request of its first waiting
-- caller, as JSON {request token, TTL in ms, owner, metadata, attempt,
-- server clock in microseconds when the attempt ran} (see acquire). Every
-- registering attempt sets or clears that field, so it always belongs to
-- the client's latest one. A request that does not read as one is not
-- granted; its client is only told. When the lock is freed and
-- the next waiting client left a request, the lock is granted to it there
-- and then: held with the request token as its token, and the client is
-- told so; the caller needs no round trip of its own to take it. A client
-- that left none is only told that the lock may be free, and so is one
-- whose request an attempt cleaned up of late left (see late_key): a late
-- copy of that attempt left it, once the hash that kept the clean-up's
-- record had run out.
--
-- The notice of a grant is "\0" .. attempt .. " " .. fence .. " " ..
-- elapsed .. " " .. #token .. " " .. token .. k (a token or key may hold
-- spaces), where elapsed is how long, in microseconds of the server's
-- clock, the grant came after the attempt that left the request ran. The
-- caller counts the TTL from when it sent that attempt, plus elapsed: no
-- later than the grant.

-- pass hands lock k, being freed, to its next waiter: the client
-- registered longest ago in waiter set wk that has not expired and is not
-- deaf (see wake). If it left a request and listens, pass grants it the
-- lock, writing the hash (with rel, the fields and values that record its
-- release, see release)
-- and its TTL, and returns true. If not, pass tells it the lock may be free
-- and returns false: the caller frees the hash. fk is the lock's fence
-- counter and fence the last fence the hash holds; forced is the hash's
-- 'forced' record (see force_release). A client is granted the
-- lock only while it listens: one that died since its last attempt would
-- hold the lock for its TTL, unheard (it is dropped, see wake). The client
-- is taken out of the set as it is found (see pop_waiter), which spares the
-- ZREM of a grant; one only told is put back in its place.
local function pass(k, wk, fk, fence, rel, forced)
  local h = waking()
  local w, t = h.pop_waiter(wk, nil, k)
  for try = 1, wake_tries do
    if not w then return false end
    local m = w.member
    local rec = redis.call('HGET', k, 'g:' .. m)
    local ok, g = false, nil
    if rec then ok, g = pcall(cjson.decode, rec) end
    local dead -- nil until asked (see died)
    ok = ok and type(g) == 'table' and #g == 6 and type(g[1]) == 'string' and g[1] ~= ''
      and (tonumber(g[2]) or 0) > 0 and type(g[3]) == 'string' and type(g[4]) == 'string'
    if ok and late_for(k, rel_word(g[1])) then
      -- Left by a late copy of an attempt cleaned up (see late_key), which
      -- came once the hash holding the clean-up's record had run out: its
      -- caller is gone. The client is only told.
      redis.call('HDEL', k, 'g:' .. m)
    elseif ok then
      dead = h.died(w, k)
      if not dead then
        -- The expiry first: at maxmemory, a write that adds no memory lets
        -- the next ones run (see release). A lock not granted after all
        -- gets the free lock's expiry.
        redis.call('PEXPIRE', k, g[2])
        local now_us, now_text = clock_us(t)
        local f, text = next_fence(fk, now_us, tonumber(fence), now_text)
        if f then
          redis.call('HSET', k, 'token', g[1], 'req', g[1], 'owner', g[3], 'count', '1', 'meta', g[4],
            'fence', text, 'since', string.sub(now_text, 1, -4), 's', '', unpack(rel))
          redis.call('HDEL', k, 'g:' .. m)
          if forced and listed(forced, g[1]) then redis.call('HSET', k, 'forced', unlisted(forced, g[1])) end
          local elapsed = math.max(now_us - (tonumber(g[6]) or now_us), 0)
          h.tell(m, k, '\0' .. g[5] .. ' ' .. text .. ' ' .. string.format('%.0f', elapsed) .. ' ' .. #g[1] .. ' ' .. g[1] .. k)
          return true
        end
      end
    end
    if dead == nil then dead = h.died(w, k) end
    if not dead and not h.deaf(w, h.tell(m, k)) then
      h.put_back(wk, w, t)
      return false
    end
    h.drop(wk, k, w, true)
    if try < wake_tries then w = h.pop_waiter(wk, t, k) end
  end
  return false
end
