package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/dlockio/dlock"
)

// The model-based tests run random sequences of operations from several
// clients against a real Redis and against a small in-memory model of the
// primitive, and compare every result, and what Inspect reports after every
// operation, step by step. Set DLOCK_MODEL_SEED to replay a failed run.

// modelSteps is the number of operations of one run.
const modelSteps = 3000

func TestModelRWMutex(t *testing.T)     { runModel(t, modelRW, false) }
func TestModelFairRWMutex(t *testing.T) { runModel(t, modelRW, true) }
func TestModelSemaphore(t *testing.T)   { runModel(t, modelSem, false) }

type modelKind int

const (
	modelRW modelKind = iota
	modelSem
)

// mHold is a live hold in the model.
type mHold struct {
	mode, owner string
	count       int
	fence       uint64
	// recs are the request tokens of its recorded acquisitions, oldest
	// first (see scripts/holds.lua).
	recs []string
}

// mWaiter is a waiter a read/write lock records.
type mWaiter struct{ req, mode string }

// mValue is a *dlock.Lock the test holds, with what the model knows of it.
type mValue struct {
	l                *dlock.Lock
	token, req, mode string
	released         bool // Release reached the server: the next is refused locally
	ended            bool // its lease ended: Refresh is refused locally
}

// model is the in-memory model of one name.
type model struct {
	kind        modelKind
	fair        bool
	holds       map[string]*mHold // live holds by token
	waiters     []mWaiter         // live waiters, in arrival order
	enqueued    map[string]bool   // request tokens whose attempts recorded a waiter: their give-up sends a clean-up
	exists      bool              // the name's base key exists
	lastFence   uint64            // the newest fence issued
	lastPermits int               // the count of the last acquire that took a permit
}

// outcome is what the model expects of one acquire attempt.
type outcome int

const (
	granted  outcome = iota // a new hold
	rejoined                // the same request again, or an owner's re-entry
	refused
	mismatch // the request token holds the other mode
)

// held returns the live hold a Lock with token and request token req acts
// on in mode, as the scripts look it up: by its token, if the hold counts
// the Lock's acquisition (see mine); mis is set when the token holds the
// other mode.
func (m *model) held(token, req, mode string) (h *mHold, mis bool) {
	if h := m.holds[token]; h != nil {
		if h.mode != mode {
			return nil, true
		}
		if !h.mine(req) {
			return nil, false
		}
		return h, false
	}
	return nil, false
}

// mine reports whether the hold counts the acquisition with request token
// req: it records it, or records none.
func (h *mHold) mine(req string) bool {
	return len(h.recs) == 0 || slices.Contains(h.recs, req)
}

// ownedBy returns the live hold of owner in mode, which its acquires
// re-enter, and its token.
func (m *model) ownedBy(owner, mode string) (string, *mHold) {
	if owner != "" {
		for tok, h := range m.holds {
			if h.owner == owner && h.mode == mode {
				return tok, h
			}
		}
	}
	return "", nil
}

// attempt applies one acquire attempt to the model and returns its outcome
// and the token of the hold it joins or makes.
func (m *model) attempt(req, mode, owner string, wait bool, permits int) (outcome, string) {
	if h := m.holds[req]; h != nil {
		if !h.mine(req) { // the hold this request made, released and kept by re-entries
			return refused, ""
		}
		if h.mode != mode {
			return mismatch, ""
		}
		return m.rejoined(req, mode, wait), req
	}
	if tok, h := m.recorder(req); h != nil { // the same re-entry again, its reply lost
		if h.mode != mode {
			return mismatch, ""
		}
		return m.rejoined(req, mode, wait), tok
	}
	if tok, h := m.ownedBy(owner, mode); h != nil {
		h.count++
		h.recs = append(h.recs, req)
		return m.rejoined(req, mode, wait), tok
	}
	if m.blocked(req, mode, permits) {
		if wait && m.kind == modelRW && (m.fair || mode == dlock.ModeWrite) && !m.waiting(req, mode) {
			m.waiters = append(m.waiters, mWaiter{req, mode})
			if m.enqueued == nil {
				m.enqueued = map[string]bool{}
			}
			m.enqueued[req] = true
		}
		return refused, ""
	}
	m.dropWaiter(req, mode)
	m.holds[req] = &mHold{mode: mode, owner: owner, count: 1, recs: []string{req}}
	m.exists = true
	if m.kind == modelSem {
		m.lastPermits = permits
	}
	return granted, req
}

