package dlock

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Kind is the kind of primitive a name is used by.
type Kind string

// The kinds of primitive.
const (
	KindNone      Kind = ""          // the name is free
	KindLock      Kind = "lock"      // an exclusive lock
	KindRWMutex   Kind = "rwlock"    // a read/write lock (Client.RWMutex)
	KindSemaphore Kind = "semaphore" // a semaphore (Client.Semaphore)
)

// Info is what Inspect, List and ForceRelease report of a name.
type Info struct {
	Name    string   // the name: as given to Inspect or ForceRelease, as List finds it
	Kind    Kind     // KindNone when the name is free
	Holders []Holder // who holds it now, longest-held first
	// Fence is the newest fencing token issued for the name, from its fence
	// counter, or, where clients keep none (WithFenceRetention), from an
	// exclusive lock's hash while it lasts; never less than a holder's
	// fence; 0 when none of these is there.
	Fence uint64
	// Permits is a semaphore's permit count, as its last acquire gave it.
	Permits int
	// Waiters counts the waiting callers a read/write lock records: writers
	// waiting, and in a fair lock every waiter. Of the callers of one
	// client waiting for one lock, only the first in line talks to Redis,
	// so only it is recorded. Other waiters register only as clients (see
	// WaitingClients) and are not counted here.
	Waiters int
	// WaitingClients counts the clients (one per Client, in any process)
	// registered as waiting for the name, each for one caller or more, for
	// every kind. A client registers once a waiting caller's attempt was
	// refused, and leaves when its last waiting caller is done; the
	// registration of a client that died lapses within 1.5 s, or sooner
	// when a release finds that nobody listens for it any more, where the
	// server saw it listening when it registered.
	WaitingClients int
	// WriterWaiting is set when a writer waits for a read/write lock; new
	// readers are then kept out.
	WriterWaiting bool
	// Fair is set for a read/write lock that serves in arrival order.
	Fair bool
}

// Holder is one holder of a name. Tokens are never shown.
type Holder struct {
	Mode     string        // ModeExclusive, ModeWrite, ModeRead or ModePermit
	Owner    string        // the WithOwner id, or ""
	Metadata string        // the WithMetadata string
	Count    int           // the hold count (above 1 when re-entered; 0 for an exclusive lock released and kept for its minimum hold, see WithMinHold)
	Since    time.Time     // when it was obtained, by the server's clock
	TTL      time.Duration // how long it has left unless refreshed (the longest Duration when it lives longer, as with WithMinHold(math.MaxInt64))
	Fence    uint64        // its fencing token; 0 for read holds and permits
}

// Inspect reports what holds name, in one round trip: its kind, its
// holders, and for a read/write lock its waiters. A free name has Kind
// KindNone and no holders. A name whose holders all expired without
// releasing keeps its kind, with no holders, until its keys expire too
// (the longest TTL it was given).
func (c *Client) Inspect(ctx context.Context, name string) (*Info, error) {
	return c.describe(ctx, scriptInspect, name)
}

// ForceRelease frees name whoever holds it, wakes its waiters, and returns
// what it removed. It is meant for operators: the holders are not asked,
// and learn of the loss at their next refresh (their Done channels close
// then), told it was force-released (their errors match ErrForceReleased):
// an exclusive lock's hash stays, free, for a minute (as a released lock's
// does), with a record of the hold it ended, and the holds of a read/write
// lock or a semaphore are recorded for a minute in the name's release
// marker. Every hold of the name goes, and the waiters a read/write lock
// recorded, which record themselves again at their next attempt (in a
// fair lock, in the order of those attempts). The fence counter stays, so
// later holders still get larger fences.
func (c *Client) ForceRelease(ctx context.Context, name string) (*Info, error) {
	return c.describe(ctx, scriptForceRelease, name)
}

func (c *Client) describe(ctx context.Context, s *Script, name string) (*Info, error) {
	if ctx == nil {
		return nil, ErrNilContext
	}
	if err := c.checkName(name); err != nil {
		return nil, err
	}
	key := c.RedisKey(name)
	keys := describeKeys(key)
	if s == scriptForceRelease {
		keys = append(keys, key+":late") // see force_release.lua
	}
	v, err := c.eval(ctx, s, keys)
	if err != nil {
		return nil, scriptError(err, key, func(int64) string { return name }, c.RedisKey)
	}
	info, ok := parseInfo(name, v)
	if !ok {
		return nil, &ServerError{Key: key, Err: fmt.Errorf("unexpected reply %#v", v)}
	}
	return info, nil
}

