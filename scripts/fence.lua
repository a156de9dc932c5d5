-- fence: shared by the scripts that issue fencing tokens; dlock puts it in
-- front of each of them.
--
-- next_fence(fk, now_us, last, now_text) returns the next fence of the
-- counter fk, as a number and as a string, or nil when fk holds data dlock
-- did not write (then fk is left untouched). last is the counter's value
-- when the caller already knows it (a released lock keeps its fence), or
-- nil to read it; now_text is now_us as text when the caller has it, which
-- spares formatting a number that large. A fence never goes backwards:
-- one more than the last, and at least the server's clock in microseconds,
-- so that increments a failover or restart lost are still overtaken. The
-- counter is kept for fence_keep_ms after the name's last fence, a day
-- unless the client says otherwise (see keep_fences): after that the clock
-- alone is ahead of every fence issued, unless the server's clock was set
-- back by more than that. A client that keeps no counter ('0') neither
-- reads nor writes it: its fences are the clock, or one more than last. A
-- counter at 2^53 or beyond, where Lua's numbers stop telling one more
-- apart (the clock gets there in 2255), was not written by dlock: the
-- fences would stop growing, so it is refused.
local fence_keep_default = '86400000'
local fence_keep_ms = fence_keep_default

-- keep_fences sets how long, in ms, next_fence keeps a counter after its
-- last fence, from a script's argument: '' or absent keeps the default, a
-- day; '0' keeps none (WithFenceRetention).
local function keep_fences(arg)
  if arg and arg ~= '' then fence_keep_ms = arg end
end

-- clock_us returns the server's clock from a TIME reply t in microseconds,
-- as a number and as text (which spares formatting a number that large).
local function clock_us(t)
  return tonumber(t[1]) * 1000000 + tonumber(t[2]), t[1] .. string.sub('00000' .. t[2], -6)
end

local function next_fence(fk, now_us, last, now_text)
  local f = now_text or string.format('%.0f', now_us)
  local counted = fence_keep_ms ~= '0'
  if not last and counted then
    -- A name without a counter takes one command: SET NX GET (Redis 7)
    -- sets the clock and reports a counter that was there instead. Before
    -- Redis 7, or on a key that is not a string, it fails; GET tells.
    local old = redis.pcall('SET', fk, f, 'PX', fence_keep_ms, 'NX', 'GET')
    if old == false then return now_us, f end
    if type(old) == 'table' then
      old = redis.pcall('GET', fk)
      if foreign(old) then return nil end -- not a string
    end
    if old then
      last = tonumber(old)
      if not last then return nil end -- not a number
    end
  end
  if last and last >= 9007199254740992 then return nil end
  if last and last + 1 > now_us then
    now_us = last + 1
    f = string.format('%.0f', now_us)
  end
  if counted then
    -- With GET, SET writes nothing on a counter of another type, which a
    -- released lock's hash (last) did not read: refused as above. Before
    -- Redis 6.2, which refuses the option, a plain SET.
    local old = redis.pcall('SET', fk, f, 'PX', fence_keep_ms, 'GET')
    if type(old) == 'table' and old.err then
      if string.sub(old.err, 1, 9) == 'WRONGTYPE' then return nil end
      redis.call('SET', fk, f, 'PX', fence_keep_ms)
    end
  end
  return now_us, f
end
