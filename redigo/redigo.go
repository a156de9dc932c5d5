// Package redigo lets dlock use a redigo connection pool
// (github.com/gomodule/redigo/redis) on a single Redis server.
//
//	pool := &redis.Pool{
//		DialContext: func(ctx context.Context) (redis.Conn, error) {
//			return redis.DialContext(ctx, "tcp", "127.0.0.1:6379",
//				redis.DialReadTimeout(3*time.Second), redis.DialWriteTimeout(3*time.Second))
//		},
//		MaxIdle: 8,
//	}
//	locks := dlock.New(redigo.New(pool))
//
// Dial with a write timeout, as above: a request's context bounds its
// writes only as far as the connection's buffers take them, and a host that
// vanished without a reset takes nothing, so that writes past the socket's
// send buffer wait for the write timeout (or, without one, for TCP to give
// up). Check idle connections, if at all, with TestOnBorrowContext and
// redis.DoContext, which the request's context bounds: a TestOnBorrow gets
// no context, and a PING in it to a server that hangs waits for the read
// timeout.
//
// redigo speaks to one server: it knows neither Redis Cluster nor
// Sentinel. On a cluster node, a call for a key that another node serves
// fails with an error that matches dlock.ErrUnsupported (the node answered
// MOVED or ASK), and so does List (SCAN would see one node's keys only).
// For Sentinel, give the pool a Dial function that asks the sentinels for
// the primary's address.
//
// The package is a module of its own, github.com/dlockio/dlock/redigo, so
// that only its users download redigo.
package redigo

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/friend"
	"github.com/gomodule/redigo/redis"
)

// Driver carries dlock's requests over a redigo pool. Make one with New:
// the zero Driver is not usable.
type Driver struct {
	pool    *redis.Pool
	timeout time.Duration
}

// DefaultTimeout bounds a request whose context has no deadline (see
// WithTimeout).
const DefaultTimeout = 3 * time.Second

// Option configures a Driver.
type Option func(*Driver)

// WithTimeout sets how long a request whose context has no deadline waits
// for a connection (a free one of a pool that waits, or a dial), and then
// for its reply, before it fails (and its connection is closed); the
// default is DefaultTimeout. A pool's connections have no read timeout
// unless dialed with one, and without a bound a request to a server that
// hangs (stopped, or cut off with no reset) would wait for as long as it
// does. A dial is bounded only through the pool's DialContext (not Dial),
// and a check of an idle connection only through the pool's
// TestOnBorrowContext (not TestOnBorrow, which redigo gives no context: a
// PING in it waits for the connection's read timeout, and without one, on
// a server that hangs, for ever). Values below 1ms are ignored: the
// earlier setting stays.
func WithTimeout(d time.Duration) Option {
	return func(drv *Driver) {
		if d >= time.Millisecond {
			drv.timeout = d
		}
	}
}

var (
	_ dlock.Driver     = (*Driver)(nil)
	_ dlock.Scanner    = (*Driver)(nil)
	_ dlock.Replicator = (*Driver)(nil)
	_ dlock.Pooled     = (*Driver)(nil)
)

// New returns a Driver over pool. The pool stays the caller's: dlock never
// closes it. Requests take a connection from the pool for each round trip;
// a subscription dials one of its own (see Driver.Subscribe). A request
// ends at its context's deadline or, without one, after WithTimeout's
// bound. New panics if pool is nil, or has neither DialContext nor Dial:
// such a pool can make no connection, and every request would fail.
func New(pool *redis.Pool, opts ...Option) *Driver {
	if pool == nil {
		panic("redigo: New with a nil pool")
	}
	if pool.DialContext == nil && pool.Dial == nil {
		panic("redigo: New with a pool that has neither DialContext nor Dial")
	}
	d := &Driver{pool: pool, timeout: DefaultTimeout}
	for _, o := range opts {
		if o != nil {
			o(d)
		}
	}
	return d
}

