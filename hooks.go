package dlock

import (
	"context"
	"errors"
	"runtime/debug"
	"time"
)

// Hooks are functions a Client calls as the locks it acquires come and go,
// so that metrics and traces can follow them without dlock depending on a
// telemetry library; package github.com/dlockio/dlock/otel turns them into
// OpenTelemetry metrics and spans. Every field may be nil.
//
// The hooks follow every acquisition (exclusive locks, read and write
// holds, permits) from the moment its names are found valid, and the
// Locks it obtains until they end; locks obtained by Attach are not
// followed. Each obtained lock ends exactly once, and End says so. They
// run on the goroutine doing the work (the watchdog's for automatic
// refreshes, or on a Partitioned driver the one of its goroutines that
// refreshes the locks of the lock's server, a timer's for a deadline that
// passes, the caller's when Err or Done finds the deadline passed), so
// several at once, and must return quickly. A hook may
// call the Lock's methods, but not Client.Close: Close waits for the
// watchdog, which may be the goroutine running the hook.
//
// Hooks should not panic. A panic in one set does not keep the others from
// their call, and goes on once they had it. On the caller's goroutine it
// reaches the caller: a panic in Retry or AcquireDone ends the acquisition
// (a lock it obtained is given back, unless it was obtained WithToken,
// whose hold may be another Lock's too; its End comes, with an error
// wrapping ErrLost, when AcquireDone said obtained), one in Refresh or End
// goes on once the lock's end is counted (its Done closed, when a refresh
// found it lost), and one in AcquireStart or ReleaseStart leaves the hooks
// given before it without their Done call (an open span), and the release
// is not sent. On a goroutine of dlock's own (the watchdog's, a deadline
// timer's) no caller could take it, and it would end the program with every
// lock in it: dlock recovers it, logs it at level Error with its stack (see
// WithLogger; without a logger it goes unseen), and goes on as if the hook
// had returned. So it does for the locks a Redlock Locker takes on its
// nodes (package redlock), which it calls on goroutines of its own.
type Hooks struct {
	// AcquireStart is called when an acquisition begins. The context it
	// returns (ctx, or one derived from it, such as one carrying a span) is
	// the one the acquisition runs under and the one AcquireDone and Retry
	// get.
	AcquireStart func(ctx context.Context, h HookInfo) context.Context
	// Retry is called after each failed attempt of a waiting acquisition,
	// the last before it gives up included (not one refused for good, as
	// with ErrWrongType, ErrKindMismatch or an ACL refusal, which ends the
	// acquisition at once): failed attempts so far, and why the last one
	// failed (ErrNotObtained while the lock is held, or a Redis error).
	Retry func(ctx context.Context, h HookInfo, failed int, err error)
	// AcquireDone is called when the acquisition ends, obtained or not.
	AcquireDone func(ctx context.Context, h HookInfo, r AcquireResult)

	// Refresh is called after every refresh of an obtained lock, by
	// Lock.Refresh or by the watchdog: err is nil when the lock was
	// extended. The watchdog refreshes a lock from the moment it is
	// obtained, so its first Refresh calls may come before the lock's
	// AcquireDone hooks have returned (before a later set's is called)
	// when they, or the caller's goroutine, take longer than its refresh
	// interval; its End still comes after them.
	Refresh func(ctx context.Context, h HookInfo, err error)

	// ReleaseStart is called when Release begins; the context it returns
	// is the one the release runs under and the one ReleaseDone gets.
	ReleaseStart func(ctx context.Context, h HookInfo) context.Context
	// ReleaseDone is called when Release returns: held is how long the
	// lock was held, from the request that obtained it.
	ReleaseDone func(ctx context.Context, h HookInfo, held time.Duration, err error)

	// End is called exactly once for every lock AcquireDone reported
	// obtained, when it ends, before its Done channel closes, and never
	// before that AcquireDone: a lock that ended while the AcquireDone
	// hooks ran (a TTL shorter than they took) ends for the hooks right
	// after them, its Done closed by then (its caller has not had the Lock
	// yet, so nobody waits on it). err is nil when a Release ended it, and wraps ErrLost
	// when it was lost (a refresh or a release found it expired or taken,
	// or its deadline passed without a refresh), as Lock.Err then does, or
	// when a panic in a hook ended the acquisition before its caller got
	// the lock, which is given back then. held is how long it was held. A
	// Release that comes after the lock was lost reports to ReleaseDone
	// only. While the End hooks run, the lock has ended for every other
	// call: a Release, Refresh or TTL on another goroutine returns what
	// its end says (ErrNotHeld, or nil for a Release after a release) and
	// may do so before Done closes, which comes once the hooks return. (A
	// hook may call the Lock's methods, so they do not wait for it.)
	End func(h HookInfo, held time.Duration, err error)
}

// HookInfo says which acquisition or lock a hook is about.
type HookInfo struct {
	Mode  string   // ModeExclusive, ModeRead, ModeWrite or ModePermit
	Names []string // the names; shared, not to be modified
	Wait  bool     // the acquisition waits (Lock, RLock, Acquire, …), not Try…
}

// AcquireResult is the outcome of an acquisition, given to
// Hooks.AcquireDone.
type AcquireResult struct {
	Outcome  string        // OutcomeObtained, OutcomeNotObtained or OutcomeError
	Wait     time.Duration // from AcquireStart to the outcome
	Attempts int           // acquire requests sent; a lock a release granted to the waiter came with no request of its own
	Fence    uint64        // the lock's fence, when obtained (see Lock.Fence)
	Err      error         // nil when obtained
}

