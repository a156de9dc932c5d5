-- library: the start of every function of the function library (see
-- WithFunctions). The library defines the helpers once, when it is
-- loaded, ahead of its functions, where a script defines those it uses
-- each time it runs; begin, called first by each function, gives a call
-- what a script's run starts with: KEYS, which the helpers read (the
-- function's own KEYS and ARGV are its parameters), and the helpers'
-- state at its starting values. A helper that keeps state between its
-- calls within a run (a top-level local it assigns) has it reset here.
local function begin(keys)
  KEYS = keys
  fence_keep_ms, late_keys = fence_keep_default, {}
end
