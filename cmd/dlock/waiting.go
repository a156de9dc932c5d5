package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlockio/dlock"
)

// statusEvery is how often the waiting status is looked up and redrawn.
const statusEvery = time.Second

// redisDown is the cause of a wait given up because Redis could not be
// reached for unreachableWait.
type redisDown struct{ err error }

func (r redisDown) Error() string { return downWords(r.err) + ": " + r.err.Error() }

// downWords says why Redis cannot be used for a while, as err shows: busy
// or not ready (see passing), or unreachable.
func downWords(err error) string {
	switch {
	case notReplicated(err):
		return "not confirmed by replicas"
	case full(err):
		return "Redis full (maxmemory)"
	case readOnly(err):
		return "Redis is a replica (read-only)"
	case cannotSave(err):
		return "Redis cannot save to disk (MISCONF)"
	case clusterDown(err):
		return "Redis Cluster down"
	case passing(err):
		return "Redis busy or not ready"
	}
	return "Redis unreachable"
}

// isTimeout reports whether err is a timeout of the network: a request
// that its deadline ended.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// redisRefused is the cause of a wait given up at once because Redis
// refused an attempt in a way that retrying cannot change (see denied).
type redisRefused struct{ err error }

func (r redisRefused) Error() string { return "Redis refused: " + r.err.Error() }

// cutShort reports whether err is that of an attempt cut short by the end
// of the wait, which says nothing about Redis. An acquire whose replicas
// did not confirm it in time was not: it may match
// context.DeadlineExceeded too, when the reply did not come by the WAIT's
// timeout (see dlock.WithReplicas).
func cutShort(err error) bool {
	return !notReplicated(err) && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded))
}

// waiter reports run's wait for a lock: on a terminal one status line,
// redrawn in place; otherwise a log line on stderr when the wait starts and
// each time the holder changes. It also gives the wait up once Redis has
// been unreachable for unreachableWait, at once when Redis refuses an
// attempt for good, and at the end of --wait (see giveUpAfter).
type waiter struct {
	a      *app
	c      *conn
	name   string
	self   string // the metadata of the hold the wait asks for: its own, once granted
	kind   kind   // the hold the wait asks for
	quiet  bool
	tty    bool
	cancel context.CancelCauseFunc // ends the wait

	begin    sync.Once
	begun    chan struct{} // closed at the first failed attempt
	halt     chan struct{} // closed by stop
	done     chan struct{} // closed when the goroutine returns
	failedAt time.Time     // when the first attempt failed; set before begun closes

	limit   time.Duration // --wait, zero for none
	ctx     *waitCtx      // the attempts' context, with limit
	started time.Time     // when the wait began, with limit
	timer   *time.Timer   // ends the wait after limit, from the first failed attempt on; nil before

	mu       sync.Mutex
	answered time.Time // when an attempt last found the lock held, or the wait began
	lastErr  error     // the last attempt's error, nil if the lock was held
	held     bool      // an attempt found the lock held
}

// firstTry is how long the first attempt may take however short --wait
// is: a free lock is obtained even with --wait 1ns, and a wait that ends
// is known to have found the lock held, or Redis failing.
const firstTry = pingTimeout

// giveUpAfter ends the wait with errWaitedOut once d has passed since it
// began, or once the first attempt has failed if that is later: until then
// the wait's deadline, firstTry at least, bounds it (see obtain). It
// returns the context for the attempts, ctx with the deadline moved to
// the wait's end once the first attempt has failed (see waitCtx).
func (w *waiter) giveUpAfter(ctx context.Context, d time.Duration) context.Context {
	w.limit = d
	w.ctx = &waitCtx{Context: ctx}
	return w.ctx
}

// waitCtx is the context of the attempts of a wait with a --wait: its
// deadline is the first attempt's (firstTry at least) until that attempt
// has failed, and --wait's end from then on. The waiter ends the wait then
// by cancelling it, and go-redis ends a request under way at its
// context's deadline only (ContextTimeoutEnabled), not at its
// cancellation: with the first attempt's deadline, an attempt sent just
// before --wait's end ran on for its read timeout, up to that deadline.
// The contexts the library derives from it without a deadline of their
// own (WithCancel, or a WithTimeout longer than its deadline) ask it for
// its deadline each time, and so see it move. The context package asks
// that successive calls of Deadline return the same: this one moves once,
// only earlier, to when the waiter's timer cancels it (so Done closes at
// the deadline it then reports), and only the attempts of this one wait
// use it.
type waitCtx struct {
	context.Context
	end atomic.Int64 // --wait's end in Unix nanoseconds, once the first attempt failed; 0 before
}

func (c *waitCtx) Deadline() (time.Time, bool) {
	d, ok := c.Context.Deadline()
	if e := c.end.Load(); e != 0 {
		if end := time.Unix(0, e); !ok || end.Before(d) {
			return end, true
		}
	}
	return d, ok
}

// pastEnd reports whether --wait has ended, so that an attempt's timeout
// may be the deadline of waitCtx, which cuts it short.
func (w *waiter) pastEnd() bool {
	return w.limit > 0 && !time.Now().Before(w.started.Add(w.limit))
}

// outcome returns what the attempts found: the last one's error, nil if
// it found the lock held, and whether any found it held.
func (w *waiter) outcome() (lastErr error, held bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastErr, w.held
}

