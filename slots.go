package dlock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/dlockio/dlock/internal/keyslot"
)

// A lock on several names is served by one script call on all of them,
// which is atomic. Redis Cluster refuses such a call (CROSSSLOT) when the
// names lie in several hash slots. The client learns so from the refusal,
// not from the driver: it then splits such locks by slot and serves each
// slot by a call of its own, and splits every later one from the start.
// A single server, where one call serves any names, never refuses, so
// there a lock keeps its one atomic call.
//
// A split lock is taken slot by slot in the order of the slot numbers, and
// the names of each slot in the order of their keys, the same order for
// every client, so that no two attempts on overlapping names take them in
// opposite orders. An attempt that is refused at one slot gives back the
// slots it took before it returns (a waiting acquisition then waits as for
// any lock), so it never holds on to names while it waits for others; but
// others may see those names taken for as long as the attempt lasts.

// part is the names of a lock that one script call serves, with the keys of
// each script for them, laid out as the Lock's own.
type part struct {
	at              []int // the indexes of its names in Lock.names; nil for all of them, in order
	keys, held, rel []string
}

// size returns how many of names p has.
func (p part) size(names []string) int {
	if p.at == nil {
		return len(names)
	}
	return len(p.at)
}

// index returns the index in Lock.names of p's j-th name.
func (p part) index(j int) int {
	if p.at == nil {
		return j
	}
	return p.at[j]
}

// name returns the name at a script's 1-based key index i in p, or p's
// first name for an index beyond its names.
func (p part) name(names []string, i int64) string {
	return names[p.index(p.at1(names, i))]
}

// at1 returns the index in p of its i-th name, counted from 1 as the
// scripts count them (the first for an i out of range).
func (p part) at1(names []string, i int64) int {
	if i < 1 || int(i) > p.size(names) {
		return 0
	}
	return int(i - 1)
}

// units returns what the lock's script calls are made on: its parts when
// it is split, or else all of its names at once.
func (l *Lock) units() []part {
	if l.parts != nil {
		return l.parts
	}
	return []part{{keys: l.keys, held: l.held, rel: l.rel}}
}

// send makes one call on each of units, built by call, in one pipeline,
// and returns the calls in the order of units.
func (l *Lock) send(ctx context.Context, r replication, units []part, call func(p part) *Call) []*Call {
	if len(units) == 1 {
		calls := call(units[0]).one()
		l.c.evalWith(ctx, r, calls...)
		return calls
	}
	calls := make([]*Call, len(units))
	for i, p := range units {
		calls[i] = call(p)
	}
	l.c.evalWith(ctx, r, calls...)
	return calls
}

// exclusiveKeys returns the script keys of an exclusive lock from keys,
// its lock keys, then their waiter sets, their fence counters and their
// clean-ups' records: acquire's (see scriptKeys) and the clean-up's (all of
// them; a release may grant the lock to a waiter, with a fence, and a
// clean-up keeps its record), and refresh's and ttl's (the locks), the
// start of the others.
func exclusiveKeys(keys []string) (acquire, held, rel []string) {
	n := len(keys) / 4
	return keys, keys[:n:n], keys
}

// scriptKeys returns the keys of p for an acquire or a release: all of them
// for a read/write lock or a semaphore; for an exclusive lock, all but the
// clean-ups' records, which only a clean-up (and a force release) writes
// and names (see late_keys in scripts/held.lua), so that the others are
// not refused for as long as their slot moves while no such record is
// there.
func (l *Lock) scriptKeys(keys []string) []string {
	if l.kind.modeArg {
		return keys
	}
	return keys[:len(keys)/4*3]
}

