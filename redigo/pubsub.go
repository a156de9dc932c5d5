package redigo

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/dlockio/dlock"
	"github.com/gomodule/redigo/redis"
)

// The backoff between attempts to connect a subscription again: it starts
// at minBackoff and doubles up to maxBackoff, and starts over once a
// connection has lasted maxBackoff.
const (
	minBackoff = 10 * time.Millisecond
	maxBackoff = time.Second
)

// A subscription's connection is sent a PING every pingEvery, and taken
// for dead, and dialed again, when nothing (not even that PING's reply)
// has come for silentFor: a connection cut off without a reset, or a
// server that hangs, is noticed within seconds, not at TCP keep-alive's
// pace.
var (
	pingEvery = 3 * time.Second
	silentFor = 3 * pingEvery
)

// errClosed is returned by a closed subscription.
var errClosed = errors.New("redigo: subscription closed")

// Subscribe dials a connection of its own with the pool's DialContext (or
// Dial) function, outside the pool and its limits, and checks it with a
// PING (bounded by ctx, or the driver's timeout). A goroutine of the
// subscription reads it (a redis.PubSubConn) and calls notify with each
// message; another sends it a PING every 3s. When the connection fails, or
// nothing came on it for 9s, the first goroutine dials again, with a
// backoff from 10ms to 1s, subscribes again to the subscription's
// channels, and calls notify with an empty channel and payload before the
// first reply on the new connection (see dlock.Subscription). Close closes the connection and waits for both goroutines to
// end.
func (d *Driver) Subscribe(ctx context.Context, notify func(channel, payload string)) (dlock.Subscription, error) {
	s := &subscription{pool: d.pool, notify: notify, channels: map[string]bool{}, done: make(chan struct{}),
		pingEvery: pingEvery, silentFor: silentFor}
	ctx, cancel := d.bound(ctx)
	defer cancel()
	c, err := dial(ctx, s.pool)
	if err != nil {
		return nil, err
	}
	if _, err := do(ctx, d.timeout, c, "PING"); err != nil {
		_ = c.Close()
		return nil, err
	}
	s.conn = c
	s.ctx, s.cancel = context.WithCancel(context.Background())
	go s.run(c)
	return s, nil
}

// subscription is a dlock.Subscription over a connection of its own.
type subscription struct {
	pool   *redis.Pool
	notify func(channel, payload string)
	ctx    context.Context // ends when Close is called
	cancel context.CancelFunc
	done   chan struct{} // closed when run has returned
	close  sync.Once

	pingEvery, silentFor time.Duration // see pingEvery

	// mu guards the writes to the connection: one goroutine reads it, one
	// at a time writes.
	mu       sync.Mutex
	conn     redis.Conn // nil while dialing again, and once closed
	channels map[string]bool
	asked    bool     // a caller's Subscribe came: only the first waits (see Subscribe)
	first    *pending // the first SUBSCRIBE, written on conn, until answered
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

// dial opens a connection with the pool's dial function, outside the pool.
func dial(ctx context.Context, pool *redis.Pool) (redis.Conn, error) {
	switch {
	case pool.DialContext != nil:
		return pool.DialContext(ctx)
	case pool.Dial != nil:
		return pool.Dial()
	}
	return nil, errors.New("redigo: the pool has neither DialContext nor Dial")
}

// run reads the connection and keeps it up until Close.
func (s *subscription) run(c redis.Conn) {
	defer close(s.done)
	delay := minBackoff
	for resumed := false; ; resumed = true {
		since := time.Now()
		s.receive(c, resumed)
		s.drop(c)
		if time.Since(since) >= maxBackoff {
			delay = minBackoff
		}
		if c = s.reconnect(&delay); c == nil {
			return
		}
	}
}

// receive calls notify with every message of c until c fails, falls
// silent, or is closed. It pings c meanwhile (see pingEvery). On a
// connection that resumed the subscription, its first reply (the channels'
// confirmation) is preceded by a call of notify with an empty channel and
// payload (see dlock.Subscription).
func (s *subscription) receive(c redis.Conn, resumed bool) {
	psc := redis.PubSubConn{Conn: c}
	stop, pinged := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(pinged)
		s.ping(c, stop)
	}()
	defer func() {
		close(stop)
		<-pinged
	}()
	for {
		// A read that times out fails the connection (redigo closes it).
		reply := psc.ReceiveWithTimeout(s.silentFor)
		if _, failed := reply.(error); resumed && !failed {
			resumed = false
			if s.ctx.Err() == nil {
				s.notify("", "")
			}
		}
		switch m := reply.(type) {
		case redis.Message:
			if s.ctx.Err() != nil {
				return
			}
			s.notify(m.Channel, string(m.Data))
		case redis.Subscription:
			if m.Kind == "subscribe" {
				s.answer(c, nil)
			}
		case error:
			if c.Err() != nil {
				return
			}
			// An error reply to the first SUBSCRIBE, a channel the
			// server refused (NOPERM), or the answer to a PING or an
			// UNSUBSCRIBE on a connection whose channels the server
			// confirmed: the connection goes on. Any other (BUSY) before
			// anything else on a connection dialed again answered the
			// SUBSCRIBE that resumed the channels: they are not
			// subscribed, and the connection is dialed anew.
			if !s.answer(c, m) && !refusal(m) && resumed {
				return
			}
		}
	}
}