// rejoined is the outcome of an attempt that joins a hold: a waiter takes
// back the waiter it recorded.
func (m *model) rejoined(req, mode string, wait bool) outcome {
	if wait {
		m.dropWaiter(req, mode)
	}
	return rejoined
}

func (m *model) blocked(req, mode string, permits int) bool {
	if m.kind == modelSem {
		return len(m.holds) >= permits
	}
	for _, h := range m.holds {
		if mode == dlock.ModeWrite || h.mode == dlock.ModeWrite {
			return true
		}
	}
	for _, w := range m.waiters {
		if w.req == req && w.mode == mode { // its own place: the server queues a request token in each mode apart
			break
		}
		if w.mode == dlock.ModeWrite && (mode == dlock.ModeRead || m.fair) || m.fair && mode == dlock.ModeWrite {
			return true
		}
	}
	return false
}

func (m *model) waiting(req, mode string) bool {
	return slices.ContainsFunc(m.waiters, func(w mWaiter) bool { return w.req == req && w.mode == mode })
}

func (m *model) dropWaiter(req, mode string) {
	m.waiters = slices.DeleteFunc(m.waiters, func(w mWaiter) bool { return w.req == req && w.mode == mode })
}

// recorder returns the hold that records the acquisition req, and its
// token, if that joined a hold of another token.
func (m *model) recorder(req string) (string, *mHold) {
	for tok, h := range m.holds {
		if tok != req && slices.Contains(h.recs, req) {
			return tok, h
		}
	}
	return "", nil
}

// cleanup is what a failed acquire in mode takes back: the waiter it may
// have recorded, and the acquisition its request token may have made
// unseen, if a hold still records it. sent is set when the client sends
// the clean-up (its reply was lost, or it recorded a waiter): one that
// finds nothing of its own on a read/write lock with nothing live left
// removes the name's keys.
func (m *model) cleanup(req, mode string, sent bool) {
	m.dropWaiter(req, mode)
	for tok, h := range m.holds {
		if i := slices.Index(h.recs, req); i >= 0 && h.mode == mode {
			h.recs = slices.Delete(h.recs, i, i+1)
			m.drop(tok)
			return
		}
	}
	if sent && m.kind == modelRW && len(m.holds) == 0 && len(m.waiters) == 0 {
		m.exists = false
	}
}

// release gives up one count of the hold tok by the Lock of request token
// req; the hold forgets that Lock's record, then its oldest records beyond
// the count left.
func (m *model) release(tok, req string) {
	h := m.holds[tok]
	m.drop(tok)
	if i := slices.Index(h.recs, req); i >= 0 {
		h.recs = slices.Delete(h.recs, i, i+1)
	}
	if over := len(h.recs) - h.count; over > 0 {
		h.recs = h.recs[over:]
	}
}

// drop takes one count of the hold tok away.
func (m *model) drop(tok string) {
	h := m.holds[tok]
	if h.count--; h.count > 0 {
		return
	}
	delete(m.holds, tok)
	if len(m.holds) == 0 && len(m.waiters) == 0 {
		m.exists = false // the release removed the name's keys
	}
}

// info is what Inspect should report.
func (m *model) info(name string) *dlock.Info {
	info := &dlock.Info{Name: name, Fence: m.lastFence}
	if !m.exists {
		return info
	}
	info.Kind = dlock.KindRWMutex
	if m.kind == modelSem {
		info.Kind, info.Permits = dlock.KindSemaphore, m.lastPermits
	}
	info.Fair, info.Waiters = m.fair, len(m.waiters)
	for _, w := range m.waiters {
		info.WriterWaiting = info.WriterWaiting || w.mode == dlock.ModeWrite
	}
	for _, h := range m.holds {
		info.Holders = append(info.Holders, dlock.Holder{Mode: h.mode, Owner: h.owner, Count: h.count, Fence: h.fence})
	}
	return info
}