// PoolSize returns the pool's MaxActive, the most connections it has out
// at once (0: no bound), beyond which a request waits for one (Wait) or
// fails (see dlock.Pooled).
func (d *Driver) PoolSize() int { return d.pool.MaxActive }

// bound returns ctx, or when ctx can be cancelled but has no deadline, ctx
// bounded by the driver's timeout. A ctx that never ends is returned as it
// is: its requests are bounded by the driver's timeout one by one (see do),
// which spares redigo a goroutine per request, and so is taking a
// connection (see timed).
func (d *Driver) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok || ctx.Done() == nil {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d.timeout)
}

// Eval runs the calls by EVALSHA on one connection of the pool, several
// calls as pipelines (see sendChunk), and runs again, on the same
// connection, those the server answered NOSCRIPT (it had not seen the
// script yet, or has restarted since): the first of each script by EVAL,
// and the others by EVALSHA behind it (see dlock.EvalAgain). Calls
// that all find their connection closed (an idle one of the pool that the
// server closed: redigo hands those out unchecked) run once more on a new
// connection.
func (d *Driver) Eval(ctx context.Context, calls ...*dlock.Call) {
	if len(calls) == 0 {
		return
	}
	ctx, cancel := d.bound(ctx)
	defer cancel()
	conn, err := d.conn(ctx)
	if err != nil {
		failAll(calls, err)
		return
	}
	conn = d.evalRenewing(ctx, conn, calls)
	_ = conn.Close()
}

// evalRenewing runs the calls on conn, and once more on a new connection
// when they all found conn closed: an idle connection of the pool that the
// server had closed (its timeout, CLIENT KILL), which redigo hands out
// unchecked. So go-redis does too; dlock's scripts count a request that
// ran twice once. It returns the connection the calls ran on last, which
// the caller closes.
func (d *Driver) evalRenewing(ctx context.Context, conn redis.Conn, calls []*dlock.Call) redis.Conn {
	eval(ctx, d.timeout, conn, calls)
	if !closedUnder(calls) || ctx.Err() != nil {
		return conn
	}
	fresh, err := d.dial(ctx)
	if err != nil {
		return conn
	}
	_ = conn.Close()
	for _, c := range calls {
		c.Val, c.Err = nil, nil
	}
	eval(ctx, d.timeout, fresh, calls)
	return fresh
}

// dial opens a connection outside the pool, for a request that found its
// pooled connection closed, bounded by ctx or the driver's timeout.
func (d *Driver) dial(ctx context.Context) (redis.Conn, error) {
	ctx, cancel := d.bound(ctx)
	defer cancel()
	ctx, cancelDial := d.timed(ctx)
	defer cancelDial()
	return dial(ctx, d.pool)
}

// closedUnder reports whether every call failed because the connection
// was closed under it (see dlock.ConnectionClosed).
func closedUnder(calls []*dlock.Call) bool {
	for _, c := range calls {
		if !dlock.ConnectionClosed(c.Err) {
			return false
		}
	}
	return true
}

// EvalWait runs the calls as Eval does and then, on the connection they
// ran on, WAIT replicas timeout, whose reply it returns: how many replicas
// acknowledged the writes. The reply is awaited for the timeout and a
// second more, or until ctx ends if it has a deadline. WAIT is never sent
// alone on a new connection, which would wait for nothing.
func (d *Driver) EvalWait(ctx context.Context, replicas int, timeout time.Duration, calls ...*dlock.Call) (int, error) {
	ectx, cancel := d.bound(ctx) // for the calls; WAIT has its own bound
	defer cancel()
	conn, err := d.conn(ectx)
	if err != nil {
		failAll(calls, err)
		return 0, err
	}
	conn = d.evalRenewing(ectx, conn, calls)
	defer conn.Close()
	wait := timeout + time.Second
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl))
	}
	if wait <= 0 {
		return 0, context.DeadlineExceeded
	}
	v, err := redis.DoWithTimeout(conn, wait, "WAIT", replicas, timeout.Milliseconds())
	return redis.Int(v, unbounded(err))
}

