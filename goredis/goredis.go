// Package goredis lets dlock use a go-redis v9 client: a single node, a
// Sentinel-managed failover client, or a Redis Cluster, anything that
// implements redis.UniversalClient (a type of yours that wraps a cluster
// client or a Ring, embedding it or a redis.UniversalClient that holds it,
// is taken for what it wraps; any other for a single server: see New). On a
// Ring, a lock on names of several hash tags is refused with
// dlock.ErrUnsupported: a Ring would run its script on the first name's
// shard only. A Ring cannot subscribe either (its shards' channels are
// separate): waits on it poll. A Ring moves names between shards when a
// shard's heartbeat fails or SetAddrs changes them, and a moved name is
// free on its new shard while its holder still acts: a Ring does not keep
// two holders apart across such a change (see the README's Drivers
// section).
//
//	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
//	locks := dlock.New(goredis.New(rdb))
//
// Set ContextTimeoutEnabled: without it go-redis does not apply a context's
// deadline to a request already on a connection, and a server that stops
// answering holds dlock's calls (refreshes, clean-ups, waits) for the
// client's read timeout (3s by default) instead of their own deadlines.
// Even with it, go-redis ends a request already sent at its context's
// deadline, not at its cancellation: a call whose context is cancelled
// (as dlock.Client.Close cancels the waits under way) waits for its reply,
// or for the read timeout when the server stalls.
//
// The Driver tells dlock the client's PoolSize (see Driver.PoolSize): the
// watchdog of a client holding many locks, whose refresh pipelines (one
// for each 1,000 locks) each take a connection for as long as its reply
// takes, keeps a quarter of the pool, two connections at least, for other
// requests, as far as its locks' deadlines allow (see the README's
// auto-refresh part). Give the pool a third more connections than a server
// has thousands of locks refreshed automatically, so that the watchdog
// holds nothing back.
package goredis

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/friend"
	"github.com/dlockio/dlock/internal/keyslot"
	"github.com/redis/go-redis/v9"
)

// Driver carries dlock's requests over a go-redis client. Make one with
// New: the zero Driver is not usable.
type Driver struct {
	// rdb is the caller's client: every request sent through a client
	// (rather than through one node's client, see clu) goes through it,
	// a wrapper of the caller's included, so that its instrumentation sees
	// them.
	rdb   redis.UniversalClient
	ring  ringClient    // the Ring that rdb is or wraps, nil elsewhere: see refuseAcrossShards
	clu   clusterClient // the cluster client that rdb is or wraps, nil elsewhere: see refuseAcrossSlots
	plain bool          // rdb is a Client: see settle
	// shardOf returns the address of a Ring's shard for a key (see Server).
	shardOf func(key string) string
	pool    int // see PoolSize
}

var (
	_ dlock.Driver      = (*Driver)(nil)
	_ dlock.Partitioned = (*Driver)(nil)
	_ dlock.Pooled      = (*Driver)(nil)
)

// New returns a Driver over rdb. The client stays the caller's: dlock never
// closes it. A type of the caller's that wraps a go-redis client (to
// instrument it, say) is taken for the client it wraps, whose kind, pool
// size and cluster slot map the driver uses: a cluster client or a Ring by
// the methods it gets from one it embeds by pointer (Options among them);
// else the client it holds in an exported embedded field, of type
// redis.UniversalClient or a pointer, looked for through up to eight
// wrappers (a wrapper of a wrapper). On a Ring, a lock on names of several
// hash tags is refused as on the Ring itself. The driver sends its
// requests through rdb all the same, so that the wrapper sees them; only
// those that must reach one node of a cluster or one shard of a Ring
// (WithReplicas's pipelines with WAIT, the function library's loads,
// SSUBSCRIBE, SCAN, the PING that tells whether the client was closed) go
// through that node's client, which the cluster client or the Ring gives,
// as they do when rdb is one. Another implementation of
// redis.UniversalClient, or a wrapper whose client lies in an unexported
// field (which the driver cannot read), is taken for a single server.
// New panics if rdb is nil or a nil *redis.Client, ClusterClient or Ring,
// or if it wraps nil: a wrapper that is a nil pointer, or that holds one of
// those nil or a nil redis.UniversalClient, whose methods would fail at
// their first use.
func New(rdb redis.UniversalClient) *Driver {
	if isNil(rdb) {
		panic("goredis: New with a nil client")
	}
	under, nilAt := unwrap(rdb)
	switch {
	case nilAt == 0:
		panic("goredis: New with a nil client")
	case nilAt > 0:
		panic(fmt.Sprintf("goredis: New with a %T that holds a nil client", rdb))
	}
	defer func() {
		// The methods of an embedded nil client fail deep inside go-redis.
		if r := recover(); r != nil {
			if _, ok := r.(runtime.Error); ok {
				panic(fmt.Sprintf("goredis: New with a %T that holds a nil client (%v)", rdb, r))
			}
			panic(r)
		}
	}()
	d := &Driver{rdb: rdb}
	d.clu, _ = under.(clusterClient)
	_, d.plain = rdb.(*redis.Client)
	if r, ok := under.(ringClient); ok {
		d.ring, d.shardOf = r, shardOf(r.Options())
	}
	d.pool = poolSize(under)
	return d
}

// isNil reports whether rdb is nil, or a nil pointer to one of go-redis's
// clients, whose methods would fail deep inside go-redis.
func isNil(rdb redis.UniversalClient) bool {
	switch c := rdb.(type) {
	case nil:
		return true
	case *redis.Client:
		return c == nil
	case *redis.ClusterClient:
		return c == nil
	case *redis.Ring:
		return c == nil
	}
	return false
}

