package dlockotel

import (
	"context"
	"errors"
	"reflect"
	"time"

	"github.com/dlockio/dlock"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the meter and the tracer that
// Hooks use.
const ScopeName = "github.com/dlockio/dlock/otel"

// The attributes, as the README's tables list them. Lock names go on spans
// only: on metrics they would make a time series per name.
const (
	keyMode           = attribute.Key("dlock.lock.mode")
	keyNames          = attribute.Key("dlock.lock.names")
	keyFence          = attribute.Key("dlock.lock.fence")
	keyWait           = attribute.Key("dlock.acquire.wait")
	keyOutcome        = attribute.Key("dlock.acquire.outcome")
	keyAttempts       = attribute.Key("dlock.acquire.attempts")
	keyRetryReason    = attribute.Key("dlock.retry.reason")
	keyRefreshOutcome = attribute.Key("dlock.refresh.outcome")
	keyHoldEnd        = attribute.Key("dlock.hold.end")
	keyReleaseOutcome = attribute.Key("dlock.release.outcome")
	keyErrorMessage   = attribute.Key("error.message")
)

// Values of dlock.refresh.outcome, dlock.release.outcome and dlock.hold.end
// (dlock.acquire.outcome and dlock.retry.reason take dlock's Outcome
// constants).
const (
	refreshed = "refreshed"
	released  = "released"
	notHeld   = "not_held"
	failed    = "error"
	lost      = "lost"
	maxHold   = "max_hold"
)

// Bucket boundaries, in seconds. An acquisition that does not wait takes
// a round trip, well under a millisecond on a local network; one that
// waits may take minutes. Holds last from milliseconds to hours.
var (
	acquireBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}
	holdBuckets    = []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600}
)

// Option configures Hooks.
type Option func(*config)

type config struct {
	mp metric.MeterProvider
	tp trace.TracerProvider
}

// WithMeterProvider sets the provider of the meter the metrics are
// recorded with. The default, also used for nil (a nil
// *sdkmetric.MeterProvider too), is the global one,
// otel.GetMeterProvider().
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.mp = mp }
}

// WithTracerProvider sets the provider of the tracer the spans are
// started with. The default, also used for nil (a nil
// *sdktrace.TracerProvider too), is the global one,
// otel.GetTracerProvider().
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// Hooks returns hooks for dlock.WithHooks that record the metrics and the
// spans described in the package documentation. Several clients may share
// them; give them to a client once (given twice, the two sets' spans of
// one acquisition are confused: one is ended twice, the other never). It
// fails only if the meter provider refuses to create an instrument.
func Hooks(opts ...Option) (dlock.Hooks, error) {
	var c config
	for _, o := range opts {
		if o != nil { // as dlock's own options, a nil one is left out
			o(&c)
		}
	}
	if isNil(c.mp) {
		c.mp = otel.GetMeterProvider()
	}
	if isNil(c.tp) {
		c.tp = otel.GetTracerProvider()
	}
	r, err := newRecorder(c)
	if err != nil {
		return dlock.Hooks{}, err
	}
	return dlock.Hooks{
		AcquireStart: r.acquireStart,
		Retry:        r.retry,
		AcquireDone:  r.acquireDone,
		Refresh:      r.refresh,
		ReleaseStart: r.releaseStart,
		ReleaseDone:  r.releaseDone,
		End:          r.end,
	}, nil
}

// recorder holds the instruments and the tracer of one set of hooks.
type recorder struct {
	tracer trace.Tracer

	acquireDuration metric.Float64Histogram
	acquisitions    metric.Int64Counter
	retries         metric.Int64Counter
	refreshes       metric.Int64Counter
	holdDuration    metric.Float64Histogram
	heldLocks       metric.Int64UpDownCounter
	lostLocks       metric.Int64Counter
}

func newRecorder(c config) (*recorder, error) {
	m := c.mp.Meter(ScopeName)
	r := &recorder{tracer: c.tp.Tracer(ScopeName)}
	var errs [7]error
	r.acquireDuration, errs[0] = m.Float64Histogram("dlock.acquire.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from the start of an acquisition to its outcome."),
		metric.WithExplicitBucketBoundaries(acquireBuckets...))
	r.acquisitions, errs[1] = m.Int64Counter("dlock.acquisitions", metric.WithUnit("{acquisition}"),
		metric.WithDescription("Acquisitions that ended, by outcome."))
	r.retries, errs[2] = m.Int64Counter("dlock.acquire.retries", metric.WithUnit("{retry}"),
		metric.WithDescription("Failed attempts of waiting acquisitions, the last before one gave up included, but not a refusal for good."))
	r.refreshes, errs[3] = m.Int64Counter("dlock.refreshes", metric.WithUnit("{refresh}"),
		metric.WithDescription("Refreshes of held locks, by Lock.Refresh or the watchdog, by outcome."))
	r.holdDuration, errs[4] = m.Float64Histogram("dlock.hold.duration", metric.WithUnit("s"),
		metric.WithDescription("How long locks were held, recorded when they were released, lost, or ended at their max hold."),
		metric.WithExplicitBucketBoundaries(holdBuckets...))
	r.heldLocks, errs[5] = m.Int64UpDownCounter("dlock.held_locks", metric.WithUnit("{lock}"),
		metric.WithDescription("Locks held now."))
	r.lostLocks, errs[6] = m.Int64Counter("dlock.lost_locks", metric.WithUnit("{lock}"),
		metric.WithDescription("Locks lost: found expired or taken, or past their deadline without a refresh."))
	return r, errors.Join(errs[:]...)
}

