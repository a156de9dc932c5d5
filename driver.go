package dlock

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Driver carries dlock's requests to Redis. It is the only part of dlock that
// knows a Redis client library: goredis (go-redis v9), dlockrueidis
// (rueidis) and redigo implement it, and package dlocktest checks any
// implementation against real Redis.
//
// A Driver never knows what a lock is: it runs scripts and delivers
// pub/sub notices. Every method must be safe for concurrent use.
type Driver interface {
	// Eval runs every call's script with its keys and arguments, by EVALSHA
	// with a fallback to EVAL when the server answers NOSCRIPT, once per
	// script and server for a pipeline of many calls (see EvalAgain), or by
	// FCALL, when the call has a Lib, and stores each reply in the call. Calls may be sent in one pipeline; each is
	// routed by its first key. Replies are converted to nil (a nil reply),
	// int64, string, or []any of those; an error reply or a failure to send
	// is stored in Call.Err. An error reply inside an array reply is an
	// error value in the []any. The text of an error reply is the server's:
	// dlock learns that it talks to Redis Cluster from a reply that starts
	// with "CROSSSLOT". A failure to find a connection for the call (a
	// client library's pool at its limit) may be an error with a method
	// NotSent() bool that returns true: dlock then sends a release or a
	// clean-up again a little later, as after the server's refusal of a
	// request before it ran. An error that matches ErrClosed says that the
	// client library under the driver was closed, for good: waits end, and
	// the Client stops listening for notices (it closes its Subscription);
	// a driver returns one only when it knows its client was closed.
	Eval(ctx context.Context, calls ...*Call)

	// Subscribe opens a pub/sub connection that calls notify with the
	// channel and payload of every message it receives, from a single
	// goroutine that the driver owns. Subscribe and Unsubscribe on the returned Subscription
	// change the set of channels. ctx bounds the opening only: the
	// subscription lives until Close, after ctx ends. A driver that cannot
	// subscribe returns ErrUnsupported; dlock then wakes waiters by timers
	// and retries alone. A release that frees a lock passes over a waiting
	// client that the server saw subscribed when it registered and no longer
	// sees (PUBSUB NUMSUB), as a client that died; a subscription that the
	// server running the scripts never sees (on another node) is never taken
	// for dead, unless the lock's slot moved to that node from the
	// subscription's after the client registered (it then registers again
	// at its next attempt).
	Subscribe(ctx context.Context, notify func(channel, payload string)) (Subscription, error)
}

// ShardedSubscriber is implemented by drivers that can subscribe to shard
// channels (SSUBSCRIBE, Redis 7) on a Redis Cluster. A notice published on a
// shard channel (SPUBLISH) goes only to the shard that owns the channel's
// slot, where a plain PUBLISH travels to every node of the cluster. On a
// driver that has it, dlock wakes waiters with sharded notices: a client
// waiting for a lock listens on a channel in the lock's own slot.
type ShardedSubscriber interface {
	// SubscribeSharded opens a subscription to shard channels, which
	// calls notify as Subscribe's does, one message at a time, though not
	// always from the same goroutine. Its Subscribe and Unsubscribe take
	// shard channels of any slots; the driver reaches the primary that owns
	// each (where a release sees who listens, PUBSUB SHARDNUMSUB), and
	// follows it through failovers and slot moves. It returns
	// ErrUnsupported where shard channels gain nothing or cannot be had (a
	// single server, a server before Redis 7); dlock then uses Subscribe.
	SubscribeSharded(ctx context.Context, notify func(channel, payload string)) (Subscription, error)
}

// Partitioned is implemented by drivers whose keys live on several
// servers: a Redis Cluster, or a go-redis Ring. A Client over one keeps
// the requests for names on one server from waiting on another: it
// batches the requests to each server apart from the others (see
// WithPipelines; by hash slot for the keys whose server the driver cannot
// tell), and its watchdog refreshes the locks on each server in a
// pipeline of their own, whose replies it takes as they come. A stalled
// or unreachable server then holds up only the requests for its own names
// (on a cluster, until the node timeout: a cluster that requires full
// coverage then refuses every request until a failover).
// A driver that does not implement it is taken for one server: on a
// cluster, one stalled primary can then hold up the client's requests to
// the others, and the automatic refreshes of their locks.
type Partitioned interface {
	// Partitioned reports whether the driver's keys live on several
	// servers. New calls it once.
	Partitioned() bool
	// Server returns the address of the server that a call whose first
	// key is key goes to, as far as the driver knows now, or "" when it
	// cannot tell. The client asks it for every request it sends, so it
	// must be cheap: it may read the cluster's map of slots within ctx
	// when it has none or the one it has is old, but should not otherwise
	// wait on the network.
	Server(ctx context.Context, key string) string
}