// shows reports whether rdb tells by its methods which of go-redis's
// clients it is: a cluster client, a Ring or a Client, or a type that
// embeds one by pointer.
func shows(rdb redis.UniversalClient) bool {
	switch rdb.(type) {
	case clusterClient, ringClient, interface{ Options() *redis.Options }:
		return true
	}
	return false
}

// maxWrapping is how many wrappers deep unwrap looks for a client.
const maxWrapping = 8

var universalClient = reflect.TypeFor[redis.UniversalClient]()

// unwrap returns the client that shows what rdb is (see shows): rdb
// itself, or the one a wrapper of the caller's holds in its embedded
// field, a wrapper's wrapper's, and so on; rdb itself when it finds none.
// nilAt is the depth at which it found nil in place of a client, whose
// methods would fail at their first use (0: rdb is a nil pointer to a
// wrapper), or -1 for none.
//
// Only exported fields are followed: reflect cannot hand out the value of
// an unexported one (without package unsafe). A struct with several
// embedded clients promotes the methods of none (Go's rule for fields at
// one depth): it implements them itself, sending wherever it likes, and is
// taken for what it shows.
func unwrap(rdb redis.UniversalClient) (under redis.UniversalClient, nilAt int) {
	v := reflect.ValueOf(rdb)
	for depth := 0; depth <= maxWrapping; depth++ {
		if c, ok := v.Interface().(redis.UniversalClient); ok {
			if isNil(c) {
				return nil, depth
			}
			if shows(c) {
				return c, -1
			}
		}
		t := v.Type()
		if t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return rdb, -1
		}
		field := -1
		for i := range t.NumField() {
			f := t.Field(i)
			if f.Anonymous && f.IsExported() && (f.Type.Implements(universalClient) || reflect.PointerTo(f.Type).Implements(universalClient)) {
				if field >= 0 {
					return rdb, -1 // several
				}
				field = i
			}
		}
		if field < 0 {
			return rdb, -1
		}
		if v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return nil, depth
			}
			v = v.Elem()
		}
		if v = v.Field(field); v.Kind() == reflect.Interface {
			if v.IsNil() {
				return nil, depth + 1
			}
			v = v.Elem()
		}
	}
	return rdb, -1
}

// clusterClient is what the driver uses of a *redis.ClusterClient beyond
// redis.UniversalClient: a cluster client has it, and so has a type that
// embeds one.
type clusterClient interface {
	redis.UniversalClient
	Options() *redis.ClusterOptions
	MasterForKey(ctx context.Context, key string) (*redis.Client, error)
	ForEachMaster(ctx context.Context, fn func(ctx context.Context, client *redis.Client) error) error
	ReloadState(ctx context.Context)
}

// ringClient is what the driver uses of a *redis.Ring beyond
// redis.UniversalClient: a Ring has it, and so has a type that embeds one.
type ringClient interface {
	redis.UniversalClient
	Options() *redis.RingOptions
	ForEachShard(ctx context.Context, fn func(ctx context.Context, client *redis.Client) error) error
}

// PoolSize returns how many requests the client has out at once on one
// server's connections (a cluster's node, a Ring's shard): its PoolSize,
// or MaxActiveConns when that is less (see dlock.Pooled). A request
// beyond PoolSize waits for a connection, up to PoolTimeout; one beyond a
// smaller MaxActiveConns fails at once (go-redis's "connection pool
// exhausted"): dlock sends a release or a clean-up so refused again a
// little later (see notSent), and an acquire or a refresh fails as on a
// timeout (a wait tries again), but the application's own requests fail:
// leave MaxActiveConns at 0, or at PoolSize or more.
func (d *Driver) PoolSize() int { return d.pool }

// poolSize reads rdb's PoolSize and MaxActiveConns (see PoolSize); 0 for
// a client of another type.
func poolSize(rdb redis.UniversalClient) int {
	var size, most int
	switch c := rdb.(type) {
	case interface{ Options() *redis.Options }: // a Client, or a type that embeds one
		size, most = c.Options().PoolSize, c.Options().MaxActiveConns
	case clusterClient:
		size, most = c.Options().PoolSize, c.Options().MaxActiveConns
	case ringClient:
		// A Ring passes them on to each shard's client, which sets its
		// default in place of 0.
		size, most = c.Options().PoolSize, c.Options().MaxActiveConns
		if size == 0 {
			size = 10 * runtime.GOMAXPROCS(0)
		}
	default:
		return 0
	}
	if most > 0 && most < size {
		return most
	}
	return size
}

// shardOf returns a function that finds the shard of a Ring's key as the
// Ring does, by its hash tag and its consistent hash, over all the shards
// it was given: while some are down, or after SetAddrs, the Ring may send
// a key elsewhere.
func shardOf(opt *redis.RingOptions) func(key string) string {
	addrs := make(map[string]string, len(opt.Addrs))
	names := make([]string, 0, len(opt.Addrs))
	for name, addr := range opt.Addrs {
		addrs[name] = addr
		names = append(names, name)
	}
	if opt.NewConsistentHash == nil || len(names) == 0 {
		return func(string) string { return "" }
	}
	hash := opt.NewConsistentHash(names)
	return func(key string) string { return addrs[hash.Get(keyslot.Tag(key))] }
}

