// Package dlockrueidis lets dlock use a rueidis client: a single node, a
// Sentinel-managed primary, or a Redis Cluster, with rueidis's
// auto-pipelining and RESP3.
//
//	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
//	...
//	locks := dlock.New(dlockrueidis.New(client))
//
// The package lives at github.com/dlockio/dlock/rueidis, a module of its
// own so that only its users download rueidis. It is named dlockrueidis,
// not rueidis, so that it can be imported beside rueidis without an alias.
package dlockrueidis

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/keyslot"
	"github.com/redis/rueidis"
)

// Driver carries dlock's requests over a rueidis client. Make one with New:
// the zero Driver is not usable.
type Driver struct {
	client rueidis.Client
	slots  atomic.Pointer[slotMap] // a cluster's slot map, for EvalWait, SubscribeSharded and Server; nil until asked
	// lastSlots is the slot map read last, for Server, which keeps it
	// where slots was reset (see serverMap).
	lastSlots atomic.Pointer[slotMap]
	tried     atomic.Int64 // when Server last read the slot map (ns since epoch; see serverMap)
}

var (
	_ dlock.Driver      = (*Driver)(nil)
	_ dlock.Scanner     = (*Driver)(nil)
	_ dlock.Partitioned = (*Driver)(nil)
)

// New returns a Driver over client. The client stays the caller's: dlock
// never closes it. New panics if client is nil.
func New(client rueidis.Client) *Driver {
	if client == nil {
		panic("dlockrueidis: New with a nil client")
	}
	return &Driver{client: client}
}

// Partitioned reports whether the client talks to a Redis Cluster (see
// dlock.Partitioned).
func (d *Driver) Partitioned() bool {
	return d.client.Mode() == rueidis.ClientModeCluster
}

// Server returns the address of the primary that serves key's slot on a
// cluster, by the driver's slot map; "" elsewhere, or while the driver has
// no map (see serverMap).
func (d *Driver) Server(ctx context.Context, key string) string {
	if !d.Partitioned() {
		return ""
	}
	m := d.serverMap(ctx)
	if m == nil {
		return ""
	}
	return m.owner(keyslot.Of(key))
}

// Eval runs the calls by EVALSHA, in one pipeline (DoMulti) when there are
// several, and runs again those the server answered NOSCRIPT (it had not
// seen the script yet, or has restarted or failed over since): the first
// of each script by EVAL, and the others by EVALSHA behind it (see
// dlock.EvalAgain).
// Calls with a Lib run by FCALL, and again once the library is loaded where
// a server answered that the function is missing (by EVAL where the server
// cannot load it for want of memory, or the function is missing still).
//
// A call whose connection the server closed under it goes again at once,
// up to four times; on a cluster, one whose dial was refused goes again
// after 100ms, 200ms and 400ms, within ctx (see failoverRetries).
//
// Each call is routed by its first key. The other keys go out as plain
// arguments, so that a call whose keys lie in several cluster slots is
// refused by the server (CROSSSLOT), as with any other client, instead of
// making rueidis's command builder panic.
func (d *Driver) Eval(ctx context.Context, calls ...*dlock.Call) {
	if len(calls) == 0 {
		return
	}
	defer d.settle(ctx, calls)
	d.eval(ctx, calls)
	// rueidis learns that the server closed a connection (CLIENT KILL, its
	// timeout) only from the requests it sends there, one failing on each
	// of its connections, and does not send scripts again: those go once
	// more on the next, as go-redis would send them (dlock's scripts count
	// a request that ran twice once). A server that is down refuses the
	// dial instead, which is not sent again.
	for range closedRetries {
		again := closedUnder(calls)
		if len(again) == 0 || ctx.Err() != nil {
			break
		}
		for _, c := range again {
			c.Val, c.Err = nil, nil
		}
		d.eval(ctx, again)
	}
	// On a cluster, a client idle through a failover still sends to the
	// old primary, which refuses the dial, until rueidis has read the slots
	// again in the background, a few hundred milliseconds later: such calls
	// go again after a pause, within ctx.
	if d.client.Mode() != rueidis.ClientModeCluster {
		return
	}
	pause := failoverPause
	for range failoverRetries {
		var again []*dlock.Call
		for _, c := range calls {
			if dialFailed(c.Err) {
				again = append(again, c)
			}
		}
		if len(again) == 0 || !sleep(ctx, pause) {
			return
		}
		for _, c := range again {
			c.Val, c.Err = nil, nil
		}
		d.eval(ctx, again)
		pause *= 2
	}
}

// closedRetries bounds how many times Eval sends again the calls whose
// connection was closed under them.
const closedRetries = 4

