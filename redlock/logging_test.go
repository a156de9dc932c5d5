package redlock_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/redistest"
	"github.com/dlockio/dlock/redlock"
)

// loggedLocker returns a Locker over three masters whose node clients all
// log, through one logger, every record from debug up as JSON; the
// masters; and a function that returns the records written so far.
func loggedLocker(t *testing.T) (*redlock.Locker, []*redistest.Server, func() []logRecord) {
	t.Helper()
	srvs := redistest.StartMasters(t, 3)
	var buf redistest.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r := newLockerOf(t, srvs, func(_ int, d dlock.Driver) *dlock.Client { return dlock.New(d, dlock.WithLogger(logger)) })
	return r, srvs, func() []logRecord { return parseRecords(t, buf.String()) }
}

// logRecord is one JSON log record.
type logRecord map[string]any

func (r logRecord) msg() string   { s, _ := r["msg"].(string); return s }
func (r logRecord) level() string { s, _ := r["level"].(string); return s }
func (r logRecord) err() string   { s, _ := r["err"].(string); return s }

// warns reports whether the record is a warning or worse.
func (r logRecord) warns() bool { return r.level() == "WARN" || r.level() == "ERROR" }

// names returns the record's "names" attribute.
func (r logRecord) names() []any { n, _ := r["names"].([]any); return n }

func (r logRecord) String() string {
	b, _ := json.Marshal(map[string]any(r))
	return string(b)
}

func parseRecords(t *testing.T, out string) []logRecord {
	t.Helper()
	var recs []logRecord
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var rec logRecord
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
		recs = append(recs, rec)
	}
	return recs
}

// awaitRecord waits up to 5s for a record that match accepts, and returns
// it; the test fails with every record written if none comes.
func awaitRecord(t *testing.T, logs func() []logRecord, what string, match func(logRecord) bool) logRecord {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		recs := logs()
		if i := slices.IndexFunc(recs, match); i >= 0 {
			return recs[i]
		}
		if time.Now().After(end) {
			t.Fatalf("no record %s within 5s; the log:\n%s", what, joinRecords(recs))
		}
	}
}

func joinRecords(recs []logRecord) string {
	var b strings.Builder
	for _, r := range recs {
		fmt.Fprintln(&b, r)
	}
	return b.String()
}

