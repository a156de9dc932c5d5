package redistest

import (
	"net"
	"sync"
	"testing"
)

// proxy accepts TCP connections and forwards each to a server, by
// goroutines its kind starts (see CutProxy, DelayProxy), until the test
// ends.
type proxy struct {
	ln     net.Listener
	mu     sync.Mutex
	closed bool
	conns  []net.Conn
	copies sync.WaitGroup // the accepting goroutine, and those start starts
}

// serve accepts the connections of p.ln until the test ends, dials target
// for each, and calls start with the client's and the server's
// connections, under p.mu, to start the goroutines that copy between
// them, each counted in p.copies. A connection to target that fails closes
// the client's.
func (p *proxy) serve(tb testing.TB, target string, start func(c, s net.Conn)) {
	p.copies.Add(1)
	go func() {
		defer p.copies.Done()
		for {
			c, err := p.ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			if p.closed {
				p.mu.Unlock()
				_, _ = c.Close(), s.Close()
				return
			}
			p.conns = append(p.conns, c, s)
			start(c, s)
			p.mu.Unlock()
		}
	}()
	tb.Cleanup(func() {
		p.close()
		p.copies.Wait()
	})
}

// close closes every connection and stops listening.
func (p *proxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
}

// Addr is the address to dial instead of the server's.
func (p *proxy) Addr() string { return p.ln.Addr().String() }

// listen listens on a free loopback port.
func listen(tb testing.TB) net.Listener {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	return ln
}