// Partitioned reports whether the client spreads keys over several servers:
// a Redis Cluster or a Ring (see dlock.Partitioned).
func (d *Driver) Partitioned() bool {
	return d.clu != nil || d.ring != nil
}

// Server returns the address of the primary that serves key's slot on a
// cluster, by the client's slot map (or "" when it has none and cannot
// read one within ctx); on a Ring, of the shard the Ring sends key to
// while all its shards are up.
func (d *Driver) Server(ctx context.Context, key string) string {
	if d.shardOf != nil {
		return d.shardOf(key)
	}
	if d.clu == nil {
		return ""
	}
	node, err := d.clu.MasterForKey(ctx, key)
	if err != nil {
		return ""
	}
	return node.Options().Addr
}

// refuseAcrossShards fails the calls whose keys do not share one hash tag,
// on a Ring, and returns the others. A Ring sends a script to the shard of
// its first key, where the other keys would be locked on a server that
// does not own them, while another client locks them on their own shard:
// two holders at once. One name's keys always share a tag; a lock on
// several names is taken on a Ring only when its names share one too
// ("{order:42}:pay", "{order:42}:ship").
func refuseAcrossShards(calls []*dlock.Call) []*dlock.Call {
	ok := calls[:0:0]
	for _, call := range calls {
		if len(call.Keys) > 0 && !sameTag(call.Keys) {
			call.Val, call.Err = nil, fmt.Errorf("%w: a lock on names of several hash tags on a go-redis Ring, which would take them on the first one's shard", dlock.ErrUnsupported)
			continue
		}
		ok = append(ok, call)
	}
	return ok
}

// refuseAcrossSlots fails the calls whose keys lie in several slots, on a
// cluster client, as the server would (CROSSSLOT), and returns the others:
// dlock then takes a lock on several names slot by slot. A cluster client
// made with ClusterSlots over standalone servers, which never refuse a
// request for keys of slots they do not own, would take them all on the
// server of the first key's slot, while another client locks them on
// their own servers: two holders at once.
func refuseAcrossSlots(calls []*dlock.Call) []*dlock.Call {
	ok := calls[:0:0]
	for _, call := range calls {
		if len(call.Keys) > 1 && !sameSlot(call.Keys) {
			call.Val, call.Err = nil, errCrossSlot
			continue
		}
		ok = append(ok, call)
	}
	return ok
}

// errCrossSlot is the server's refusal of a request for keys of several
// slots, given by the driver before it sends one.
var errCrossSlot error = crossSlot{}

type crossSlot struct{}

func (crossSlot) Error() string {
	return "CROSSSLOT Keys in request don't hash to the same slot (refused by dlock's goredis driver before sending)"
}

// RedisError makes it a go-redis error reply (redis.Error): the
// connection is sound.
func (crossSlot) RedisError() {}

// sameSlot reports whether keys lie in one Redis Cluster slot.
func sameSlot(keys []string) bool {
	slot := keyslot.Of(keys[0])
	for _, k := range keys[1:] {
		if keyslot.Of(k) != slot {
			return false
		}
	}
	return true
}

// sameTag reports whether keys share one hash tag.
func sameTag(keys []string) bool {
	tag := keyslot.Tag(keys[0])
	for _, k := range keys[1:] {
		if keyslot.Tag(k) != tag {
			return false
		}
	}
	return true
}

// Eval runs the calls by EVALSHA, in one pipeline when there are several,
// and runs again those the server answered NOSCRIPT (it had not seen the
// script yet, or has restarted or failed over since): the first of each
// script by EVAL, and the others by EVALSHA behind it (see
// dlock.EvalAgain). Calls with
// a Lib run by FCALL, and again once the library is loaded where a server
// answered that the function is missing (by EVAL where the server cannot
// load it for want of memory, or the function is missing still).
func (d *Driver) Eval(ctx context.Context, calls ...*dlock.Call) {
	if d.ring != nil {
		calls = refuseAcrossShards(calls)
	}
	if d.clu != nil {
		calls = refuseAcrossSlots(calls)
	}
	d.run(ctx, calls, nil)
	defer d.reloadAfterFailure(calls)
	if again, lib := dlock.Unknown(calls); len(again) > 0 {
		dlock.Resend(again, lib, func(lib *dlock.Library, calls []*dlock.Call) ([]*dlock.Call, []*dlock.Call) {
			return d.load(ctx, lib, calls)
		}, func(calls []*dlock.Call) {
			_ = dlock.EvalAgain(calls, func(calls []*dlock.Call, byEval []bool) error {
				d.run(ctx, calls, byEval)
				return nil
			})
		})
	}
	d.settle(ctx, calls)
}

// redirected turns a MOVED or ASK reply to a client that is not a cluster
// client (a Client or a Ring given a Redis Cluster node's address), which
// follows none, into an error matching dlock.ErrUnsupported: no attempt
// would do better, and a wait ends at once.
func redirected(err error) error {
	if err != nil && isReply(err) && (strings.HasPrefix(err.Error(), "MOVED ") || strings.HasPrefix(err.Error(), "ASK ")) {
		return fmt.Errorf("%w: a Redis Cluster node through a go-redis client that follows no redirection (the node answered %q): use a ClusterClient: %w",
			dlock.ErrUnsupported, err.Error(), err)
	}
	return err
}

