package dlockotel_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	dlockotel "github.com/dlockio/dlock/otel"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// Example_prometheus exports the metrics to Prometheus: an OpenTelemetry
// meter provider reads them into a Prometheus registry, which an HTTP
// handler serves. It prints the dlock lines of a scrape, less the
// histogram buckets and sums, whose values vary from run to run.
func Example_prometheus() {
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		fmt.Println(err)
		return
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer mp.Shutdown(context.Background())
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()

	hooks, err := dlockotel.Hooks(dlockotel.WithMeterProvider(mp))
	if err != nil {
		fmt.Println(err)
		return
	}
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	locks := dlock.New(goredis.New(rdb), dlock.WithHooks(hooks))
	defer locks.Close()

	ctx := context.Background()
	l, err := locks.TryLock(ctx, "nightly-report")
	if err != nil {
		fmt.Println(err)
		return
	}
	_, err = locks.TryLock(ctx, "nightly-report") // taken: not obtained
	fmt.Println(err)
	if err := l.Release(ctx); err != nil {
		fmt.Println(err)
		return
	}

	resp, err := http.Get(srv.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "dlock_") && !strings.Contains(line, "_bucket") && !strings.Contains(line, "_sum") {
			fmt.Println(line)
		}
	}
	// Output:
	// dlock: not obtained: "nightly-report" is held
	// dlock_acquire_duration_seconds_count{dlock_acquire_outcome="not_obtained",dlock_acquire_wait="false",dlock_lock_mode="exclusive"} 1
	// dlock_acquire_duration_seconds_count{dlock_acquire_outcome="obtained",dlock_acquire_wait="false",dlock_lock_mode="exclusive"} 1
	// dlock_acquisitions_total{dlock_acquire_outcome="not_obtained",dlock_acquire_wait="false",dlock_lock_mode="exclusive"} 1
	// dlock_acquisitions_total{dlock_acquire_outcome="obtained",dlock_acquire_wait="false",dlock_lock_mode="exclusive"} 1
	// dlock_held_locks{dlock_lock_mode="exclusive"} 0
	// dlock_hold_duration_seconds_count{dlock_hold_end="released",dlock_lock_mode="exclusive"} 1
}

// Example_tracing records the spans: dlock.acquire and dlock.release are
// children of the span in the context given to the call. A SpanRecorder
// stands in for the exporter an application would give its
// TracerProvider.
func Example_tracing() {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.Background())

	hooks, err := dlockotel.Hooks(dlockotel.WithTracerProvider(tp))
	if err != nil {
		fmt.Println(err)
		return
	}
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	locks := dlock.New(goredis.New(rdb), dlock.WithHooks(hooks))
	defer locks.Close()

	// The request the lock is taken for has a span of its own.
	ctx, request := tp.Tracer("example").Start(context.Background(), "POST /orders/42")
	l, err := locks.TryLock(ctx, "orders:42")
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := l.Release(ctx); err != nil {
		fmt.Println(err)
		return
	}
	request.End()

	for _, s := range spans.Ended() {
		if s.Parent().SpanID() != request.SpanContext().SpanID() {
			continue // the request's own span
		}
		fmt.Print(s.Name(), " under the request's span:")
		for _, kv := range s.Attributes() {
			switch kv.Key {
			case "dlock.lock.names", "dlock.acquire.outcome", "dlock.release.outcome":
				fmt.Print(" ", kv.Key, "=", kv.Value.Emit())
			}
		}
		fmt.Println()
	}
	// Output:
	// dlock.acquire under the request's span: dlock.lock.names=["orders:42"] dlock.acquire.outcome=obtained
	// dlock.release under the request's span: dlock.lock.names=["orders:42"] dlock.release.outcome=released
}
