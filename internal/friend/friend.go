// Package friend carries what package dlock lets its own other packages
// use, and nobody else.
package friend

import (
	"context"
	"log/slog"
)

// OneUseToken, set by package dlock, returns a dlock.Option (as any) that
// gives an acquisition its token, as dlock.WithToken does, for that one
// acquisition only: dlock treats it as a token it made itself, so the
// acquisition's release or clean-up records its end, and a late copy of
// its acquire takes nothing. Package redlock takes each node with it: one
// token for every node of an attempt, never used again.
var OneUseToken func(token string) any

// GiveBack, set by package dlock, releases a *dlock.Lock (as any) as its
// Release does; when a server does not answer in time, the clean-up of
// the acquisition (by its request token) is sent again in the background
// until one answers, as a failed acquire's is. Package redlock gives back
// its node locks with it: a node that stalls then does not keep its lock
// until the TTL.
var GiveBack func(ctx context.Context, l any) error

// LogHookPanics, set by package dlock, returns a dlock.Option (as any)
// that has the hooks of the acquisition, and of the Lock it obtains, log
// their panics as they do on dlock's own goroutines, instead of raising
// them: package redlock calls its node clients on goroutines of its own,
// where nobody could recover a panic, and takes each node with it.
var LogHookPanics func() any

// RefusedForGood, set by package dlock, reports whether err is a refusal
// that no retry changes (a missing password or permission, a driver that
// cannot do what was asked: ErrUnsupported), which ends a dlock Client's
// wait at once. Package redlock ends a wait when a majority of its nodes
// refuse so.
var RefusedForGood func(err error) bool

// LostNotHeld, set by package dlock, returns the error of a Release of a
// lock lost before it: it matches dlock.ErrNotHeld and dlock.ErrLost, and
// dlock.ErrForceReleased or dlock.ErrMaxHold where lost matches them, and
// reads as lost does. Package redlock's Release returns it as a dlock
// Lock's does.
var LostNotHeld func(lost error) error

// QuorumPart, set by package dlock, returns a dlock.Option (as any) that
// marks the acquisition as one node's part of a lock held by a quorum:
// the end of its Lock with an error is logged as a debug record, "dlock:
// a Redlock node's lock ended", not as the warning "dlock: lock lost",
// since a node's loss is not the lock's. Package redlock takes each node
// with it, and logs itself whether the quorum still holds the lock.
var QuorumPart func() any

// Logger, set by package dlock, returns the logger of a *dlock.Client (as
// any): the one given by dlock.WithLogger, or the client's own that
// discards everything. Package redlock logs through its nodes' clients'
// logger when they all have the same one.
var Logger func(c any) *slog.Logger

// Made, set by package dlock, reports whether dlock.New made a
// *dlock.Client (as any): the zero Client is not usable. Package redlock
// refuses a node with a Client that New did not make, whose methods would
// panic on the Locker's goroutines, where nobody could recover.
var Made func(c any) bool

// ScriptArg, set by package dlock, returns a *dlock.Script's (as any)
// Function (function set) or SHA1 as a command argument, boxed once for
// all its calls: the drivers whose client library takes a command's
// arguments as values (goredis, redigo) send it so, an allocation less
// for each call.
var ScriptArg func(s any, function bool) any