// describeKeys are the keys of inspect.lua and force_release.lua for the
// name whose base key is key: the base key, its fence counter, waiter set,
// holds, pending acquires, arrival queue and release marker.
func describeKeys(key string) []string {
	return []string{key, key + ":fence", key + ":waiters", key + ":holds", key + ":pending", key + ":queue", key + ":released"}
}

// parseInfo reads the reply of describe.lua.
func parseInfo(name string, v any) (*Info, bool) {
	r, _ := v.([]any)
	const head, fields = 8, 7
	if len(r) < head {
		return nil, false
	}
	kind, _ := r[0].(string)
	info := &Info{Name: name, Kind: Kind(kind), Fence: parseUint(r[1]), Permits: int(parseUint(r[2])),
		Waiters: int(parseUint(r[3])), WriterWaiting: parseUint(r[4]) == 1, Fair: parseUint(r[5]) == 1,
		WaitingClients: int(parseUint(r[6]))}
	n, _ := r[7].(int64)
	if len(r) != head+int(n)*fields {
		return nil, false
	}
	for i := range int(n) {
		h := r[head+i*fields : head+(i+1)*fields]
		mode, _ := h[0].(string)
		owner, _ := h[1].(string)
		meta, _ := h[2].(string)
		pttl, _ := h[5].(int64)
		info.Holders = append(info.Holders, Holder{
			Mode: mode, Owner: owner, Metadata: meta, Count: int(parseUint(h[3])),
			Since: time.UnixMilli(int64(parseUint(h[4]))),
			TTL:   max(milliseconds(pttl), 0), Fence: parseUint(h[6]),
		})
		// A writer's fence outlives its counter where the retention is
		// shorter than its hold, or none.
		info.Fence = max(info.Fence, info.Holders[i].Fence)
	}
	sort.SliceStable(info.Holders, func(i, j int) bool { return info.Holders[i].Since.Before(info.Holders[j].Since) })
	return info, true
}

// parseUint reads a number that a script returned as an integer or a string.
func parseUint(v any) uint64 {
	switch v := v.(type) {
	case int64:
		return uint64(max(v, 0))
	case string:
		n, _ := strconv.ParseUint(v, 10, 64)
		return n
	}
	return 0
}

// Scanner is implemented by drivers that can walk the keyspace (on every
// primary of a cluster). List needs it; the goredis driver has it.
type Scanner interface {
	// Scan calls fn with every key that matches the glob pattern match and
	// holds the Redis type typ, until fn returns an error, which Scan then
	// returns. fn is called from one goroutine at a time and never again
	// after it returned an error. A key may be seen more than once.
	Scan(ctx context.Context, match, typ string, fn func(key string) error) error
}

// List reports every name in use by a primitive of any kind that matches
// the glob pattern (Redis syntax: *, ?, [abc]; "" or "*" for all), sorted
// by name. It walks the keys with SCAN, never KEYS (only hashes: the other
// keys of a name are not), and asks about every name in one pipelined
// round trip. Names released while it runs are left out. It returns
// ErrUnsupported if the driver has no Scanner.
func (c *Client) List(ctx context.Context, pattern string) ([]*Info, error) {
	if ctx == nil {
		return nil, ErrNilContext
	}
	c.made()
	sc, ok := c.driver.(Scanner)
	if !ok {
		return nil, fmt.Errorf("%w: List needs a driver that can SCAN", ErrUnsupported)
	}
	if pattern == "" {
		pattern = "*"
	}
	seen := map[string]bool{}
	var names []string
	err := sc.Scan(ctx, escapeGlob(c.prefix)+"*", "hash", func(key string) error {
		name := c.nameOf(key)
		if !seen[name] && globMatch(pattern, name) {
			seen[name] = true
			names = append(names, name)
		}
		return nil
	})
	if err != nil {
		return nil, &ServerError{Key: c.prefix + "*", Err: err}
	}
	sort.Strings(names)
	calls := make([]*Call, len(names))
	for i, name := range names {
		key := c.RedisKey(name)
		calls[i] = &Call{Script: scriptInspect, Keys: describeKeys(key)}
	}
	if len(calls) > 0 {
		c.batch.run(ctx, calls...)
	}
	var out []*Info
	for i, call := range calls {
		if call.Err != nil {
			if strings.Contains(call.Err.Error(), "DLOCK_WRONGTYPE") {
				continue // a hash under the prefix that dlock did not write
			}
			return nil, &ServerError{Key: call.Keys[0], Err: call.Err}
		}
		if info, ok := parseInfo(names[i], call.Val); ok && info.Kind != KindNone {
			out = append(out, info)
		}
	}
	return out, nil
}

