// Package goredis lets dlock use a go-redis v9 client: a single node, a
// Sentinel-managed failover client, or a Redis Cluster, anything that
// implements redis.UniversalClient.
//
//	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
//	locks := dlock.New(goredis.New(rdb))
//
// Set ContextTimeoutEnabled: without it go-redis does not apply a context's
// deadline to a request already on a connection, and a server that stops
// answering holds dlock's calls (refreshes, clean-ups, waits) for the
// client's read timeout (3s by default) instead of their own deadlines.
package goredis

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/dlockio/dlock"
	"github.com/redis/go-redis/v9"
)

// Driver carries dlock's requests over a go-redis client.
type Driver struct {
	rdb redis.UniversalClient
}

var _ dlock.Driver = (*Driver)(nil)

// New returns a Driver over rdb. The client stays the caller's: dlock never
// closes it.
func New(rdb redis.UniversalClient) *Driver {
	if rdb == nil {
		panic("goredis: New with a nil client")
	}
	return &Driver{rdb: rdb}
}

// Eval runs the calls by EVALSHA, in one pipeline when there are several,
// and runs again by EVAL those the server answered NOSCRIPT (it had not
// seen the script yet, or has restarted or failed over since).
func (d *Driver) Eval(ctx context.Context, calls ...*dlock.Call) {
	var retry []*dlock.Call
	d.run(ctx, calls, true)
	for _, c := range calls {
		if c.Err != nil && strings.HasPrefix(c.Err.Error(), "NOSCRIPT") {
			retry = append(retry, c)
		}
	}
	if len(retry) > 0 {
		d.run(ctx, retry, false)
	}
}

func (d *Driver) run(ctx context.Context, calls []*dlock.Call, bySHA bool) {
	cmd := func(c redis.Scripter, call *dlock.Call) *redis.Cmd {
		if bySHA {
			return c.EvalSha(ctx, call.Script.SHA1, call.Keys, call.Args...)
		}
		return c.Eval(ctx, call.Script.Src, call.Keys, call.Args...)
	}
	if len(calls) == 1 {
		store(calls[0], cmd(d.rdb, calls[0]))
		return
	}
	cmds := make([]*redis.Cmd, len(calls))
	_, err := d.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, call := range calls {
			cmds[i] = cmd(p, call)
		}
		return nil
	})
	for i, call := range calls {
		if cmds[i].Err() == nil && cmds[i].Val() == nil {
			// go-redis leaves the commands of a pipeline it could not
			// send (no connection, or the context ended before) without
			// an error; a reply, nil included, always sets one of them.
			if err == nil {
				err = errNoReply
			}
			call.Val, call.Err = nil, err
			continue
		}
		store(call, cmds[i])
	}
}

var errNoReply = errors.New("goredis: the pipeline returned no reply")

func store(call *dlock.Call, cmd *redis.Cmd) {
	call.Val, call.Err = cmd.Val(), cmd.Err()
	if errors.Is(call.Err, redis.Nil) {
		call.Val, call.Err = nil, nil
	}
}

// Subscribe opens a go-redis PubSub; go-redis reconnects it and re-subscribes
// its channels after a connection loss.
func (d *Driver) Subscribe(ctx context.Context, notify func(channel, payload string)) (dlock.Subscription, error) {
	ps := d.rdb.Subscribe(ctx)
	s := &subscription{ps: ps, done: make(chan struct{})}
	ch := ps.Channel()
	go func() {
		defer close(s.done)
		for msg := range ch {
			notify(msg.Channel, msg.Payload)
		}
	}()
	return s, nil
}

type subscription struct {
	ps    *redis.PubSub
	done  chan struct{}
	close sync.Once
	err   error
}

func (s *subscription) Subscribe(ctx context.Context, channels ...string) error {
	return s.ps.Subscribe(ctx, channels...)
}

func (s *subscription) Unsubscribe(ctx context.Context, channels ...string) error {
	return s.ps.Unsubscribe(ctx, channels...)
}

func (s *subscription) Close() error {
	s.close.Do(func() {
		s.err = s.ps.Close()
		<-s.done
	})
	return s.err
}

var _ dlock.Scanner = (*Driver)(nil)

// Scan walks the keys matching match of Redis type typ with SCAN, on every
// primary of a cluster.
func (d *Driver) Scan(ctx context.Context, match, typ string, fn func(key string) error) error {
	c, ok := d.rdb.(*redis.ClusterClient)
	if !ok {
		return scan(ctx, d.rdb, match, typ, fn)
	}
	// The primaries are walked at once; fn sees one key at a time, and no
	// more once it returned an error.
	var mu sync.Mutex
	var stop error
	return c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		return scan(ctx, node, match, typ, func(key string) error {
			mu.Lock()
			defer mu.Unlock()
			if stop == nil {
				stop = fn(key)
			}
			return stop
		})
	})
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
// primaries are asked at once. A Ring client is not supported: its shards
// are independent primaries.
func (d *Driver) EvalWait(ctx context.Context, replicas int, timeout time.Duration, calls ...*dlock.Call) (int, error) {
	switch c := d.rdb.(type) {
	case *redis.Client:
		return evalWait(ctx, c, replicas, timeout, calls)
	case *redis.ClusterClient:
		groups := map[*redis.Client][]*dlock.Call{}
		for _, call := range calls {
			node, err := c.MasterForKey(ctx, call.Keys[0])
			if err != nil {
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
		if err != nil {
			return 0, err
		}
		return max(least, 0), nil
	}
	return 0, fmt.Errorf("%w: WAIT through a %T", dlock.ErrUnsupported, d.rdb)
}

// evalWait pipelines the calls and WAIT on one connection of node, by
// EVALSHA, then once more by EVAL for the calls answered NOSCRIPT.
func evalWait(ctx context.Context, node *redis.Client, replicas int, timeout time.Duration, calls []*dlock.Call) (int, error) {
	least := -1
	for _, bySHA := range []bool{true, false} {
		if len(calls) == 0 {
			break
		}
		cmds := make([]*redis.Cmd, len(calls))
		var wait *redis.Cmd
		_, _ = node.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, call := range calls {
				if bySHA {
					cmds[i] = p.EvalSha(ctx, call.Script.SHA1, call.Keys, call.Args...)
				} else {
					cmds[i] = p.Eval(ctx, call.Script.Src, call.Keys, call.Args...)
				}
			}
			wait = p.Do(ctx, "WAIT", replicas, timeout.Milliseconds())
			return nil
		})
		n, err := wait.Int()
		if err != nil {
			return 0, err
		}
		if acked := n; least < 0 || acked < least {
			least = acked
		}
		var again []*dlock.Call
		for i, call := range calls {
			store(call, cmds[i])
			if bySHA && call.Err != nil && strings.HasPrefix(call.Err.Error(), "NOSCRIPT") {
				again = append(again, call)
			}
		}
		calls = again
	}
	return max(least, 0), nil
}
