package dlock

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlockio/dlock/internal/causes"
)

// DefaultPrefix is the prefix of every Redis key and channel dlock writes,
// unless WithPrefix sets another.
const DefaultPrefix = "dlock:"

// Client obtains locks through a Driver. It is safe for concurrent use; make
// one per Redis deployment, with New, and share it. The zero Client is not
// usable: its methods panic, as do those of a nil *Client.
type Client struct {
	driver Driver
	prefix string
	log    *slog.Logger
	hooks  []Hooks
	batch  batcher
	// lanes are the batchers of each server, made as they are first
	// needed and dropped once idle, on a Partitioned driver; nil
	// elsewhere, where batch serves every request.
	lanes *lanes
	// confirmed are the batchers of lone calls confirmed on replicas,
	// made as they are first needed and dropped once idle (see waitLane).
	confirmed laneSet[waitKey]

	// fenceKeep is the fence counters' retention in ms, boxed for the
	// scripts' arguments, or nil for the default (see WithFenceRetention).
	fenceKeep any

	// cluster is set once the server refused a lock's call on names in
	// several hash slots (CROSSSLOT): from then on such locks are split by
	// slot from the start (see slots.go).
	cluster atomic.Bool

	ttlArgs atomic.Pointer[ttlArg] // see ttlArg

	mu      sync.Mutex
	wd      *watchdog                         // started by the first lock that refreshes automatically
	waits   *waitHub                          // made by the first caller that waits
	waiting map[*context.CancelCauseFunc]bool // end the waits under way, at Close (see endsAtClose)
	busy    int                               // acquisitions under way (see underway)
	idle    chan struct{}                     // closed when the acquisitions Close waits for have ended
	closed  bool
	shut    chan struct{} // made by the first Close, closed when it returns: later calls wait for it

	// The clean-ups sent again in the background (see inBackground): Close
	// waits for them (bg), ending them (bgEnd) at its bound, bgBy, and
	// starts no more once bgClosed is set.
	bg       sync.WaitGroup
	bgCtx    context.Context
	bgEnd    context.CancelFunc
	bgClosed bool
	bgBy     time.Time
}

// ClientOption configures a Client.
type ClientOption func(*Client)

// WithPrefix sets the prefix of every key and channel the client uses. The
// default is DefaultPrefix, "dlock:". Two clients see each other's locks only
// if they use the same prefix. A prefix with a hash tag ("app{locks}:") puts
// every lock in one Redis Cluster slot; one whose first '{' opens an empty
// tag ("p{}:") has every name refused (ErrInvalidName), as the keys of a
// lock could not share a slot. An empty prefix is allowed, but then the
// locks' keys sit among the application's own, and List and the dlock
// command's ls scan every hash of the database.
func WithPrefix(prefix string) ClientOption {
	return func(c *Client) { c.prefix = prefix }
}

// WithLogger sets where the client logs: debug records for acquisitions,
// retries, refreshes and releases, warnings for losses and for failures it
// cannot return to a caller, error records for an automatic refresh that
// Redis denies (ErrDenied: a setting to fix) and, with its stack, for a
// hook that panicked on one of dlock's own goroutines (see Hooks), and an
// info record when the driver cannot subscribe (waiting then polls). Records
// about a lock name it with the attribute "names", a list (a name longer
// than 256 bytes by its first bytes, "…" and its length). Tokens are never
// logged. The loss of one node's lock of a Redlock lock (package redlock)
// is a debug record, not a warning: Redlock logs whether the lock is lost.
// The default discards everything.
func WithLogger(l *slog.Logger) ClientOption {
	return func(c *Client) {
		if l != nil {
			c.log = l
		}
	}
}

