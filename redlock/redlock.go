package redlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/friend"
	"github.com/dlockio/dlock/internal/nilretry"
)

// DefaultNodeTimeout bounds each request to a node when WithNodeTimeout is
// not given.
const DefaultNodeTimeout = 50 * time.Millisecond

// Errors returned by the package. Match them with errors.Is; the argument
// errors also match dlock.ErrInvalidArgument.
var (
	// ErrNoNodes means New was given no nodes.
	ErrNoNodes = fmt.Errorf("%w: redlock: no nodes", dlock.ErrInvalidArgument)
	// ErrDuplicateNode means New was given the same node twice: two nodes
	// with the same address, or the same *dlock.Client for two addresses.
	ErrDuplicateNode = fmt.Errorf("%w: redlock: node given twice", dlock.ErrInvalidArgument)
	// ErrInvalidNode means a node has no address or no client, or a
	// client that dlock.New did not make (the zero dlock.Client).
	ErrInvalidNode = fmt.Errorf("%w: redlock: node without an address or a client", dlock.ErrInvalidArgument)

	// ErrNoQuorum means that nodes failed (or did not answer in time) and
	// decided the outcome: an acquisition that the failing nodes could
	// have completed, or that a quorum granted too late (the lock may be
	// free; it does not match dlock.ErrNotObtained then), or a refresh or
	// release that fewer than a quorum of nodes answered, which may
	// succeed later.
	ErrNoQuorum = errors.New("redlock: no quorum: nodes failed or did not answer in time")

	// ErrNodeTimeout is the error of a node that did not answer within the
	// node timeout (see WithNodeTimeout).
	ErrNodeTimeout = errors.New("redlock: node did not answer in time")
)

// NodeError is what went wrong on one node. The errors of an operation
// that failed are joined (errors.Join) with one NodeError for every node
// that did not do its part; find them with errors.As.
type NodeError struct {
	Node int    // the node's index in the slice given to New
	Addr string // the node's address
	Err  error  // what the node's client returned, or ErrNodeTimeout (which also wraps a client's own context deadline error at the node timeout)
}

// Error names the node and says what went wrong there.
func (e *NodeError) Error() string {
	return fmt.Sprintf("redlock: node %d (%s): %v", e.Node, e.Addr, e.Err)
}

// Unwrap returns the node's error.
func (e *NodeError) Unwrap() error { return e.Err }

// Node is one of the independent Redis masters a Locker spreads its locks
// over.
type Node struct {
	// Addr names the master, such as "10.0.0.1:6379". It identifies the
	// node in errors and in New's check that no node is given twice, so it
	// must name the server that Client reaches: New cannot verify that
	// without asking the servers.
	Addr string
	// Client reaches the master, made by dlock.New, such as
	// dlock.New(goredis.New(rdb)). It stays the caller's: the Locker never
	// closes it. The Locker calls it on goroutines of its own, where
	// nobody could recover a panic of its hooks (dlock.WithHooks): the
	// client logs such a panic (see dlock.WithLogger) and goes on as if the
	// hook had returned, as on dlock's own goroutines.
	Client *dlock.Client
}

// Locker obtains Redlock locks: a lock counts as held while a majority of
// its nodes hold it. It is safe for concurrent use; make one per set of
// masters and share it. The zero Locker is not usable: make one with New
// (its methods panic otherwise, as on a nil *Locker).
type Locker struct {
	nodes   []Node
	quorum  int
	timeout time.Duration
	log     *slog.Logger
	// nodeOpts are the options of every node's lock besides its token, TTL
	// and metadata (see quorumPart).
	nodeOpts []dlock.Option

	bg     context.Context // background work: refreshing; cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // goroutines that outlive the call that started them

	mu     sync.Mutex
	closed bool
}

// LockerOption configures a Locker.
type LockerOption func(*lockerConfig)

type lockerConfig struct {
	timeout time.Duration
	log     *slog.Logger
	err     error
}