// modelRun drives one run.
type modelRun struct {
	t       *testing.T
	e       *env
	rng     *rand.Rand
	ctx     context.Context
	name    string
	m       *model
	drivers []*tapDriver
	clients []*dlock.Client
	rws     []*dlock.RWMutex
	sems    []*dlock.Semaphore
	rwOpts  []dlock.RWOption
	values  []*mValue
	waiting []*waiter // parked waiters
	tokens  int
	steps   int
}

func modelSeed(t *testing.T) uint64 {
	if s := os.Getenv("DLOCK_MODEL_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("DLOCK_MODEL_SEED=%q: %v", s, err)
		}
		return n
	}
	return uint64(time.Now().UnixNano())
}

func runModel(t *testing.T, kind modelKind, fair bool) {
	seed := modelSeed(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("replay with DLOCK_MODEL_SEED=%d", seed)
		}
	})
	runModelOn(t, newEnv(t), kind, fair, rand.NewPCG(seed, seed), "model", modelSteps)
}

// runModelOn runs steps operations on the name, their choices drawn from
// src, with clients of their own on e's server: three, the second of which
// runs the scripts as Redis Functions (WithFunctions), whose library keeps
// the helpers from call to call.
func runModelOn(t *testing.T, e *env, kind modelKind, fair bool, src rand.Source, name string, steps int) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := &modelRun{t: t, e: e, rng: rand.New(src), ctx: ctx, name: name,
		m: &model{kind: kind, fair: fair, holds: map[string]*mHold{}}}
	for i := range 3 {
		d := e.newDriver(t)
		var opts []dlock.ClientOption
		if i == 1 {
			opts = append(opts, dlock.WithFunctions())
		}
		c := dlock.New(d, opts...)
		t.Cleanup(func() { _ = c.Close() })
		r.drivers, r.clients = append(r.drivers, d), append(r.clients, c)
		if fair {
			r.rwOpts = []dlock.RWOption{dlock.Fair()}
		}
		r.rws = append(r.rws, c.RWMutex(r.name, r.rwOpts...))
		r.sems = append(r.sems, c.Semaphore(r.name, 3))
	}
	defer func() {
		for len(r.waiting) > 0 {
			r.giveUp(r.waiting[0])
		}
	}()
	for r.steps < steps && !t.Failed() {
		r.step()
	}
}

// step runs one random operation and compares Inspect afterwards.
func (r *modelRun) step() {
	r.steps++
	n := r.rng.IntN(100)
	if len(r.m.holds) > 2 && r.rng.IntN(2) == 0 {
		n = 45 + r.rng.IntN(46) // let holders go, or the writers would rarely get in
	}
	switch {
	case n < 25:
		r.tryAcquire("", n < 2)
	case n < 32 && len(r.waiting) < 4:
		r.startWaiting(n < 27)
	case n < 40 && len(r.waiting) > 0:
		w := r.waiting[r.rng.IntN(len(r.waiting))]
		if n < 36 {
			r.resume(w)
		} else {
			r.giveUp(w)
		}
	case n < 45 && len(r.values) > 0:
		// A token used before: the same request again, or its hold's mode.
		r.tryAcquire(r.values[r.rng.IntN(len(r.values))].token, false)
	case n < 65:
		r.release()
	case n < 75:
		r.refresh()
	case n < 80:
		r.ttl()
	case n < 85:
		r.expireHold()
	case n < 89:
		r.expireWaiter()
	case n < 91:
		r.forceRelease()
	case n < 94:
		r.otherKind()
	default:
		r.setPermits()
	}
	r.checkInspect()
}

func (r *modelRun) mode() string {
	if r.m.kind == modelSem {
		return dlock.ModePermit
	}
	if r.rng.IntN(2) == 0 {
		return dlock.ModeWrite
	}
	return dlock.ModeRead
}

