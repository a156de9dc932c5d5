package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/dlockio/dlock"
)

// statusEvery is how often the waiting status is looked up and redrawn.
const statusEvery = time.Second

// redisDown is the cause of a wait given up because Redis could not be
// reached for unreachableWait.
type redisDown struct{ err error }

func (r redisDown) Error() string { return "Redis unreachable: " + r.err.Error() }

// waiter reports run's wait for a lock: on a terminal one status line,
// redrawn in place; otherwise a log line on stderr when the wait starts and
// each time the holder changes. It also gives the wait up once Redis has
// been unreachable for unreachableWait.
type waiter struct {
	a      *app
	c      *conn
	name   string
	quiet  bool
	tty    bool
	cancel context.CancelCauseFunc // ends the wait

	begin    sync.Once
	begun    chan struct{} // closed at the first failed attempt
	halt     chan struct{} // closed by stop
	done     chan struct{} // closed when the goroutine returns
	failedAt time.Time     // when the first attempt failed; set before begun closes

	mu       sync.Mutex
	errSince time.Time // when Redis errors began, zero while it answers
	lastErr  error
}

func (a *app) newWaiter(c *conn, name string, quiet bool, cancel context.CancelCauseFunc) *waiter {
	w := &waiter{
		a: a, c: c, name: name, quiet: quiet, cancel: cancel,
		tty:   !quiet && isTerminal(a.stderr),
		begun: make(chan struct{}), halt: make(chan struct{}), done: make(chan struct{}),
	}
	go w.report()
	return w
}

// onRetry is called by Lock, on its goroutine, after each failed attempt.
func (w *waiter) onRetry(failed int, err error) {
	w.begin.Do(func() {
		w.failedAt = time.Now()
		close(w.begun)
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	if errors.Is(err, dlock.ErrNotObtained) {
		w.errSince, w.lastErr = time.Time{}, nil
		return
	}
	if w.errSince.IsZero() {
		w.errSince = time.Now()
	}
	w.lastErr = err
	if time.Since(w.errSince) >= unreachableWait {
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
		return fmt.Sprintf("waiting for %s — Redis unreachable (%v); retrying", quote(w.name), oneLine(libMsg(rerr))), "unreachable"
	}
	ictx, cancel := context.WithTimeout(ctx, statusEvery)
	defer cancel()
	info, err := w.c.locks.Inspect(ictx, w.name)
	switch {
	case err != nil:
		return fmt.Sprintf("waiting for %s", quote(w.name)), "unknown"
	case len(info.Holders) == 0:
		return fmt.Sprintf("waiting for %s — just released", quote(w.name)), "free"
	}
	key = fmt.Sprint(len(info.Holders))
	for _, h := range info.Holders {
		key += fmt.Sprintf(" %d", h.Fence)
	}
	return fmt.Sprintf("waiting for %s — held by %s", quote(w.name), heldBy(info, time.Now())), key
}

// draw replaces the status line, cut to the terminal's width so that it
// never wraps (a wrapped line could not be redrawn in place).
func (w *waiter) draw(line string) {
	if f, ok := w.a.stderr.(*os.File); ok {
		if width := termWidth(f); width > 1 {
			if r := []rune(line); len(r) > width-1 {
				line = string(r[:width-2]) + "…"
			}
		}
	}
	fmt.Fprintf(w.a.stderr, "\r%s\x1b[K", line)
}
