package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/dlockio/dlock"
	"github.com/redis/go-redis/v9"
)

// hold is one time a worker held a lock. Times are wall-clock nanoseconds,
// comparable between the processes of one machine.
type hold struct {
	ID     string `json:"id"` // unique in a scenario: worker and count
	Worker int    `json:"worker"`
	Name   string `json:"name"`
	Fence  uint64 `json:"fence"`
	Sent   int64  `json:"sent"`    // Lock was called
	Since  int64  `json:"since"`   // the server obtained it (its own clock, ms precision); Granted if unknown
	Grant  int64  `json:"granted"` // Lock returned it
	Enter  int64  `json:"enter"`   // resource sequence numbers around the acting; Exit 0: never
	Exit   int64  `json:"exit"`
	ExitAt int64  `json:"exit_at"`
	// DoneAt is when the holder saw Done closed while it worked (0: not);
	// Deadline its lease's last deadline.
	DoneAt   int64 `json:"done_at"`
	Deadline int64 `json:"deadline"`
	// DoneLate: after the work, the deadline had passed but Done was not
	// closed yet (the pause scenario looks).
	DoneLate bool `json:"done_late"`
	Paused   bool `json:"paused"` // its process was stopped while it held the lock
	// End is how the hold ended: "released", "not held" (Release said
	// ErrNotHeld), or "release failed".
	End string `json:"end"`
}

// write is one SetFenced call and what the writer was told.
type write struct {
	Hold   string `json:"hold"`
	Value  string `json:"value"`
	Fence  uint64 `json:"fence"`
	Result string `json:"result"` // "ok", "stale", "error"
	Late   bool   `json:"late"`   // written after the holder saw Done close
	Err    string `json:"err,omitempty"`
}

// opCounts counts the operations of a scenario and their outcomes.
type opCounts struct {
	Acquires, Granted, NotObtained, AcquireErrors     int
	Releases, Released, ReleaseNotHeld, ReleaseErrors int
	Writes, WritesOK, WritesStale, WriteErrors        int
	LateWrites, LateOK, LateStale                     int
	Losses                                            int // holds whose Done closed while the holder worked
}

// recorder collects what a scenario's workers did.
type recorder struct {
	mu         sync.Mutex
	ops        opCounts
	holds      []*hold
	writes     []write
	unreported []string // operations that returned no error although they failed
	early      []string // locks lost before their deadline, without a restart to explain it
	kept       []string // locks still refreshed after their holder's Release failed
	// notHeld are Releases that answered ErrNotHeld before the lock's
	// deadline: an early loss, unless the server's record shows that the
	// Release itself deleted the lock (its request ran twice).
	notHeld []notHeld
	errs    map[string]int
}

func newRecorder() *recorder { return &recorder{errs: map[string]int{}} }

func (r *recorder) acquired(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops.Acquires++
	switch {
	case err == nil:
		r.ops.Granted++
	case errors.Is(err, dlock.ErrNotObtained):
		r.ops.NotObtained++
	default:
		r.ops.AcquireErrors++
		r.errs["acquire: "+errClass(err)]++
	}
}

func (r *recorder) released(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops.Releases++
	switch {
	case err == nil:
		r.ops.Released++
	case errors.Is(err, dlock.ErrNotHeld):
		r.ops.ReleaseNotHeld++
	default:
		r.ops.ReleaseErrors++
		r.errs["release: "+errClass(err)]++
	}
}

func (r *recorder) wrote(w write) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.writes = append(r.writes, w)
	if w.Late {
		r.ops.LateWrites++
		switch w.Result {
		case "ok":
			r.ops.LateOK++
		case "stale":
			r.ops.LateStale++
		}
		return
	}
	r.ops.Writes++
	switch w.Result {
	case "ok":
		r.ops.WritesOK++
	case "stale":
		r.ops.WritesStale++
	default:
		r.ops.WriteErrors++
	}
}

func (r *recorder) addHold(h *hold) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.holds = append(r.holds, h)
	if h.DoneAt != 0 {
		r.ops.Losses++
	}
}

func (r *recorder) failure(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unreported = append(r.unreported, fmt.Sprintf(format, args...))
}

func (r *recorder) earlyLoss(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.early = append(r.early, fmt.Sprintf(format, args...))
}

// notHeld is a Release that answered ErrNotHeld before its deadline.
type notHeld struct {
	token, msg string
}

func (r *recorder) notHeldEarly(token, msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notHeld = append(r.notHeld, notHeld{token, msg})
}

func (r *recorder) keptAlive(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.kept = append(r.kept, fmt.Sprintf(format, args...))
}

// errorSummary lists the kinds of errors seen, most frequent first.
func (r *recorder) errorSummary() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	kinds := make([]string, 0, len(r.errs))
	for k := range r.errs {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool {
		a, b := kinds[i], kinds[j]
		return r.errs[a] > r.errs[b] || r.errs[a] == r.errs[b] && a < b
	})
	out := make([]string, len(kinds))
	for i, k := range kinds {
		out[i] = fmt.Sprintf("%d× %s", r.errs[k], k)
	}
	return out
}

