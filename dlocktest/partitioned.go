package dlocktest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/keyslot"
)

// testPartitioned checks that a driver that implements dlock.Partitioned
// reports a cluster as one, and one server as not, and the primary of a
// key; and that on a cluster a client's request that one primary holds up
// does not hold up its requests to another, with a single pipeline slot.
func testPartitioned(t *testing.T, e *env) {
	p, ok := e.driver(t).(dlock.Partitioned)
	cluster := e.dep.Topology == Cluster
	switch {
	case !ok && cluster:
		t.Skip("the driver does not implement dlock.Partitioned: on a cluster, a stalled primary can hold up the client's requests to the others")
	case !ok:
		t.Skip("the driver does not implement dlock.Partitioned: it is taken for one server, as it is here")
	}
	if got := p.Partitioned(); got != cluster {
		t.Fatalf("Partitioned() = %v on a %v deployment", got, e.dep.Topology)
	}
	ctx := timeout(t)
	if !cluster {
		if got := p.Server(ctx, "{x}"); got != "" {
			t.Errorf("Server = %q on one server, want \"\"", got)
		}
		return
	}
	for _, srv := range e.primaries[:2] {
		key := "{" + e.tagOn(t, srv) + "}"
		if got := p.Server(ctx, key); got != srv.Addr() {
			t.Errorf("Server(%q) = %q, want %q, the primary that serves it", key, got, srv.Addr())
		}
	}
	// The client batches the requests to each server apart: or, for keys
	// whose server the driver cannot tell, each slot's.
	t.Run("ByServer", func(t *testing.T) { testHeldUpRequest(t, e, false) })
	t.Run("BySlot", func(t *testing.T) { testHeldUpRequest(t, e, true) })
}

// testHeldUpRequest checks that a client's request that one primary holds
// up does not hold up its requests to another, with a single pipeline
// slot; with unknown, over a driver that cannot tell a key's server.
func testHeldUpRequest(t *testing.T, e *env, unknown bool) {
	ctx := timeout(t)
	stalled, healthy, d, c := e.heldUp(t, dlock.WithPipelines(1))
	d.unknown = unknown
	d.hold.Store(true)
	held := make(chan error, 1)
	go func() {
		l, err := c.TryLock(ctx, stalled)
		if err == nil {
			err = l.Release(ctx)
		}
		held <- err
	}()
	receive(t, d.entered, "the held-up request")
	other, cancel := context.WithTimeout(ctx, 2*time.Second)
	l, err := c.TryLock(other, healthy)
	if err == nil {
		err = l.Release(other)
	}
	cancel()
	close(d.gate)
	if err != nil {
		t.Errorf("lock on another primary while a request is held up: %v", err)
	}
	if err := receive(t, held, "the held-up lock"); err != nil {
		t.Errorf("the held-up lock: %v", err)
	}
}

// testPartitionedRefreshes checks that, on a cluster, the automatic
// refreshes of a client's locks on one primary go on while those of its
// locks on another are held up: a stalled primary does not cost the
// client its locks elsewhere.
func testPartitionedRefreshes(t *testing.T, e *env) {
	if _, ok := e.driver(t).(dlock.Partitioned); !ok {
		t.Skip("the driver does not implement dlock.Partitioned")
	}
	// The watchdog groups the refreshes by server, or, for keys whose
	// server the driver cannot tell, by slot.
	t.Run("ByServer", func(t *testing.T) { testHeldUpRefresh(t, e, false) })
	t.Run("BySlot", func(t *testing.T) { testHeldUpRefresh(t, e, true) })
}

// testHeldUpRefresh checks that the refreshes of a lock go on while those
// of a lock on another primary are held up; with unknown, over a driver
// that cannot tell a key's server.
func testHeldUpRefresh(t *testing.T, e *env, unknown bool) {
	ctx := timeout(t)
	stalled, healthy, d, c := e.heldUp(t)
	d.unknown = unknown
	long, err := c.TryLock(ctx, stalled, dlock.WithTTL(3*time.Second), dlock.WithAutoRefresh())
	if err != nil {
		t.Fatal(err)
	}
	short, err := c.TryLock(ctx, healthy, dlock.WithTTL(600*time.Millisecond), dlock.WithAutoRefresh())
	if err != nil {
		t.Fatal(err)
	}
	d.hold.Store(true)
	receive(t, d.entered, "the held-up refresh")
	// Four refreshes of the short lock, 200ms apart: two TTLs of it,
	// within the long lock's.
	start := d.others.Load()
	await(t, "refreshes of the lock on the other primary", func() bool { return d.others.Load() >= start+4 })
	close(d.gate)
	for _, l := range []*dlock.Lock{short, long} {
		select {
		case <-l.Done():
			t.Errorf("%s lost while a refresh was held up: %v", l.Name(), l.Err())
		default:
		}
		if err := l.Release(ctx); err != nil {
			t.Errorf("Release %s: %v", l.Name(), err)
		}
	}
}

// heldUp returns a name on the first primary and one on the second, and
// a client over a heldUp driver that holds up the first one's calls once
// told to.
func (e *env) heldUp(t *testing.T, opts ...dlock.ClientOption) (stalled, healthy string, d *heldUp, c *dlock.Client) {
	stalled, healthy = "{"+e.tagOn(t, e.primaries[0])+"}", "{"+e.tagOn(t, e.primaries[1])+"}"
	d = &heldUp{Driver: e.driver(t), slot: keyslot.Of(stalled), entered: make(chan struct{}), gate: make(chan struct{})}
	opts = append([]dlock.ClientOption{dlock.WithPrefix(prefix(t))}, opts...)
	if e.functions {
		opts = append(opts, dlock.WithFunctions())
	}
	c = dlock.New(d, opts...)
	t.Cleanup(func() {
		select {
		case <-d.gate:
		default:
			close(d.gate)
		}
		_ = c.Close()
	})
	return stalled, healthy, d, c
}

// heldUp is a driver whose calls on one hash slot wait, once hold is set,
// until gate is closed before they are sent, as if their primary had
// stalled. It counts the calls on other slots. With unknown set, it
// cannot tell a key's server.
type heldUp struct {
	dlock.Driver
	unknown bool
	slot    int
	hold    atomic.Bool
	once    sync.Once
	entered chan struct{} // closed when the first call held up arrives
	gate    chan struct{}
	others  atomic.Int64
}

func (d *heldUp) Partitioned() bool { return d.Driver.(dlock.Partitioned).Partitioned() }

func (d *heldUp) Server(ctx context.Context, key string) string {
	if d.unknown {
		return ""
	}
	return d.Driver.(dlock.Partitioned).Server(ctx, key)
}

func (d *heldUp) Eval(ctx context.Context, calls ...*dlock.Call) {
	held := false
	for _, c := range calls {
		if len(c.Keys) > 0 && keyslot.Of(c.Keys[0]) == d.slot {
			held = true
		} else {
			d.others.Add(1)
		}
	}
	if held && d.hold.Load() {
		d.once.Do(func() { close(d.entered) })
		<-d.gate
	}
	d.Driver.Eval(ctx, calls...)
}