// WithNodeTimeout bounds every request to a node: a node that has not
// answered within d counts as failed (ErrNodeTimeout), whatever its client
// does meanwhile. The default is DefaultNodeTimeout (50ms). Keep it far
// below the TTL of the locks (a few percent) but above the round trip to
// the slowest healthy node. Every lock's TTL must exceed it.
func WithNodeTimeout(d time.Duration) LockerOption {
	return func(c *lockerConfig) {
		if d <= 0 && c.err == nil {
			c.err = fmt.Errorf("%w: WithNodeTimeout(%v) must be positive", dlock.ErrInvalidOption, d)
		}
		c.timeout = d
	}
}

// WithLogger sets where the Locker logs: a warning when one of its locks
// is lost (fewer than a quorum of its nodes hold it: "redlock: lock lost",
// with the error Lock.Err returns, which names the nodes that lost it and
// why), and an info record when a node loses its copy of a lock that a
// quorum still holds ("redlock: a node lost the lock; the quorum still
// holds it", with the node's index, address and error, and how many nodes
// hold it; told by the lock's next refresh or Release, so that nodes lost
// together are told once, as the lock's loss), and a warning when an
// automatic refresh does not reach a quorum ("redlock: refresh did not
// reach a quorum; retrying until the lock's deadline", with its error;
// once for a run of failed refreshes, until one succeeds). Records name the lock
// with the attribute "names", a list, as dlock's do. The nodes' clients
// then do not warn of their nodes' losses: they log them as debug records,
// "dlock: a Redlock node's lock ended", since a node's loss is not the
// lock's. A Lock's records are written one at a time, in the order of what
// they tell, and under none of its locks: the handler may call the
// methods of the Lock it is told of (Release, say), but not Locker.Close,
// which may wait for the goroutine writing the record.
//
// The default is the logger of the nodes' clients when they all have the
// same one (dlock.WithLogger given the same *slog.Logger). When they log
// through loggers of their own (one per node, say, whose attributes would
// mislabel the Locker's records), the Locker logs nothing by default, and
// the nodes' clients warn of each node's loss as of a lock of their own,
// "dlock: lock lost", so that a lost lock is not left untold: give
// WithLogger to have the Locker's records instead. A nil l keeps the
// default.
func WithLogger(l *slog.Logger) LockerOption {
	return func(c *lockerConfig) {
		if l != nil {
			c.log = l
		}
	}
}

// New returns a Locker over nodes, which must be independent Redis masters
// (not replicas of one another, not one Redis Cluster). A lock is held
// while a quorum of len(nodes)/2+1 of them hold it, so the Locker works
// while fewer than half of the nodes are down or unreachable.
//
// New sends nothing to the servers. It returns ErrNoNodes for no nodes,
// ErrInvalidNode for a node without an address or a client (or with a
// Client that dlock.New did not make), and ErrDuplicateNode when two nodes
// have the same address (compared without regard to case or surrounding
// spaces) or the same client: a node counted twice would give one server
// two votes. Two addresses that reach one
// server under different names ("localhost:6379" and "127.0.0.1:6379")
// cannot be told apart and must not be given.
//
// Close the Locker when done with it.
func New(nodes []Node, opts ...LockerOption) (*Locker, error) {
	if len(nodes) == 0 {
		return nil, ErrNoNodes
	}
	cfg := lockerConfig{timeout: DefaultNodeTimeout}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if cfg.err != nil {
		return nil, cfg.err
	}
	addrs := make(map[string]int, len(nodes))
	clients := make(map[*dlock.Client]int, len(nodes))
	for i, n := range nodes {
		addr := strings.ToLower(strings.TrimSpace(n.Addr))
		switch {
		case addr == "":
			return nil, fmt.Errorf("%w: node %d has no address", ErrInvalidNode, i)
		case n.Client == nil:
			return nil, fmt.Errorf("%w: node %d (%s) has no client", ErrInvalidNode, i, n.Addr)
		case !friend.Made(n.Client):
			// Its methods would panic on the Locker's goroutines.
			return nil, fmt.Errorf("%w: node %d (%s) has a Client that dlock.New did not make", ErrInvalidNode, i, n.Addr)
		}
		if j, ok := addrs[addr]; ok {
			return nil, fmt.Errorf("%w: nodes %d and %d are both %q", ErrDuplicateNode, j, i, n.Addr)
		}
		if j, ok := clients[n.Client]; ok {
			return nil, fmt.Errorf("%w: nodes %d (%s) and %d (%s) share one client", ErrDuplicateNode, j, nodes[j].Addr, i, n.Addr)
		}
		addrs[addr], clients[n.Client] = i, i
	}
	nodeOpts := []dlock.Option{logHookPanics, quorumPart}
	if cfg.log == nil {
		var shared bool
		if cfg.log, shared = nodesLogger(nodes); !shared {
			// Nobody to tell of the lock's loss but the nodes' clients:
			// they warn of their own nodes' losses, as of locks of their
			// own, rather than the loss go untold.
			nodeOpts = nodeOpts[:1]
		}
	}
	r := &Locker{nodes: append([]Node(nil), nodes...), quorum: len(nodes)/2 + 1, timeout: cfg.timeout, log: cfg.log, nodeOpts: nodeOpts}
	r.bg, r.cancel = context.WithCancel(context.Background())
	return r, nil
}