// errClass names the kind of an error, for the counts in the report.
func errClass(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "context deadline exceeded"
	case errors.Is(err, dlock.ErrNotReplicated):
		return "not replicated"
	}
	var se *dlock.ServerError
	if errors.As(err, &se) {
		msg := se.Err.Error()
		for _, s := range []string{"connection refused", "connection reset", "i/o timeout", "EOF", "broken pipe", "LOADING"} {
			if strings.Contains(msg, s) {
				return "redis: " + s
			}
		}
		return "redis: other"
	}
	return "other"
}

// restartLog records when the lock's server was killed and up again.
type restartLog struct {
	persistent bool

	mu     sync.Mutex
	events [][2]int64 // killed, up again (0 while down)
}

// killing records that the server is about to be killed, before it is, so
// that a worker answered by the restarted server already finds the
// restart here; up records that it answers again.
func (l *restartLog) killing() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, [2]int64{time.Now().UnixNano(), 0})
}

func (l *restartLog) up() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events[len(l.events)-1][1] = time.Now().UnixNano()
}

// explains reports whether a restart that lost every lock (no persistence)
// happened between from and to.
func (l *restartLog) explains(from, to int64) bool {
	if l == nil || l.persistent {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.events {
		if e[0] >= from && e[0] <= to {
			return true
		}
	}
	return false
}

// list returns the restarts so far.
func (l *restartLog) list() [][2]int64 {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([][2]int64(nil), l.events...)
}

// fleet is what in-process workers share: where they record, the resource
// they protect, and an unfaulted connection to the lock's server that
// shows the server's view.
type fleet struct {
	rec      *recorder
	res      *resource
	view     *redis.Client
	prefix   string
	restarts *restartLog // nil unless the lock's server restarts
}

// workerSpec says what one in-process worker does.
type workerSpec struct {
	id        int
	addr      string // the lock server, or the fault proxy in front of it
	names     []string
	ttl       time.Duration
	work      [2]time.Duration // how long it acts under a lock: short holds
	long      [2]time.Duration // and, one time in three, long ones that need refreshing
	until     time.Time
	maxHolds  int
	lateWrite bool // after Done closed, write anyway: a fencing probe
}

// newLockClient returns a dlock client on its own go-redis client at addr.
// Contexts bound every request (ContextTimeoutEnabled) and the pool holds
// 8 connections; go-redis's other settings are its defaults, its retries
// of failed commands included.
func newLockClient(addr, prefix string) (*dlock.Client, func()) {
	return newLockClientRetries(addr, prefix, 0)
}

// newLockClientRetries is newLockClient with go-redis's MaxRetries: -1
// sends every command at most once.
func newLockClientRetries(addr, prefix string, maxRetries int) (*dlock.Client, func()) {
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: 8, MaxRetries: maxRetries})
	c := newLocks(rdb, dlock.WithPrefix(prefix))
	return c, func() {
		_ = c.Close()
		_ = rdb.Close()
	}
}

// run makes the worker hold locks until its time or count is up.
func (f *fleet) run(ctx context.Context, w workerSpec, seed uint64) {
	locks, closeClient := newLockClient(w.addr, f.prefix)
	defer closeClient()
	r := rand.New(rand.NewPCG(seed, uint64(w.id)))
	for n := 0; n < w.maxHolds && time.Now().Before(w.until) && ctx.Err() == nil; n++ {
		f.holdOnce(ctx, locks, w, r, n)
	}
}

// holdOnce obtains a lock, acts under it (mark, work, write, mark) and
// releases it, checking each answer against the server's view.
func (f *fleet) holdOnce(ctx context.Context, locks *dlock.Client, w workerSpec, r *rand.Rand, n int) {
	name := w.names[r.IntN(len(w.names))]
	id := fmt.Sprintf("w%d#%d", w.id, n)
	sent := time.Now()
	actx, cancel := context.WithTimeout(ctx, 4*w.ttl)
	l, err := locks.Lock(actx, name, dlock.WithTTL(w.ttl), dlock.WithAutoRefresh(), dlock.WithMetadata(id))
	cancel()
	granted := time.Now()
	f.rec.acquired(err)
	if err != nil {
		return
	}
	h := &hold{ID: id, Worker: w.id, Name: name, Fence: l.Fence(), Sent: sent.UnixNano(), Grant: granted.UnixNano(), Since: granted.UnixNano()}
	if since, ok := f.checkHeld(ctx, locks, l, h, "Lock returned it"); ok {
		h.Since = since
	}
	h.Enter, _, _ = f.res.mark(ctx)

	d := between(r, w.work)
	if r.IntN(3) == 0 {
		d = between(r, w.long)
	}
	work := time.NewTimer(d)
	select {
	case <-work.C:
	case <-l.Done():
		h.DoneAt = time.Now().UnixNano()
		f.lost(l, h)
	}
	work.Stop()
	if h.DoneAt == 0 {
		f.checkHeld(ctx, locks, l, h, "before its write")
		f.write(ctx, l, h, false)
	}
	h.Exit, h.ExitAt, _ = f.res.mark(ctx)
	if h.DoneAt != 0 && w.lateWrite {
		f.write(ctx, l, h, true)
	}
	f.release(ctx, locks, l, h, w.ttl)
	h.Deadline = l.Deadline().UnixNano()
	f.rec.addHold(h)
}

