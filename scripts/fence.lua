-- fence: shared by the scripts that issue fencing tokens; dlock puts it in
-- front of each of them.
--
-- next_fence(fk, now_us) returns the next fence of the counter fk, or nil
-- when fk holds data dlock did not write (then fk is left untouched). A
-- fence never goes backwards: one more than the last, and at least the
-- server's clock in microseconds, so that increments a failover or restart
-- lost are still overtaken. The counter is kept for a day after the name's
-- last fence: after that the clock alone is ahead of every fence issued,
-- unless the server's clock was set back by more than that day.
local fence_keep_ms = 86400000

local function next_fence(fk, now_us)
  local last = redis.pcall('GET', fk)
  if type(last) == 'table' then return nil end -- not a string
  local f = now_us
  if last then
    last = tonumber(last)
    if not last then return nil end -- not a number
    if last + 1 > f then f = last + 1 end
  end
  redis.call('SET', fk, string.format('%.0f', f), 'PX', fence_keep_ms)
  return f
end
