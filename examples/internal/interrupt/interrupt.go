// Package interrupt lets the examples clean up what they started when they
// are interrupted.
package interrupt

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// OnInterrupt runs cleanup and exits with code 130 (SIGINT) or 143
// (SIGTERM) when the program is interrupted, so that nothing it started is
// left behind;
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
			if s == syscall.SIGTERM {
				os.Exit(143)
			}
			os.Exit(130)
		case <-done:
		}
	}()
	return func() {
		signal.Stop(sig)
		close(done)
	}
}