// write writes the holder's value to the resource with its fence.
func (f *fleet) write(ctx context.Context, l *dlock.Lock, h *hold, late bool) {
	value := h.ID
	if late {
		value += "/late"
	}
	res, err := f.res.write(ctx, h.Name, l.Fence(), value)
	w := write{Hold: h.ID, Value: value, Fence: l.Fence(), Result: res, Late: late}
	if err != nil && res == "error" {
		w.Err = err.Error()
	}
	f.rec.wrote(w)
}

// checkHeld asks the server, bypassing any fault, who holds the lock, and
// records an unreported failure if the lock is not the caller's although
// its lease says it is (before its deadline, Done open) and no restart
// without persistence explains it. It returns when the server obtained
// the lock for its holder.
func (f *fleet) checkHeld(ctx context.Context, locks *dlock.Client, l *dlock.Lock, h *hold, when string) (since int64, ok bool) {
	deadline := l.Deadline()
	vctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	v, err := f.view.HMGet(vctx, locks.RedisKey(h.Name), "token", "since").Result()
	after := time.Now()
	if err != nil || len(v) != 2 {
		return 0, false // the server is down: nothing to compare with
	}
	token, _ := v[0].(string)
	if token == l.Token() {
		var ms int64
		if s, _ := v[1].(string); s != "" {
			_, _ = fmt.Sscan(s, &ms)
		}
		return ms * int64(time.Millisecond), ms > 0
	}
	if !after.Before(deadline) || l.Err() != nil || f.restarts.explains(h.Sent, after.UnixNano()) {
		return 0, false
	}
	holder := "free"
	if token != "" {
		holder = "held with another token"
	}
	f.rec.failure("%s: %s on %q with %v of its lease left and Done open, but the server shows the lock %s",
		h.ID, when, h.Name, deadline.Sub(after).Round(time.Millisecond), holder)
	return 0, false
}

// lost records how a lease ended while its holder worked: a lock lost
// before its deadline, with no restart to explain it, is an early loss.
func (f *fleet) lost(l *dlock.Lock, h *hold) {
	if dl := l.Deadline(); time.Unix(0, h.DoneAt).Before(dl) && !f.restarts.explains(h.Sent, h.DoneAt) {
		f.rec.earlyLoss("%s on %q: lost %v before its deadline: %v", h.ID, h.Name, dl.Sub(time.Unix(0, h.DoneAt)).Round(time.Millisecond), l.Err())
	}
}

// release releases the lock once, as deferred Release calls do, and checks
// the answer against the server's view. After a failed Release the holder
// has given the lock up: it must then run out within its TTL, as a crashed
// holder's would; a second Release afterwards frees the name for the
// others.
func (f *fleet) release(ctx context.Context, locks *dlock.Client, l *dlock.Lock, h *hold, ttl time.Duration) {
	deadline := l.Deadline()
	wasOpen := l.Err() == nil && !isClosed(l.Done())
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*ttl)
	err := l.Release(rctx)
	cancel()
	ret := time.Now()
	f.rec.released(err)
	switch {
	case err == nil:
		h.End = "released"
		if token, ok := f.serverToken(ctx, locks, h.Name); ok && token == l.Token() {
			f.rec.failure("%s: Release of %q returned nil, but the server still holds the lock with its token", h.ID, h.Name)
		}
		return
	case errors.Is(err, dlock.ErrNotHeld):
		h.End = "not held"
		if wasOpen && ret.Before(deadline) && !f.restarts.explains(h.Sent, ret.UnixNano()) {
			f.rec.notHeldEarly(l.Token(), fmt.Sprintf("%s on %q: Release answered ErrNotHeld %v before its deadline, Done still open",
				h.ID, h.Name, deadline.Sub(ret).Round(time.Millisecond)))
		}
		return
	}
	h.End = "release failed"
	time.Sleep(2 * ttl)
	if token, ok := f.serverToken(ctx, locks, h.Name); ok && token == l.Token() {
		f.rec.keptAlive("%s: Release of %q failed (%s); %v later the lock was still held with its token", h.ID, h.Name, errClass(err), 2*ttl)
	}
	rctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), 2*ttl)
	_ = l.Release(rctx)
	cancel()
}

// serverToken reads the token a lock is held with, bypassing any fault.
func (f *fleet) serverToken(ctx context.Context, locks *dlock.Client, name string) (string, bool) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	token, err := f.view.HGet(ctx, locks.RedisKey(name), "token").Result()
	if errors.Is(err, redis.Nil) {
		return "", true
	}
	return token, err == nil
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