// The outcomes of an acquisition, as AcquireResult.Outcome reports them.
const (
	// OutcomeObtained: the lock was obtained.
	OutcomeObtained = "obtained"
	// OutcomeNotObtained: the lock was held by another; TryLock found it
	// taken, or Lock gave up waiting for it (its error matches
	// ErrNotObtained). A wait whose last answer from Redis was a failure,
	// or that got none, is an OutcomeError.
	OutcomeNotObtained = "not_obtained"
	// OutcomeError: Redis failed, or refused the request for a reason that
	// retrying does not change (such as ErrWrongType).
	OutcomeError = "error"
)

// WithHooks adds hooks to the client. Given more than once, every set is
// called, in the order given.
func WithHooks(h Hooks) ClientOption {
	return func(c *Client) { c.hooks = append(c.hooks, h) }
}

// outcome classifies an acquisition's error.
func outcome(err error) string {
	switch {
	case err == nil:
		return OutcomeObtained
	case errors.Is(err, ErrNotObtained):
		return OutcomeNotObtained
	default:
		return OutcomeError
	}
}

// hooked is what the hooks know of one acquisition and the lock it
// obtains.
type hooked struct {
	c    *Client
	info HookInfo
	// logged: the hooks' panics are logged, as on dlock's own goroutines,
	// not raised; the acquisition's caller is a goroutine of package
	// redlock's own (see friend.LogHookPanics).
	logged bool
}

func (h *hooked) acquireStart(ctx context.Context) context.Context {
	return h.starts(ctx, "AcquireStart", func(k *Hooks) func(context.Context, HookInfo) context.Context { return k.AcquireStart })
}

func (h *hooked) retry(ctx context.Context, failed int, err error) {
	h.each("Retry", func(k *Hooks) {
		if k.Retry != nil {
			k.Retry(ctx, h.info, failed, err)
		}
	})
}

func (h *hooked) acquireDone(ctx context.Context, r AcquireResult) {
	h.each("AcquireDone", func(k *Hooks) {
		if k.AcquireDone != nil {
			k.AcquireDone(ctx, h.info, r)
		}
	})
}

func (h *hooked) refresh(ctx context.Context, err error) {
	h.raise("Refresh", h.refreshed(ctx, err))
}

// refreshed calls the Refresh hooks, and returns the first panic of one
// (nil for none), for the watchdog, which logs it.
func (h *hooked) refreshed(ctx context.Context, err error) *hookPanic {
	return h.all(func(k *Hooks) {
		if k.Refresh != nil {
			k.Refresh(ctx, h.info, err)
		}
	})
}

func (h *hooked) releaseStart(ctx context.Context) context.Context {
	return h.starts(ctx, "ReleaseStart", func(k *Hooks) func(context.Context, HookInfo) context.Context { return k.ReleaseStart })
}

func (h *hooked) releaseDone(ctx context.Context, held time.Duration, err error) {
	h.each("ReleaseDone", func(k *Hooks) {
		if k.ReleaseDone != nil {
			k.ReleaseDone(ctx, h.info, held, err)
		}
	})
}

// end calls the End hooks, and returns the first panic of one (nil for
// none) for the caller to raise again, or log, once the lease has ended: a
// panic must not leave its Done open.
func (h *hooked) end(held time.Duration, err error) *hookPanic {
	return h.all(func(k *Hooks) {
		if k.End != nil {
			k.End(h.info, held, err)
		}
	})
}

// starts calls the start hooks (AcquireStart or ReleaseStart, named by
// hook) that of picks from each set, each with the context the one before
// returned, and returns the last context. A panic goes on at once, leaving
// the later sets uncalled, unless the hooks' panics are logged: then the
// set that panicked is passed over.
func (h *hooked) starts(ctx context.Context, hook string, of func(k *Hooks) func(context.Context, HookInfo) context.Context) context.Context {
	for i := range h.c.hooks {
		start := of(&h.c.hooks[i])
		if start == nil {
			continue
		}
		call := func() {
			if next := start(ctx, h.info); next != nil {
				ctx = next
			}
		}
		if !h.logged {
			call()
		} else if p := recovered(call); p != nil {
			h.c.logHookPanic(hook, p)
		}
	}
	return ctx
}

// hookPanic is a hook's panic: its value, and the stack it was raised on.
type hookPanic struct {
	v     any
	stack []byte
}

// logHookPanic logs p, the panic of a hook on one of dlock's own
// goroutines, which nobody could recover, instead of raising it (see
// Hooks).
func (c *Client) logHookPanic(hook string, p *hookPanic) {
	c.log.Error("dlock: a hook panicked; dlock goes on as if it had returned", "hook", hook, "panic", p.v, "stack", string(p.stack))
}

// raise panics again with p, the first panic of the hooks named hook, or
// logs it when the hooks' panics are logged; nothing for a nil p.
func (h *hooked) raise(hook string, p *hookPanic) {
	switch {
	case p == nil:
	case h.logged:
		h.c.logHookPanic(hook, p)
	default:
		panic(p.v)
	}
}

// each calls f with every set of hooks in turn (see all), and then raises
// the first panic of the hooks named hook.
func (h *hooked) each(hook string, f func(k *Hooks)) {
	h.raise(hook, h.all(f))
}

// all calls f with every set of hooks in turn, all of them even when one
// panics (each set hears of every outcome and end it heard the start of),
// and returns the first panic, nil for none.
func (h *hooked) all(f func(k *Hooks)) (first *hookPanic) {
	for i := range h.c.hooks {
		if p := recovered(func() { f(&h.c.hooks[i]) }); p != nil && first == nil {
			first = p
		}
	}
	return first
}

// recovered calls f, and returns its panic, nil for none.
func recovered(f func()) (p *hookPanic) {
	defer func() {
		if v := recover(); v != nil {
			p = &hookPanic{v: v, stack: debug.Stack()}
		}
	}()
	f()
	return nil
}