// split divides an exclusive lock's names by hash slot: one part for each
// slot, in the order of the slot numbers, with its names in the order of
// their keys. It returns nil when the names share one slot.
func (l *Lock) split() []part {
	locks := l.held
	slots := make([]int, len(locks))
	order := make([]int, len(locks))
	for i, k := range locks {
		slots[i], order[i] = keyslot.Of(k), i
	}
	slices.SortFunc(order, func(a, b int) int {
		return cmp.Or(cmp.Compare(slots[a], slots[b]), strings.Compare(locks[a], locks[b]))
	})
	if slots[order[0]] == slots[order[len(order)-1]] {
		return nil
	}
	var parts []part
	for len(order) > 0 {
		n := 1
		for n < len(order) && slots[order[n]] == slots[order[0]] {
			n++
		}
		parts = append(parts, l.partOf(order[:n:n]))
		order = order[n:]
	}
	return parts
}

// partOf returns the part of an exclusive lock's names at the indexes at.
func (l *Lock) partOf(at []int) part {
	all, n := len(l.held), len(at)
	keys := make([]string, 4*n)
	for j, i := range at {
		keys[j], keys[n+j], keys[2*n+j], keys[3*n+j] = l.keys[i], l.keys[all+i], l.keys[2*all+i], l.keys[3*all+i]
	}
	p := part{at: at}
	p.keys, p.held, p.rel = exclusiveKeys(keys)
	return p
}

// splitIfRefused reports whether err is Redis Cluster's refusal of a call
// on all of the lock's names at once because they lie in several hash
// slots. If so, the client remembers that it talks to a cluster, and the
// lock is split by slot.
//
// Only the goroutine that builds the lock calls it, before the lock is
// handed out: parts never change once other goroutines can see it.
func (l *Lock) splitIfRefused(err error) bool {
	// Only an exclusive lock has several names; the keys of any other
	// share a hash tag (see Client.checkName).
	if err == nil || l.parts != nil || l.kind != exclusiveHold {
		return false
	}
	var se *ServerError
	if !errors.As(err, &se) || !strings.HasPrefix(se.Err.Error(), "CROSSSLOT") {
		return false
	}
	parts := l.split()
	if parts == nil {
		return false // one slot after all: not a refusal splitting can mend
	}
	l.c.cluster.Store(true)
	l.parts = parts
	return true
}

// takeParts makes an attempt on a split lock: it takes its parts one after
// another, in their order. When a part is refused or fails, the parts
// already taken are given back before it returns, and the part that failed
// too when it may have been taken unseen, so that a failed attempt leaves
// nothing taken.
func (l *Lock) takeParts(ctx context.Context, ttl time.Duration, wa waitArgs) (token string, fences []uint64, holderTTL time.Duration, err error) {
	// A waiter registers at the name that refuses it, but does not register
	// again at the names it takes for the next caller of this client (as
	// the script does when all are taken at once): giving those names back
	// would then wake the waiter itself, and it would try again at once,
	// over and over, while the name that refused it stays held.
	more := wa.more
	wa.more = ""
	args := l.acquireArgs(ttl, wa, nil)
	if l.givenToken {
		// A name this attempt finds held with the caller's token may be
		// another Lock's hold of it (see WithToken), which the give-back
		// of a refused attempt would end: the script says which.
		for len(args) < 11 {
			args = append(args, argNone)
		}
		args = append(args, argOne)
	}
	token, fences = l.req, make([]uint64, len(l.names))
	taken := make([]part, 0, len(l.parts))
	tokens := make([]string, 0, len(l.parts))
	for i, p := range l.parts {
		t, f, joins, holderTTL, err := l.takePart(ctx, p, args, nil)
		if err != nil {
			refused := errors.Is(err, ErrNotObtained)
			if wa.channel != "" && !isFinal(err) && !notRun(err) {
				// Refused, it registered the caller; its reply lost, it
				// may have.
				l.mayWaitAt(i, true)
			}
			if !refused && !isFinal(err) && !notRun(err) {
				// The part may have been taken unseen (its reply was
				// lost): it goes back too, by the request token, so that
				// a waiter holds nothing between attempts.
				if own, ok := l.ownPart(l.parts[i]); ok {
					taken, tokens = append(taken, own), append(tokens, l.req)
				}
			}
			gerr := l.giveBack(ctx, taken, tokens)
			if gerr != nil {
				// What it took may be left there: its clean-up goes on
				// past refused dials (see Lock.reached).
				l.leftTaken = true
			}
			if gerr != nil && notRun(gerr) {
				// Not sent, or refused before it ran: it cannot run late,
				// so a waiting caller goes on. What it did not give back
				// stays held by the request token until the next attempt
				// takes it again, or the clean-up after the last: the
				// attempt counts as one whose reply was lost, not as
				// refused.
				err = fmt.Errorf("%w; the attempt had failed: "+hadVerb(err), gerr, err)
			} else if gerr != nil {
				// Names may be left taken: the caller must not count the
				// attempt as refused, and cleans up as after a lost reply.
				// A waiting caller stops waiting (see errGiveBack).
				err = fmt.Errorf("%w: %w; the attempt had failed: "+hadVerb(err), &gaveBackError{by: l.gaveBackBy}, gerr, err)
			}
			if refused && wa.channel != "" {
				l.leaveStale(ctx, i, wa.channel, more)
			}
			return "", nil, holderTTL, err
		}
		if wa.channel != "" {
			l.mayWaitAt(i, false) // taking it took the caller out of its waiters
		}
		if t != l.req {
			token = t // as the script does: a re-entered name's token
		}
		l.noteJoins(p, joins)
		if own, ok := l.ownPart(p); ok {
			taken, tokens = append(taken, own), append(tokens, t)
		}
		for j, fence := range f {
			fences[p.index(j)] = fence
		}
	}
	return token, fences, 0, nil
}

