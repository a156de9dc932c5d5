-- inspect: what the name whose lock key is KEYS[1] and fence counter is
-- KEYS[2] holds; see describe.
return describe(KEYS[1], KEYS[2])
