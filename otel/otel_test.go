package dlockotel_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	dlockotel "github.com/dlockio/dlock/otel"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

var (
	exclusive   = attribute.String("dlock.lock.mode", dlock.ModeExclusive)
	read        = attribute.String("dlock.lock.mode", dlock.ModeRead)
	permit      = attribute.String("dlock.lock.mode", dlock.ModePermit)
	waits       = attribute.Bool("dlock.acquire.wait", true)
	tries       = attribute.Bool("dlock.acquire.wait", false)
	obtained    = attribute.String("dlock.acquire.outcome", dlock.OutcomeObtained)
	notObtained = attribute.String("dlock.acquire.outcome", dlock.OutcomeNotObtained)
	failed      = attribute.String("dlock.acquire.outcome", dlock.OutcomeError)
	released    = attribute.String("dlock.hold.end", "released")
	lost        = attribute.String("dlock.hold.end", "lost")
)

func TestAcquisitionsByOutcome(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	free, taken, wrong := e.name("free"), e.name("taken"), e.name("wrong")

	l, err := e.locks.TryLock(ctx, free)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	w, err := e.locks.Lock(ctx, e.name("waited"))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Release(ctx)
	holder, err := e.other.TryLock(ctx, taken)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(ctx)
	if _, err := e.locks.TryLock(ctx, taken); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock of a taken lock: %v", err)
	}
	if err := e.rdb.Set(ctx, key(wrong), "not a lock", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.locks.TryLock(ctx, wrong); !errors.Is(err, dlock.ErrWrongType) {
		t.Fatalf("TryLock of a foreign key: %v", err)
	}

	e.wantSum("dlock.acquisitions", 4)
	e.wantSum("dlock.acquisitions", 1, exclusive, tries, obtained)
	e.wantSum("dlock.acquisitions", 1, exclusive, waits, obtained)
	e.wantSum("dlock.acquisitions", 1, exclusive, tries, notObtained)
	e.wantSum("dlock.acquisitions", 1, exclusive, tries, failed)
	e.wantCount("dlock.acquire.duration", 4)
	e.wantCount("dlock.acquire.duration", 2, obtained)
	e.wantCount("dlock.acquire.duration", 1, notObtained)
	e.wantCount("dlock.acquire.duration", 1, failed)
	e.wantSum("dlock.held_locks", 2, exclusive)
	e.wantSum("dlock.acquire.retries", 0)

	spans := e.ended("dlock.acquire")
	if len(spans) != 4 {
		t.Fatalf("%d dlock.acquire spans, want 4", len(spans))
	}
	for i, want := range []struct {
		name, outcome string
		wait          bool
		code          codes.Code
	}{
		{free, dlock.OutcomeObtained, false, codes.Unset},
		{e.name("waited"), dlock.OutcomeObtained, true, codes.Unset},
		{taken, dlock.OutcomeNotObtained, false, codes.Unset},
		{wrong, dlock.OutcomeError, false, codes.Error},
	} {
		s := spans[i]
		if v, _ := attr(s, "dlock.lock.names"); !slices.Equal(v.AsStringSlice(), []string{want.name}) {
			t.Errorf("span %d: names %v, want [%s]", i, v.AsStringSlice(), want.name)
		}
		if v, _ := attr(s, "dlock.lock.mode"); v.AsString() != dlock.ModeExclusive {
			t.Errorf("span %d: mode %q", i, v.AsString())
		}
		if v, _ := attr(s, "dlock.acquire.wait"); v.AsBool() != want.wait {
			t.Errorf("span %d: wait %v, want %v", i, v.AsBool(), want.wait)
		}
		if v, _ := attr(s, "dlock.acquire.outcome"); v.AsString() != want.outcome {
			t.Errorf("span %d: outcome %q, want %q", i, v.AsString(), want.outcome)
		}
		if v, _ := attr(s, "dlock.acquire.attempts"); v.AsInt64() != 1 {
			t.Errorf("span %d: attempts %d, want 1", i, v.AsInt64())
		}
		if s.Status().Code != want.code {
			t.Errorf("span %d: status %v, want %v", i, s.Status(), want.code)
		}
		_, hasFence := attr(s, "dlock.lock.fence")
		if hasFence != (want.outcome == dlock.OutcomeObtained) {
			t.Errorf("span %d (%s): fence attribute present = %v", i, want.outcome, hasFence)
		}
	}
	if v, _ := attr(spans[0], "dlock.lock.fence"); uint64(v.AsInt64()) != l.Fence() {
		t.Errorf("fence attribute %d, want %d", v.AsInt64(), l.Fence())
	}
	if ev := spans[3].Events(); len(ev) != 1 || ev[0].Name != "exception" {
		t.Errorf("events of the failed acquisition: %v, want the error recorded", ev)
	}
}