// WithPipelines sets how many requests or pipelines the client sends at
// once before it queues further requests from other goroutines and sends
// them together as one pipeline; the default is DefaultPipelines (4).
// Values below 1 count as 1, and above 1<<20 as 1<<20. Idle or lightly
// loaded, every request goes out at once, alone. A caller whose context ends leaves its pipeline, as a
// request whose reply was lost, instead of waiting for the callers with
// later deadlines that share it; a refresh stays, so that it never runs
// after its lock's next refresh. The caller that sends a pipeline for the
// others (the one of the latest deadline, or of none) gives it up once it
// and every other caller of it have left (not one with a refresh, a
// release or a clean-up in it), so that with a driver that ends a request
// at its context's cancellation (rueidis, not go-redis) a cancelled caller
// does not wait on for a stalled server. Releases, clean-ups and
// waiter-set exits may have n more in flight: requests a stalled server
// holds do not keep them queued. On a Partitioned driver (a cluster, a Ring), each server has
// n (and n more) of its own, and the requests queued for it go out
// together, to it alone.
func WithPipelines(n int) ClientOption {
	// Capped so that releases' n more do not overflow: no client keeps
	// that many requests in flight.
	return func(c *Client) { c.batch.max = min(max(n, 1), maxPipelines) }
}

// maxPipelines is the most WithPipelines takes.
const maxPipelines = 1 << 20

// DefaultFenceRetention is how long a name's fence counter is kept after
// the name's last fence, unless WithFenceRetention sets another time.
const DefaultFenceRetention = 24 * time.Hour

// WithFenceRetention sets how long the key that counts a name's fencing
// tokens (its fence counter, at RedisKey(name)+":fence") is kept after the
// name's last fence; the default is DefaultFenceRetention, a day. Fences
// are at least the server's clock in microseconds, and one more than the
// last: the counter only keeps them growing across a server clock that is
// set back (by hand, or by a failover to a replica whose clock is behind),
// by up to d. Each distinct name keeps a counter of about 140 bytes for
// that long, so a service that locks many names (one per order, say) keeps
// fewer keys with a shorter d.
//
// A d of 0 or less keeps no counter: the client neither writes nor reads
// one (an acquire of a fresh name then runs one command less). An exclusive
// lock's fence is then the clock, or one more than the fence its hash
// keeps while it is held and for a minute after its release; a writer's
// fence on a read/write lock is the clock alone. Fences of a name then grow
// only while the server's clock does not go back. Give every client of a
// name the same retention: one that keeps none does not see the counters
// of the others. A d that is not a whole number of milliseconds is rounded
// up.
func WithFenceRetention(d time.Duration) ClientOption {
	return func(c *Client) {
		switch {
		case d == DefaultFenceRetention:
			c.fenceKeep = nil // the scripts' default: no argument to send
		case d <= 0:
			c.fenceKeep = "0"
		default:
			c.fenceKeep = strconv.FormatInt(ceilMilliseconds(d), 10) // no overflow near the longest d
		}
	}
}

// fenceArg returns args with the fence retention at index i (the script's
// ARGV[i+1], after empty arguments up to it) when the client keeps fence
// counters for other than the default time; otherwise args as they are.
func (c *Client) fenceArg(args []any, i int) []any {
	if c.fenceKeep == nil {
		return args
	}
	for len(args) < i {
		args = append(args, argNone)
	}
	return append(args, c.fenceKeep)
}

// New returns a Client that reaches Redis through d, such as
// goredis.New(rdb). It panics if d is nil. Close the client when done with
// it: once used, it may own a goroutine and a pub/sub connection.
func New(d Driver, opts ...ClientOption) *Client {
	if d == nil {
		panic("dlock: New with a nil Driver")
	}
	c := &Client{driver: d, prefix: DefaultPrefix, log: slog.New(slog.DiscardHandler)}
	c.batch = batcher{driver: d, max: DefaultPipelines, closedUnder: c.closedUnder}
	for _, o := range opts {
		if o != nil {
			o(c)
		}
	}
	if p, ok := d.(Partitioned); ok && p.Partitioned() {
		c.lanes = &lanes{p: p}
	}
	return c
}

// notNew is the panic of a method of a Client that New did not make.
const notNew = "dlock: Client used without New (the zero Client is not usable)"

// made panics unless New made c: a Client without a driver would wait for
// ever for its first request to be sent, or fail deep inside.
func (c *Client) made() {
	if c == nil {
		panic("dlock: method called on a nil *Client")
	}
	if c.driver == nil {
		panic(notNew)
	}
}

