package harness

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// errTally counts failed operations and keeps their messages, with digits
// blurred so that the same failure on different keys counts as one kind.
type errTally struct {
	mu    sync.Mutex
	n     int64
	kinds map[string]int64
}

const maxErrKinds = 4

func (t *errTally) add(op string, err error) {
	msg := op + ": " + blurDigits(err.Error())
	if len(msg) > 160 {
		msg = msg[:160] + "…"
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n++
	if t.kinds == nil {
		t.kinds = map[string]int64{}
	}
	if _, ok := t.kinds[msg]; ok || len(t.kinds) < maxErrKinds {
		t.kinds[msg]++
	}
}

func (t *errTally) count() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

// note describes the failures, most frequent first; "" if none.
func (t *errTally) note() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == 0 {
		return ""
	}
	kinds := make([]string, 0, len(t.kinds))
	for k := range t.kinds {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool { return t.kinds[kinds[i]] > t.kinds[kinds[j]] })
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%d× %s", t.kinds[k], k)
	}
	return fmt.Sprintf("%d failed operations (%s); ", t.n, strings.Join(parts, "; "))
}

func blurDigits(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return '#'
		}
		return r
	}, s)
}

// processCPU returns the CPU time this process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
