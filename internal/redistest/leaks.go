package redistest

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

const (
	// leakGrace is how long VerifyNoLeaks waits for goroutines to end.
	leakGrace = 5 * time.Second
	// leakPoll is how often VerifyNoLeaks looks again.
	leakPoll = 20 * time.Millisecond
)

// VerifyNoLeaks runs the tests and then fails (exit code 1, printing the
// leaked stacks to stderr) if goroutines started during the tests are still
// running after a grace period of up to 5s (polled every 20ms, so it passes
// as soon as they end). Goroutines that existed before the tests and known
// runtime and testing goroutines are ignored. If the tests fail, it exits
// with their exit code without checking. Use it as
//
//	func TestMain(m *testing.M) { redistest.VerifyNoLeaks(m) }
func VerifyNoLeaks(m *testing.M) { os.Exit(RunWithoutLeaks(m)) }

// RunWithoutLeaks is VerifyNoLeaks that returns the exit code instead of
// exiting, for a TestMain with work to do after the tests.
func RunWithoutLeaks(m *testing.M) int {
	before := map[int]bool{}
	for _, g := range goroutines() {
		before[g.id] = true
	}
	code := m.Run()
	if code != 0 {
		return code
	}
	deadline := time.Now().Add(leakGrace)
	for {
		leaked := leakedGoroutines(before)
		if len(leaked) == 0 {
			return 0
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			fmt.Fprintf(&b, "redistest: %d goroutine(s) leaked by the tests, still running %v after they finished:\n", len(leaked), leakGrace)
			for _, g := range leaked {
				b.WriteString("\n")
				b.WriteString(g.stack)
				b.WriteString("\n")
			}
			fmt.Fprint(os.Stderr, b.String())
			return 1
		}
		time.Sleep(leakPoll)
	}
}

// goroutine is one goroutine's entry in a runtime.Stack dump.
type goroutine struct {
	id    int
	stack string
}

// goroutines returns the stacks of all goroutines but the calling one.
func goroutines() []goroutine {
	buf := make([]byte, 64<<10)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var gs []goroutine
	for i, block := range strings.Split(strings.TrimSpace(string(buf)), "\n\n") {
		if i == 0 {
			continue // the calling goroutine comes first
		}
		var id int
		if _, err := fmt.Sscanf(block, "goroutine %d", &id); err != nil {
			continue
		}
		gs = append(gs, goroutine{id: id, stack: block})
	}
	return gs
}

// leakedGoroutines returns the goroutines that are not in before and are not
// known runtime or testing goroutines.
func leakedGoroutines(before map[int]bool) []goroutine {
	var leaked []goroutine
	for _, g := range goroutines() {
		if before[g.id] || ignoredGoroutine(g.stack) {
			continue
		}
		leaked = append(leaked, g)
	}
	return leaked
}

// ignoredStackParts mark goroutines of the runtime and the testing package
// that may outlive the tests.
var ignoredStackParts = []string{
	"testing.(*T).Run(",
	"testing.tRunner(",
	"testing.(*M).Run(",
	"testing.(*M).startAlarm",
	"testing.runTests",
	"testing.runFuzzTests",
	"testing.runFuzzing",
	"os/signal.signal_recv",
	"os/signal.loop",
	"runtime.ensureSigM",
	"runtime.ReadTrace",
	"runtime/trace.Start",
	"created by runtime.gc",
	"created by runtime.init",
	"runtime.gcBgMarkWorker",
	"runtime.bgsweep",
	"runtime.bgscavenge",
	"runtime.forcegchelper",
	"runtime.runfinq",
	"runtime.unique_runtime_registerUniqueMapCleanup",
}

// ignoredGoroutine reports whether stack belongs to a known runtime or
// testing goroutine.
func ignoredGoroutine(stack string) bool {
	for _, part := range ignoredStackParts {
		if strings.Contains(stack, part) {
			return true
		}
	}
	// A goroutine whose only frame is runtime.goexit is finishing.
	lines := strings.Split(stack, "\n")
	var funcs []string
	for _, l := range lines[1:] {
		if l != "" && !strings.HasPrefix(l, "\t") && !strings.HasPrefix(l, "created by ") {
			funcs = append(funcs, l)
		}
	}
	return len(funcs) == 0 || (len(funcs) == 1 && strings.HasPrefix(funcs[0], "runtime.goexit"))
}