// Prefix returns the key prefix of the client.
func (c *Client) Prefix() string {
	c.made()
	return c.prefix
}

// RedisKey returns the Redis key of the lock called name. Every key of one lock
// shares the name's hash tag, so it lives in one Redis Cluster slot: a name
// that holds a hash tag of its own ("{order:42}:pay") keeps it, any other is
// wrapped in braces ("dlock:{orders:42}"). So "{x}" and "x" name the same
// lock. Every call that takes a name refuses (ErrInvalidName) one that starts
// with '}' and has no tag of its own, and one with a tag that ends in a
// suffix of the other keys of a lock (":fence", ":waiters", ":holds",
// ":pending", ":queue", ":released" or ":late"): "{x}:fence" would be a key of the
// lock "{x}".
func (c *Client) RedisKey(name string) string {
	c.made()
	if hasHashTag(name) {
		return c.prefix + name
	}
	return c.prefix + "{" + name + "}"
}

// lockKeys returns the Redis keys of the exclusive lock called name: its
// RedisKey, its waiter set, its fence counter and its clean-ups' record
// (see late_key in scripts/held.lua), in one string.
func (c *Client) lockKeys(name string) (key, waiters, fence, late string) {
	c.made()
	open, shut := "{", "}"
	if hasHashTag(name) {
		open, shut = "", ""
	}
	all := c.prefix + open + name + shut + c.prefix + open + name + shut + ":waiters" +
		c.prefix + open + name + shut + ":fence" + c.prefix + open + name + shut + ":late"
	n := len(c.prefix) + len(open) + len(name) + len(shut)
	w := n + n + len(":waiters")
	f := w + n + len(":fence")
	return all[:n], all[n:w], all[w:f], all[f:]
}

// keySuffixes are the endings of the keys a name's lock keeps beside its
// RedisKey (see lockKeys, describeKeys, RWMutex and Semaphore; ":late" is
// the clean-ups' record, see late_key in scripts/held.lua).
var keySuffixes = [...]string{":fence", ":waiters", ":holds", ":pending", ":queue", ":released", ":late"}

// checkName validates a lock name. A name with a hash tag of its own is its
// RedisKey less the prefix, so one that ends like the other keys of a lock
// ("{x}:fence") would be a key of the lock of another name ("{x}"): it is
// refused. A name without a tag cannot collide: its key ends in '}'.
func checkName(name string) error {
	switch {
	case name == "":
		return ErrEmptyName
	case name[0] == '}' && !hasHashTag(name):
		return fmt.Errorf("%w: %s starts with '}' and has no hash tag of its own", ErrInvalidName, causes.Quote(name))
	}
	if hasHashTag(name) {
		for _, s := range keySuffixes {
			if strings.HasSuffix(name, s) {
				return fmt.Errorf("%w: %s holds a hash tag and ends in %q, which names a key of the lock %s",
					ErrInvalidName, causes.Quote(name), s, causes.Quote(strings.TrimSuffix(name, s)))
			}
		}
	}
	return nil
}

// checkName is checkName for the client's prefix too: a prefix with a
// '{' of its own opens the key's hash tag, and one whose first '{' is
// followed by '}' ("p{}:"), or a name that closes the prefix's brace at
// once ("}a{b}" after "p{"), leaves the key with an empty tag, and the
// lock's keys in different slots of a Redis Cluster. Such a name is
// refused on any deployment, so that it does not work on one and fail on
// another.
func (c *Client) checkName(name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	// A prefix without '{' (the default's) leaves the tag to the name,
	// which checkName has checked: no key need be made.
	if strings.IndexByte(c.prefix, '{') < 0 {
		return nil
	}
	if key := c.RedisKey(name); !hasHashTag(key) {
		return fmt.Errorf("%w: %s with the prefix %s makes the key %s, whose hash tag is empty: the lock's keys would fall in different Redis Cluster slots",
			ErrInvalidName, causes.Quote(name), causes.Quote(c.prefix), causes.Quote(key))
	}
	return nil
}

// hasHashTag reports whether s holds a non-empty Redis Cluster hash tag.
func hasHashTag(s string) bool {
	i := strings.IndexByte(s, '{')
	if i < 0 {
		return false
	}
	j := strings.IndexByte(s[i+1:], '}')
	return j > 0
}