// nodesLogger returns the logger of the nodes' clients and true when they
// all have the same one, and else one that discards everything and false
// (see WithLogger).
func nodesLogger(nodes []Node) (*slog.Logger, bool) {
	log := friend.Logger(nodes[0].Client)
	for _, n := range nodes[1:] {
		if friend.Logger(n.Client) != log {
			return slog.New(slog.DiscardHandler), false
		}
	}
	return log, true
}

// Quorum returns how many nodes must hold a lock for it to count as held:
// len(nodes)/2+1. With an even number of nodes that is one more than with
// one node fewer, for the same number of nodes that may fail: five nodes
// tolerate two failures, four and three tolerate one.
func (r *Locker) Quorum() int {
	r.made()
	return r.quorum
}

// made panics unless New made r: a Locker without nodes would count a lock
// held by none of them as held (a quorum of zero).
func (r *Locker) made() {
	if r == nil {
		panic("redlock: method called on a nil *Locker")
	}
	if r.bg == nil {
		panic("redlock: Locker used without New")
	}
}

// Nodes returns the addresses of the nodes, in the order given to New.
func (r *Locker) Nodes() []string {
	r.made()
	addrs := make([]string, len(r.nodes))
	for i, n := range r.nodes {
		addrs[i] = n.Addr
	}
	return addrs
}

// Close stops refreshing the Locker's locks (they run out at their
// deadlines, and their Done channels close then) and waits for the
// requests still under way to nodes that did not answer in time, which
// can take as long as the nodes' clients wait for a reply (go-redis: its
// read timeout, 3s by default, without ContextTimeoutEnabled) and then
// give back what such a request may have taken (up to 2s more), and for
// the releases of failed attempts, each bounded by 2s: about 6s on a
// node that stalls, with go-redis's defaults. Locks still
// held are not released. After Close, locks can still be obtained,
// refreshed and released, but not refreshed automatically (ErrClosed), and
// each call then waits for all of its requests. Close does not close the
// nodes' clients. It is safe to call more than once.
func (r *Locker) Close() error {
	r.made()
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.cancel()
	r.wg.Wait()
	return nil
}

// isClosed reports whether Close was called.
func (r *Locker) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// goOwned runs f on a goroutine that Close waits for, and reports whether
// it did; after Close it does not.
func (r *Locker) goOwned(f func()) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		f()
	}()
	return true
}

// fanOut sends one request to each node in idx at once, each on its own
// goroutine with a context that ends after the node timeout, and waits
// until all have returned, the node timeout has passed, or ctx has ended,
// whichever comes first. It is fanOutFor with the node timeout for each
// request.
func (r *Locker) fanOut(ctx context.Context, idx []int, req func(ctx context.Context, i int)) (cut bool) {
	return r.fanOutFor(ctx, idx, r.timeout, req)
}