// reloadAfterFailure has a cluster client read the cluster's slot map
// again after a call could not reach its node: go-redis otherwise keeps
// sending to a failed primary until its map is ten seconds old or a node
// answers MOVED, which holds locks up for seconds after a failover.
func (d *Driver) reloadAfterFailure(calls []*dlock.Call) {
	c := d.clu
	if c == nil {
		return
	}
	for _, call := range calls {
		if call.Err != nil && !isReply(call.Err) &&
			!errors.Is(call.Err, context.Canceled) && !errors.Is(call.Err, context.DeadlineExceeded) {
			c.ReloadState(context.Background()) // lazy: go-redis reloads in the background, once at a time
			return
		}
	}
}

// load loads the function library where the calls that run by FCALL ran:
// on the server, or on a cluster the primaries of their keys' slots (a
// primary that stalls or is down then holds up only its own calls); on a
// Ring, on every shard that is up. It returns the calls to send again (those that run by
// EVAL too), and those to run as scripts (see dlock.Loaded).
func (d *Driver) load(ctx context.Context, lib *dlock.Library, calls []*dlock.Call) (again, scripts []*dlock.Call) {
	loadOn := func(ctx context.Context, node redis.Cmdable, calls []*dlock.Call) (again, scripts []*dlock.Call) {
		return dlock.Loaded(calls, node.FunctionLoad(ctx, lib.Src).Err())
	}
	var fcalls []*dlock.Call
	for _, call := range calls {
		if call.Lib == nil {
			again = append(again, call)
		} else {
			fcalls = append(fcalls, call)
		}
	}
	if len(fcalls) == 0 {
		return again, nil
	}
	switch {
	case d.clu != nil:
		nodes := map[string]*redis.Client{}
		groups := map[string][]*dlock.Call{} // by primary
		for _, call := range fcalls {
			node, err := d.clu.MasterForKey(ctx, firstKey(call))
			if err != nil {
				call.Val, call.Err = nil, err
				continue
			}
			addr := node.Options().Addr
			nodes[addr] = node
			groups[addr] = append(groups[addr], call)
		}
		// The primaries are asked at once (the calls of one Eval are
		// mostly one primary's: see dlock.Partitioned).
		var mu sync.Mutex
		var wg sync.WaitGroup
		for addr, calls := range groups {
			wg.Add(1)
			go func() {
				defer wg.Done()
				a, s := loadOn(ctx, nodes[addr], calls)
				mu.Lock()
				defer mu.Unlock()
				again, scripts = append(again, a...), append(scripts, s...)
			}()
		}
		wg.Wait()
	case d.ring != nil:
		// On every shard that is up: the Ring's own map of keys to shards
		// follows SetAddrs and shards that go down, where shardOf does
		// not, and a Ring tells no key's shard. A call whose shard (by
		// shardOf) refused the load gets its answer; the others are sent
		// again (wherever the Ring sends them, the library is there, or
		// they run by EVAL).
		var mu sync.Mutex
		failed := map[string]error{}
		_ = d.ring.ForEachShard(ctx, func(ctx context.Context, node *redis.Client) error {
			if err := node.FunctionLoad(ctx, lib.Src).Err(); err != nil {
				mu.Lock()
				defer mu.Unlock()
				failed[node.Options().Addr] = err
			}
			return nil
		})
		for _, call := range fcalls {
			a, s := dlock.Loaded([]*dlock.Call{call}, failed[d.shardOf(firstKey(call))])
			again, scripts = append(again, a...), append(scripts, s...)
		}
	default:
		a, s := loadOn(ctx, d.rdb, fcalls)
		again, scripts = append(again, a...), append(scripts, s...)
	}
	return again, scripts
}

// firstKey returns the key that routes call, "" for none.
func firstKey(call *dlock.Call) string {
	if len(call.Keys) == 0 {
		return ""
	}
	return call.Keys[0]
}

// send adds one call to c: by FCALL when it has a library, else by
// EVALSHA, or by EVAL when byEval is set. On go-redis's own clients and
// pipelines, it makes the command as their EvalSha, Eval and FCall do,
// the same for their hooks and their routing, less an allocation: the
// script's SHA1 or function name is boxed once for all calls (see
// friend.ScriptArg). On a type of the caller's, it calls those methods,
// which the type may have made its own (to instrument them, say).
func send(ctx context.Context, c redis.Cmdable, call *dlock.Call, byEval bool) *redis.Cmd {
	switch c.(type) {
	case *redis.Client, *redis.ClusterClient, *redis.Ring, *redis.Pipeline:
		return process(ctx, c.(processor), call, byEval)
	}
	switch {
	case call.Lib != nil && call.Script.Function != "":
		return c.FCall(ctx, call.Script.Function, call.Keys, call.Args...)
	case byEval:
		return c.Eval(ctx, call.Script.Src, call.Keys, call.Args...)
	default:
		return c.EvalSha(ctx, call.Script.SHA1, call.Keys, call.Args...)
	}
}

// process adds call to c as send does, with a command it makes itself.
func process(ctx context.Context, c processor, call *dlock.Call, byEval bool) *redis.Cmd {
	args := make([]any, 3+len(call.Keys)+len(call.Args))
	switch {
	case call.Lib != nil && call.Script.Function != "":
		args[0], args[1] = "fcall", friend.ScriptArg(call.Script, true)
	case byEval:
		args[0], args[1] = "eval", call.Script.Src
	default:
		args[0], args[1] = "evalsha", friend.ScriptArg(call.Script, false)
	}
	args[2] = len(call.Keys)
	for i, k := range call.Keys {
		args[3+i] = k
	}
	copy(args[3+len(call.Keys):], call.Args)
	cmd := redis.NewCmd(ctx, args...)
	if len(call.Keys) > 0 {
		cmd.SetFirstKeyPos(3)
	}
	_ = c.Process(ctx, cmd)
	return cmd
}

