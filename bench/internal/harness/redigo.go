package harness

import (
	"context"
	"strings"
	"time"

	"github.com/gomodule/redigo/redis"
)

// newRedigo returns the redigo pool of the dlock-redigo row: as large as a
// go-redis client's pool (callers wait when it is exhausted, as with
// go-redis), its connections counted.
func newRedigo(cfg ClientConfig) *redis.Pool {
	return &redis.Pool{
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			c, err := redis.DialContext(ctx, "tcp", cfg.Addr)
			if err != nil {
				return nil, err
			}
			return &countingConn{Conn: c, c: cfg.Counters}, nil
		},
		MaxIdle:   cfg.PoolSize,
		MaxActive: cfg.PoolSize,
		Wait:      true,
	}
}

// countingConn counts the commands sent on a redigo connection, and a
// round trip when it flushes any. It leaves out the commands of the
// driver's subscription, which dials its connection with the pool's
// DialContext too: go-redis sends a PubSub's commands past its hooks, and
// rueidis on a dedicated connection that countingRueidis does not see.
//
// It is used by one goroutine at a time, as a redigo connection is: the
// pool lends it to one caller, and the subscription writes under a lock.
type countingConn struct {
	redis.Conn
	c       *Counters
	pending bool // commands sent and not flushed yet
}

// sent counts command name (none if "") and, when flush, the round trip
// that carries it with the commands before it.
func (cc *countingConn) sent(name string, flush bool) {
	if name != "" && !pubsubCommand(name) {
		cc.c.Commands.Add(1)
		cc.pending = true
	}
	if flush && cc.pending {
		cc.c.RoundTrips.Add(1)
		cc.pending = false
	}
}

func pubsubCommand(name string) bool {
	switch strings.ToUpper(name) {
	case "SUBSCRIBE", "UNSUBSCRIBE", "PING":
		return true
	}
	return false
}

func (cc *countingConn) Do(name string, args ...any) (any, error) {
	cc.sent(name, true)
	return cc.Conn.Do(name, args...)
}

func (cc *countingConn) Send(name string, args ...any) error {
	cc.sent(name, false)
	return cc.Conn.Send(name, args...)
}

func (cc *countingConn) Flush() error {
	cc.sent("", true)
	return cc.Conn.Flush()
}

// The pool's connections pass on DoContext, ReceiveContext and the
// timeouts only when the connection under them has them.

func (cc *countingConn) DoContext(ctx context.Context, name string, args ...any) (any, error) {
	cc.sent(name, true)
	return redis.DoContext(cc.Conn, ctx, name, args...)
}

func (cc *countingConn) DoWithTimeout(d time.Duration, name string, args ...any) (any, error) {
	cc.sent(name, true)
	return redis.DoWithTimeout(cc.Conn, d, name, args...)
}

func (cc *countingConn) ReceiveContext(ctx context.Context) (any, error) {
	return redis.ReceiveContext(cc.Conn, ctx)
}

func (cc *countingConn) ReceiveWithTimeout(d time.Duration) (any, error) {
	return redis.ReceiveWithTimeout(cc.Conn, d)
}

var (
	_ redis.ConnWithContext = (*countingConn)(nil)
	_ redis.ConnWithTimeout = (*countingConn)(nil)
)