// On a cluster, Eval sends a call whose dial failed again failoverRetries
// times, after failoverPause, then twice that, and so on: 700ms in all.
const (
	failoverRetries = 3
	failoverPause   = 100 * time.Millisecond
)

// dialFailed reports whether err says that a request could not be sent:
// the server refused its connection. (Not a dial that timed out: one more
// would wait as long.)
func dialFailed(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED)
}

// sleep waits d, or until ctx ends; it reports whether ctx lasted.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// closedUnder returns the calls that failed because their connection was
// closed under them (see dlock.ConnectionClosed).
func closedUnder(calls []*dlock.Call) []*dlock.Call {
	var out []*dlock.Call
	for _, c := range calls {
		if dlock.ConnectionClosed(c.Err) {
			out = append(out, c)
		}
	}
	return out
}

// eval runs the calls by EVALSHA (or FCALL), and again those the server
// answered NOSCRIPT, each script's text sent once (see dlock.EvalAgain), or
// by FCALL once the library is loaded.
func (d *Driver) eval(ctx context.Context, calls []*dlock.Call) {
	d.run(ctx, calls, nil)
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
}

// load loads the function library where the calls that run by FCALL ran:
// on the server, or on a cluster the primaries of their keys' slots, all at
// once (a primary that stalls or is down then holds up only its own
// calls). It returns the calls to send again (those that run by EVAL too),
// and those to run as scripts (see dlock.Loaded).
func (d *Driver) load(ctx context.Context, lib *dlock.Library, calls []*dlock.Call) (again, scripts []*dlock.Call) {
	var groups [][]*dlock.Call // by primary, or by slot when the slot map has none
	at := map[string]int{}
	cluster := d.client.Mode() == rueidis.ClientModeCluster
	var m *slotMap
	if cluster {
		m = d.serverMap(ctx)
	}
	for _, call := range calls {
		if call.Lib == nil {
			again = append(again, call)
			continue
		}
		where := ""
		if cluster && len(call.Keys) > 0 {
			slot := keyslot.Of(call.Keys[0])
			if m != nil {
				where = m.owner(slot)
			}
			if where == "" {
				where = strconv.Itoa(slot)
			}
		}
		i, ok := at[where]
		if !ok {
			i = len(groups)
			at[where] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], call)
	}
	if len(groups) == 0 {
		return again, nil
	}
	// One FUNCTION LOAD for each group, routed as its first call (rueidis
	// sends each to its slot's primary, at once). Calls without keys go
	// anywhere: run sends them with another call's key, as this does.
	anyKey := ""
	for _, g := range groups {
		if len(g[0].Keys) > 0 {
			anyKey = g[0].Keys[0]
		}
	}
	cmds := make(rueidis.Commands, len(groups))
	for i, g := range groups {
		cmds[i] = d.client.B().FunctionLoad().FunctionCode(lib.Src).Build()
		key := anyKey
		if len(g[0].Keys) > 0 {
			key = g[0].Keys[0]
		}
		if cluster && key != "" {
			cmds[i] = cmds[i].SetSlot(key)
		}
	}
	for i, r := range d.client.DoMulti(ctx, cmds...) {
		a, s := dlock.Loaded(groups[i], loadError(r))
		again, scripts = append(again, a...), append(scripts, s...)
	}
	return again, scripts
}

// loadError returns the error of r, the reply to a FUNCTION LOAD, with
// Redis's text intact (see RedisError), as dlock.Loaded reads it: nil for
// none.
func loadError(r rueidis.RedisResult) error {
	if err := r.NonRedisError(); err != nil {
		return err
	}
	msg, _ := r.ToMessage()
	if msg.Error() == nil {
		return nil
	}
	return replyError(&msg)
}

// run sends the calls, in one DoMulti when there are several, by EVAL
// those whose byEval is set (byEval is nil for none) and by EVALSHA the
// others (or by FCALL, see command), and stores their replies.
func (d *Driver) run(ctx context.Context, calls []*dlock.Call, byEval []bool) {
	if len(calls) == 1 {
		store(calls[0], d.client.Do(ctx, command(d.client, calls[0], byEval != nil && byEval[0])))
		return
	}
	// rueidis refuses (panics) to pipeline a command without a key beside
	// commands of several cluster slots: a call without keys, which may
	// run on any node, goes with the batch's first key instead.
	var anyKey string
	for _, call := range calls {
		if len(call.Keys) > 0 {
			anyKey = call.Keys[0]
			break
		}
	}
	cmds := make(rueidis.Commands, len(calls))
	for i, call := range calls {
		cmds[i] = command(d.client, call, byEval != nil && byEval[i])
		if len(call.Keys) == 0 && anyKey != "" {
			cmds[i] = cmds[i].SetSlot(anyKey)
		}
	}
	for i, r := range d.client.DoMulti(ctx, cmds...) {
		store(calls[i], r)
	}
}

