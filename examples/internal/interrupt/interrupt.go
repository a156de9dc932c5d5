// Package interrupt lets the examples clean up what they started when they
// are interrupted.
package interrupt

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// OnInterrupt runs cleanup and exits with code 130 when the program is
// interrupted (Ctrl-C, SIGTERM), so that nothing it started is left behind;
// what prints what is being stopped. The function it returns stops
// watching.
func OnInterrupt(what string, cleanup func()) (stop func()) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sig:
			fmt.Fprintf(os.Stderr, "%v: stopping %s\n", s, what)
			cleanup()
			os.Exit(130)
		case <-done:
		}
	}()
	return func() {
		signal.Stop(sig)
		close(done)
	}
}
