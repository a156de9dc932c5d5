package dlockotel_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	"github.com/dlockio/dlock/internal/redistest"
	dlockotel "github.com/dlockio/dlock/otel"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// redisAddr is the address of the Redis server the tests and the examples
// share; each test uses lock names of its own.
var redisAddr string

func TestMain(m *testing.M) { redistest.RunMain(m, &redisAddr) }

// env is one test's client, followed by the hooks, with the metrics and
// spans they recorded; and another client, not followed, as another
// process would have.
type env struct {
	t      *testing.T
	rdb    *redis.Client
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	drv    *flakyDriver // the driver of locks
	locks  *dlock.Client
	other  *dlock.Client
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(e.reader))
	e.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(e.spans))
	t.Cleanup(func() {
		_ = mp.Shutdown(context.Background())
		_ = e.tp.Shutdown(context.Background())
	})
	h, err := dlockotel.Hooks(dlockotel.WithMeterProvider(mp), dlockotel.WithTracerProvider(e.tp))
	if err != nil {
		t.Fatal(err)
	}
	e.rdb = newRedis(t)
	e.drv = &flakyDriver{Driver: goredis.New(newRedis(t))}
	e.locks = dlock.New(e.drv, dlock.WithHooks(h))
	t.Cleanup(func() { _ = e.locks.Close() })
	e.other = newClient(t)
	return e
}

// errInjected is the error of the calls that flakyDriver fails.
var errInjected = errors.New("injected failure")

// flakyDriver fails its next Eval calls, as many as fail says, as Redis
// could: the scripts do not run.
type flakyDriver struct {
	dlock.Driver
	fail atomic.Int32
}

func (d *flakyDriver) Eval(ctx context.Context, calls ...*dlock.Call) {
	if d.fail.Add(-1) >= 0 {
		for _, c := range calls {
			c.Err = errInjected
		}
		return
	}
	d.fail.Store(0)
	d.Driver.Eval(ctx, calls...)
}

// newRedis returns a go-redis client of the test's own, closed with it.
func newRedis(t *testing.T) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// newClient returns a dlock client on a connection of its own, closed with
// the test.
func newClient(t *testing.T, opts ...dlock.ClientOption) *dlock.Client {
	c := dlock.New(goredis.New(newRedis(t)), opts...)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// name returns a lock name of the test's own.
func (e *env) name(s string) string { return e.t.Name() + "/" + s }

// key returns the Redis key of the exclusive lock called name.
func key(name string) string { return "dlock:{" + name + "}" }

// metrics returns what the hooks recorded so far, by instrument name.
func (e *env) metrics() map[string]metricdata.Metrics {
	e.t.Helper()
	var rm metricdata.ResourceMetrics
	if err := e.reader.Collect(context.Background(), &rm); err != nil {
		e.t.Fatal(err)
	}
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != dlockotel.ScopeName {
			e.t.Errorf("scope %q, want %q", sm.Scope.Name, dlockotel.ScopeName)
		}
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// sum returns the total of the points of the counter or up-down counter
// called name whose attributes include attrs.
func (e *env) sum(name string, attrs ...attribute.KeyValue) int64 {
	e.t.Helper()
	m, ok := e.metrics()[name]
	if !ok {
		return 0
	}
	s, ok := m.Data.(metricdata.Sum[int64])
	if !ok {
		e.t.Fatalf("%s is a %T, not an int64 sum", name, m.Data)
	}
	var n int64
	for _, p := range s.DataPoints {
		if has(p.Attributes, attrs) {
			n += p.Value
		}
	}
	return n
}

// histogram returns the count and the sum of the points of the histogram
// called name whose attributes include attrs.
func (e *env) histogram(name string, attrs ...attribute.KeyValue) (count uint64, sum float64) {
	e.t.Helper()
	m, ok := e.metrics()[name]
	if !ok {
		return 0, 0
	}
	h, ok := m.Data.(metricdata.Histogram[float64])
	if !ok {
		e.t.Fatalf("%s is a %T, not a float64 histogram", name, m.Data)
	}
	for _, p := range h.DataPoints {
		if has(p.Attributes, attrs) {
			count += p.Count
			sum += p.Sum
		}
	}
	return count, sum
}

// has reports whether set has every attribute of attrs.
func has(set attribute.Set, attrs []attribute.KeyValue) bool {
	for _, kv := range attrs {
		if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// wantSum checks the total of a counter's points with attrs.
func (e *env) wantSum(name string, want int64, attrs ...attribute.KeyValue) {
	e.t.Helper()
	if got := e.sum(name, attrs...); got != want {
		e.t.Errorf("%s%v = %d, want %d", name, attrs, got, want)
	}
}

// wantCount checks the count of a histogram's points with attrs.
func (e *env) wantCount(name string, want uint64, attrs ...attribute.KeyValue) {
	e.t.Helper()
	if got, _ := e.histogram(name, attrs...); got != want {
		e.t.Errorf("%s%v count = %d, want %d", name, attrs, got, want)
	}
}

// eventually waits until cond holds, failing the test after 5s.
func (e *env) eventually(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("still not so after 5s: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ended returns the ended spans called name, in the order they ended.
func (e *env) ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range e.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// attr returns the attribute key of span s, and whether it has it.
func attr(s sdktrace.ReadOnlySpan, key attribute.Key) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}