func TestHeldLocksReturnToZero(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()

	// Released.
	l, err := e.locks.TryLock(ctx, e.name("released"))
	if err != nil {
		t.Fatal(err)
	}
	e.wantSum("dlock.held_locks", 1, exclusive)
	if err := l.Refresh(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	e.wantSum("dlock.held_locks", 0)
	e.wantCount("dlock.hold.duration", 1, exclusive, released)
	e.wantSum("dlock.refreshes", 1, exclusive, attribute.String("dlock.refresh.outcome", "refreshed"))

	// A release that finds the lock gone ends nothing more: the refresh
	// that found it gone reported the loss.
	gone := e.name("gone")
	l, err = e.locks.TryLock(ctx, gone)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.Del(ctx, key(gone)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(ctx, time.Minute); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Refresh of a deleted lock: %v", err)
	}
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Release of a lost lock: %v", err)
	}
	e.wantSum("dlock.held_locks", 0)
	e.wantSum("dlock.lost_locks", 1, exclusive)
	e.wantSum("dlock.refreshes", 1, exclusive, attribute.String("dlock.refresh.outcome", "not_held"))
	e.wantCount("dlock.hold.duration", 1, exclusive, lost)

	// Lost at its deadline, on the timer's goroutine.
	l, err = e.locks.TryLock(ctx, e.name("lapsed"), dlock.WithTTL(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	e.eventually("the lapsed lock is counted lost", func() bool { return e.sum("dlock.lost_locks") == 2 })
	e.wantSum("dlock.held_locks", 0)
	if !errors.Is(l.Err(), dlock.ErrLost) {
		t.Errorf("Err = %v, want ErrLost", l.Err())
	}

	// Ended at its max hold: its holder's bound, not a loss.
	l, err = e.locks.TryLock(ctx, e.name("capped"), dlock.WithTTL(100*time.Millisecond), dlock.WithAutoRefresh(),
		dlock.WithMaxHold(150*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	<-l.Done()
	if !errors.Is(l.Err(), dlock.ErrMaxHold) {
		t.Errorf("Err = %v, want ErrMaxHold", l.Err())
	}
	e.wantSum("dlock.held_locks", 0)
	e.wantSum("dlock.lost_locks", 2)
	e.wantCount("dlock.hold.duration", 1, exclusive, attribute.String("dlock.hold.end", "max_hold"))

	// Read holds and permits are counted by mode.
	r, err := e.locks.RWMutex(e.name("doc")).RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p, err := e.locks.Semaphore(e.name("pool"), 2).TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e.wantSum("dlock.held_locks", 1, read)
	e.wantSum("dlock.held_locks", 1, permit)
	e.wantSum("dlock.held_locks", 2)
	// They have no fence: their spans carry none.
	for _, s := range e.ended("dlock.acquire") {
		if v, _ := attr(s, "dlock.lock.mode"); v.AsString() != dlock.ModeExclusive {
			if f, ok := attr(s, "dlock.lock.fence"); ok {
				t.Errorf("a %s span has the fence attribute %d", v.AsString(), f.AsInt64())
			}
		}
	}
	if err := r.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	e.wantSum("dlock.held_locks", 0)
	e.wantCount("dlock.hold.duration", 6)
	e.wantCount("dlock.hold.duration", 3, released)
	e.wantCount("dlock.hold.duration", 1, read, released)
	e.wantCount("dlock.hold.duration", 1, permit, released)
}

func TestRetriesUnderContention(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	name := e.name("contended")

	// Left to expire: the waiter retries until the holder's TTL runs out.
	const ttl = 300 * time.Millisecond
	taken := time.Now()
	if _, err := e.other.TryLock(ctx, name, dlock.WithTTL(ttl)); err != nil {
		t.Fatal(err)
	}
	called := time.Now()
	l, err := e.locks.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	retries := e.sum("dlock.acquire.retries", exclusive, attribute.String("dlock.retry.reason", dlock.OutcomeNotObtained))
	if retries < 1 || retries != e.sum("dlock.acquire.retries") {
		t.Errorf("retries: %d for contention of %d", retries, e.sum("dlock.acquire.retries"))
	}
	// At least what was left of the holder's TTL when the wait began (the
	// clock's granularity aside).
	left := ttl - called.Sub(taken) - 5*time.Millisecond
	if n, wait := e.histogram("dlock.acquire.duration", waits, obtained); n != 1 || wait < left.Seconds() {
		t.Errorf("acquire.duration: %d points, %.3fs; want 1, at least the holder's remaining %v", n, wait, left)
	}
	span := e.ended("dlock.acquire")[0]
	if v, _ := attr(span, "dlock.acquire.attempts"); v.AsInt64() != retries+1 {
		t.Errorf("attempts %d, want one more than the %d retries", v.AsInt64(), retries)
	}
	var events int64
	for _, ev := range span.Events() {
		if ev.Name == "dlock.retry" {
			events++
		}
	}
	if events != retries {
		t.Errorf("%d dlock.retry events, want %d", events, retries)
	}

	// Given up after its first refusal: not obtained after waiting.
	wctx, giveUp := context.WithTimeout(ctx, 5*time.Second)
	defer giveUp()
	if _, err := e.locks.Lock(wctx, name, dlock.WithOnRetry(func(int, error) { giveUp() })); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatal(err)
	}
	e.wantSum("dlock.acquisitions", 1, waits, notObtained)
	if n := e.sum("dlock.acquire.retries"); n <= retries {
		t.Errorf("retries %d after a wait that gave up, want more than %d", n, retries)
	}
}

func TestSpansNestUnderTheCaller(t *testing.T) {
	e := newEnv(t)
	ctx, parent := e.tp.Tracer("app").Start(context.Background(), "job")
	name := e.name("nested")
	l, err := e.locks.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("second Release: %v", err)
	}
	parent.End()

	for _, name := range []string{"dlock.acquire", "dlock.release"} {
		for _, s := range e.ended(name) {
			if s.Parent().SpanID() != parent.SpanContext().SpanID() || s.SpanContext().TraceID() != parent.SpanContext().TraceID() {
				t.Errorf("%s: parent %v, trace %v; want the caller's span %v", name, s.Parent().SpanID(), s.SpanContext().TraceID(), parent.SpanContext())
			}
		}
	}
	rel := e.ended("dlock.release")
	if len(rel) != 2 {
		t.Fatalf("%d dlock.release spans, want 2", len(rel))
	}
	for i, want := range []struct {
		outcome string
		code    codes.Code
	}{{"released", codes.Unset}, {"not_held", codes.Error}} {
		if v, _ := attr(rel[i], "dlock.release.outcome"); v.AsString() != want.outcome || rel[i].Status().Code != want.code {
			t.Errorf("release %d: outcome %q, status %v; want %q, %v", i, v.AsString(), rel[i].Status(), want.outcome, want.code)
		}
		if v, _ := attr(rel[i], "dlock.lock.names"); !slices.Equal(v.AsStringSlice(), []string{name}) {
			t.Errorf("release %d: names %v", i, v.AsStringSlice())
		}
	}
	// The second release found nothing to release, and ended no lock.
	e.wantSum("dlock.held_locks", 0)
	e.wantCount("dlock.hold.duration", 1)
}

// TestTwoSetsOfHooksEndTheirOwnSpans: each set of hooks ends the span it
// started, though the second's is the innermost in the context.
func TestTwoSetsOfHooksEndTheirOwnSpans(t *testing.T) {
	ctx := context.Background()
	var recs [2]*tracetest.SpanRecorder
	var opts []dlock.ClientOption
	for i := range recs {
		recs[i] = tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recs[i]))
		t.Cleanup(func() { _ = tp.Shutdown(ctx) })
		h, err := dlockotel.Hooks(dlockotel.WithTracerProvider(tp), dlockotel.WithMeterProvider(metricnoop.NewMeterProvider()))
		if err != nil {
			t.Fatal(err)
		}
		opts = append(opts, dlock.WithHooks(h))
	}
	locks := newClient(t, opts...)
	l, err := locks.TryLock(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for i, rec := range recs {
		var names []string
		for _, s := range rec.Ended() {
			names = append(names, s.Name())
		}
		if !slices.Equal(names, []string{"dlock.acquire", "dlock.release"}) {
			t.Errorf("hooks %d ended %q", i, names)
		}
		if n := len(rec.Started()); n != 2 {
			t.Errorf("hooks %d started %d spans, want 2", i, n)
		}
	}
}

// TestGlobalProvidersByDefault: without providers (nil ones, or nil
// pointers to the SDK's), the hooks record with the global ones; a nil
// Option is left out, as dlock's own are.
func TestGlobalProvidersByDefault(t *testing.T) {
	reader, spans := sdkmetric.NewManualReader(), tracetest.NewSpanRecorder()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	otel.SetMeterProvider(mp)
	otel.SetTracerProvider(tp)
	t.Cleanup(func() {
		otel.SetMeterProvider(metricnoop.NewMeterProvider())
		otel.SetTracerProvider(tracenoop.NewTracerProvider())
		_ = mp.Shutdown(context.Background())
		_ = tp.Shutdown(context.Background())
	})
	// Typed nils too: an SDK provider's pointer left nil.
	h, err := dlockotel.Hooks(dlockotel.WithMeterProvider((*sdkmetric.MeterProvider)(nil)), nil, dlockotel.WithTracerProvider((*sdktrace.TracerProvider)(nil)))
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, reader: reader, spans: spans}
	ctx := context.Background()
	locks := newClient(t, dlock.WithHooks(h))
	l, err := locks.TryLock(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	e.wantSum("dlock.acquisitions", 1, obtained)
	if n := len(e.ended("dlock.acquire")); n != 1 {
		t.Errorf("%d dlock.acquire spans, want 1", n)
	}
}

// TestRedisErrors: Redis errors in a wait, a refresh and a release are
// told apart from contention and loss.
func TestRedisErrors(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()

	e.drv.fail.Store(1) // the first attempt
	l, err := e.locks.Lock(ctx, e.name("flaky"))
	if err != nil {
		t.Fatal(err)
	}
	e.wantSum("dlock.acquire.retries", 1, exclusive, attribute.String("dlock.retry.reason", dlock.OutcomeError))
	e.wantSum("dlock.acquisitions", 1, waits, obtained)
	span := e.ended("dlock.acquire")[0]
	if ev := span.Events(); len(ev) != 1 || ev[0].Name != "dlock.retry" {
		t.Fatalf("events %v, want one dlock.retry", ev)
	} else {
		set := attribute.NewSet(ev[0].Attributes...)
		msg, _ := set.Value("error.message")
		if !has(set, []attribute.KeyValue{attribute.Int("dlock.acquire.attempts", 1), attribute.String("dlock.retry.reason", dlock.OutcomeError)}) ||
			!strings.Contains(msg.AsString(), errInjected.Error()) {
			t.Errorf("dlock.retry event attributes %v", ev[0].Attributes)
		}
	}
	if span.Status().Code != codes.Unset {
		t.Errorf("status %v of an acquisition that obtained the lock", span.Status())
	}

	e.drv.fail.Store(1)
	if err := l.Refresh(ctx, time.Minute); !errors.Is(err, errInjected) {
		t.Fatalf("Refresh: %v", err)
	}
	e.wantSum("dlock.refreshes", 1, exclusive, attribute.String("dlock.refresh.outcome", "error"))

	// A failed release ends nothing: the lock is still held, until a
	// release succeeds (or its TTL runs out, and it is lost).
	e.drv.fail.Store(2) // Release sends a failed request once more
	if err := l.Release(ctx); !errors.Is(err, errInjected) {
		t.Fatalf("Release: %v", err)
	}
	e.wantSum("dlock.held_locks", 1, exclusive)
	rel := e.ended("dlock.release")
	if v, _ := attr(rel[0], "dlock.release.outcome"); v.AsString() != "error" || rel[0].Status().Code != codes.Error {
		t.Errorf("failed release: outcome %q, status %v", v.AsString(), rel[0].Status())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	e.wantSum("dlock.held_locks", 0)
	e.wantCount("dlock.hold.duration", 1, released)
	e.wantSum("dlock.lost_locks", 0)
}
