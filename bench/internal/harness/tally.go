package harness

import (
	"fmt"
	"os"
	"sort"
	"strconv"
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

// machineBusy returns the CPU time all CPUs of the machine have spent busy
// (not idle, not waiting for I/O), from /proc/stat; false where unknown.
func machineBusy() (time.Duration, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return 0, false
	}
	var busy int64
	for i, v := range f[1:] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, false
		}
		if i == 3 || i == 4 || i >= 7 { // idle, iowait; steal and guest time are not ours to count
			continue
		}
		busy += n
	}
	const clockTick = 100 // USER_HZ on Linux
	return time.Duration(busy) * time.Second / clockTick, true
}