// fanOutFor sends one request to each node in idx at once, each on its
// own goroutine with a context that ends after timeout, and waits until
// all have returned, the node timeout has passed, or ctx has ended,
// whichever comes first; cut reports that ctx ended before the node
// timeout passed, cutting short the wait or the requests, whose failures
// are then the caller's, not the nodes'. The requests record their own
// outcomes (under the lock's mutex), also when they come late: a request
// that has not returned when fanOut does goes on in the background, owned
// by the Locker. Node clients need not honour context deadlines (go-redis, for
// one, ignores them unless ContextTimeoutEnabled is set), so the timeout
// is kept here, not left to them. After Close nothing may outlive the
// call: fanOut then waits for every request.
func (r *Locker) fanOutFor(ctx context.Context, idx []int, timeout time.Duration, req func(ctx context.Context, i int)) (cut bool) {
	if len(idx) == 0 {
		return false
	}
	done := make(chan struct{}, len(idx)) // buffered: late requests never block
	var joined sync.WaitGroup
	for _, i := range idx {
		run := func() {
			nctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			req(nctx, i)
			done <- struct{}{}
		}
		if !r.goOwned(run) {
			joined.Add(1)
			go func() {
				defer joined.Done()
				run()
			}()
		}
	}
	defer joined.Wait()
	timer := time.NewTimer(r.timeout)
	defer timer.Stop()
	for range idx {
		select {
		case <-done:
		case <-timer.C:
			return false
		case <-ctx.Done():
			return true
		}
	}
	return ctx.Err() != nil
}

// Defaults of the lock options.
const (
	// DefaultRetryDelay is the longest delay between two attempts of Lock
	// under DefaultRetry.
	DefaultRetryDelay = 250 * time.Millisecond
)

// DefaultRetry returns the retry strategy of Lock when WithRetry is not
// given: it never stops (the context or WithMaxWait bound the wait) and
// waits a random delay between 50ms and 250ms between attempts, so that
// lockers that split the votes between them do not collide again.
func DefaultRetry() dlock.RetryStrategy { return defaultRetry }

var defaultRetry = dlock.Jitter(dlock.ConstantBackoff(DefaultRetryDelay), 0.8)

// Option configures one acquisition (TryLock, Lock, Do).
type Option func(*options)

type options struct {
	ttl      time.Duration
	retry    dlock.RetryStrategy
	maxWait  time.Duration // WithMaxWait; zero when not given
	meta     string
	auto     bool
	interval time.Duration
	maxHold  time.Duration
	err      error
}

func (o *options) fail(err error) {
	if o.err == nil {
		o.err = err
	}
}

// WithTTL sets how long the lock lives on each node unless refreshed; the
// default is dlock.DefaultTTL (10s). It must be at least dlock.MinTTL and,
// less the clock drift allowance (1% and 2ms), longer than the node
// timeout, and in practice far longer: the time an acquisition takes is
// subtracted from the lock's validity.
func WithTTL(ttl time.Duration) Option {
	return func(o *options) {
		if ttl < dlock.MinTTL {
			o.fail(fmt.Errorf("%w: %v is under the minimum of %v", dlock.ErrInvalidTTL, ttl, dlock.MinTTL))
		}
		o.ttl = ttl
	}
}

// WithMetadata stores a string with the lock on every node, such as who
// holds it, for dlock.Client.Inspect and Lock.Metadata.
func WithMetadata(meta string) Option {
	return func(o *options) { o.meta = meta }
}