// answer counts a reply on c to the first SUBSCRIBE, while it waits for
// one: a confirmation of one of its channels (err nil), or its refusal,
// whose channels are then forgotten, so that a connection dialed again
// does not ask for them. Once answered, its caller learns the answer. It
// reports whether the reply was the first SUBSCRIBE's.
func (s *subscription) answer(c redis.Conn, err error) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.first
	if s.conn != c || p == nil {
		return false
	}
	if p.left--; err == nil && p.left > 0 {
		return true
	}
	s.first = nil
	if err != nil {
		for _, ch := range p.channels {
			delete(s.channels, ch)
		}
	}
	p.answer <- err
	return true
}

// refusal reports whether err is the server's refusal of a channel
// (NOPERM: a user who may not listen on it, "no permissions to access one
// of the channels"), which leaves the connection as it was.
func refusal(err error) bool {
	msg := err.Error()
	return strings.HasPrefix(msg, "NOPERM") && (strings.Contains(msg, "channel") || strings.Contains(msg, "subscribe'"))
}

// ping sends c a PING every pingEvery until stop is closed, or a PING
// cannot be written (the reader then learns c failed).
func (s *subscription) ping(c redis.Conn, stop <-chan struct{}) {
	t := time.NewTicker(s.pingEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		s.mu.Lock()
		err := error(nil)
		if s.conn == c {
			err = redis.PubSubConn{Conn: c}.Ping("")
		}
		s.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// drop forgets and closes a connection that failed, or at Close. A first
// SUBSCRIBE not answered on it is answered nil: its channels are
// subscribed to once connected again.
func (s *subscription) drop(c redis.Conn) {
	s.mu.Lock()
	if s.conn == c {
		s.conn = nil
		if s.first != nil {
			s.first.answer <- nil
			s.first = nil
		}
	}
	s.mu.Unlock()
	_ = c.Close()
}

// reconnect dials again after *delay, and again with a longer delay after
// each failure, until it succeeds or Close is called (it then returns nil).
func (s *subscription) reconnect(delay *time.Duration) redis.Conn {
	for {
		t := time.NewTimer(*delay)
		select {
		case <-s.ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		*delay = min(2**delay, maxBackoff)
		c, err := dial(s.ctx, s.pool)
		if err != nil {
			continue
		}
		s.mu.Lock()
		if s.ctx.Err() != nil {
			s.mu.Unlock()
			_ = c.Close()
			return nil
		}
		if len(s.channels) > 0 {
			err = redis.PubSubConn{Conn: c}.Subscribe(s.list()...)
		}
		if err == nil {
			s.conn = c
		}
		s.mu.Unlock()
		if err == nil {
			return c
		}
		_ = c.Close()
	}
}

// list returns the subscription's channels. s.mu is held.
func (s *subscription) list() []any {
	out := make([]any, 0, len(s.channels))
	for ch := range s.channels {
		out = append(out, ch)
	}
	return out
}

// Subscribe adds channels. It writes SUBSCRIBE. The first call waits,
// within ctx, for the server's answer, and returns its refusal (NOPERM: an
// ACL user who may not listen on those channels), which dlock logs, its
// waiting callers polling then; the later calls do not wait, as the
// goroutine that reads the answers may be calling notify, which may wait
// for their caller. While the subscription dials again, it only records
// them: they are subscribed to once it is connected.
func (s *subscription) Subscribe(ctx context.Context, channels ...string) error {
	p, err := s.change(true, channels)
	if p == nil || err != nil {
		return err
	}
	select {
	case err := <-p.answer:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-s.ctx.Done():
		return errClosed
	}
}

// Unsubscribe removes channels, as Subscribe adds them.
func (s *subscription) Unsubscribe(_ context.Context, channels ...string) error {
	_, err := s.change(false, channels)
	return err
}

// change writes SUBSCRIBE or UNSUBSCRIBE for channels, and returns the
// first SUBSCRIBE, whose answer its caller waits for.
func (s *subscription) change(subscribe bool, channels []string) (*pending, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return nil, errClosed
	}
	args := make([]any, len(channels))
	for i, ch := range channels {
		args[i] = ch
		if subscribe {
			s.channels[ch] = true
		} else {
			delete(s.channels, ch)
		}
	}
	first := subscribe && !s.asked
	s.asked = s.asked || subscribe
	if s.conn == nil || len(channels) == 0 {
		return nil, nil
	}
	psc := redis.PubSubConn{Conn: s.conn}
	if !subscribe {
		return nil, psc.Unsubscribe(args...)
	}
	if err := psc.Subscribe(args...); err != nil || !first {
		return nil, err
	}
	s.first = &pending{channels: channels, left: len(channels), answer: make(chan error, 1)}
	return s.first, nil
}

// Close closes the connection and waits for the goroutine that calls
// notify to end. It always returns nil.
func (s *subscription) Close() error {
	s.close.Do(func() {
		s.mu.Lock()
		s.cancel()
		c := s.conn
		s.conn = nil
		s.mu.Unlock()
		if c != nil {
			_ = c.Close() // ends the read in progress
		}
	})
	<-s.done
	return nil
}
