package dlockrueidis_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/redistest"
	dlockrueidis "github.com/dlockio/dlock/rueidis"
	"github.com/redis/rueidis"
)

// closedUnderAWait starts a server on which another client holds name (for
// a minute), has a dlock client over a rueidis client of its own wait for
// name with opts, and closes that rueidis client once an attempt of the
// wait was refused. It returns the server, the holder's Lock and client,
// the waiting client, and the wait's outcome to come.
func closedUnderAWait(t *testing.T, name string, opts ...dlock.Option) (srv *redistest.Server, held *dlock.Lock, h, c *dlock.Client, got <-chan error) {
	t.Helper()
	srv = redistest.Start(t)
	newClient := func() rueidis.Client {
		client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		return client
	}
	holder := newClient()
	t.Cleanup(holder.Close)
	h = dlock.New(dlockrueidis.New(holder))
	t.Cleanup(func() { _ = h.Close() })
	held, err := h.TryLock(context.Background(), name, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	client := newClient()
	c = dlock.New(dlockrueidis.New(client))
	t.Cleanup(func() { _ = c.Close() })
	out := make(chan error, 1)
	refused := make(chan struct{})
	var once sync.Once
	go func() {
		_, err := c.Lock(context.Background(), name, append(opts, dlock.WithMaxWait(20*time.Second),
			dlock.WithOnRetry(func(int, error) { once.Do(func() { close(refused) }) }))...)
		out <- err
	}()
	<-refused // it waits, registered, with its request for a grant
	client.Close()
	return srv, held, h, c, out
}

// TestAClosedRueidisClientEndsAWaitAtOnce: once the rueidis client under
// the driver is closed (a shutdown that closes it first), an acquire fails
// with an error matching dlock.ErrClosed, and a wait under way ends then,
// rather than trying for its whole max wait, as over go-redis and redigo.
func TestAClosedRueidisClientEndsAWaitAtOnce(t *testing.T) {
	_, _, _, c, got := closedUnderAWait(t, "held")
	select {
	case err := <-got:
		if !errors.Is(err, dlock.ErrClosed) {
			t.Errorf("a wait when its rueidis client closed: %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the wait went on for 5s after its rueidis client closed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.TryLock(ctx, "held"); !errors.Is(err, dlock.ErrClosed) {
		t.Errorf("a TryLock after its rueidis client closed: %v, want ErrClosed", err)
	}
	if _, err := c.Lock(ctx, "held"); !errors.Is(err, dlock.ErrClosed) || ctx.Err() != nil {
		t.Errorf("a wait after its rueidis client closed: %v (its context: %v), want ErrClosed at once", err, ctx.Err())
	}
}

// TestAWaiterWhoseClientClosedIsNotGrantedTheLock: a Lock that waits with
// its request for a grant when the application closes the rueidis client
// under the driver ends with ErrClosed, and the dlock client stops
// listening for notices: the release that follows passes over it. Its
// subscription's connection, which the rueidis client's Close leaves open,
// stayed open, so the release granted it the lock, which nobody could
// give back: the name stayed held, by nobody, for the waiter's TTL.
func TestAWaiterWhoseClientClosedIsNotGrantedTheLock(t *testing.T) {
	srv, held, h, _, got := closedUnderAWait(t, "job", dlock.WithTTL(20*time.Second))
	if err := <-got; !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("the wait: %v, want ErrClosed", err)
	}
	// The server has seen its subscription go (or, before, never did; the
	// release comes within its registration's lease all the same).
	for end := time.Now().Add(200 * time.Millisecond); srv.PubSubConnections(t) > 0 && time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond)
	}
	ctx := context.Background()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := h.TryLock(ctx, "job")
	if err != nil {
		t.Fatalf("after the only holder released: %v (PTTL %s)", err, srv.Do(t, "PTTL", "dlock:{job}"))
	}
	_ = l.Release(ctx)
}