// WithRetry sets how many attempts Lock makes and the delay between them;
// the default is DefaultRetry(). Redlock has no notice of a release, so
// Lock polls: keep the delays random (dlock.Jitter), so that lockers that
// split the votes do not try again in step. A nil s, a nil
// dlock.RetryFunc or a strategy built from one makes the call fail with
// dlock.ErrInvalidOption.
func WithRetry(s dlock.RetryStrategy) Option {
	return func(o *options) {
		if what := nilretry.Refused(s); what != "" {
			o.fail(fmt.Errorf("%w: %s (dlock.NoRetry() retries nothing; without WithRetry, DefaultRetry)", dlock.ErrInvalidOption, what))
		}
		o.retry = s
	}
}

// WithMaxWait bounds how long Lock waits: it gives up after d, or when its
// context ends if that is sooner. Without it, Lock waits as long as its
// context allows, and at most dlock.DefaultMaxWait (1m) when the context
// has no deadline.
func WithMaxWait(d time.Duration) Option {
	return func(o *options) {
		if d <= 0 {
			o.fail(fmt.Errorf("%w: WithMaxWait(%v) must be positive", dlock.ErrInvalidOption, d))
		}
		o.maxWait = d
	}
}

// WithAutoRefresh keeps the lock alive until it is released: a goroutine
// of the lock refreshes it on every node every third of its TTL (see
// WithRefreshInterval), and again sooner after a refresh that did not
// reach a quorum. If the lock is lost all the same, Done closes and Err
// says why.
func WithAutoRefresh() Option {
	return func(o *options) { o.auto = true }
}

// WithRefreshInterval refreshes the lock automatically (as WithAutoRefresh)
// every d instead of every third of its TTL. d must be at least 1ms, and
// shorter than the TTL less the drift allowance (1% of it and 2ms).
func WithRefreshInterval(d time.Duration) Option {
	return func(o *options) {
		if d < time.Millisecond {
			o.fail(fmt.Errorf("%w: WithRefreshInterval(%v) is under the minimum of 1ms", dlock.ErrInvalidOption, d))
		}
		o.auto, o.interval = true, d
	}
}

// WithMaxHold bounds how long automatic refreshing may keep the lock: d
// after it was obtained it runs out, its Done channel closes and Err
// matches dlock.ErrMaxHold. d must be at least the TTL.
func WithMaxHold(d time.Duration) Option {
	return func(o *options) {
		if d <= 0 {
			o.fail(fmt.Errorf("%w: WithMaxHold(%v) must be positive", dlock.ErrInvalidOption, d))
		}
		o.maxHold = d
	}
}

// options validates a call's options against the Locker.
func (r *Locker) options(ctx context.Context, opts []Option) (*options, error) {
	r.made()
	if ctx == nil {
		return nil, dlock.ErrNilContext
	}
	o := &options{ttl: dlock.DefaultTTL, retry: defaultRetry}
	for _, f := range opts {
		if f != nil {
			f(o)
		}
	}
	if o.err != nil {
		return nil, o.err
	}
	if o.ttl-drift(o.ttl) <= r.timeout {
		return nil, fmt.Errorf("%w: the TTL %v, less %v for clock drift, is not longer than the node timeout %v: a round that waits for a slow node would always run past its validity", dlock.ErrInvalidTTL, o.ttl, drift(o.ttl), r.timeout)
	}
	if o.auto && o.refreshInterval() >= o.ttl-drift(o.ttl) {
		return nil, fmt.Errorf("%w: refresh interval %v does not come before the lock's deadline: its TTL %v less %v for clock drift",
			dlock.ErrInvalidOption, o.refreshInterval(), o.ttl, drift(o.ttl))
	}
	if o.maxHold > 0 && o.maxHold < o.ttl {
		return nil, fmt.Errorf("%w: max hold %v is shorter than the TTL %v", dlock.ErrInvalidOption, o.maxHold, o.ttl)
	}
	if o.auto && r.isClosed() {
		return nil, dlock.ErrClosed
	}
	return o, nil
}

// refreshInterval is the automatic refresh period, or zero when off.
func (o *options) refreshInterval() time.Duration {
	switch {
	case !o.auto:
		return 0
	case o.interval > 0:
		return o.interval
	default:
		return o.ttl / 3
	}
}
