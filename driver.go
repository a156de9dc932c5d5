package dlock

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
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
	// with a fallback to EVAL when the server answers NOSCRIPT, and stores
	// each reply in the call. Calls may be sent in one pipeline; each is
	// routed by its first key. Replies are converted to nil (a nil reply),
	// int64, string, or []any of those; an error reply or a failure to send
	// is stored in Call.Err. An error reply inside an array reply is an
	// error value in the []any. The text of an error reply is the server's:
	// dlock learns that it talks to Redis Cluster from a reply that starts
	// with "CROSSSLOT".
	Eval(ctx context.Context, calls ...*Call)

	// Subscribe opens a pub/sub connection that calls notify with the
	// channel and payload of every message it receives, from a single
	// goroutine that the driver owns. Subscribe and Unsubscribe on the returned Subscription
	// change the set of channels. A driver that cannot subscribe returns
	// ErrUnsupported; dlock then wakes waiters by timers and retries alone.
	Subscribe(ctx context.Context, notify func(channel, payload string)) (Subscription, error)
}

// Subscription is a pub/sub connection opened by Driver.Subscribe. The
// driver re-establishes it after a connection loss and re-subscribes its
// channels; notices published meanwhile are lost, which dlock tolerates.
type Subscription interface {
	// Subscribe adds channels. It may return before the server confirmed
	// them; it must not wait for a notify call under way.
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
}

// NewScript returns a Script with its SHA1 computed.
func NewScript(name, src string) *Script {
	sum := sha1.Sum([]byte(src))
	return &Script{Name: name, Src: src, SHA1: hex.EncodeToString(sum[:])}
}

// Call is one script invocation carried by a Driver.
type Call struct {
	Script *Script
	Keys   []string
	Args   []any // strings, []byte and integers

	// Set by the driver.
	Val any   // the reply: nil, int64, string or []any
	Err error // an error reply, or why the call could not be made
}