// TestANodeLosingItsCopyWhileTheQuorumHoldsLogsNoLoss: one of three nodes
// loses its copy of a held Redlock lock (the key deleted there, as by a
// restart without persistence); a refresh finds it gone there and reaches
// the other two, a quorum. The lock is held, so nothing warns of a loss:
// the node's dlock client logged a warning, "dlock: lock lost", for its
// lock there, which an operator reads as the lock lost. What is logged is
// an info record of Redlock's that names the lock and the node and says
// that the quorum still holds it.
func TestANodeLosingItsCopyWhileTheQuorumHoldsLogsNoLoss(t *testing.T) {
	r, srvs, logs := loggedLocker(t)
	ctx := context.Background()
	l, err := r.TryLock(ctx, "dented", redlock.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	srvs[0].Do(t, "DEL", "dlock:{dented}")
	if err := l.Refresh(ctx, 5*time.Second); err != nil {
		t.Fatalf("Refresh: %v; two of three nodes still hold it", err)
	}
	select {
	case <-l.Done():
		t.Fatalf("lost: %v", l.Err())
	default:
	}
	rec := awaitRecord(t, logs, "of Redlock's for node 0's loss", func(r logRecord) bool {
		return strings.HasPrefix(r.msg(), "redlock: ") && r["addr"] == srvs[0].Addr()
	})
	if rec.level() != "INFO" || !strings.Contains(rec.msg(), "quorum still holds") ||
		!slices.Equal(rec.names(), []any{"dented"}) || rec["node"] != 0.0 || rec["held"] != 2.0 || rec["quorum"] != 2.0 ||
		!strings.Contains(rec.err(), "not held") {
		t.Errorf("node 0's loss logged as %v; want INFO saying the quorum still holds, names [dented], node 0, held 2, quorum 2, and why (not held)", rec)
	}
	releaseHeldThroughout(t, l, logs, false)
}

// TestANodeRunOutWhileTheQuorumHoldsIsLoggedByTheNextRefresh: one of
// three nodes stops answering (paused) while a lock is refreshed
// automatically on the others, and its copy there runs out at its
// deadline. That is logged by the refresh after it, as an info record of
// Redlock's that names the node and says why (its deadline passed),
// and no warning: the lock is held on the other two all along.
func TestANodeRunOutWhileTheQuorumHoldsIsLoggedByTheNextRefresh(t *testing.T) {
	r, srvs, logs := loggedLocker(t)
	ctx := context.Background()
	l, err := r.TryLock(ctx, "limping", redlock.WithTTL(time.Second), redlock.WithRefreshInterval(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	srvs[0].Pause(t)
	rec := awaitRecord(t, logs, "of Redlock's for node 0's loss", func(r logRecord) bool {
		return strings.HasPrefix(r.msg(), "redlock: ") && r["addr"] == srvs[0].Addr()
	})
	srvs[0].Resume(t)
	if rec.level() != "INFO" || !strings.Contains(rec.msg(), "quorum still holds") || rec["node"] != 0.0 ||
		!strings.Contains(rec.err(), "deadline passed") {
		t.Errorf("node 0's loss logged as %v; want INFO saying the quorum still holds, for node 0, whose deadline passed", rec)
	}
	releaseHeldThroughout(t, l, logs, false)
}

// TestAFailedAutomaticRefreshIsWarnedOfOnceARun: two of three nodes stop
// answering (paused) while a lock is refreshed automatically; its refresh,
// retried four times a second, reaches no quorum, which is warned of once
// for the run of failures, naming the lock, and again after a refresh
// succeeded in between. The lock is held throughout.
func TestAFailedAutomaticRefreshIsWarnedOfOnceARun(t *testing.T) {
	r, srvs, logs := loggedLocker(t)
	ctx := context.Background()
	l, err := r.TryLock(ctx, "stalled", redlock.WithTTL(3*time.Second), redlock.WithRefreshInterval(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	const msg = "redlock: refresh did not reach a quorum; retrying until the lock's deadline"
	warnings := func() (n int) {
		for _, rec := range logs() {
			if rec.msg() == msg {
				n++
			}
		}
		return n
	}
	for run := 1; run <= 2; run++ {
		resume1, resume2 := srvs[1].PauseAWhile(t), srvs[2].PauseAWhile(t)
		rec := awaitRecord(t, logs, fmt.Sprintf("of failed refresh %d", run), func(r logRecord) bool { return r.msg() == msg && warnings() == run })
		if rec.level() != "WARN" || !slices.Equal(rec.names(), []any{"stalled"}) || rec.err() == "" {
			t.Errorf("logged as %v; want WARN naming [stalled], with the error", rec)
		}
		// Three more failed refreshes, seen on the node that answers.
		sent := srvs[0].CommandStat(t, "evalsha", "calls")
		eventually(t, 5*time.Second, "three more refreshes", func() bool { return srvs[0].CommandStat(t, "evalsha", "calls") >= sent+3 })
		if n := warnings(); n != run {
			t.Errorf("run %d of failed refreshes: %d warnings in all, want %d", run, n, run)
		}
		before := l.Deadline()
		resume1()
		resume2()
		eventually(t, 5*time.Second, "a refresh after the nodes resumed", func() bool { return l.Deadline().After(before) })
	}
	releaseHeldThroughout(t, l, logs, true)
}

// releaseHeldThroughout checks that l, which a quorum held throughout, is
// not lost, releases it, and fails for every record that logs it as lost,
// and for every warning unless warned is set.
func releaseHeldThroughout(t *testing.T, l *redlock.Lock, logs func() []logRecord, warned bool) {
	t.Helper()
	select {
	case <-l.Done():
		t.Fatalf("lost: %v", l.Err())
	default:
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, rec := range logs() {
		if (rec.warns() && !warned) || strings.Contains(rec.msg(), "lock lost") {
			t.Errorf("a lock held on a quorum logged as lost: %v", rec)
		}
	}
}

// TestALostQuorumIsOneWarning: a Redlock lock that fewer than a quorum of
// its three nodes hold any longer is logged once, as a warning of
// Redlock's that names the lock and says why (the nodes that lost it and
// their causes), however the loss is found: a refresh refused by two nodes
// where another holder has it, a Release that finds it gone from two, or
// every node's deadline passing without a refresh. The nodes' dlock clients
// logged a "dlock: lock lost" warning for each node instead, and Redlock
// nothing.
func TestALostQuorumIsOneWarning(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ttl   time.Duration
		lose  func(t *testing.T, l *redlock.Lock, srvs []*redistest.Server)
		nodes []int // the nodes the warning must name
	}{
		{"refreshes refused", 5 * time.Second, func(t *testing.T, l *redlock.Lock, srvs []*redistest.Server) {
			for _, srv := range srvs[:2] {
				srv.Do(t, "HSET", "dlock:{gone}", "token", "another-holder", "req", "another-holder")
			}
			if err := l.Refresh(context.Background(), 5*time.Second); !errors.Is(err, dlock.ErrNotHeld) {
				t.Fatalf("Refresh: %v, want ErrNotHeld", err)
			}
		}, []int{0, 1}},
		{"found gone by Release", 5 * time.Second, func(t *testing.T, l *redlock.Lock, srvs []*redistest.Server) {
			for _, srv := range srvs[:2] {
				srv.Do(t, "DEL", "dlock:{gone}")
			}
			if err := l.Release(context.Background()); !errors.Is(err, dlock.ErrLost) {
				t.Fatalf("Release: %v, want ErrLost", err)
			}
		}, []int{0, 1}},
		{"deadlines passed", 300 * time.Millisecond, func(t *testing.T, l *redlock.Lock, _ []*redistest.Server) {
			waitDone(t, l, 5*time.Second)
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, srvs, logs := loggedLocker(t)
			ctx := context.Background()
			l, err := r.TryLock(ctx, "gone", redlock.WithTTL(tc.ttl))
			if err != nil {
				t.Fatal(err)
			}
			tc.lose(t, l, srvs)
			waitDone(t, l, 5*time.Second)
			if !errors.Is(l.Err(), dlock.ErrLost) {
				t.Fatalf("Err = %v, want ErrLost", l.Err())
			}
			// Logged once Done has closed.
			rec := awaitRecord(t, logs, `"redlock: lock lost"`, func(r logRecord) bool { return r.msg() == "redlock: lock lost" })
			_ = l.Release(ctx) // says the loss again: not logged again
			if !slices.Equal(rec.names(), []any{"gone"}) || !strings.Contains(rec.err(), "dlock: lock lost") || !strings.Contains(rec.err(), "quorum") {
				t.Errorf("the loss logged as %v; want names [gone], and the error saying it is lost, with the quorum", rec)
			}
			for _, i := range tc.nodes {
				if node := fmt.Sprintf("redlock: node %d (%s)", i, srvs[i].Addr()); !strings.Contains(rec.err(), node) {
					t.Errorf("the loss's record does not name %s: %v", node, rec)
				}
			}
			var warned []logRecord
			for _, rec := range logs() {
				if rec.warns() || rec.msg() == "dlock: lock lost" {
					warned = append(warned, rec)
				}
				if strings.Contains(rec.msg(), "quorum still holds") {
					// Nodes lost together: the first one's loss left a
					// quorum only until the next.
					t.Errorf("a node's loss said the quorum still held the lock, lost with it: %v", rec)
				}
			}
			if len(warned) != 1 {
				t.Errorf("%d warnings or losses logged, want Redlock's one:\n%s", len(warned), joinRecords(warned))
			}
		})
	}
}

// TestTheLockersLoggerIsGivenOrTheNodesOwn: a Locker logs through the
// logger given by WithLogger, else through its nodes' clients' logger
// when they all have the same one, and else nowhere: the attributes of a
// logger of one node's would mislabel a record about the lock. Given
// WithLogger, the loss of a lock whose nodes' clients log nothing is
// logged there.
func TestTheLockersLoggerIsGivenOrTheNodesOwn(t *testing.T) {
	shared := slog.New(slog.NewJSONHandler(&redistest.Buffer{}, nil))
	given := slog.New(slog.NewJSONHandler(&redistest.Buffer{}, nil))
	locker := func(t *testing.T, logger func(i int) *slog.Logger, opts ...redlock.LockerOption) *redlock.Locker {
		nodes := make([]redlock.Node, 3)
		for i := range nodes {
			var copts []dlock.ClientOption
			if l := logger(i); l != nil {
				copts = append(copts, dlock.WithLogger(l))
			}
			c := dlock.New(&countingDriver{}, copts...)
			t.Cleanup(func() { _ = c.Close() })
			nodes[i] = redlock.Node{Addr: fmt.Sprintf("10.0.0.%d:6379", i+1), Client: c}
		}
		r, err := redlock.New(nodes, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		return r
	}
	sharedLogger := func(int) *slog.Logger { return shared }
	ownLoggers := func(i int) *slog.Logger { return shared.With("node", i) }
	noLogger := func(int) *slog.Logger { return nil }
	for _, tc := range []struct {
		name   string
		logger func(i int) *slog.Logger
		opts   []redlock.LockerOption
		want   *slog.Logger // nil: one that discards everything
	}{
		{"the clients' shared logger", sharedLogger, nil, shared},
		{"clients with loggers of their own", ownLoggers, nil, nil},
		{"clients without loggers", noLogger, nil, nil},
		{"WithLogger over the clients' shared logger", sharedLogger, []redlock.LockerOption{redlock.WithLogger(given)}, given},
		{"WithLogger over clients with loggers of their own", ownLoggers, []redlock.LockerOption{redlock.WithLogger(given)}, given},
		{"WithLogger(nil)", sharedLogger, []redlock.LockerOption{redlock.WithLogger(nil)}, shared},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := redlock.LoggerOf(locker(t, tc.logger, tc.opts...))
			switch {
			case tc.want != nil && got != tc.want:
				t.Errorf("the Locker logs through %p, want %p", got, tc.want)
			case tc.want == nil && got.Enabled(context.Background(), slog.LevelError):
				t.Errorf("the Locker logs through %p, want one that discards everything", got)
			}
		})
	}

	t.Run("a loss logged through WithLogger's", func(t *testing.T) {
		srvs := redistest.StartMasters(t, 3)
		var buf redistest.Buffer
		logger := slog.New(slog.NewJSONHandler(&buf, nil))
		r := newLocker(t, srvs, redlock.WithLogger(logger))
		l, err := r.TryLock(context.Background(), "given", redlock.WithTTL(300*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		waitDone(t, l, 5*time.Second)
		rec := awaitRecord(t, func() []logRecord { return parseRecords(t, buf.String()) }, `"redlock: lock lost"`,
			func(r logRecord) bool { return r.msg() == "redlock: lock lost" })
		if rec.level() != "WARN" || !slices.Equal(rec.names(), []any{"given"}) {
			t.Errorf("the loss logged as %v, want a warning naming the lock", rec)
		}
	})

	// Nodes' clients with loggers of their own, and no WithLogger: the
	// Locker logs nothing, so the clients warn of their nodes' losses, as
	// of locks of their own, rather than a lost lock go untold; given
	// WithLogger, they do not.
	for _, tc := range []struct {
		name string
		opts []redlock.LockerOption
		warn bool
	}{
		{"a node's loss warned of by its own logger", nil, true},
		{"a node's loss not warned of with WithLogger", []redlock.LockerOption{redlock.WithLogger(given)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srvs := redistest.StartMasters(t, 3)
			bufs := make([]redistest.Buffer, len(srvs))
			r := newLockerOf(t, srvs, func(i int, d dlock.Driver) *dlock.Client {
				return dlock.New(d, dlock.WithLogger(slog.New(slog.NewJSONHandler(&bufs[i], nil))))
			}, tc.opts...)
			ctx := context.Background()
			l, err := r.TryLock(ctx, "own", redlock.WithTTL(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			srvs[0].Do(t, "DEL", "dlock:{own}")
			if err := l.Refresh(ctx, 5*time.Second); err != nil {
				t.Fatalf("Refresh: %v; two of three nodes still hold it", err)
			}
			node0 := func() []logRecord { return parseRecords(t, bufs[0].String()) }
			if tc.warn {
				awaitRecord(t, node0, `node 0's "dlock: lock lost"`, func(r logRecord) bool {
					return r.msg() == "dlock: lock lost" && r.level() == "WARN"
				})
				return
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			for _, rec := range node0() {
				if rec.warns() {
					t.Errorf("node 0's client warned with WithLogger given: %v", rec)
				}
			}
		})
	}
}

// TestANodesLossIsToldBeforeTheLocksLoss: a refresh finds that a node lost
// its copy of the lock and logs it, saying that the quorum still holds the
// lock; while that record is being written, the other nodes' deadlines
// pass and the lock is lost. The node's record comes first, then the
// warning of the lock's loss: the warning was written meanwhile, and the
// record saying that the quorum still held the lock came after it.
func TestANodesLossIsToldBeforeTheLocksLoss(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	var buf redistest.Buffer
	h := &gatedHandler{Handler: slog.NewJSONHandler(&buf, nil), writing: make(chan struct{}), warned: make(chan struct{}), gate: make(chan struct{})}
	open := sync.OnceFunc(func() { close(h.gate) })
	r := newLocker(t, srvs, redlock.WithLogger(slog.New(h)))
	ctx := context.Background()
	l, err := r.TryLock(ctx, "told", redlock.WithTTL(400*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	// Taken now: Done called once the deadlines have passed ends the lock
	// itself, on this goroutine.
	done := l.Done()
	srvs[0].Do(t, "DEL", "dlock:{told}")
	refreshed := make(chan struct{})
	go func() {
		defer close(refreshed)
		_ = l.Refresh(ctx, 400*time.Millisecond) // nodes 1 and 2, for 400ms
	}()
	t.Cleanup(func() {
		open()
		<-refreshed
	})
	select {
	case <-h.writing:
	case <-time.After(5 * time.Second):
		t.Fatalf("node 0's loss not logged within 5s; the log:\n%s", buf.String())
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("not lost within 5s of nodes 1 and 2's deadlines")
	}
	select {
	case <-h.warned: // written while node 0's record was
	case <-time.After(200 * time.Millisecond):
	}
	open()
	<-refreshed
	logs := func() []logRecord { return parseRecords(t, buf.String()) }
	awaitRecord(t, logs, `"redlock: lock lost"`, func(r logRecord) bool { return r.msg() == "redlock: lock lost" })
	recs := logs()
	info := slices.IndexFunc(recs, func(r logRecord) bool { return strings.Contains(r.msg(), "quorum still holds") })
	lost := slices.IndexFunc(recs, func(r logRecord) bool { return r.msg() == "redlock: lock lost" })
	if info < 0 || info > lost {
		t.Errorf("node 0's loss not logged before the lock's; the log:\n%s", joinRecords(recs))
	}
}

// gatedHandler passes records to its Handler, but holds a record of a
// node's loss (one saying that the quorum still holds the lock) until gate
// is closed, having closed writing; it closes warned at the first warning.
type gatedHandler struct {
	slog.Handler
	writing, warned, gate chan struct{}
	once                  sync.Once
}

func (h *gatedHandler) Handle(ctx context.Context, r slog.Record) error {
	switch {
	case strings.Contains(r.Message, "quorum still holds"):
		close(h.writing)
		<-h.gate
	case r.Level >= slog.LevelWarn:
		h.once.Do(func() { close(h.warned) })
	}
	return h.Handler.Handle(ctx, r)
}

// callbackHandler passes records to its Handler, having first called on
// with each: a handler that calls back into the Lock it is told of.
type callbackHandler struct {
	slog.Handler
	on func(slog.Record)
}

func (h *callbackHandler) Handle(ctx context.Context, r slog.Record) error {
	h.on(r)
	return h.Handler.Handle(ctx, r)
}

// releasingLocker returns a Locker over srvs whose log handler, given a
// record whose message told accepts, releases the Lock in held and sends
// the Release's error on released; and the buffer its records go to.
func releasingLocker(t *testing.T, srvs []*redistest.Server, told func(msg string) bool) (_ *redlock.Locker, held *atomic.Pointer[redlock.Lock], released chan error, buf *redistest.Buffer) {
	held, released, buf = new(atomic.Pointer[redlock.Lock]), make(chan error, 1), new(redistest.Buffer)
	h := &callbackHandler{Handler: slog.NewJSONHandler(buf, nil), on: func(r slog.Record) {
		if !told(r.Message) {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		released <- held.Load().Release(ctx)
	}}
	return newLocker(t, srvs, redlock.WithLogger(slog.New(h))), held, released, buf
}

// TestALogHandlerMayReleaseTheLockItIsToldIsLost: the warning of a lock's
// loss goes to a handler that releases the lock it names (an application
// tidying up after a loss). The loss is found by the nodes' deadlines,
// on a goroutine of their own; the handler's Release returns the loss,
// and does not wait for the record being written, as it did (it waited
// forever) while the warning was written under the mutex that orders the
// Lock's records.
func TestALogHandlerMayReleaseTheLockItIsToldIsLost(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	r, held, released, buf := releasingLocker(t, srvs, func(msg string) bool { return msg == "redlock: lock lost" })
	l, err := r.TryLock(context.Background(), "tidied", redlock.WithTTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	held.Store(l)
	select {
	case err := <-released:
		if !errors.Is(err, dlock.ErrLost) || !errors.Is(err, dlock.ErrNotHeld) {
			t.Errorf("the handler's Release = %v, want the loss (ErrLost, ErrNotHeld)", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the handler's Release did not return within 10s of the loss (Done closed: %v); the log:\n%s", isClosed(l.Done()), buf.String())
	}
}

// TestALogHandlerMayReleaseTheLockWhoseNodeItIsToldLost: the record of a
// node's loss (the quorum still holds the lock) goes to a handler that
// releases the lock it names. The Refresh that found the loss returns, and
// so does the handler's Release, which waited forever for the Refresh's
// turn while the record was written within it.
func TestALogHandlerMayReleaseTheLockWhoseNodeItIsToldLost(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	r, held, released, buf := releasingLocker(t, srvs, func(msg string) bool { return strings.Contains(msg, "quorum still holds") })
	ctx := context.Background()
	l, err := r.TryLock(ctx, "dented", redlock.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	held.Store(l)
	srvs[0].Do(t, "DEL", "dlock:{dented}")
	refreshed := make(chan error, 1)
	go func() { refreshed <- l.Refresh(ctx, 5*time.Second) }()
	for range 2 {
		select {
		case err := <-refreshed:
			if err != nil {
				t.Errorf("Refresh: %v; two of three nodes still held it", err)
			}
		case err := <-released:
			if err != nil {
				t.Errorf("the handler's Release: %v; two of three nodes held it", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("Refresh or the handler's Release did not return within 10s; the log:\n%s", buf.String())
		}
	}
}

// isClosed reports whether ch is closed.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestALogHandlersPanicLeavesLaterRecordsWritten: the handler panics at
// the record of a node's loss, which the Refresh that found it then
// raises. The record of the next node's loss is written all the same.
func TestALogHandlersPanicLeavesLaterRecordsWritten(t *testing.T) {
	srvs := redistest.StartMasters(t, 5)
	var (
		buf      redistest.Buffer
		panicked atomic.Bool
	)
	h := &callbackHandler{Handler: slog.NewJSONHandler(&buf, nil), on: func(r slog.Record) {
		if strings.Contains(r.Message, "quorum still holds") && panicked.CompareAndSwap(false, true) {
			panic("the handler failed")
		}
	}}
	r := newLocker(t, srvs, redlock.WithLogger(slog.New(h)))
	ctx := context.Background()
	l, err := r.TryLock(ctx, "dented", redlock.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	refresh := func() (p any) {
		defer func() { p = recover() }()
		if err := l.Refresh(ctx, 5*time.Second); err != nil {
			t.Errorf("Refresh: %v; a quorum still held it", err)
		}
		return nil
	}
	srvs[0].Do(t, "DEL", "dlock:{dented}")
	if p := refresh(); p == nil {
		t.Fatal("the handler's panic did not reach the Refresh that wrote its record")
	}
	srvs[1].Do(t, "DEL", "dlock:{dented}")
	if p := refresh(); p != nil {
		t.Fatalf("Refresh panicked again: %v", p)
	}
	logs := func() []logRecord { return parseRecords(t, buf.String()) }
	awaitRecord(t, logs, "of node 1's loss", func(r logRecord) bool {
		return strings.Contains(r.msg(), "quorum still holds") && r["addr"] == srvs[1].Addr()
	})
}

// TestCloseDuringAnAutomaticRefreshWarnsOfNothing: Locker.Close cuts short
// an automatic refresh that two of three nodes have not answered yet. The
// refresh reached no quorum, but it was not the nodes' failure, and
// nothing retries it after Close: no warning says that it did not reach a
// quorum and is retried until the lock's deadline.
func TestCloseDuringAnAutomaticRefreshWarnsOfNothing(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	var buf redistest.Buffer
	entered := make(chan struct{}, 2)
	r := newLockerOf(t, srvs, func(i int, d dlock.Driver) *dlock.Client {
		if i > 0 {
			d = &stalledRefreshDriver{Driver: d, entered: entered}
		}
		return dlock.New(d)
	}, redlock.WithLogger(slog.New(slog.NewJSONHandler(&buf, nil))), redlock.WithNodeTimeout(2*time.Second))
	ctx := context.Background()
	l, err := r.TryLock(ctx, "closing", redlock.WithTTL(10*time.Second), redlock.WithRefreshInterval(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	for range 2 {
		select {
		case <-entered:
		case <-time.After(5 * time.Second):
			t.Fatal("no automatic refresh reached nodes 1 and 2 within 5s")
		}
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	// Close waited for the automatic refresh's goroutine, which writes its
	// records: the log is complete.
	for _, rec := range parseRecords(t, buf.String()) {
		if rec.warns() {
			t.Errorf("Close during a refresh logged a warning: %v", rec)
		}
	}
}

// stalledRefreshDriver holds back every refresh until its context ends,
// having sent on entered if it can: a node that does not answer in time.
type stalledRefreshDriver struct {
	dlock.Driver
	entered chan struct{}
}

func (d *stalledRefreshDriver) Eval(ctx context.Context, calls ...*dlock.Call) {
	if !slices.ContainsFunc(calls, func(c *dlock.Call) bool { return c.Script.Name == "refresh" }) {
		d.Driver.Eval(ctx, calls...)
		return
	}
	select {
	case d.entered <- struct{}{}:
	default:
	}
	<-ctx.Done()
	for _, c := range calls {
		c.Err = ctx.Err()
	}
}

// TestALogHandlersPanicLeavesTheLossWritten: the handler panics at the
// record of a node's loss, having refreshed the lock, which found it lost
// (the other nodes held by another). The warning of the lock's loss,
// queued by that Refresh while the record was being written, is written
// all the same, without a later call of the Lock's: it stayed queued, with
// nobody to write it.
func TestALogHandlersPanicLeavesTheLossWritten(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	var (
		buf      redistest.Buffer
		held     atomic.Pointer[redlock.Lock]
		panicked atomic.Bool
		lost     = make(chan error, 1)
	)
	h := &callbackHandler{Handler: slog.NewJSONHandler(&buf, nil), on: func(r slog.Record) {
		if strings.Contains(r.Message, "quorum still holds") && panicked.CompareAndSwap(false, true) {
			for _, srv := range srvs[1:] {
				srv.Do(t, "HSET", "dlock:{stranded}", "token", "another-holder", "req", "another-holder")
			}
			lost <- held.Load().Refresh(context.Background(), 5*time.Second)
			panic("the handler failed")
		}
	}}
	r := newLocker(t, srvs, redlock.WithLogger(slog.New(h)))
	ctx := context.Background()
	l, err := r.TryLock(ctx, "stranded", redlock.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	held.Store(l)
	srvs[0].Do(t, "DEL", "dlock:{stranded}")
	refresh := func() (p any) {
		defer func() { p = recover() }()
		if err := l.Refresh(ctx, 5*time.Second); err != nil {
			t.Errorf("Refresh: %v; a quorum still held it", err)
		}
		return nil
	}
	if p := refresh(); p == nil {
		t.Fatal("the handler's panic did not reach the Refresh that wrote its record")
	}
	if err := <-lost; !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("the handler's Refresh: %v, want ErrNotHeld (lost)", err)
	}
	logs := func() []logRecord { return parseRecords(t, buf.String()) }
	awaitRecord(t, logs, `"redlock: lock lost"`, func(r logRecord) bool { return r.msg() == "redlock: lock lost" })
}