// processor is what process uses of a client or a pipeline.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// run sends the calls, in one pipeline when there are several, by EVAL
// those whose byEval is set (byEval is nil for none) and by EVALSHA the
// others (or by FCALL, see send), and stores their replies.
func (d *Driver) run(ctx context.Context, calls []*dlock.Call, byEval []bool) {
	switch len(calls) {
	case 0:
	case 1:
		store(calls[0], send(ctx, d.rdb, calls[0], byEval != nil && byEval[0]))
	default:
		cmds := make([]*redis.Cmd, len(calls))
		_, err := d.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, call := range calls {
				cmds[i] = send(ctx, p, call, byEval != nil && byEval[i])
			}
			return nil
		})
		storeAll(calls, cmds, err)
	}
}

// storeAll stores the replies of a pipeline that returned err. go-redis
// leaves the commands of a pipeline it could not send (no connection, or
// the context ended before) without an error: those get err.
func storeAll(calls []*dlock.Call, cmds []*redis.Cmd, err error) {
	for i, call := range calls {
		if unsent(cmds[i]) {
			call.Val, call.Err = nil, notSent(noReply(err))
			continue
		}
		store(call, cmds[i])
	}
}

// unsent reports whether cmd, of a pipeline, got no reply: a reply, nil
// included, always sets its value or its error.
func unsent(cmd *redis.Cmd) bool { return cmd.Err() == nil && cmd.Val() == nil }

// noReply is err, or errNoReply when the pipeline returned none.
func noReply(err error) error {
	if err == nil {
		return errNoReply
	}
	return err
}

var errNoReply = errors.New("goredis: the pipeline returned no reply")

func store(call *dlock.Call, cmd *redis.Cmd) {
	call.Val, call.Err = cmd.Val(), notSent(cmd.Err())
	if errors.Is(call.Err, redis.Nil) {
		call.Val, call.Err = nil, nil
	}
}

// notSent marks err as a failure to find a connection (see dlock.Driver)
// when go-redis had none for the request (it may have sent it once before,
// and tried again after a connection failed): its pool at MaxActiveConns
// (ErrPoolExhausted) or none freed within PoolTimeout (ErrPoolTimeout),
// which go-redis v9.7 does not export, and which are known here by their
// text.
func notSent(err error) error {
	if err != nil && (err.Error() == "redis: connection pool exhausted" || err.Error() == "redis: connection pool timeout") {
		return unsentError{err}
	}
	return err
}

// settle gives the calls' errors the meaning dlock reads, once their
// replies are in. Off a cluster client, a MOVED or ASK reply becomes an
// error matching dlock.ErrUnsupported (see redirected). go-redis's
// ErrClosed becomes one matching dlock.ErrClosed when the go-redis client
// itself was closed (see closedUnder): the caller closed it, and no
// request can go any more, which a wait must not outlast. It returns
// whether it asked closedUnder, and the answer.
func (d *Driver) settle(ctx context.Context, calls []*dlock.Call) (asked, closed bool) {
	for _, call := range calls {
		switch err := call.Err; {
		case err == nil:
		case errors.Is(err, redis.ErrClosed):
			if !asked {
				asked, closed = true, d.closedUnder(ctx)
			}
			if closed {
				call.Err = closedError(err)
			}
		case d.clu == nil:
			call.Err = redirected(err)
		}
	}
	return asked, closed
}

// closedUnder reports whether the go-redis client under the driver was
// closed, after a request failed with go-redis's ErrClosed. From a Client,
// it was. A Ring or a cluster client also closes a node's client when its
// nodes change, and sends elsewhere: it is asked (PING), which a closed
// one refuses at once, with ErrClosed, sending nothing; an open one is
// given a moment to answer, not the request's whole time. A cluster
// client's primaries are asked one by one (through their clients, not the
// cluster client, which would try another node after each ErrClosed,
// pausing between tries, up to MaxRedirects times).
func (d *Driver) closedUnder(ctx context.Context) bool {
	if d.plain {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, 250*time.Millisecond)
	defer cancel()
	if c := d.clu; c != nil {
		return errors.Is(c.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() }), redis.ErrClosed)
	}
	return errors.Is(d.rdb.Ping(ctx).Err(), redis.ErrClosed)
}

// closedError is the error matching dlock.ErrClosed for err, go-redis's
// ErrClosed from a client closed under the driver.
func closedError(err error) error {
	return fmt.Errorf("%w (the go-redis client under the driver): %w", dlock.ErrClosed, err)
}

// unsentError is the error of a request that go-redis found no connection
// for.
type unsentError struct{ error }

func (e unsentError) Unwrap() error { return e.error }

// NotSent says that go-redis found no connection for the request (see
// dlock.Driver).
func (unsentError) NotSent() bool { return true }