// spanKey is the context key of the span a recorder started: its own, so
// that two sets of these hooks on one client each end their own span.
type spanKey struct{ r *recorder }

// start starts a span called name for the hook info h and returns the
// context that carries it, under the recorder's key too.
func (r *recorder) start(ctx context.Context, name string, h dlock.HookInfo, extra ...attribute.KeyValue) context.Context {
	attrs := append([]attribute.KeyValue{keyMode.String(h.Mode), keyNames.StringSlice(h.Names)}, extra...)
	ctx, span := r.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
	return context.WithValue(ctx, spanKey{r}, span)
}

// span returns the span the recorder started in ctx; a no-op span if
// there is none.
func (r *recorder) span(ctx context.Context) trace.Span {
	if s, ok := ctx.Value(spanKey{r}).(trace.Span); ok {
		return s
	}
	return trace.SpanFromContext(context.Background()) // the no-op span
}

func (r *recorder) acquireStart(ctx context.Context, h dlock.HookInfo) context.Context {
	return r.start(ctx, "dlock.acquire", h, keyWait.Bool(h.Wait))
}

func (r *recorder) retry(ctx context.Context, h dlock.HookInfo, failedAttempts int, err error) {
	reason := dlock.OutcomeError
	if errors.Is(err, dlock.ErrNotObtained) {
		reason = dlock.OutcomeNotObtained
	}
	r.retries.Add(ctx, 1, metric.WithAttributes(keyMode.String(h.Mode), keyRetryReason.String(reason)))
	if span := r.span(ctx); span.IsRecording() {
		attrs := []attribute.KeyValue{keyAttempts.Int(failedAttempts), keyRetryReason.String(reason)}
		if reason == dlock.OutcomeError {
			attrs = append(attrs, keyErrorMessage.String(err.Error()))
		}
		span.AddEvent("dlock.retry", trace.WithAttributes(attrs...))
	}
}

func (r *recorder) acquireDone(ctx context.Context, h dlock.HookInfo, res dlock.AcquireResult) {
	mode := keyMode.String(h.Mode)
	attrs := metric.WithAttributes(mode, keyWait.Bool(h.Wait), keyOutcome.String(res.Outcome))
	r.acquireDuration.Record(ctx, res.Wait.Seconds(), attrs)
	r.acquisitions.Add(ctx, 1, attrs)
	if res.Outcome == dlock.OutcomeObtained {
		r.heldLocks.Add(ctx, 1, metric.WithAttributes(mode))
	}
	span := r.span(ctx)
	span.SetAttributes(keyOutcome.String(res.Outcome), keyAttempts.Int(res.Attempts))
	if res.Outcome == dlock.OutcomeObtained && res.Fence != 0 {
		// Read holds and permits have no fence (0).
		span.SetAttributes(keyFence.Int64(int64(res.Fence)))
	}
	if res.Outcome == dlock.OutcomeError && res.Err != nil {
		span.RecordError(res.Err)
		span.SetStatus(codes.Error, res.Err.Error())
	}
	span.End()
}

func (r *recorder) refresh(ctx context.Context, h dlock.HookInfo, err error) {
	outcome := refreshed
	switch {
	case errors.Is(err, dlock.ErrNotHeld):
		outcome = notHeld
	case err != nil:
		outcome = failed
	}
	r.refreshes.Add(ctx, 1, metric.WithAttributes(keyMode.String(h.Mode), keyRefreshOutcome.String(outcome)))
}

func (r *recorder) releaseStart(ctx context.Context, h dlock.HookInfo) context.Context {
	return r.start(ctx, "dlock.release", h)
}

func (r *recorder) releaseDone(ctx context.Context, _ dlock.HookInfo, _ time.Duration, err error) {
	// The lock's end is counted by End, which comes once per lock.
	outcome := released
	switch {
	case errors.Is(err, dlock.ErrNotHeld):
		outcome = notHeld
	case err != nil:
		outcome = failed
	}
	span := r.span(ctx)
	span.SetAttributes(keyReleaseOutcome.String(outcome))
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// end records the end of a held lock: released, lost, or at its max hold
// (WithMaxHold: its holder's bound, not a loss).
func (r *recorder) end(h dlock.HookInfo, held time.Duration, err error) {
	ctx := context.Background()
	how := released
	switch {
	case errors.Is(err, dlock.ErrMaxHold):
		how = maxHold
	case err != nil:
		how = lost
		r.lostLocks.Add(ctx, 1, metric.WithAttributes(keyMode.String(h.Mode)))
	}
	mode := keyMode.String(h.Mode)
	r.holdDuration.Record(ctx, held.Seconds(), metric.WithAttributes(mode, keyHoldEnd.String(how)))
	r.heldLocks.Add(ctx, -1, metric.WithAttributes(mode))
}

// isNil reports whether p is nil, or a nil pointer in an interface (a
// nil *sdkmetric.MeterProvider given as a metric.MeterProvider), whose
// methods the SDK would fail in.
func isNil(p any) bool {
	if p == nil {
		return true
	}
	v := reflect.ValueOf(p)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
