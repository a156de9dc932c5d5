-- inspect: what the name whose base key is KEYS[1] holds; KEYS[2] is its
-- fence counter, KEYS[3] its waiter set, KEYS[4] and KEYS[5] its holds and
-- pending acquires (see describe).
return describe(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
