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

// TestAClosedRueidisClientEndsAWaitAtOnce: once the rueidis client under
// the driver is closed (a shutdown that closes it first), an acquire fails
// with an error matching dlock.ErrClosed, and a wait under way ends then,
// rather than trying for its whole max wait, as over go-redis and redigo.
func TestAClosedRueidisClientEndsAWaitAtOnce(t *testing.T) {
	srv := redistest.Start(t)
	newClient := func() rueidis.Client {
		client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		return client
	}
	holder := newClient()
	t.Cleanup(holder.Close)
	h := dlock.New(dlockrueidis.New(holder))
	defer h.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := h.TryLock(ctx, "held", dlock.WithTTL(time.Minute)); err != nil {
		t.Fatal(err)
	}
	client := newClient()
	c := dlock.New(dlockrueidis.New(client))
	defer c.Close()
	got := make(chan error, 1)
	refused := make(chan struct{})
	var once sync.Once
	go func() {
		_, err := c.Lock(ctx, "held", dlock.WithOnRetry(func(int, error) { once.Do(func() { close(refused) }) }))
		got <- err
	}()
	<-refused
	client.Close()
	select {
	case err := <-got:
		if !errors.Is(err, dlock.ErrClosed) {
			t.Errorf("a wait when its rueidis client closed: %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the wait went on for 5s after its rueidis client closed")
	}
	if _, err := c.TryLock(ctx, "held"); !errors.Is(err, dlock.ErrClosed) {
		t.Errorf("a TryLock after its rueidis client closed: %v, want ErrClosed", err)
	}
	if _, err := c.Lock(ctx, "held"); !errors.Is(err, dlock.ErrClosed) || ctx.Err() != nil {
		t.Errorf("a wait after its rueidis client closed: %v (its context: %v), want ErrClosed at once", err, ctx.Err())
	}
}