// command builds the FCALL, EVALSHA or EVAL of a call for c.
func command(c rueidis.Client, call *dlock.Call, byEval bool) rueidis.Completed {
	name, script := "EVALSHA", call.Script.SHA1
	switch {
	case call.Lib != nil && call.Script.Function != "":
		name, script = "FCALL", call.Script.Function
	case byEval:
		name, script = "EVAL", call.Script.Src
	}
	cmd := c.B().Arbitrary(name, script, strconv.Itoa(len(call.Keys)))
	if len(call.Keys) > 0 {
		cmd = cmd.Keys(call.Keys[0]).Args(call.Keys[1:]...)
	}
	for _, v := range call.Args {
		cmd = cmd.Args(arg(v)) // one at a time: the builder's pooled slice takes them without allocating
	}
	return cmd.Build()
}

// arg writes a call's argument as Redis reads it.
func arg(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	case int:
		return strconv.Itoa(v)
	case int64:
		return strconv.FormatInt(v, 10)
	case uint64:
		return strconv.FormatUint(v, 10)
	default: // the other integer types
		return fmt.Sprint(v)
	}
}

// settle gives the calls' errors the meaning dlock reads, off a cluster
// client: a MOVED or ASK reply becomes an error matching
// dlock.ErrUnsupported (see redirected). From a client of one server (not
// a Sentinel's, which closes its connection to a primary that turned
// replica and answers ErrClosing until it has another), rueidis's
// ErrClosing becomes one matching dlock.ErrClosed when the client was
// closed (see closedUnder): no request can go any more, which a wait must
// not outlast.
func (d *Driver) settle(ctx context.Context, calls []*dlock.Call) {
	mode := d.client.Mode()
	if mode == rueidis.ClientModeCluster {
		return
	}
	asked, closed := false, false
	for _, c := range calls {
		if mode == rueidis.ClientModeStandalone && errors.Is(c.Err, rueidis.ErrClosing) {
			if !asked {
				asked, closed = true, d.closedUnder(ctx)
			}
			if closed {
				c.Err = fmt.Errorf("%w (the rueidis client under the driver): %w", dlock.ErrClosed, c.Err)
				continue
			}
		}
		c.Err = redirected(c.Err)
	}
}

// closedUnder reports whether the rueidis client under the driver was
// closed, after a request failed with ErrClosing: it is asked (PING),
// which a closed client refuses at once, with ErrClosing, sending nothing.
// (One that follows a redirection to a new primary (EnableRedirect) closes
// its client of the old one a few seconds later, failing what that one
// still had under way so, and sends elsewhere.) An open one is given a
// moment to answer, not the request's whole time. A client closed after
// its dial had failed answers with that dial's error, and is not told.
func (d *Driver) closedUnder(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 250*time.Millisecond)
	defer cancel()
	return errors.Is(d.client.Do(ctx, d.client.B().Ping().Build()).Error(), rueidis.ErrClosing)
}

// redirected turns a MOVED or ASK reply to a client that is not a cluster
// client (ForceSingleClient given a Redis Cluster node's address), which
// follows none, into an error matching dlock.ErrUnsupported: no attempt
// would do better, and a wait ends at once.
func redirected(err error) error {
	if err != nil && (strings.HasPrefix(err.Error(), "MOVED ") || strings.HasPrefix(err.Error(), "ASK ")) {
		return fmt.Errorf("%w: a Redis Cluster node through a rueidis client that follows no redirection (the node answered %q): %w",
			dlock.ErrUnsupported, err.Error(), err)
	}
	return err
}

// store converts a result into the call's reply or error.
func store(call *dlock.Call, r rueidis.RedisResult) {
	call.Val, call.Err = nil, nil
	if err := r.NonRedisError(); err != nil {
		call.Err = err
		return
	}
	msg, _ := r.ToMessage()
	call.Val, call.Err = convert(&msg)
}