// nameOf is the inverse of RedisKey. A key has two names when it is a
// name wrapped in braces ("x" and "{x}"); nameOf returns the one without
// the added braces, unless that one holds braces itself and the other is
// a name with a plain hash tag of its own: "{a}{b}", not "a}{b".
func (c *Client) nameOf(key string) string {
	name := strings.TrimPrefix(key, c.prefix)
	inner, ok := strings.CutPrefix(name, "{")
	if ok {
		inner, ok = strings.CutSuffix(inner, "}")
	}
	if !ok || c.RedisKey(inner) != key {
		return name
	}
	if strings.ContainsAny(inner, "{}") && hasHashTag(name) {
		// name starts with '{': its tag runs to the first '}'.
		if tag := name[1:strings.IndexByte(name, '}')]; !strings.Contains(tag, "{") {
			return name
		}
	}
	return inner
}

// escapeGlob quotes the glob characters of s for a Redis MATCH pattern.
func escapeGlob(s string) string {
	// Byte by byte, as Redis matches: a name that is not valid UTF-8 keeps
	// its bytes (ranging over runes would write U+FFFD in their place).
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if strings.IndexByte(`*?[]\`, s[i]) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// globMatch reports whether name matches pattern in Redis's glob syntax,
// byte by byte as Redis does: * any run, ? any one byte, [abc] [a-z] [^a] a
// class, \ escapes. It takes time proportional to the product of the
// lengths at worst, whatever the pattern: every token but * matches one
// byte, so on a mismatch it is enough to let the last * take one byte more.
func globMatch(pattern, name string) bool {
	pi, ni := 0, 0
	star, starAt := -1, 0 // the last * seen, and where its run ends now
	for ni < len(name) {
		if pi < len(pattern) && pattern[pi] == '*' {
			star, starAt = pi, ni
			pi++
			continue
		}
		if pi < len(pattern) {
			if width, ok := globToken(pattern, pi, name[ni]); ok {
				pi += width
				ni++
				continue
			}
		}
		if star < 0 {
			return false
		}
		starAt++
		pi, ni = star+1, starAt
	}
	for pi < len(pattern) && pattern[pi] == '*' {
		pi++
	}
	return pi == len(pattern)
}

// globToken matches the byte c against the token of pattern at pi, which is
// not *: it returns the token's width and whether c matches it.
func globToken(pattern string, pi int, c byte) (width int, ok bool) {
	switch pattern[pi] {
	case '?':
		return 1, true
	case '[':
		return classToken(pattern, pi, c)
	case '\\':
		if pi+1 < len(pattern) {
			return 2, pattern[pi+1] == c
		}
	}
	return 1, pattern[pi] == c
}

// classToken matches c against the class [...] at pattern[pi], as Redis's
// stringmatchlen does: ^ first negates, \ escapes the next byte, a-z is a
// range (z-a too), a ']' right after '[' or '^' closes an empty class, and
// a class without its ']' runs to the end of the pattern.
func classToken(pattern string, pi int, c byte) (width int, ok bool) {
	i := pi + 1
	negate := i < len(pattern) && pattern[i] == '^'
	if negate {
		i++
	}
	match := false
	for i < len(pattern) {
		switch ch := pattern[i]; {
		case ch == '\\' && i+1 < len(pattern):
			i++
			match = match || pattern[i] == c
		case ch == ']':
			return i + 1 - pi, match != negate
		case i+2 < len(pattern) && pattern[i+1] == '-':
			// Redis compares C chars, signed here: bytes from 0x80 on
			// come before 'a'.
			lo, hi, b := int8(ch), int8(pattern[i+2]), int8(c)
			if lo > hi {
				lo, hi = hi, lo
			}
			match = match || (lo <= b && b <= hi)
			i += 2
		default:
			match = match || ch == c
		}
		i++
	}
	return i - pi, match != negate
}