// conn takes a connection from the pool, unless ctx has ended (the pool
// would hand out an idle connection all the same).
func (d *Driver) conn(ctx context.Context) (redis.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ctx, cancel := d.timed(ctx)
	defer cancel()
	c, err := d.pool.GetContext(ctx)
	switch {
	case errors.Is(err, redis.ErrPoolExhausted):
		err = unsentError{err}
	case err != nil && err.Error() == "redigo: get on closed pool":
		// No request can go any more: the caller's own shutdown, most
		// likely, which a wait must not hold up.
		err = fmt.Errorf("%w (the redigo pool under the driver): %w", dlock.ErrClosed, err)
	}
	return c, err
}

// unsentError is the error of a request that was never sent: the pool had
// no connection for it (MaxActive reached, without Wait).
type unsentError struct{ error }

func (e unsentError) Unwrap() error { return e.error }

// NotSent says that the pool had no connection for the request (see
// dlock.Driver).
func (unsentError) NotSent() bool { return true }

// timed returns ctx for taking a connection, bounded by the driver's
// timeout when ctx never ends: a pool that waits for a free connection, or
// a dial that stalls (a host that vanished, a sentinel that does not
// answer), waits no longer. It costs a timer, not a goroutine.
func (d *Driver) timed(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx.Done() != nil {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d.timeout)
}

// eval runs the calls on conn by EVALSHA, and again those answered
// NOSCRIPT, each script's text sent once (see dlock.EvalAgain); calls with
// a Lib by FCALL, and again once the library is loaded if the server
// answered that a function is missing.
func eval(ctx context.Context, limit time.Duration, conn redis.Conn, calls []*dlock.Call) {
	if len(calls) == 0 {
		return
	}
	run(ctx, limit, conn, calls, nil)
	if again, lib := dlock.Unknown(calls); len(again) > 0 {
		dlock.Resend(again, lib, func(lib *dlock.Library, calls []*dlock.Call) ([]*dlock.Call, []*dlock.Call) {
			_, err := do(ctx, limit, conn, "FUNCTION", "LOAD", lib.Src)
			return dlock.Loaded(calls, err)
		}, func(calls []*dlock.Call) {
			_ = dlock.EvalAgain(calls, func(calls []*dlock.Call, byEval []bool) error {
				run(ctx, limit, conn, calls, byEval)
				return nil
			})
		})
	}
}

// run sends the calls on conn, by EVAL those whose byEval is set (byEval
// is nil for none) and by EVALSHA the others (by FCALL those with a Lib),
// and stores their replies.
func run(ctx context.Context, limit time.Duration, conn redis.Conn, calls []*dlock.Call, byEval []bool) {
	evals := func(i int) bool { return byEval != nil && byEval[i] }
	command := func(c *dlock.Call, byEval bool) (string, []any) {
		args := make([]any, 0, 2+len(c.Keys)+len(c.Args))
		name := "EVALSHA"
		switch {
		case c.Lib != nil && c.Script.Function != "":
			name = "FCALL"
			args = append(args, friend.ScriptArg(c.Script, true)) // boxed once for every call
		case byEval:
			name = "EVAL"
			args = append(args, c.Script.Src)
		default:
			args = append(args, friend.ScriptArg(c.Script, false))
		}
		args = append(args, len(c.Keys))
		for _, k := range c.Keys {
			args = append(args, k)
		}
		return name, append(args, c.Args...)
	}
	for i, end := 0, 0; i < len(calls); i = end {
		size := callSize(calls[i], evals(i))
		for end = i + 1; end < len(calls) && size+callSize(calls[end], evals(end)) <= sendChunk; end++ {
			size += callSize(calls[end], evals(end))
		}
		chunk := calls[i:end]
		if len(chunk) == 1 {
			// One command: redigo writes and reads it within ctx.
			name, args := command(chunk[0], evals(i))
			v, err := do(ctx, limit, conn, name, args...)
			store(chunk[0], v, err)
			if err != nil && !isReply(err) {
				failAll(calls[end:], err) // the connection failed
				return
			}
			continue
		}
		for j, c := range chunk {
			name, args := command(c, evals(i+j))
			if err := conn.Send(name, args...); err != nil {
				failAll(calls[i:], err)
				return
			}
		}
		// Flush and read every reply within ctx: Do with no command.
		replies, err := do(ctx, limit, conn, "")
		all, ok := replies.([]any)
		if err == nil && (!ok || len(all) != len(chunk)) {
			err = fmt.Errorf("redigo: %d replies to a pipeline of %d commands", len(all), len(chunk))
		}
		if err != nil {
			failAll(calls[i:], err) // this chunk and the rest
			return
		}
		for i, c := range chunk {
			if re, ok := all[i].(redis.Error); ok {
				store(c, nil, re)
			} else {
				store(c, all[i], nil)
			}
		}
	}
}