// Subscribe opens a go-redis PubSub, read by a goroutine of its own.
// go-redis reconnects it and re-subscribes its channels after a connection
// fails with an error; one that goes silent (a connection cut off without
// a reset, as to a host that vanished, which TCP reports only after many
// minutes) is sent a PING after 3s without a message, and one that answers
// nothing within 3s more is replaced by a new connection with the same
// channels. With ContextTimeoutEnabled, each request the subscription makes
// (a new connection's handshake included) gets a second, so that Close
// does not wait for go-redis's read timeout on a server that stalls. The first reply on a new connection (the channels'
// confirmation) is preceded by a call of notify with an empty channel and
// payload (see dlock.Subscription). A Ring returns dlock.ErrUnsupported: its shards are separate
// servers, each with its own channels, and a release publishes on the
// shard of its lock.
func (d *Driver) Subscribe(ctx context.Context, notify func(channel, payload string)) (dlock.Subscription, error) {
	if d.ring != nil {
		return nil, fmt.Errorf("%w: pub/sub on a go-redis Ring", dlock.ErrUnsupported)
	}
	s := &subscription{rdb: d.rdb, ps: d.rdb.Subscribe(ctx), notify: notify,
		channels: map[string]bool{}, done: make(chan struct{})}
	s.life, s.end = context.WithCancel(context.Background())
	go s.receive()
	return s, nil
}

type subscription struct {
	rdb    redis.UniversalClient
	notify func(channel, payload string)
	done   chan struct{} // closed when receive returns
	// life ends at Close. The requests receive makes, which may connect
	// anew (go-redis holds the PubSub's lock meanwhile, which Close needs),
	// end with it as far as go-redis lets them (a dial does) and within
	// pubsubConnect (with ContextTimeoutEnabled).
	life context.Context
	end  context.CancelFunc

	// mu is held by Subscribe and Unsubscribe, and while a silent ps is
	// replaced, so that no change of channels is lost in between.
	mu       sync.Mutex
	ps       *redis.PubSub
	channels map[string]bool
	broken   bool // a Subscribe or Unsubscribe failed to reach the server: go-redis connects anew
	closed   bool
	stop     chan struct{} // closed by Close, made by closing
	err      error         // of Close
	asked    bool          // a caller's Subscribe came: only the first waits (see Subscribe)
	first    *pending      // the first SUBSCRIBE, written on ps, until answered
}

// pending is the first SUBSCRIBE written on a subscription's connection,
// which the caller waits for: the server answers it with one confirmation
// for each of its channels, or with one error. Nothing else that the
// server sends before it is a confirmation: no channel was subscribed to
// before.
type pending struct {
	channels []string
	left     int        // confirmations still to come
	answer   chan error // buffered
}

// subscribeRetry is how long receive waits before reading again after a
// failed read: go-redis reconnects at the next read.
const subscribeRetry = 100 * time.Millisecond

// pubsubConnect bounds each request of a subscription's, a new connection
// it may need included, so that Close, which waits for it, does not wait
// for go-redis's read timeout on a server that stalls.
const pubsubConnect = time.Second

// receive delivers the messages of the subscription until Close.
func (s *subscription) receive() {
	defer close(s.done)
	// lost is set once the connection failed or was replaced: the first
	// reply on the next one (go-redis subscribes the channels again as it
	// connects, so it is their confirmation) tells dlock that notices may
	// have been missed.
	pinged, lost := false, false
	for {
		s.mu.Lock()
		ps, closed := s.ps, s.closed
		if s.broken {
			s.broken, lost = false, true
		}
		s.mu.Unlock()
		if closed {
			return
		}
		// The context bounds the connection go-redis may make first; the
		// read has shardSilence.
		rctx, cancel := context.WithTimeout(s.life, pubsubConnect)
		msg, err := ps.ReceiveTimeout(rctx, shardSilence)
		cancel()
		if err == nil {
			pinged = false
			if lost {
				lost = false
				s.notify("", "")
			}
			switch m := msg.(type) {
			case *redis.Message:
				s.notify(m.Channel, m.Payload)
			case *redis.Subscription:
				if m.Kind == "subscribe" {
					s.answer(ps, nil)
				}
			}
			continue
		}
		if isReply(err) {
			pinged = false
			if s.answer(ps, err) || refusal(err) || !lost {
				// The first SUBSCRIBE's answer, a channel the server
				// refused (NOPERM), or the answer to a PING or an
				// UNSUBSCRIBE on a connection whose channels the server
				// confirmed: the connection goes on.
				continue
			}
			// Any other (BUSY) before anything else on a connection made
			// anew answered the SUBSCRIBE that go-redis sent as it
			// connected: the channels are not subscribed, and go-redis
			// takes the connection for sound.
			s.pause(subscribeRetry)
			s.replace(ps)
			continue
		}
		var ne net.Error
		switch {
		case !errors.As(err, &ne) || !ne.Timeout():
			// Failed, or closed: go-redis reconnects at the next read.
			pinged, lost = false, true
			s.answer(ps, errLostFirst)
			s.pause(subscribeRetry)
		case !pinged:
			// Silent for a while: a PING tells a quiet connection from a
			// dead one.
			pinged = true
			pctx, cancel := context.WithTimeout(s.life, pubsubConnect)
			err := ps.Ping(pctx)
			cancel()
			if err != nil {
				lost = true // go-redis connects anew at the next read
				s.pause(subscribeRetry)
			}
		default:
			// No answer to the PING either: a new connection.
			pinged, lost = false, true
			s.replace(ps)
		}
	}
}

// errLostFirst is what answer is given when the connection failed before
// the first SUBSCRIBE was answered: its caller is answered nil, as go-redis
// subscribes its channels again on the next connection.
var errLostFirst = errors.New("goredis: the connection failed before the answer")