func (r *modelRun) owner() string {
	if r.rng.IntN(3) == 0 {
		return "owner-" + strconv.Itoa(r.rng.IntN(2))
	}
	return ""
}

func (r *modelRun) newToken() string {
	r.tokens++
	return "t" + strconv.Itoa(r.tokens)
}

// acquire calls the primitive of client c.
func (r *modelRun) acquire(ctx context.Context, c int, mode string, wait bool, opts ...dlock.Option) (*dlock.Lock, error) {
	switch {
	case mode == dlock.ModePermit && wait:
		return r.sems[c].Acquire(ctx, opts...)
	case mode == dlock.ModePermit:
		return r.sems[c].TryAcquire(ctx, opts...)
	case mode == dlock.ModeRead && wait:
		return r.rws[c].RLock(ctx, opts...)
	case mode == dlock.ModeRead:
		return r.rws[c].TryRLock(ctx, opts...)
	case wait:
		return r.rws[c].Lock(ctx, opts...)
	default:
		return r.rws[c].TryLock(ctx, opts...)
	}
}

func (r *modelRun) opts(req, owner string) []dlock.Option {
	opts := []dlock.Option{dlock.WithToken(req), dlock.WithTTL(time.Minute)}
	if owner != "" {
		opts = append(opts, dlock.WithOwner(owner))
	}
	return opts
}

// tryAcquire makes one TryRLock, TryLock or TryAcquire, with req as its
// token, or a new one if req is "". If lose is set, the reply is lost:
// the acquire fails and takes back what it may have been granted.
func (r *modelRun) tryAcquire(req string, lose bool) {
	c, mode, owner := r.rng.IntN(len(r.clients)), r.mode(), r.owner()
	if req == "" {
		req = r.newToken()
	} else {
		owner = ""
	}
	what := fmt.Sprintf("try %s by client %d owner %q token %s", mode, c, owner, req)
	want, tok := r.m.attempt(req, mode, owner, false, r.sems[c].Permits())
	if lose {
		r.drivers[c].loseReplies(1)
		_, err := r.acquire(r.ctx, c, mode, false, r.opts(req, owner)...)
		if !errors.Is(err, errLostReply) {
			r.t.Errorf("%s with its reply lost: err = %v", what, err)
		}
		r.lostGrant(want, tok, mode)
		r.m.cleanup(req, mode, true)
		return
	}
	l, err := r.acquire(r.ctx, c, mode, false, r.opts(req, owner)...)
	r.check(what, want, req, tok, mode, l, err)
}

// waiter is an RLock, Lock or Acquire on a goroutine and a client of its
// own. After a failed attempt it parks in its OnRetry hook until the test
// lets it try again or give up, so that the waiters act one at a time, in
// an order the test draws. Its client does not subscribe, so that it tries
// again the moment it is let go, not when a notice or its beat wakes it;
// and it is alone, as the callers of one client queue behind each other.
type waiter struct {
	what, req, mode, owner string
	c                      int     // the client whose driver it shares
	permits                int     // the count of its semaphore
	want                   outcome // the model's outcome of the attempt under way
	tok                    string
	lost                   bool      // the attempt under way loses its reply
	uncertain              bool      // an attempt's reply was lost: its give-up sends a clean-up
	next                   chan bool // true: try again; false: give up
	events                 chan waitEvent
}

// waitEvent is what a waiter did: park after a failed attempt, or return.
type waitEvent struct {
	parked bool
	l      *dlock.Lock
	err    error
}