// sendChunk bounds, in bytes, the commands of a pipeline written before
// their replies are read, which are flushed and read within the request's
// context: a server whose process stopped reading leaves that much in the
// connection's buffers (its host's kernel still takes it), so that writing
// does not block, and the request ends at its deadline. A host that
// vanished takes nothing: writes past the socket's send buffer then wait
// for the pool's write timeout (redis.DialWriteTimeout, as in the package
// example). A larger command goes on its own, written and read within the
// context by redigo.
const sendChunk = 64 << 10

// callSize estimates how many bytes the command of call takes on the wire:
// by EVAL with the script's source when byEval is set, else by EVALSHA.
func callSize(c *dlock.Call, byEval bool) int {
	n := 64 + len(c.Script.SHA1) + len(c.Script.Function)
	if byEval {
		n += len(c.Script.Src)
	}
	for _, k := range c.Keys {
		n += 16 + len(k)
	}
	for _, a := range c.Args {
		switch a := a.(type) {
		case string:
			n += 16 + len(a)
		case []byte:
			n += 16 + len(a)
		default:
			n += 32
		}
	}
	return n
}

func failAll(calls []*dlock.Call, err error) {
	for _, c := range calls {
		c.Val, c.Err = nil, err
	}
}

// do runs one command, bounded by ctx, or by limit when ctx never ends.
func do(ctx context.Context, limit time.Duration, conn redis.Conn, name string, args ...any) (any, error) {
	if ctx.Done() == nil {
		v, err := redis.DoWithTimeout(conn, limit, name, args...)
		return v, unbounded(err)
	}
	v, err := redis.DoContext(conn, ctx, name, args...)
	return v, unbounded(bounded(ctx, err))
}

// unbounded turns redigo's refusal of a connection that cannot bound a
// request (a wrapper type, made by the pool's Dial, that embeds only
// redis.Conn) into an error matching dlock.ErrUnsupported: every request
// would fail so, and a wait ends at once instead of trying for as long
// as it may.
func unbounded(err error) error {
	if err != nil && strings.HasPrefix(err.Error(), "redis: connection does not support ConnWith") {
		return fmt.Errorf("%w: the pool's connections implement neither redis.ConnWithContext nor redis.ConnWithTimeout, by which dlock bounds each request (a wrapper made by Dial must pass them on): %w", dlock.ErrUnsupported, err)
	}
	return err
}

// do runs one command, bounded by ctx or, without a deadline, by the
// driver's timeout.
func (d *Driver) do(ctx context.Context, conn redis.Conn, name string, args ...any) (any, error) {
	ctx, cancel := d.bound(ctx)
	defer cancel()
	return do(ctx, d.timeout, conn, name, args...)
}

// bounded makes the failure of a request whose context ended meanwhile
// match the context's error: redigo reads until the context's deadline,
// and may report the read's timeout rather than the context's.
func bounded(ctx context.Context, err error) error {
	if err == nil || isReply(err) {
		return err
	}
	end := ctx.Err()
	if dl, ok := ctx.Deadline(); end == nil && ok && !time.Now().Before(dl) {
		end = context.DeadlineExceeded // the read's deadline came first
	}
	if end == nil || errors.Is(err, end) {
		return err
	}
	return fmt.Errorf("%w: %w", end, err)
}