// Pooled is implemented by drivers whose client library sends each request
// (a pipeline) on a connection of a bounded pool, one pool for each server,
// and makes a request wait, or fail, when every connection of its pool is
// taken: go-redis (a request beyond PoolSize waits, one beyond a smaller
// MaxActiveConns fails), redigo (MaxActive: waits with Wait set, fails
// without). The watchdog, which sends its refreshes in pipelines of up to
// 1,000 locks, all of a pass at once, then leaves a quarter of each pool
// (at least two connections) free for the client's other calls (acquires,
// releases) and the application's: the pipelines of the locks nearest their
// deadlines go first, and one beyond that share waits for one of the
// watchdog's own to return, for a tenth of the time its locks have left at
// most, and less when the round trips seen on its server say it must go
// sooner to be answered before their deadlines, or once the pipelines out
// there take more than twice as long as any lately (the server has slowed
// down: see watchdog.take). So the share keeps connections for other calls
// before any round trip has been seen, or while the replies are steadily
// slow, on a server slower than the others too; after a sudden slowdown it
// gives way almost at once. A driver that multiplexes
// requests on shared connections (rueidis) has no such pool, and need not
// implement it.
type Pooled interface {
	// PoolSize returns how many requests the client library has on the
	// connections of one server's pool at once before the next waits for
	// one (or fails), or 0 when it does not bound them.
	PoolSize() int
}

// Subscription is a pub/sub connection opened by Driver.Subscribe. The
// driver re-establishes it after a connection loss and re-subscribes its
// channels; notices published meanwhile are lost, which dlock tolerates.
// An error reply to that re-subscribe (BUSY: the server runs another
// client's script) leaves the channels unsubscribed: the driver connects
// again, a little later (dlocktest's BusyAtResubscribe).
// Once the server has confirmed the channels again, the driver calls
// notify once with an empty channel and payload, before any notice the new
// connection delivers: dlock's waiting callers then try again at once,
// instead of at their next timer (up to half a second later). A
// subscription to shard channels does the same once channels it lost (a
// failed connection, a slot that moved) are subscribed anew. A driver that
// never does so still works, its waiters woken by their timers. dlock may
// call Subscribe and Unsubscribe from several goroutines at once, but never
// two calls for one channel at a time.
type Subscription interface {
	// Subscribe adds channels. It may return before the server confirmed
	// them; it must not wait for a notify call under way. The first call
	// of a subscription may wait, within ctx, for the server's answer, so
	// as to return its refusal (NOPERM: a user who may not listen on
	// those channels), which dlock logs: dlock makes it before any notice
	// can come, holding nothing notify needs. A later channel that the
	// server refuses costs only that channel, at least until the
	// connection is made again: the connection goes on delivering the
	// others' notices (dlocktest's LaterRefused and ShardedLaterRefused).
	Subscribe(ctx context.Context, channels ...string) error
	// Unsubscribe removes channels.
	Unsubscribe(ctx context.Context, channels ...string) error
	// Close closes the connection; notify is not called after Close returns.
	Close() error
}

// Script is a Lua script that dlock runs on the server.
type Script struct {
	Name string // a short name, such as "acquire", for logs and errors
	Src  string // the Lua source
	SHA1 string // hex SHA1 of Src, the name EVALSHA knows it by
	// Function is the script's name in FunctionLibrary, the name FCALL
	// knows it by; empty for a script that is not in it.
	Function string

	body string // for dlock's own scripts, Src without the helpers in front
	// shaArg and fnArg are SHA1 and Function boxed once, as the drivers
	// that take a command's arguments as values send them (see
	// friend.ScriptArg); nil until made (by NewScript, FunctionLibrary).
	shaArg, fnArg any
}

// NewScript returns a Script with its SHA1 computed.
func NewScript(name, src string) *Script {
	sum := sha1.Sum([]byte(src))
	s := &Script{Name: name, Src: src, SHA1: hex.EncodeToString(sum[:])}
	s.shaArg = s.SHA1
	return s
}

// arg returns the script's Function (function set) or SHA1 as a command
// argument: boxed once, unless the field changed since (a Script a caller
// made or changed itself).
func (s *Script) arg(function bool) any {
	if function {
		if v, ok := s.fnArg.(string); ok && v == s.Function {
			return s.fnArg
		}
		return s.Function
	}
	if v, ok := s.shaArg.(string); ok && v == s.SHA1 {
		return s.shaArg
	}
	return s.SHA1
}