// answer counts a reply on ps to the first SUBSCRIBE, while it waits for
// one: a confirmation of one of its channels (err nil), its refusal, whose
// channels are then forgotten, or errLostFirst. Once answered, its caller
// learns the answer. It reports whether the reply was the first
// SUBSCRIBE's.
func (s *subscription) answer(ps *redis.PubSub, err error) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.first
	if s.ps != ps || p == nil {
		return false
	}
	if p.left--; err == nil && p.left > 0 {
		return true
	}
	s.first = nil
	switch {
	case err == errLostFirst:
		err = nil
	case err != nil:
		for _, ch := range p.channels {
			delete(s.channels, ch)
		}
	}
	p.answer <- err
	return true
}

// pause waits d, or until Close.
func (s *subscription) pause(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-s.closing():
	}
}

// closing returns a channel that is closed once Close was called.
func (s *subscription) closing() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return closedChan
	}
	if s.stop == nil {
		s.stop = make(chan struct{})
	}
	return s.stop
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// replace puts a new PubSub with the subscription's channels in the place
// of old, which is silent, and closes old.
func (s *subscription) replace(old *redis.PubSub) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.ps != old {
		return
	}
	if s.first != nil { // its channels go to the new connection
		s.first.answer <- nil
		s.first = nil
	}
	_ = old.Close()
	s.ps = s.rdb.Subscribe(context.Background())
	if len(s.channels) == 0 {
		return
	}
	chans := make([]string, 0, len(s.channels))
	for ch := range s.channels {
		chans = append(chans, ch)
	}
	// The channels are kept even if this fails: go-redis subscribes them
	// on the connection it makes at the next read.
	ctx, cancel := context.WithTimeout(s.life, pubsubConnect)
	defer cancel()
	_ = s.ps.Subscribe(ctx, chans...)
}

// Subscribe adds channels. The first call waits, within ctx, for the
// server's answer, and returns its refusal (NOPERM: an ACL user who may not
// listen on those channels), which dlock logs, its waiting callers polling
// then; the later calls do not wait, as the goroutine that reads the
// answers may be calling notify, which may wait for their caller.
func (s *subscription) Subscribe(ctx context.Context, channels ...string) error {
	s.mu.Lock()
	for _, ch := range channels {
		s.channels[ch] = true
	}
	first := !s.asked
	s.asked = true
	err := s.sent(s.ps.Subscribe(ctx, channels...))
	if err != nil || !first || len(channels) == 0 || s.closed {
		s.mu.Unlock()
		return err
	}
	p := &pending{channels: channels, left: len(channels), answer: make(chan error, 1)}
	s.first = p
	s.mu.Unlock()
	select {
	case err := <-p.answer:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-s.closing():
		return redis.ErrClosed
	}
}

func (s *subscription) Unsubscribe(ctx context.Context, channels ...string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ch := range channels {
		delete(s.channels, ch)
	}
	return s.sent(s.ps.Unsubscribe(ctx, channels...))
}

// sent returns err, the outcome of a request on the subscription's
// connection; one that did not reach the server has go-redis connect anew
// at the next read, which receive then tells notify of. s.mu is held.
func (s *subscription) sent(err error) error {
	if err != nil && !isReply(err) {
		s.broken = true
	}
	return err
}

// isReply reports whether err is an error reply of the server, which
// leaves the connection as it was.
func isReply(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply)
}

func (s *subscription) Close() error {
	s.end() // first: a connection being made gives up
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		if s.stop != nil {
			close(s.stop)
		}
		s.err = s.ps.Close()
	}
	err := s.err
	s.mu.Unlock()
	<-s.done
	return err
}

var _ dlock.Scanner = (*Driver)(nil)

// Scan walks the keys matching match of Redis type typ with SCAN, on every
// primary of a cluster and every shard of a Ring (whose SCAN would go to a
// shard at random).
func (d *Driver) Scan(ctx context.Context, match, typ string, fn func(key string) error) error {
	// The primaries or shards are walked at once; fn sees one key at a
	// time, and no more once it returned an error.
	var mu sync.Mutex
	var stop error
	each := func(ctx context.Context, node *redis.Client) error {
		return scan(ctx, node, match, typ, func(key string) error {
			mu.Lock()
			defer mu.Unlock()
			if stop == nil {
				stop = fn(key)
			}
			return stop
		})
	}
	if d.clu != nil {
		return d.clu.ForEachMaster(ctx, each)
	}
	if c := d.ring; c != nil {
		// ForEachShard skips the shards it takes for down: their locks
		// would be missing without a word.
		var walked atomic.Int64
		err := c.ForEachShard(ctx, func(ctx context.Context, node *redis.Client) error {
			walked.Add(1)
			return each(ctx, node)
		})
		if n, want := int(walked.Load()), len(c.Options().Addrs); err == nil && n < want {
			err = fmt.Errorf("goredis: %d of the Ring's %d shards are down; their locks were not scanned", want-n, want)
		}
		return err
	}
	return scan(ctx, d.rdb, match, typ, fn)
}

func scan(ctx context.Context, c redis.Cmdable, match, typ string, fn func(key string) error) error {
	it := c.ScanType(ctx, 0, match, 1000, typ).Iterator()
	for it.Next(ctx) {
		if err := fn(it.Val()); err != nil {
			return err
		}
	}
	return it.Err()
}

var _ dlock.Replicator = (*Driver)(nil)

