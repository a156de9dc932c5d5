package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/rs/zerolog"
)

func init() {
	toxics.Register("cut_once", new(cutOnce))
}

// cutOnce is a toxic that drops the next Times chunks that pass it, on
// whichever connections they come, and closes the connection each came
// on: downstream, a request runs but its reply is lost, once.
type cutOnce struct {
	Times int64 `json:"times"`
}

func (t *cutOnce) Pipe(stub *toxics.ToxicStub) {
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			if atomic.AddInt64(&t.Times, -1) >= 0 {
				stub.Close()
				return
			}
			stub.Output <- c
		}
	}
}

// faultProxy is a TCP proxy on loopback, in this process, between some of
// the clients and the lock's Redis server: toxiproxy, whose toxics delay,
// cut or drop the traffic.
type faultProxy struct {
	p *toxiproxy.Proxy

	mu      sync.Mutex
	enabled bool
}

func newFaultProxy(name, upstream string) (*faultProxy, error) {
	zerolog.SetGlobalLevel(zerolog.Disabled) // toxics log through the global logger
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("starting the fault proxy: %w", err)
	}
	return &faultProxy{p: p, enabled: true}, nil
}

// addr is where clients connect to go through the proxy.
func (f *faultProxy) addr() string { return f.p.Listen }

// toxic adds a toxic; remove takes it away again.
func (f *faultProxy) toxic(name, typ, stream string, attrs map[string]int64) error {
	b, err := json.Marshal(map[string]any{"name": name, "type": typ, "stream": stream, "toxicity": 1.0, "attributes": attrs})
	if err != nil {
		return err
	}
	_, err = f.p.Toxics.AddToxicJson(strings.NewReader(string(b)))
	return err
}

func (f *faultProxy) remove(name string) {
	_ = f.p.Toxics.RemoveToxic(context.Background(), name)
}

// partition closes every connection through the proxy and refuses new ones
// until heal.
func (f *faultProxy) partition() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.enabled {
		f.p.Stop()
		f.enabled = false
	}
}