// Call is one script invocation carried by a Driver.
type Call struct {
	Script *Script  // the script to run
	Keys   []string // its keys; the first routes the call on a cluster
	Args   []any    // its arguments: strings, []byte and integers
	// Lib is set when the client runs its scripts as Redis Functions
	// (WithFunctions): the driver then sends FCALL Script.Function instead
	// of EVALSHA, and loads Lib (FUNCTION LOAD) on a server that
	// answers that the function is missing, and then calls again (see
	// Unknown and Resend). A driver that does not know Lib may
	// ignore it: EVALSHA does the same work.
	Lib *Library

	// Set by the driver.
	Val any   // the reply: nil, int64, string or []any
	Err error // an error reply, or why the call could not be made

	alone [1]*Call // see one
	// waitBy is when the WAIT of a lone call confirmed on replicas is to
	// end, its WithReplicas timeout from when it was made, however long it
	// queued (see waitLane); zero for the others.
	waitBy time.Time
}

// one returns a slice of the call alone, without allocating one.
func (c *Call) one() []*Call {
	c.alone[0] = c
	return c.alone[:]
}

// unknownScript reports whether err is a server's answer that it does not
// know a call's script (NOSCRIPT) or function: the call did not run, and a
// driver's second round sends it again.
func unknownScript(err error) bool {
	msg := err.Error()
	return strings.HasPrefix(msg, "NOSCRIPT") || strings.HasPrefix(msg, "ERR Function not found")
}

// Unknown returns, for a driver's second round, the calls the server
// answered without knowing their script (NOSCRIPT: send them again by
// EVAL) or their function (send them again by FCALL once lib, the library
// of the first of them that has one, is loaded; nil when none has).
func Unknown(calls []*Call) (again []*Call, lib *Library) {
	for _, c := range calls {
		if c.Err == nil {
			continue
		}
		if unknownScript(c.Err) {
			again = append(again, c)
			if lib == nil {
				lib = c.Lib
			}
		}
	}
	return again, lib
}

// ConnectionClosed reports whether err says that the connection a request
// went on was closed under it: EOF, a reset, a broken pipe, or a
// connection the client library closed after one of those. A driver whose
// client library does not send such a request again on another connection
// does it itself (dlock's scripts count a request that ran twice once).
func ConnectionClosed(err error) bool {
	return err != nil && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed))
}

// Loaded sorts the calls of a server that was asked to load their library
// (FUNCTION LOAD, without REPLACE) and answered err. The calls that run by
// EVAL (no Lib) are returned as again, to send again, whatever err; so are
// the others when err is nil, or when the server has a library of that
// name already (another client loaded it since their calls found it
// missing: the name is drawn from the library's code, so it is this one,
// and is not compiled again). A
// refusal for want of memory (a server at its maxmemory refuses FUNCTION
// LOAD, where the scripts that give locks up still run by EVAL) returns
// them as scripts, to run by AsScripts. So does a refusal of the
// permission to load functions (an ACL user that may FCALL but not
// FUNCTION LOAD, whose library an operator loaded and someone deleted
// since) for the calls that give locks up or keep them (a release, a
// refresh: the scripts a full server runs too), so that they are not left
// held; the others get the refusal, which tells that the library is
// missing. Any other error is stored in them.
func Loaded(calls []*Call, err error) (again, scripts []*Call) {
	if err == nil {
		return calls, nil
	}
	msg := err.Error()
	oom := strings.HasPrefix(msg, "OOM ")
	noLoad := strings.HasPrefix(msg, "NOPERM ") && strings.Contains(msg, "'function|load'")
	for _, c := range calls {
		switch {
		case c.Lib == nil, libraryExists(msg, c.Lib):
			again = append(again, c)
		case oom, noLoad && givesUp[c.Script]:
			scripts = append(scripts, c)
		default:
			c.Val, c.Err = nil, err
		}
	}
	return again, scripts
}

// libraryExists reports whether msg is Redis's refusal to load lib because
// a library of its name is loaded already (with or without the "ERR "
// prefix, which some client libraries drop).
func libraryExists(msg string, lib *Library) bool {
	rest, ok := strings.CutPrefix(strings.TrimPrefix(msg, "ERR "), "Library '")
	if !ok {
		return false
	}
	name, ok := strings.CutSuffix(rest, "' already exists")
	return ok && name == lib.Name
}

// AsScripts runs calls through run as calls without a Lib (by EVALSHA or
// EVAL, as run sends calls without one), and stores their replies in them.
// A driver runs so the calls whose server could not load the library for
// want of memory (see Loaded), and those answered once more that their
// function is missing after it was loaded (someone deleted it meanwhile).
func AsScripts(calls []*Call, run func(calls []*Call)) {
	if len(calls) == 0 {
		return
	}
	plain := make([]*Call, len(calls))
	for i, c := range calls {
		// With its error so far, should run not send it.
		plain[i] = &Call{Script: c.Script, Keys: c.Keys, Args: c.Args, Err: c.Err}
	}
	run(plain)
	for i, c := range calls {
		c.Val, c.Err = plain[i].Val, plain[i].Err
	}
}