// startWaiting starts a waiter. If lose is set, its first attempt's reply
// is lost.
func (r *modelRun) startWaiting(lose bool) {
	c, mode, owner := r.rng.IntN(len(r.clients)), r.mode(), r.owner()
	w := &waiter{req: r.newToken(), mode: mode, owner: owner, c: c, permits: r.sems[c].Permits(), lost: lose, uncertain: lose,
		next: make(chan bool), events: make(chan waitEvent)}
	w.what = fmt.Sprintf("wait %s by client %d owner %q token %s", mode, c, owner, w.req)
	w.want, w.tok = r.m.attempt(w.req, mode, owner, true, r.sems[c].Permits())
	if lose {
		r.drivers[c].loseReplies(1)
	}
	client := dlock.New(noSubscribe{r.drivers[c]})
	go func() {
		defer client.Close()
		// The hook and the strategy run on this goroutine, one after the
		// other: giving up stops the strategy, which ends the wait at once.
		stop := false
		hook := func(_ int, err error) {
			w.events <- waitEvent{parked: true, err: err}
			stop = !<-w.next
		}
		retry := dlock.RetryFunc(func(int) (time.Duration, bool) { return 0, !stop })
		ctx := r.ctx
		opts := append(r.opts(w.req, owner), dlock.WithRetry(retry), dlock.WithOnRetry(hook))
		var l *dlock.Lock
		var err error
		switch mode {
		case dlock.ModePermit:
			l, err = client.Semaphore(r.name, r.sems[c].Permits()).Acquire(ctx, opts...)
		case dlock.ModeRead:
			l, err = client.RWMutex(r.name, r.rwOpts...).RLock(ctx, opts...)
		default:
			l, err = client.RWMutex(r.name, r.rwOpts...).Lock(ctx, opts...)
		}
		w.events <- waitEvent{l: l, err: err}
	}()
	r.await(w)
}

// resume lets a parked waiter try again.
func (r *modelRun) resume(w *waiter) {
	r.unpark(w)
	w.want, w.tok = r.m.attempt(w.req, w.mode, w.owner, true, w.permits)
	w.lost = false
	w.next <- true
	r.await(w)
}

// giveUp makes a parked waiter give up.
func (r *modelRun) giveUp(w *waiter) {
	r.unpark(w)
	w.next <- false
	ev := r.event(w)
	if ev.parked || !errors.Is(ev.err, dlock.ErrNotObtained) && !errors.Is(ev.err, errLostReply) {
		r.t.Errorf("%s: gave up with %+v", w.what, ev)
	}
	r.m.cleanup(w.req, w.mode, w.uncertain || r.m.enqueued[w.req])
}

// await takes a waiter's next event after an attempt.
func (r *modelRun) await(w *waiter) {
	ev := r.event(w)
	switch {
	case !ev.parked:
		r.check(w.what, w.want, w.req, w.tok, w.mode, ev.l, ev.err)
		return
	case w.lost:
		if !errors.Is(ev.err, errLostReply) {
			r.t.Errorf("%s: attempt whose reply was lost failed with %v", w.what, ev.err)
		}
		r.lostGrant(w.want, w.tok, w.mode)
	case w.want != refused || !errors.Is(ev.err, dlock.ErrNotObtained):
		r.t.Errorf("%s: attempt failed with %v, model: %v", w.what, ev.err, w.want)
	}
	r.waiting = append(r.waiting, w)
}

// event waits for a waiter's next event.
func (r *modelRun) event(w *waiter) waitEvent {
	select {
	case ev := <-w.events:
		return ev
	case <-time.After(10 * time.Second):
		r.t.Fatalf("%s: no news for 10s", w.what)
		return waitEvent{}
	}
}

// lostGrant learns the fence of a write hold granted by an attempt whose
// reply was lost, from the fence counter.
func (r *modelRun) lostGrant(want outcome, tok, mode string) {
	if want == granted && mode == dlock.ModeWrite {
		f, _ := strconv.ParseUint(r.e.srv.Do(r.t, "GET", "dlock:{"+r.name+"}:fence"), 10, 64)
		r.m.holds[tok].fence, r.m.lastFence = f, f
	}
}

func (r *modelRun) unpark(w *waiter) {
	r.waiting = slices.DeleteFunc(r.waiting, func(x *waiter) bool { return x == w })
}