// convert turns a reply into nil, int64, string or []any, as dlock.Call
// documents, the way Redis answers a RESP2 client: RESP3 booleans become 1
// or nil, maps flat arrays, and doubles and big numbers strings. An error
// reply is returned as an error, or, inside an array, as an element.
func convert(m *rueidis.RedisMessage) (any, error) {
	switch {
	case m.IsNil():
		return nil, nil
	case m.Error() != nil:
		return nil, replyError(m)
	case m.IsInt64():
		return m.AsInt64()
	case m.IsBool():
		if b, _ := m.AsBool(); b {
			return int64(1), nil
		}
		return nil, nil
	case m.IsArray():
		elems, err := m.ToArray()
		if err != nil {
			return nil, err
		}
		return convertAll(elems), nil
	case m.IsMap():
		fields, err := m.ToMap()
		if err != nil {
			return nil, err
		}
		names := make([]string, 0, len(fields))
		for name := range fields {
			names = append(names, name)
		}
		sort.Strings(names)
		out := make([]any, 0, 2*len(names))
		for _, name := range names {
			v := fields[name]
			out = append(out, name, element(&v))
		}
		return out, nil
	}
	return m.ToString() // strings, doubles, big numbers
}

// convertAll converts the elements of an array.
func convertAll(elems []rueidis.RedisMessage) []any {
	out := make([]any, len(elems))
	for i := range elems {
		out[i] = element(&elems[i])
	}
	return out
}

// element converts an element of an array or map; an error reply becomes
// an error value.
func element(m *rueidis.RedisMessage) any {
	v, err := convert(m)
	if err != nil {
		return err
	}
	return v
}

// RedisError is an error reply from Redis, with the server's text intact
// (rueidis's own error drops an "ERR " prefix). It unwraps to the
// *rueidis.RedisError.
type RedisError struct {
	msg string
	err *rueidis.RedisError
}

// replyError returns the error of an error reply.
func replyError(m *rueidis.RedisMessage) error {
	msg, err := m.ToString()
	var re *rueidis.RedisError
	if !errors.As(err, &re) {
		return err
	}
	return &RedisError{msg: msg, err: re}
}

// Error returns the text of the reply.
func (e *RedisError) Error() string { return e.msg }

// Unwrap returns rueidis's error.
func (e *RedisError) Unwrap() error { return e.err }

// Scan walks the keys matching match of Redis type typ with SCAN: on every
// primary of a cluster, one after the other, and on the primary otherwise,
// also for a client that sends read-only commands to replicas
// (SendToReplicas, see scanCommand).
func (d *Driver) Scan(ctx context.Context, match, typ string, fn func(key string) error) error {
	nodes := []rueidis.Client{d.client}
	if d.client.Mode() == rueidis.ClientModeCluster {
		var err error
		if nodes, err = d.primaries(ctx); err != nil {
			return err
		}
	}
	for _, n := range nodes {
		if err := scan(ctx, n, match, typ, fn); err != nil {
			return err
		}
	}
	return nil
}

// primaries returns the nodes of a cluster client that serve slots, as
// the cluster's slot map says now (CLUSTER SLOTS, from any node that
// answers), in the order of their addresses: a replica that is down does
// not matter, and a primary the client has no connection to is an error.
func (d *Driver) primaries(ctx context.Context) ([]rueidis.Client, error) {
	m, err := d.readSlots(ctx)
	if err != nil {
		return nil, err
	}
	var addrs []string
	first := map[string]int{} // a slot of each primary
	for _, r := range m.ranges {
		if _, ok := first[r.addr]; !ok {
			first[r.addr] = r.first
			addrs = append(addrs, r.addr)
		}
	}
	sort.Strings(addrs)
	out := make([]rueidis.Client, 0, len(addrs))
	for _, addr := range addrs {
		n, ok := m.nodes[addr]
		if !ok {
			return nil, d.unconnected(ctx, addr, keyIn(first[addr]), "a primary of the cluster")
		}
		out = append(out, n)
	}
	return out, nil
}

func scan(ctx context.Context, c rueidis.Client, match, typ string, fn func(key string) error) error {
	var cursor uint64
	for {
		e, err := c.Do(ctx, scanCommand(c, cursor, match, typ)).AsScanEntry()
		if err != nil {
			return err
		}
		for _, key := range e.Elements {
			if err := fn(key); err != nil {
				return err
			}
		}
		if e.Cursor == 0 {
			return nil
		}
		cursor = e.Cursor
	}
}

// scanCommand builds a SCAN that is not flagged read-only, though it is:
// a client given SendToReplicas asks that function about every command,
// and one that sends read-only commands to replicas (cmd.IsReadOnly())
// would walk a replica, which may lag behind its primary, and List would
// leave out a lock taken a moment ago. Like rueidis's own SCAN, it is
// sent again after a connection failure.
func scanCommand(c rueidis.Client, cursor uint64, match, typ string) rueidis.Completed {
	return c.B().Arbitrary("SCAN", strconv.FormatUint(cursor, 10)).
		Args("MATCH", match, "COUNT", "1000", "TYPE", typ).Build().ToRetryable()
}
