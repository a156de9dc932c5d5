// Command prometheus serves the metrics of dlock's locks to Prometheus.
// Three workers take turns at a lock on a Redis server, each holding it a
// moment and sometimes only trying; /metrics shows what they did:
//
//	go run ./examples/prometheus -redis 127.0.0.1:6379 -listen 127.0.0.1:2112
//	curl -s 127.0.0.1:2112/metrics | grep '^dlock_'
//
// It runs until interrupted.
package main

import (
	"context"
	"errors"
	"flag"
	"log"
	"math/rand/v2"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	dlockotel "github.com/dlockio/dlock/otel"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

func main() {
	addr := flag.String("redis", "127.0.0.1:6379", "the Redis server")
	listen := flag.String("listen", "127.0.0.1:2112", "where to serve /metrics")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	// OpenTelemetry metrics, read into a Prometheus registry. Without scope
	// info: the otel_scope_* labels would repeat dlock's scope on every line.
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		log.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer mp.Shutdown(context.Background())
	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Addr: *listen}
	go func() {
		if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
			log.Fatal(err)
		}
	}()
	defer srv.Close()

	// A dlock client followed by the hooks.
	hooks, err := dlockotel.Hooks(dlockotel.WithMeterProvider(mp))
	if err != nil {
		log.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: *addr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	locks := dlock.New(goredis.New(rdb), dlock.WithHooks(hooks))
	defer locks.Close()

	log.Printf("serving http://%s/metrics; interrupt to stop", *listen)
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			work(ctx, locks)
		}()
	}
	wg.Wait()
}

// work takes the lock, or only tries to one time in four, and holds it
// 10-60ms, until ctx ends.
func work(ctx context.Context, locks *dlock.Client) {
	for ctx.Err() == nil {
		var l *dlock.Lock
		var err error
		if rand.IntN(4) == 0 {
			l, err = locks.TryLock(ctx, "report", dlock.WithTTL(time.Second))
		} else {
			l, err = locks.Lock(ctx, "report", dlock.WithTTL(time.Second))
		}
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		time.Sleep(time.Duration(10+rand.IntN(50)) * time.Millisecond)
		_ = l.Release(context.WithoutCancel(ctx))
	}
}