// check compares an acquire's result with the model's outcome.
func (r *modelRun) check(what string, want outcome, req, tok, mode string, l *dlock.Lock, err error) {
	r.t.Helper()
	switch want {
	case refused:
		if !errors.Is(err, dlock.ErrNotObtained) {
			r.t.Errorf("%s: err = %v, model: refused", what, err)
		}
		return
	case mismatch:
		if !errors.Is(err, dlock.ErrModeMismatch) {
			r.t.Errorf("%s: err = %v, model: mode mismatch", what, err)
		}
		return
	}
	if err != nil {
		r.t.Errorf("%s: err = %v, model: obtained", what, err)
		return
	}
	if l.Token() != tok || l.Mode() != mode {
		r.t.Errorf("%s: token %s mode %s, model: %s %s", what, l.Token(), l.Mode(), tok, mode)
	}
	h := r.m.holds[tok]
	switch {
	case want == granted && mode == dlock.ModeWrite:
		if l.Fence() <= r.m.lastFence {
			r.t.Errorf("%s: fence %d after %d", what, l.Fence(), r.m.lastFence)
		}
		h.fence, r.m.lastFence = l.Fence(), l.Fence()
	case l.Fence() != h.fence:
		r.t.Errorf("%s: fence %d, the hold's is %d", what, l.Fence(), h.fence)
	}
	r.values = append(r.values, &mValue{l: l, token: l.Token(), req: req, mode: mode})
}

func (r *modelRun) value() *mValue {
	if len(r.values) == 0 {
		return nil
	}
	return r.values[r.rng.IntN(len(r.values))]
}

// wantHeld checks the error of an operation on a hold the model says is
// held (h not nil), not held, or held in another mode.
func (r *modelRun) wantHeld(what string, err error, h *mHold, mis bool) {
	r.t.Helper()
	switch {
	case mis:
		if !errors.Is(err, dlock.ErrModeMismatch) || !errors.Is(err, dlock.ErrNotHeld) {
			r.t.Errorf("%s: err = %v, model: the token holds the other mode", what, err)
		}
	case h == nil:
		if !errors.Is(err, dlock.ErrNotHeld) || errors.Is(err, dlock.ErrModeMismatch) {
			r.t.Errorf("%s: err = %v, model: not held", what, err)
		}
	case err != nil:
		r.t.Errorf("%s: err = %v, model: held", what, err)
	}
}

// wantLocal checks the error of an operation refused without asking the
// server, as the lock was released or lost before (the loss's cause is
// wrapped too).
func (r *modelRun) wantLocal(what string, err error) {
	r.t.Helper()
	if !errors.Is(err, dlock.ErrNotHeld) {
		r.t.Errorf("%s: err = %v, want ErrNotHeld", what, err)
	}
}

func (r *modelRun) release() {
	v := r.value()
	if v == nil {
		return
	}
	what := "release of " + v.token
	err := v.l.Release(r.ctx)
	if v.released {
		r.wantLocal(what+" (released before)", err)
		return
	}
	h, mis := r.m.held(v.token, v.req, v.mode)
	if v.ended && h != nil && !mis {
		// Lost here before (a refresh found it gone), though an acquire
		// of its token took the name again since: Release frees that
		// hold, and reports the loss it had.
		if !errors.Is(err, dlock.ErrNotHeld) || !errors.Is(err, dlock.ErrLost) {
			r.t.Errorf("%s: err = %v, model: held again, lost here before", what, err)
		}
	} else {
		r.wantHeld(what, err, h, mis)
	}
	if h != nil {
		r.m.release(v.token, v.req)
	}
	v.released, v.ended = true, true
}

func (r *modelRun) refresh() {
	v := r.value()
	if v == nil {
		return
	}
	what := "refresh of " + v.token
	err := v.l.Refresh(r.ctx, time.Minute)
	if v.ended {
		r.wantLocal(what+" (ended before)", err)
		return
	}
	h, mis := r.m.held(v.token, v.req, v.mode)
	r.wantHeld(what, err, h, mis)
	v.ended = h == nil
}

func (r *modelRun) ttl() {
	v := r.value()
	if v == nil {
		return
	}
	left, err := v.l.TTL(r.ctx)
	h, mis := r.m.held(v.token, v.req, v.mode)
	// A TTL that finds the lock not held ends it, as a refresh does.
	v.ended = v.ended || h == nil
	if mis {
		if !errors.Is(err, dlock.ErrModeMismatch) {
			r.t.Errorf("TTL of %s: err = %v, model: the token holds the other mode", v.token, err)
		}
		return
	}
	r.wantHeld("TTL of "+v.token, err, h, false)
	if h != nil && (left <= 50*time.Second || left > time.Minute) {
		r.t.Errorf("TTL of %s = %v", v.token, left)
	}
}