// isReply reports whether err is an error reply from the server, not a
// failure of the connection.
func isReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// store converts a reply into the call's reply or error.
func store(call *dlock.Call, v any, err error) {
	call.Val, call.Err = nil, nil
	if err != nil {
		call.Err = replyError(err)
		return
	}
	call.Val = convert(v)
}

// convert turns a reply into nil, int64, string or []any, as dlock.Call
// documents; an error reply inside an array stays an error value.
func convert(v any) any {
	switch v := v.(type) {
	case []byte:
		return string(v)
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = convert(e)
		}
		return out
	}
	return v // nil, int64, a status string, or a redis.Error
}

// replyError turns a MOVED or ASK reply, which means the server is a
// cluster node that does not serve the key, into a ClusterError.
func replyError(err error) error {
	var re redis.Error
	if errors.As(err, &re) && (strings.HasPrefix(string(re), "MOVED ") || strings.HasPrefix(string(re), "ASK ")) {
		return &ClusterError{Reply: re}
	}
	return err
}

// ClusterError is the error of a call that a Redis Cluster node answered
// with a redirection (MOVED or ASK): redigo cannot follow it, as it knows
// nothing of clusters. It matches dlock.ErrUnsupported and unwraps to the
// server's reply.
type ClusterError struct {
	Reply redis.Error // the node's reply, such as "MOVED 3999 127.0.0.1:7001"
}

// Error says that Redis Cluster is not supported, and what the node said.
func (e *ClusterError) Error() string {
	return fmt.Sprintf("%v: Redis Cluster (the node answered %q)", dlock.ErrUnsupported, string(e.Reply))
}

// Unwrap returns dlock.ErrUnsupported and the server's reply.
func (e *ClusterError) Unwrap() []error { return []error{dlock.ErrUnsupported, e.Reply} }

// Scan walks the keys matching match of Redis type typ with SCAN. On a
// Redis Cluster node it fails with an error matching dlock.ErrUnsupported
// instead, as it would see that node's keys only. It tells a cluster node
// by INFO: for a user whose ACL denies INFO it assumes a single server, and
// on a cluster node lists that node's keys alone. When the pooled
// connection it took was closed by the server (an idle one: the server's
// timeout, CLIENT KILL, a restart), it goes on a new connection, as Eval
// does.
func (d *Driver) Scan(ctx context.Context, match, typ string, fn func(key string) error) error {
	gctx, cancel := d.bound(ctx)
	conn, err := d.conn(gctx)
	cancel()
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	// A user whose ACL denies INFO is assumed not to be on a cluster.
	info, err := redis.String(d.do(ctx, conn, "INFO", "cluster"))
	if dlock.ConnectionClosed(err) && ctx.Err() == nil {
		// An idle connection of the pool that the server had closed (see
		// evalRenewing): INFO, which changes nothing, goes once more on a
		// new connection.
		if fresh, derr := d.dial(ctx); derr == nil {
			_ = conn.Close()
			conn = fresh
			info, err = redis.String(d.do(ctx, conn, "INFO", "cluster"))
		}
	}
	if err != nil && !isReply(err) {
		return err
	}
	if strings.Contains(info, "cluster_enabled:1") {
		return fmt.Errorf("%w: SCAN on one node of a Redis Cluster, which would miss the other nodes' keys", dlock.ErrUnsupported)
	}
	cursor := "0"
	for {
		r, err := redis.Values(d.do(ctx, conn, "SCAN", cursor, "MATCH", match, "COUNT", 1000, "TYPE", typ))
		if err != nil {
			return err
		}
		if len(r) != 2 {
			return fmt.Errorf("redigo: unexpected SCAN reply %q", r)
		}
		keys, err := redis.Strings(r[1], nil)
		if err != nil {
			return err
		}
		if cursor, err = redis.String(r[0], nil); err != nil {
			return err
		}
		for _, key := range keys {
			if err := fn(key); err != nil {
				return err
			}
		}
		if cursor == "0" {
			return nil
		}
	}
}