// EvalWait runs the calls as Eval does, each group of calls bound for one
// primary in one pipeline followed by WAIT on the same connection, and
// returns the fewest replicas that acknowledged any group. On a cluster
// the calls are grouped by the primary of their first key's slot, and the
// primaries are asked at once (on their nodes' clients, which the cluster
// client gives, whether rdb is one or wraps one). A Ring client is not
// supported: its shards are independent primaries; nor is a client of a
// type of yours other than one that wraps a cluster client (one that wraps
// a *redis.Client too: WAIT must follow the calls on their connection,
// which only the Client's own pipeline promises, and sent through the
// Client they would pass the wrapper by). The calls fail with
// dlock.ErrUnsupported, sending nothing.
func (d *Driver) EvalWait(ctx context.Context, replicas int, timeout time.Duration, calls ...*dlock.Call) (int, error) {
	if c, ok := d.rdb.(*redis.Client); ok {
		acked, err := evalWait(ctx, c, replicas, timeout, calls)
		d.settle(ctx, calls)
		return acked, err
	}
	if c := d.clu; c != nil {
		defer d.reloadAfterFailure(calls)
		groups := map[*redis.Client][]*dlock.Call{}
		for _, call := range refuseAcrossSlots(calls) {
			if len(call.Keys) == 0 {
				call.Val, call.Err = nil, fmt.Errorf("%w: a call without keys through WAIT on a cluster", dlock.ErrUnsupported)
				continue
			}
			node, err := c.MasterForKey(ctx, call.Keys[0])
			if err != nil {
				if errors.Is(err, redis.ErrClosed) && d.closedUnder(ctx) {
					err = closedError(err)
				}
				return 0, err
			}
			groups[node] = append(groups[node], call)
		}
		// The primaries are asked at once: each WAIT may take the whole
		// timeout, and the caller budgets for one.
		type result struct {
			acked int
			err   error
		}
		results := make(chan result, len(groups))
		for node, calls := range groups {
			go func() {
				acked, err := evalWait(ctx, node, replicas, timeout, calls)
				results <- result{acked, err}
			}()
		}
		least := -1
		var err error
		for range groups {
			r := <-results
			if r.err != nil {
				err = cmp.Or(err, r.err)
			} else if least < 0 || r.acked < least {
				least = r.acked
			}
		}
		if err != nil || movedAny(calls) {
			// The slot map may be stale (a failover made a primary a
			// replica, which refuses WAIT and redirects the scripts):
			// MasterForKey must not keep choosing that node.
			c.ReloadState(context.Background())
		}
		asked, closed := d.settle(ctx, calls)
		if err != nil {
			if errors.Is(err, redis.ErrClosed) && (closed || !asked && d.closedUnder(ctx)) {
				err = closedError(err)
			}
			return 0, err
		}
		return max(least, 0), nil
	}
	return 0, fmt.Errorf("%w: WAIT through a %T", dlock.ErrUnsupported, d.rdb)
}

// movedAny reports whether a call was answered that its key lives on
// another node, or that the node is a replica.
func movedAny(calls []*dlock.Call) bool {
	for _, call := range calls {
		var reply redis.Error
		if errors.As(call.Err, &reply) {
			msg := reply.Error()
			if strings.HasPrefix(msg, "MOVED ") || strings.HasPrefix(msg, "ASK ") || strings.HasPrefix(msg, "READONLY ") {
				return true
			}
		}
	}
	return false
}

// evalWait pipelines the calls and WAIT on one connection of node, by
// EVALSHA (or FCALL), then once more, with WAIT again, the calls the
// server answered without knowing their script: the first of each script
// by EVAL and the others by EVALSHA behind it (see dlock.EvalAgain), or by
// FCALL once the library is loaded. The pipeline's replies are read within the WAIT's timeout and a
// second more, whatever the client's read timeout: go-redis reads a
// pipeline within that, and would take a WAIT still waiting for a failure
// and send the whole pipeline again.
func evalWait(ctx context.Context, node *redis.Client, replicas int, timeout time.Duration, calls []*dlock.Call) (int, error) {
	if rt := node.Options().ReadTimeout; rt > 0 && rt < timeout+time.Second { // 0: no timeout
		node = node.WithTimeout(timeout + time.Second)
	}
	// pass sends the calls and WAIT in one pipeline, and returns WAIT's
	// reply. The passes all wait within timeout: the WAIT of a first pass
	// the server answered with NOSCRIPT confirms nothing, but waits all the
	// same while a replica lags, and the next pass's WAIT has what is left.
	end := time.Now().Add(timeout)
	pass := func(calls []*dlock.Call, byEval []bool) (int, error) {
		wait := timeout
		if byEval != nil { // a second round
			wait = max(time.Until(end), time.Millisecond)
		}
		cmds := make([]*redis.Cmd, len(calls))
		var waitCmd *redis.Cmd
		_, perr := node.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, call := range calls {
				cmds[i] = send(ctx, p, call, byEval != nil && byEval[i])
			}
			waitCmd = p.Do(ctx, "WAIT", replicas, wait.Milliseconds())
			return nil
		})
		// Every reply is kept, even when WAIT failed: a refused acquire's
		// reply says so, and an error says which call failed.
		storeAll(calls, cmds, perr)
		if unsent(waitCmd) {
			return 0, noReply(perr)
		}
		return waitCmd.Int()
	}
	least, err := pass(calls, nil)
	if err != nil {
		return 0, err
	}
	if again, lib := dlock.Unknown(calls); len(again) > 0 {
		least, err = dlock.ResendWait(again, lib, least, func(lib *dlock.Library, calls []*dlock.Call) ([]*dlock.Call, []*dlock.Call) {
			return dlock.Loaded(calls, node.FunctionLoad(ctx, lib.Src).Err())
		}, pass)
		if err != nil {
			return 0, err
		}
	}
	return max(least, 0), nil
}
