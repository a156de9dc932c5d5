package redistest

import (
	"net"
	"testing"
)

// CutProxy forwards TCP connections to a server until Cut, after which the
// connections open then pass nothing either way and stay open, as a
// connection to a host that vanished without a reset does. Connections
// opened after a Cut are forwarded.
type CutProxy struct {
	proxy
	epoch int // under mu
}

// StartCutProxy listens on a free loopback port and forwards to target,
// until the test ends.
func StartCutProxy(tb testing.TB, target string) *CutProxy {
	tb.Helper()
	return ServeCutProxy(tb, listen(tb), target)
}

// ServeCutProxy forwards the connections ln accepts to target, until the
// test ends: a server that comes up at an address a client already tries.
func ServeCutProxy(tb testing.TB, ln net.Listener, target string) *CutProxy {
	p := &CutProxy{proxy: proxy{ln: ln}}
	p.serve(tb, target, func(c, s net.Conn) {
		p.copies.Add(2)
		go p.pipe(c, s, p.epoch)
		go p.pipe(s, c, p.epoch)
	})
	return p
}

// Close closes every connection and stops listening, as a server that
// went away does: a connection in use fails, and a new one is refused.
func (p *CutProxy) Close() { p.close() }

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
