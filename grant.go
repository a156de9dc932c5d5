package dlock

import (
	"context"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// A release may grant the lock to the next waiting client there and then
// (see scripts/grant.lua), which saves the waiter the round trip of an
// attempt of its own: the lock passes from one holder to the next in the
// time the release's notice takes to arrive. A waiting caller asks for it
// with each attempt that registers it, which leaves its request (token,
// TTL, owner, metadata, the attempt's number and the server's clock when it
// ran) in the lock's hash; the grant is held with the caller's request
// token, and its notice names the attempt whose request it used and how
// long after that attempt ran, by the server's clock, the grant came. The
// caller counts the TTL from when it sent that attempt plus that time, less
// the drift allowance on both: no later than the grant, so its deadline
// never comes after the server's. (When that comes out later than the
// notice's arrival, the server's clock stepped, and the caller counts from
// the attempt's send time alone.) A notice can be lost: the caller's next
// attempt then finds the lock held with its own request token and takes it
// as a repeated acquire. A notice that cannot be used (it came too late, or names an attempt the caller no
// longer remembers) is only dropped, never acted on: the lock the caller's
// request token holds may be a later grant than the one it tells of, and
// the next attempt learns which.
//
// Only a caller of Lock on one name that waits with notices asks, without
// WithReplicas: a grant is not written on the caller's connection, so WAIT
// there would confirm nothing.

// grantNotice is the notice that a release granted a lock to a waiting
// caller: the request token it is held with, the number of the attempt
// whose request it used, its fence, how long after that attempt ran the
// grant came, by the server's clock, and when the notice arrived.
type grantNotice struct {
	req     string
	attempt uint64
	fence   uint64
	elapsed time.Duration
	arrived time.Time
}

// parseGrant reads the payload of a notice. A grant's is "\x00", then the
// attempt, the fence, the elapsed microseconds and the request token's
// length, each followed by a space, then the request token and the key
// (see grant.lua); a plain notice's is the key alone. isGrant is set for a
// grant's, ok when it also reads.
func parseGrant(payload string) (n grantNotice, key string, isGrant, ok bool) {
	rest, isGrant := strings.CutPrefix(payload, "\x00")
	if !isGrant {
		return n, payload, false, false
	}
	var nums [4]uint64
	for i := range nums {
		f, r, found := strings.Cut(rest, " ")
		v, err := strconv.ParseUint(f, 10, 63)
		if !found || err != nil {
			return n, "", true, false
		}
		nums[i], rest = v, r
	}
	if nums[3] == 0 || nums[3] > uint64(len(rest)) {
		return n, "", true, false
	}
	n.attempt, n.fence, n.elapsed = nums[0], nums[1], time.Duration(nums[2])*time.Microsecond
	n.req, key = rest[:nums[3]], rest[nums[3]:]
	return n, key, true, true
}

// sentAttempts is how many of its latest attempts a waiting Lock remembers
// the send time of: a grant uses the request of the latest attempt that
// registered, or of one just before it whose successor failed unseen.
const sentAttempts = 8

// sent is when a Lock sent an attempt that asked for a grant, and with
// which TTL.
type sent struct {
	attempt uint64
	at      time.Time
	ttl     time.Duration
}

// asksGrant reports whether an attempt that registers the caller as a
// waiter asks to be granted the lock.
func (l *Lock) asksGrant() bool {
	return l.kind == exclusiveHold && len(l.names) == 1 && l.parts == nil && l.repl.replicas == 0
}

// nextAttempt numbers an attempt sent at with ttl that asks for a grant,
// and remembers when it was sent. A Lock numbers its attempts from a
// random start, so that the notice of a grant to another Lock's attempt
// with the same token (WithToken) never names one of its own.
func (l *Lock) nextAttempt(at time.Time, ttl time.Duration) string {
	n := rand.Uint64() >> 1 // room to count on
	if len(l.sent) > 0 {
		n = l.sent[len(l.sent)-1].attempt + 1
	}
	if len(l.sent) == sentAttempts {
		l.sent = append(l.sent[:0], l.sent[1:]...)
	}
	l.sent = append(l.sent, sent{attempt: n, at: at, ttl: ttl})
	return strconv.FormatUint(n, 10)
}

// claim takes a lock a release granted this Lock: with the deadline the
// send time of the attempt the notice names gives, moved on by the time
// the grant came after it (both less the drift allowance), or from the
// send time alone if that comes out later than the notice's arrival. A
// notice that cannot be used (its attempt is forgotten, or the deadline has
// passed) is dropped, and the caller goes on waiting: its next attempt
// takes the lock if it is still held with its request token.
func (l *Lock) claim(_ context.Context, n grantNotice) bool {
	var s *sent
	for i := range l.sent {
		if l.sent[i].attempt == n.attempt {
			s = &l.sent[i]
		}
	}
	if s == nil || n.req != l.req {
		return false
	}
	at := s.at.Add(n.elapsed - n.elapsed/100)
	if at.After(n.arrived) {
		// The server's clock puts the grant after the notice arrived: it
		// stepped. Count from the attempt's send time, which the grant
		// surely came after.
		at = s.at
	}
	deadline := at.Add(s.ttl - drift(s.ttl))
	if !time.Now().Before(deadline) {
		return false
	}
	l.mu.Lock()
	l.token, l.fences = l.req, []uint64{n.fence}
	l.mu.Unlock()
	l.start(at, deadline)
	return true
}
