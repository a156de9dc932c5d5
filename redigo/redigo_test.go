package redigo_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/dlocktest"
	"github.com/dlockio/dlock/internal/redistest"
	dlockredigo "github.com/dlockio/dlock/redigo"
	"github.com/gomodule/redigo/redis"
)

func TestMain(m *testing.M) { redistest.VerifyNoLeaks(m) }

// TestConformance runs the driver conformance suite over a redigo pool on
// a single server, the only deployment redigo knows, alone and with a
// replica to confirm writes on.
func TestConformance(t *testing.T) {
	dlocktest.Run(t, func(t testing.TB, d dlocktest.Deployment) dlock.Driver {
		return dlockredigo.New(newPool(t, d.Addrs[0]))
	}, dlocktest.Standalone, dlocktest.Replicated)
}

// newPool returns a pool of connections to addr, closed with the test.
func newPool(t testing.TB, addr string) *redis.Pool {
	pool := &redis.Pool{
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			return redis.DialContext(ctx, "tcp", addr, redis.DialReadTimeout(5*time.Second))
		},
		MaxIdle: 4,
	}
	t.Cleanup(func() { _ = pool.Close() })
	return pool
}

// TestClusterIsUnsupported: on a cluster node, names that another node
// serves fail with ErrUnsupported (the node answers MOVED), and so does
// List; names that node serves work.
func TestClusterIsUnsupported(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	locks := dlock.New(dlockredigo.New(newPool(t, c.Nodes[0].Addr())))
	defer locks.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	moved, served := 0, 0
	for i := range 12 {
		name := "n" + strconv.Itoa(i)
		l, err := locks.TryLock(ctx, name)
		var ce *dlockredigo.ClusterError
		switch {
		case err == nil:
			served++
			_ = l.Release(ctx)
		case errors.Is(err, dlock.ErrUnsupported) && errors.As(err, &ce):
			moved++
		default:
			t.Errorf("TryLock(%q): %v, want ErrUnsupported or success", name, err)
		}
	}
	if moved == 0 || served == 0 {
		t.Errorf("%d names served by the node, %d moved: want some of each", served, moved)
	}
	if _, err := locks.List(ctx, ""); !errors.Is(err, dlock.ErrUnsupported) {
		t.Errorf("List on a cluster node: err = %v, want ErrUnsupported", err)
	}
}