// ttlArg is a TTL as a script argument, in ms, boxed.
type ttlArg struct {
	ttl time.Duration
	arg any
}

// ttlArg returns ttl as a script argument: a string of its milliseconds,
// kept for the next call with the same TTL (most locks of a client share
// one), so that an acquire neither boxes nor formats a number.
func (c *Client) ttlArg(ttl time.Duration) any {
	if a := c.ttlArgs.Load(); a != nil && a.ttl == ttl {
		return a.arg
	}
	a := &ttlArg{ttl: ttl, arg: strconv.FormatInt(ttl.Milliseconds(), 10)}
	c.ttlArgs.Store(a)
	return a.arg
}

// eval runs one script call and returns its reply.
func (c *Client) eval(ctx context.Context, s *Script, keys []string, args ...any) (any, error) {
	call := &Call{Script: s, Keys: keys, Args: args}
	c.evalOne(ctx, call)
	return call.Val, call.Err
}

// closeCleanupBound bounds how long Close waits for the waits it ended to
// clean up, and for the acquisitions under way to end: each clean-up is
// bounded by cleanupTimeout.
const closeCleanupBound = cleanupTimeout + time.Second

// Close stops the client: it takes no new work, ends the waits under way,
// and stops its background work, the watchdog that refreshes locks
// obtained WithAutoRefresh and the subscription that wakes waiting callers.
//
// After Close, every acquire (TryLock, Lock, TryLockMulti, LockMulti, Do,
// and those of read/write locks and semaphores) returns ErrClosed at once,
// without contacting Redis, as does AutoRefresh, and Attach
// WithAutoRefresh. The callers waiting in a Lock (of any primitive) when
// Close is called stop waiting and return an error that matches
// ErrClosed (not ErrNotObtained), having left their waiter registrations
// and given back what their last attempt may hold (an attempt under way is
// cut short as the end of its context would, where the driver ends a
// request at its context's cancellation: go-redis does not, and a request
// it sent to a stalled server ends at its read timeout), as callers whose
// wait ended always do; Close waits for that, up to 3 seconds, so that the
// Redis client may be closed next. A TryLock under way is not interrupted, and
// may still obtain its lock; one WithAutoRefresh that obtains it after
// Close gives it back and returns ErrClosed, since nothing would refresh
// it. Close waits for the TryLocks under way too, within the same bound,
// so that their give-backs and clean-ups are done with the driver open.
//
// Locks still held are not released, and stay usable: Release, Refresh
// and TTL still work, so a deferred Release still frees its lock (Attach,
// Inspect, List, ForceRelease and SetFenced work too). They are no longer
// refreshed automatically, so they expire with their TTL and their Done
// channels close at their deadlines, unless released; those that were
// refreshed automatically are lost then with an error that matches
// ErrClosed too (Lock.Err, and the context of Lock.Context and of Do's
// function), unless their last refresh before Close had failed. Close
// does not end Do's functions: a shutdown that should not wait for their
// locks' deadlines ends Do's contexts, waits for Do to return, and then
// calls Close. A refresh under way
// is abandoned, and not reported as a failed refresh; Close waits for the
// driver to give it up, which, when the server does not answer, can take
// the driver's read timeout (go-redis: ReadTimeout, 3s by default), and
// for a refresh WithReplicas whose WAIT is under way, up to that WAIT's
// timeout (the server answers WAIT only then, whatever the context). So
// does a clean-up being sent again in the background (see TryLock),
// which Close waits for within its 3 seconds, and then ends (a try that
// began before Close, allowed half a second at first and up to 4 seconds
// when the server answered none of the earlier tries in time, may take
// that long, as far as the driver ends a request at its context's
// deadline); an Unsubscribe of idle shard channels under way (up to 1s);
// and a subscription being opened, for a driver that dials for its own
// timeout whatever its context says (up to 10s), or closed (rueidis
// waits up to 1s for a server that does not answer). Close does not close the
// Redis client under the driver. It is safe to call more than once, also
// from several goroutines at once: every call returns once the first has
// done its work (so a hook that calls it, which no hook may, waits for ever
// while another Close waits for that hook). Called
// from a waiting caller's own WithOnRetry function, it waits out its bound
// for that caller, which cannot end its wait until Close returns.
func (c *Client) Close() error {
	c.made()
	start := time.Now()
	c.mu.Lock()
	if shut := c.shut; shut != nil {
		// Closed, or closing: done once the first call is.
		c.mu.Unlock()
		<-shut
		return nil
	}
	c.shut = make(chan struct{})
	defer close(c.shut)
	wd, waits := c.wd, c.waits
	c.bgBy = start.Add(closeCleanupBound)
	c.wd, c.closed = nil, true
	ends := make([]*context.CancelCauseFunc, 0, len(c.waiting))
	for end := range c.waiting {
		ends = append(ends, end)
	}
	var idle chan struct{}
	if c.busy > 0 { // acquisitions under way, the waits among them
		if c.idle == nil {
			c.idle = make(chan struct{})
		}
		idle = c.idle
	}
	c.mu.Unlock()
	for _, end := range ends {
		(*end)(ErrClosed)
	}
	if idle != nil {
		// The acquisitions end with the driver, which the caller may close
		// next: the waits clean up (leave their registrations, give back
		// what their last attempt may hold), and a lock obtained
		// WithAutoRefresh is given back.
		t := time.NewTimer(closeCleanupBound)
		select {
		case <-idle:
		case <-t.C:
		}
		t.Stop()
	}
	// The clean-ups sent again in the background, those of the waits
	// Close ended among them, have what is left of the same bound.
	c.mu.Lock()
	c.bgClosed = true
	bgEnd := c.bgEnd
	c.mu.Unlock()
	if bgEnd != nil {
		t := time.AfterFunc(time.Until(c.closeBy()), bgEnd)
		c.bg.Wait()
		t.Stop()
		bgEnd()
	}
	if wd != nil {
		wd.close()
	}
	if waits != nil {
		waits.close()
	}
	return nil
}