// Resend is a driver's second round, for the calls Unknown returned (and
// their library): those the server answered NOSCRIPT go again with their
// script's text (see EvalAgain); those answered that their function is
// missing go again by FCALL once load has loaded lib where they ran (load
// returns them as Loaded does), or as scripts (see AsScripts), as do those
// whose function is missing still. run sends calls as a second round does:
// through EvalAgain, which sends by FCALL those with a Lib.
func Resend(again []*Call, lib *Library, load func(lib *Library, calls []*Call) (again, scripts []*Call), run func(calls []*Call)) {
	var scripts []*Call
	if lib != nil {
		again, scripts = load(lib, again)
	}
	if len(again) > 0 {
		run(again)
	}
	missing, _ := Unknown(again) // a function deleted again meanwhile
	AsScripts(append(scripts, missing...), run)
}

// ResendWait is Resend for a driver's EvalWait, each of whose passes sends
// WAIT after its calls: pass sends calls as EvalAgain's pass does, with
// WAIT after them in the same pipeline, and returns how many replicas
// acknowledged them. Every pass that sends a call again so waits: the
// writes of a call sent by EVALSHA behind another's EVAL, or in a later
// round, are confirmed as those of the first. It returns the fewest of
// least and the passes' counts, or the error of the first pass that
// failed, after which nothing more is sent (the calls not sent are given
// that error).
func ResendWait(again []*Call, lib *Library, least int, load func(lib *Library, calls []*Call) (again, scripts []*Call), pass func(calls []*Call, byEval []bool) (int, error)) (int, error) {
	var err error
	Resend(again, lib, load, func(calls []*Call) {
		if err != nil {
			for _, c := range calls {
				c.Val, c.Err = nil, err
			}
			return
		}
		err = EvalAgain(calls, func(calls []*Call, byEval []bool) error {
			acked, err := pass(calls, byEval)
			if err == nil {
				least = min(least, acked)
			}
			return err
		})
	})
	return least, err
}

// EvalAgain sends again, for a driver's second round (Resend's run), calls
// the server answered NOSCRIPT: pass sends calls in one pipeline, by EVAL
// those whose byEval is true and by EVALSHA the others (by FCALL, whatever
// byEval says, those with a Lib whose Script has a Function), and stores
// their replies. The first call of each script goes by EVAL, which loads
// the script where it runs, and the calls after it by EVALSHA, behind it
// in the same pipeline: a pipeline of many calls of one script (ls of
// 54,000 names on a server just restarted) sends the script's text (35 KB
// for the inspection script) once, not once for each call, which wrote
// some 1.9 GB and failed at the client's write timeout. Those answered
// NOSCRIPT all the same (on a cluster, whose other primaries the first
// call did not reach; after a SCRIPT FLUSH in between) go again so, each
// round sending every script once more to one server at least that lacks
// it, for up to 16 rounds in all, the last by EVAL alone. A call answered
// NOSCRIPT did not run: sending it again is safe. A pass that returns an
// error ends EvalAgain, which returns it: the calls that would have gone
// again get it.
func EvalAgain(calls []*Call, pass func(calls []*Call, byEval []bool) error) error {
	for round := 1; len(calls) > 0; round++ {
		byEval := make([]bool, len(calls))
		var sent []string // the SHA1s of the scripts sent by EVAL this round
		for i, c := range calls {
			switch {
			case c.Lib != nil && c.Script.Function != "": // by FCALL
			case round == evalRounds || len(calls) == 1:
				byEval[i] = true
			case !slices.Contains(sent, c.Script.SHA1):
				byEval[i] = true
				sent = append(sent, c.Script.SHA1)
			}
		}
		err := pass(calls, byEval)
		var again []*Call
		for i, c := range calls {
			if !byEval[i] && c.Err != nil && strings.HasPrefix(c.Err.Error(), "NOSCRIPT") &&
				(c.Lib == nil || c.Script.Function == "") {
				again = append(again, c)
			}
		}
		if err != nil {
			for _, c := range again {
				c.Val, c.Err = nil, err
			}
			return err
		}
		calls = again
	}
	return nil
}

// evalRounds bounds EvalAgain's rounds: on a cluster, each loads the
// scripts on one more primary at least (three primaries take three), and a
// server whose scripts are flushed again and again does not keep it going.
const evalRounds = 16

// FailFunctions stores err, why the function library could not be loaded,
// in the calls that run by FCALL, and returns the others.
func FailFunctions(calls []*Call, err error) (rest []*Call) {
	for _, c := range calls {
		if c.Lib != nil {
			c.Val, c.Err = nil, err
		} else {
			rest = append(rest, c)
		}
	}
	return rest
}