// expireHold makes a hold expire on the server as if its holder had died:
// its expiry is set in the past.
func (r *modelRun) expireHold() {
	for tok := range r.m.holds {
		r.e.srv.Do(r.t, "ZADD", "dlock:{"+r.name+"}:holds", "XX", "1", tok)
		delete(r.m.holds, tok)
		return
	}
}

// expireWaiter makes a recorded waiter expire as if it had died.
func (r *modelRun) expireWaiter() {
	if len(r.m.waiters) == 0 {
		return
	}
	w := r.m.waiters[r.rng.IntN(len(r.m.waiters))]
	r.e.srv.Do(r.t, "ZADD", "dlock:{"+r.name+"}:pending", "XX", "1", w.mode[:1]+w.req)
	r.m.dropWaiter(w.req, w.mode)
}

func (r *modelRun) forceRelease() {
	want := r.m.info(r.name)
	was, err := r.clients[r.rng.IntN(len(r.clients))].ForceRelease(r.ctx, r.name)
	r.compareInfo("force release", want, was, err)
	r.m.holds, r.m.waiters, r.m.exists = map[string]*mHold{}, nil, false
}

// otherKind uses the name as another kind, or a read/write lock of the
// other fairness, while it is in use: refused, changing nothing.
func (r *modelRun) otherKind() {
	if !r.m.exists {
		return
	}
	c := r.clients[r.rng.IntN(len(r.clients))]
	var err error
	switch r.rng.IntN(3) {
	case 0:
		_, err = c.TryLock(r.ctx, r.name)
	case 1:
		if r.m.kind == modelRW {
			_, err = c.Semaphore(r.name, 5).TryAcquire(r.ctx)
		} else {
			_, err = c.RWMutex(r.name).TryRLock(r.ctx)
		}
	default:
		if r.m.kind == modelSem {
			_, err = c.RWMutex(r.name, dlock.Fair()).TryLock(r.ctx)
		} else if r.m.fair {
			_, err = c.RWMutex(r.name).TryRLock(r.ctx)
		} else {
			_, err = c.RWMutex(r.name, dlock.Fair()).TryRLock(r.ctx)
		}
	}
	if !errors.Is(err, dlock.ErrKindMismatch) {
		r.t.Errorf("name used as another kind: err = %v, want ErrKindMismatch", err)
	}
}

func (r *modelRun) setPermits() {
	if r.m.kind != modelSem {
		return
	}
	s := r.sems[r.rng.IntN(len(r.sems))]
	if err := s.SetPermits(1 + r.rng.IntN(4)); err != nil {
		r.t.Error(err)
	}
}

func (r *modelRun) checkInspect() {
	r.t.Helper()
	info, err := r.clients[r.rng.IntN(len(r.clients))].Inspect(r.ctx, r.name)
	r.compareInfo(fmt.Sprintf("Inspect after step %d", r.steps), r.m.info(r.name), info, err)
}

func (r *modelRun) compareInfo(what string, want, got *dlock.Info, err error) {
	r.t.Helper()
	if err != nil {
		r.t.Errorf("%s: %v", what, err)
		return
	}
	key := func(info *dlock.Info) string {
		hs := make([]string, len(info.Holders))
		for i, h := range info.Holders {
			hs[i] = fmt.Sprintf("%s/%s/%d/%d", h.Mode, h.Owner, h.Count, h.Fence)
		}
		slices.Sort(hs)
		return fmt.Sprintf("%s kind=%q fence=%d permits=%d waiters=%d writer=%v fair=%v holders=%v", info.Name,
			info.Kind, info.Fence, info.Permits, info.Waiters, info.WriterWaiting, info.Fair, hs)
	}
	if key(got) != key(want) {
		r.t.Errorf("%s:\n got %s\nwant %s", what, key(got), key(want))
	}
}