// closeBy returns the end of Close's bound for the work in the background,
// or the zero time before Close.
func (c *Client) closeBy() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bgBy
}

// inBackground runs f on a goroutine of the client's own, with a context
// that ends after d, or at Close's bound (Close waits for it); it reports
// whether it did: not once Close is done with the acquisitions under way,
// whose clean-ups it waits for.
func (c *Client) inBackground(d time.Duration, f func(ctx context.Context)) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bgClosed {
		return false
	}
	if c.bgEnd == nil {
		c.bgCtx, c.bgEnd = context.WithCancel(context.Background())
	}
	ctx := c.bgCtx
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		ctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		f(ctx)
	}()
	return true
}

// watchdog returns the client's watchdog, starting it on first use; nil
// once the client is closed.
func (c *Client) watchdog() *watchdog {
	c.made()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.wd == nil && !c.closed {
		c.wd = newWatchdog(c)
	}
	return c.wd
}

// watchdogIfAny returns the client's watchdog, nil when it has none
// (nothing was refreshed automatically yet, or Close was called).
func (c *Client) watchdogIfAny() *watchdog {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.wd
}

// unwatch takes a lease that ended out of the client's watchdog, if it
// has one.
func (c *Client) unwatch(s *lease) {
	if w := c.watchdogIfAny(); w != nil {
		w.remove(s)
	}
}

// closedUnder is told that a request failed because the Redis client
// under the driver was closed (the application closed it before this
// client): no request can go any more, and the client stops listening
// for notices, for good. Its subscription may be a connection of its own,
// which the Redis client's Close leaves open (redigo dials it apart from
// the pool; rueidis keeps it): a release would grant the lock to a waiter
// that gave up, which nothing could give back, and the name would stay
// held, by nobody, for that waiter's TTL.
func (c *Client) closedUnder() {
	c.mu.Lock()
	h, closed := c.waits, c.closed
	c.mu.Unlock()
	if h != nil && !closed {
		h.deafen()
	}
}

// isClosed reports whether Close was called.
func (c *Client) isClosed() bool {
	c.made()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}