// partsKeys returns the lock keys of parts.
func partsKeys(parts []part) []string {
	var keys []string
	for _, p := range parts {
		keys = append(keys, p.held...)
	}
	return keys
}

// mayWaitAt records whether the waiting caller may be registered at part i
// (see leaveStale).
func (l *Lock) mayWaitAt(i int, may bool) {
	if l.waited == nil {
		if !may {
			return
		}
		l.waited = make([]bool, len(l.parts))
	}
	l.waited[i] = may
}

// leaveStale is leave_others (see acquire.lua) for a split lock's waiting
// caller that part refused, after its giving back: the script sees the names
// of one slot only. An earlier attempt refused at a later part (or whose
// reply from it was lost) may have registered the client there, and this one
// never reached it: the release that frees such a name tells this client
// first, which cannot use the notice, while the callers of other clients
// waiting for that name alone sleep. So it leaves the names of those parts
// that are free, and the next waiter there is told in its place; it stays
// where the name is held (the release will tell it, and the next refusal
// leaves it then), where more of its callers wait (more), and where one
// asked for a grant. The parts before refused were taken by this attempt,
// which took the client out of their waiter sets. A part is done with once
// the client is out of all its names' waiter sets; a failure leaves the
// registration to its lease.
func (l *Lock) leaveStale(ctx context.Context, refused int, channel, more string) {
	var calls []*Call
	var of []int // the part of each call
	all := len(l.held)
	for q := refused + 1; q < len(l.waited); q++ {
		if !l.waited[q] {
			continue
		}
		p := l.parts[q]
		for j := range p.size(l.names) {
			if i := p.index(j); i >= len(more) || more[i] != '1' {
				calls = append(calls, &Call{Script: scriptUnwait, Keys: []string{l.keys[i], l.keys[all+i]}, Args: []any{channel, argOne}})
				of = append(of, q)
			}
		}
	}
	if len(calls) == 0 {
		return
	}
	l.c.evalWith(ctx, replication{}, calls...)
	done := map[int]bool{}
	for _, q := range of {
		done[q] = true
	}
	for k, call := range calls {
		if call.Err != nil || call.Val != int64(1) {
			done[of[k]] = false
		}
	}
	for q, out := range done {
		if out {
			l.waited[q] = false
		}
	}
}