func (f *faultProxy) heal() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.enabled {
		return nil
	}
	var err error
	for range 50 { // the port may linger for a moment
		if err = f.p.Start(); err == nil {
			f.enabled = true
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("restarting the fault proxy: %w", err)
}

func (f *faultProxy) close() {
	f.p.Toxics.ResetToxics(context.Background())
	f.partition()
}

// fault is one kind of network fault: inject starts one window of it and
// returns the function that ends the window.
type fault struct {
	name     string
	short    string // for the summary
	describe string
	// window bounds how long each injection lasts, and gap how long the
	// network stays healthy between two.
	window, gap [2]time.Duration
	inject      func(f *faultProxy, r *rand.Rand) (undo func() error, err error)
}

// faultLog counts what a fault loop injected.
type faultLog struct {
	windows int
	total   time.Duration
}

// runFaults injects windows of flt until stop is closed or until passes,
// and leaves the network healthy.
func runFaults(px *faultProxy, flt fault, until time.Time, stop <-chan struct{}, seed uint64) (faultLog, error) {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	var log faultLog
	pause := func(d [2]time.Duration) bool {
		t := time.NewTimer(between(r, d))
		defer t.Stop()
		select {
		case <-t.C:
			return time.Now().Before(until)
		case <-stop:
			return false
		}
	}
	for pause(flt.gap) {
		start := time.Now()
		undo, err := flt.inject(px, r)
		if err != nil {
			return log, err
		}
		pause(flt.window)
		if err := undo(); err != nil {
			return log, err
		}
		log.windows++
		log.total += time.Since(start)
	}
	return log, nil
}

// between returns a random duration in [d[0], d[1]].
func between(r *rand.Rand, d [2]time.Duration) time.Duration {
	if d[1] <= d[0] {
		return d[0]
	}
	return d[0] + time.Duration(r.Int64N(int64(d[1]-d[0])+1))
}

// networkFaults are the faults of the network scenarios, scaled to the
// lock's TTL.
func networkFaults(ttl time.Duration) []fault {
	ms := func(d time.Duration) int64 { return d.Milliseconds() }
	return []fault{{
		name:  "latency",
		short: fmt.Sprintf("replies delayed %v, beyond the %v TTL", 3*ttl/2, ttl),
		describe: fmt.Sprintf("replies (and in a third of the windows requests too) delayed by %v ± %v, beyond the %v TTL, "+
			"for windows of %v–%v every %v–%v", 3*ttl/2, ttl/5, ttl, ttl, 3*ttl, ttl, 3*ttl),
		window: [2]time.Duration{ttl, 3 * ttl},
		gap:    [2]time.Duration{ttl, 3 * ttl},
		inject: func(f *faultProxy, r *rand.Rand) (func() error, error) {
			attrs := map[string]int64{"latency": ms(3 * ttl / 2), "jitter": ms(ttl / 5)}
			if err := f.toxic("lat_down", "latency", "downstream", attrs); err != nil {
				return nil, err
			}
			both := r.IntN(3) == 0
			if both {
				if err := f.toxic("lat_up", "latency", "upstream", attrs); err != nil {
					return nil, err
				}
			}
			return func() error {
				f.remove("lat_down")
				if both {
					f.remove("lat_up")
				}
				return nil
			}, nil
		},
	}, {
		name:  "cuts",
		short: "connections cut mid-request",
		describe: fmt.Sprintf("connections cut mid-request: requests reset before they reach Redis (reset_peer), "+
			"or replies cut after 1–64 bytes so the request ran but its answer was lost (limit_data), "+
			"for windows of %v–%v every %v–%v", ttl/5, ttl, ttl/2, 2*ttl),
		window: [2]time.Duration{ttl / 5, ttl},
		gap:    [2]time.Duration{ttl / 2, 2 * ttl},
		inject: func(f *faultProxy, r *rand.Rand) (func() error, error) {
			name, typ, stream, attrs := "cut", "reset_peer", "upstream", map[string]int64{"timeout": r.Int64N(20)}
			if r.IntN(2) == 0 {
				typ, stream, attrs = "limit_data", "downstream", map[string]int64{"bytes": 1 + r.Int64N(64)}
			}
			if err := f.toxic(name, typ, stream, attrs); err != nil {
				return nil, err
			}
			return func() error { f.remove(name); return nil }, nil
		},
	}, {
		name:  "blackhole",
		short: "traffic black-holed",
		describe: fmt.Sprintf("traffic silently dropped in one direction or both (timeout toxic): requests lost, or run "+
			"with their replies lost, the connections open and silent until the window ends, then closed; "+
			"windows of %v–%v every %v–%v", ttl/5, 2*ttl, ttl, 3*ttl),
		window: [2]time.Duration{ttl / 5, 2 * ttl},
		gap:    [2]time.Duration{ttl, 3 * ttl},
		inject: func(f *faultProxy, r *rand.Rand) (func() error, error) {
			streams := [][]string{{"upstream"}, {"downstream"}, {"upstream", "downstream"}}[r.IntN(3)]
			for _, s := range streams {
				if err := f.toxic("hole_"+s, "timeout", s, map[string]int64{"timeout": 0}); err != nil {
					return nil, err
				}
			}
			return func() error {
				for _, s := range streams {
					f.remove("hole_" + s)
				}
				return nil
			}, nil
		},
	}, {
		name:  "partition",
		short: "short partitions",
		describe: fmt.Sprintf("short partitions: every connection through the proxy closed and new ones refused "+
			"for windows of %v–%v every %v–%v", ttl/5, 2*ttl, ttl, 3*ttl),
		window: [2]time.Duration{ttl / 5, 2 * ttl},
		gap:    [2]time.Duration{ttl, 3 * ttl},
		inject: func(f *faultProxy, _ *rand.Rand) (func() error, error) {
			f.partition()
			return f.heal, nil
		},
	}}
}
