package dlock_test

import (
	"context"
	"strconv"
	"testing"
)

// BenchmarkTryLockRelease measures an uncontended acquire and release on
// one client: time, allocations and bytes per pair. The benchmark module
// under bench/ compares it with other libraries.
func BenchmarkTryLockRelease(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	names := make([]string, 1024)
	for i := range names {
		names[i] = "bench:" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		l, err := e.c.TryLock(ctx, names[i%len(names)])
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
