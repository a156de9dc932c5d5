-- fence: shared by the scripts that issue fencing tokens; dlock puts it in
-- front of each of them.
--
-- next_fence(fk, now_us) returns the next fence of the counter fk, or nil
-- when fk holds data dlock did not write. A fence never goes backwards: one
-- more than the last, and at least the server's clock in microseconds, so
-- that increments a failover or restart lost are still overtaken.
local function next_fence(fk, now_us)
  local f = redis.pcall('INCR', fk)
  if type(f) == 'table' then return nil end
  if f < now_us then
    f = now_us
    redis.call('SET', fk, string.format('%.0f', f))
  end
  return f
end

