package redistest

import (
	"net"
	"sync"
	"testing"
)

// CutProxy forwards TCP connections to a server until Cut, after which the
// connections open then pass nothing either way and stay open, as a
// connection to a host that vanished without a reset does. Connections
// opened after a Cut are forwarded.
type CutProxy struct {
	ln     net.Listener
	mu     sync.Mutex
	closed bool
	epoch  int
	conns  []net.Conn
	copies sync.WaitGroup
}

// StartCutProxy listens on a free loopback port and forwards to target,
// until the test ends.
func StartCutProxy(tb testing.TB, target string) *CutProxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	return ServeCutProxy(tb, ln, target)
}

// ServeCutProxy forwards the connections ln accepts to target, until the
// test ends: a server that comes up at an address a client already tries.
func ServeCutProxy(tb testing.TB, ln net.Listener, target string) *CutProxy {
	p := &CutProxy{ln: ln}
	p.copies.Add(1)
	go func() {
		defer p.copies.Done()
		for {
			c, err := ln.Accept()
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
			epoch := p.epoch
			p.conns = append(p.conns, c, s)
			p.copies.Add(2)
			p.mu.Unlock()
			go p.pipe(c, s, epoch)
			go p.pipe(s, c, epoch)
		}
	}()
	tb.Cleanup(func() {
		p.Close()
		p.copies.Wait()
	})
	return p
}

// Close closes every connection and stops listening, as a server that
// went away does: a connection in use fails, and a new one is refused.
func (p *CutProxy) Close() {
	_ = p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
}

// Addr is the address to dial instead of the server's.
func (p *CutProxy) Addr() string { return p.ln.Addr().String() }

// Cut silences every connection open now.
func (p *CutProxy) Cut() {
	p.mu.Lock()
	p.epoch++
	p.mu.Unlock()
}

// pipe copies from src to dst while the proxy is in the epoch the
// connection was opened in; after a Cut it reads and drops. A connection
// that src closes (a server that went down) closes dst too, unless Cut
// silenced it.
func (p *CutProxy) pipe(dst, src net.Conn, epoch int) {
	defer p.copies.Done()
	buf := make([]byte, 32<<10)
	live := func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.epoch == epoch
	}
	for {
		n, err := src.Read(buf)
		if err != nil {
			if live() {
				_ = dst.Close()
			}
			return
		}
		if live() {
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
	}
}