func (a *app) newWaiter(c *conn, name, self string, k kind, quiet bool, cancel context.CancelCauseFunc, begin time.Time) *waiter {
	w := &waiter{
		a: a, c: c, name: name, self: self, kind: k, quiet: quiet, cancel: cancel,
		tty:   !quiet && isTerminal(a.stderr),
		begun: make(chan struct{}), halt: make(chan struct{}), done: make(chan struct{}),
		answered: begin, started: begin,
	}
	go w.report()
	return w
}

// onRetry is called by Lock, on its goroutine, after each failed attempt.
func (w *waiter) onRetry(failed int, err error) {
	if denied(err) {
		// Ended before it is reported as a wait, which it is not.
		w.cancel(redisRefused{err})
		return
	}
	// Recorded before the report starts, which reads the record first: the
	// first waiting line says what the first attempt met.
	w.record(err)
	w.begin.Do(func() {
		w.failedAt = time.Now()
		if w.limit > 0 {
			w.ctx.end.Store(w.started.Add(w.limit).UnixNano())
			w.timer = time.AfterFunc(max(w.limit-time.Since(w.started), 0), func() { w.cancel(errWaitedOut) })
		}
		close(w.begun)
	})
}

// record keeps what a failed attempt met: the lock held, or Redis failing,
// which ends the wait once it has lasted unreachableWait.
func (w *waiter) record(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case errors.Is(err, dlock.ErrNotObtained):
		w.answered, w.lastErr, w.held = time.Now(), nil, true
		return
	case cutShort(err), w.pastEnd() && isTimeout(err):
		// An attempt cut short by the wait's end (waitCtx's deadline, which
		// go-redis reports as a timeout) says nothing about Redis.
		return
	}
	// Counted from the last answer, not from this first failure, which
	// comes a read timeout or more into an outage.
	w.lastErr = err
	if time.Since(w.answered) >= unreachableWait {
		w.cancel(redisDown{err})
	}
}

// waited reports whether the lock was held when run first asked.
func (w *waiter) waited() bool {
	select {
	case <-w.begun:
		return true
	default:
		return false
	}
}

// since returns how long run has waited.
func (w *waiter) since() time.Duration {
	if !w.waited() {
		return 0
	}
	return time.Since(w.failedAt)
}

// stop ends the reporting, clears the status line and waits for the
// goroutine to return.
func (w *waiter) stop() {
	if w.timer != nil {
		w.timer.Stop()
	}
	close(w.halt)
	<-w.done
}

func (w *waiter) report() {
	defer close(w.done)
	select {
	case <-w.begun:
	case <-w.halt:
		return
	}
	if w.quiet {
		<-w.halt
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-w.halt:
			cancel() // abandon a lookup under way
		case <-ctx.Done():
		}
	}()
	drawn, last := false, ""
	tick := time.NewTicker(statusEvery)
	defer tick.Stop()
	for {
		line, key := w.status(ctx)
		if ctx.Err() == nil {
			if w.tty {
				w.draw(line)
				drawn = true
			} else if key != last {
				fmt.Fprintf(w.a.stderr, "dlock: %s\n", line)
			}
			last = key
		}
		select {
		case <-tick.C:
		case <-w.halt:
			if drawn {
				fmt.Fprint(w.a.stderr, "\r\x1b[K")
			}
			return
		}
	}
}

// status looks up the holder and returns the status line, and a key that
// changes when the holder does.
func (w *waiter) status(ctx context.Context) (line, key string) {
	w.mu.Lock()
	rerr := w.lastErr
	w.mu.Unlock()
	if rerr != nil {
		return fmt.Sprintf("waiting for %s — %s (%v); retrying", quote(w.name), downWords(rerr), oneLine(libMsg(rerr))), "unreachable"
	}
	ictx, cancel := context.WithTimeout(ctx, statusEvery)
	defer cancel()
	info, err := w.c.locks.Inspect(ictx, w.name)
	if err != nil {
		return fmt.Sprintf("waiting for %s — holder unknown (%v)", quote(w.name), oneLine(libMsg(err))), "unknown"
	}
	return w.heldLine(info)
}

// heldLine returns the status line and key of a lock whose record is info.
func (w *waiter) heldLine(info *dlock.Info) (line, key string) {
	// A release may grant the lock to this wait before it hears of it
	// (at its next attempt, without notices): its own hold is no holder
	// to wait for.
	if len(info.Holders) == 0 || info.Holders[0].Metadata == w.self && len(info.Holders) == 1 {
		return fmt.Sprintf("waiting for %s — just released", quote(w.name)), "free"
	}
	key = fmt.Sprint(len(info.Holders))
	for _, h := range info.Holders {
		key += fmt.Sprintf(" %d", h.Fence)
	}
	held := "held by " + heldBy(info, time.Now())
	switch {
	case w.kind.writerFirst(info):
		held, key = w.kind.writerFirstText("it too")+"; "+held, "writer first "+key
	case w.kind.permitRule(info) != "":
		held, key = held+", and "+w.kind.permitRule(info), fmt.Sprintf("of %d %s", info.Permits, key)
	}
	return fmt.Sprintf("waiting for %s — %s", quote(w.name), held), key
}

// draw replaces the status line, cut to the terminal's width (see
// fitWidth).
func (w *waiter) draw(line string) {
	fmt.Fprintf(w.a.stderr, "\r%s\x1b[K", fitWidth(w.a.stderr, line))
}
