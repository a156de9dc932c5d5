package redistest

import (
	"fmt"
	"os"
	"slices"
	"testing"
)

// RunMain is the TestMain of a package whose tests and Example functions
// share one server: it starts the server, sets *addr to its address, runs
// the tests as VerifyNoLeaks does, stops the server and exits.
func RunMain(m *testing.M, addr *string) {
	srv, stop, err := StartForMain()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*addr = srv.Addr()
	code := RunWithoutLeaks(m)
	stop()
	os.Exit(code)
}

// starter is the part of testing.TB that starting a server needs, so that
// TestMain can start one too (see StartForMain).
type starter interface {
	Helper()
	TempDir() string
	Cleanup(func())
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// StartForMain starts a server as Start does, outside of any test: for a
// TestMain whose Example functions need a Redis server. The caller must call
// stop once the tests have run.
func StartForMain(opts ...Option) (s *Server, stop func(), err error) {
	m := &mainStarter{}
	stop = func() {
		for _, f := range slices.Backward(m.cleanups) {
			f()
		}
		for _, d := range m.dirs {
			_ = os.RemoveAll(d)
		}
	}
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(mainFatal)
			if !ok {
				panic(r)
			}
			stop()
			s, stop, err = nil, nil, f
		}
	}()
	return start(m, opts...), stop, nil
}

type mainFatal string

func (f mainFatal) Error() string { return string(f) }

// mainStarter is a starter outside of a test: Fatalf panics with a
// mainFatal, which StartForMain recovers.
type mainStarter struct {
	cleanups []func()
	dirs     []string
}

func (m *mainStarter) Helper() {}

func (m *mainStarter) TempDir() string {
	d, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		m.Fatalf("redistest: %v", err)
	}
	m.dirs = append(m.dirs, d)
	return d
}

func (m *mainStarter) Cleanup(f func()) { m.cleanups = append(m.cleanups, f) }

func (m *mainStarter) Errorf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
}

func (m *mainStarter) Fatalf(format string, args ...any) {
	panic(mainFatal(fmt.Sprintf(format, args...)))
}