// noteJoins records what the script reports in joins (for a lock taken
// WithToken) of the names of p it obtained: those that were held with the
// caller's token before, which another Lock of the token may hold (see
// WithToken), and those it took anew. A name held before that no attempt
// of this acquisition took anew is another's, as far as it knows: its
// give-backs and clean-up leave it held, and it is the acquisition's once
// an attempt obtains the lock. A name taken anew, and found held with the
// token later (its give-back never ran), is the acquisition's own.
func (l *Lock) noteJoins(p part, joins string) {
	if joins == "" {
		return
	}
	for j := range p.size(l.names) {
		i := p.index(j)
		switch {
		case joins[j] != '1':
			if l.took == nil {
				l.took = map[int]bool{}
			}
			l.took[i] = true
			delete(l.others, i)
		case !l.took[i]:
			if l.others == nil {
				l.others = map[int]bool{}
			}
			l.others[i] = true
		}
	}
}

// gaveBack notes that p was given back: names of it that a later attempt
// finds held with the caller's token are another Lock's (see noteJoins).
func (l *Lock) gaveBack(p part) {
	for j := range p.size(l.names) {
		delete(l.took, p.index(j))
	}
}

// ownPart returns p without the names that another Lock of the caller's
// token holds (see noteJoins), and whether any are left.
func (l *Lock) ownPart(p part) (part, bool) {
	if len(l.others) == 0 {
		return p, true
	}
	var at []int
	for j := range p.size(l.names) {
		if i := p.index(j); !l.others[i] {
			at = append(at, i)
		}
	}
	switch len(at) {
	case 0:
		return part{}, false
	case p.size(l.names):
		return p, true
	}
	return l.partOf(at), true
}

// ownUnits returns the units a clean-up of the acquisition acts on: its
// parts less the names another Lock of its token holds (see noteJoins).
func (l *Lock) ownUnits() []part {
	units := l.units()
	if len(l.others) == 0 {
		return units
	}
	own := make([]part, 0, len(units))
	for _, p := range units {
		if p, ok := l.ownPart(p); ok {
			own = append(own, p)
		}
	}
	return own
}

// hadVerb returns the verb that words an attempt's own error after the
// error of its give-back: %v, so that a refusal (ErrNotObtained) does not
// count as one, but %w for an attempt that its context's deadline cut
// short, whose error then says so, as an acquire's always does.
func hadVerb(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return "%w"
	}
	return "%v"
}

// giveBack releases the parts an attempt took, each with the token it was
// taken with, on a context that outlives ctx's cancellation but is bounded
// in time. The release finds the attempt's acquisition by its request
// token: a name the attempt re-entered gets its count back, and no other
// acquisition's.
func (l *Lock) giveBack(ctx context.Context, parts []part, tokens []string) error {
	if len(parts) == 0 {
		return nil
	}
	attempt := ctx
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	l.gaveBackBy, _ = ctx.Deadline()
	// Begun once the attempt's context had ended, or run past it: the
	// acquisition's exit began with it (see gaveBackLate).
	defer func() { l.gaveBackLate = attempt.Err() != nil }()
	calls := make([]*Call, len(parts))
	for i, p := range parts {
		args := l.releaseArgs(tokens[i], newReleaseID(), nil)
		if !l.kind.modeArg {
			args = l.c.fenceArg(args, 7) // how long a fence counter is kept, for a grant
		}
		calls[i] = &Call{Script: l.kind.release, Keys: l.scriptKeys(p.rel), Args: args}
	}
	l.c.evalWith(ctx, replication{}, calls...)
	l.c.wakeAlone(partsKeys(parts))
	// The error of a release that may have run comes first: see notRun.
	var ran, first error
	for i, call := range calls {
		switch {
		case call.Err == nil:
			l.gaveBack(parts[i])
		case !notRun(call.Err):
			ran = cmp.Or(ran, l.replyError(parts[i], call.Err))
		default:
			first = cmp.Or(first, l.replyError(parts[i], call.Err))
		}
	}
	return cmp.Or(ran, first)
}
