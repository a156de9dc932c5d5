package redistest

import (
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// DelayProxy forwards TCP connections to a server and holds every reply
// back for a delay, as a server far away answers: a request reaches the
// server at once and runs, and its reply comes delay later, the replies of
// a connection in order. A client's request then keeps its connection (of
// a client library's pool) for the delay, as it would over a slow link.
// The delay may change at any time, and counts for the replies held then
// too: a long one holds them until a shorter one lets them go.
type DelayProxy struct {
	proxy
	delay atomic.Int64 // a time.Duration
}

// StartDelayProxy listens on a free loopback port and forwards to target,
// with no delay until SetDelay, until the test ends.
func StartDelayProxy(tb testing.TB, target string) *DelayProxy {
	tb.Helper()
	p := &DelayProxy{proxy: proxy{ln: listen(tb)}}
	p.serve(tb, target, func(c, s net.Conn) {
		p.copies.Add(3)
		go p.forward(s, c)
		replies := make(chan delayed, 1024)
		go p.read(replies, s, c)
		go p.write(c, replies)
	})
	return p
}

// delayed is a chunk of replies and when it was read.
type delayed struct {
	data []byte
	read time.Time
}

// SetDelay sets how long each reply is held back from when it was read.
func (p *DelayProxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// forward copies requests from src to dst as they come.
func (p *DelayProxy) forward(dst, src net.Conn) {
	defer p.copies.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			_ = dst.Close()
			return
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

// read reads replies from src and queues each chunk with the time it is
// due at; dst is closed when src is.
func (p *DelayProxy) read(out chan<- delayed, src, dst net.Conn) {
	defer p.copies.Done()
	defer close(out)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		out <- delayed{data: append([]byte(nil), buf[:n]...), read: time.Now()}
	}
}

// write passes the queued replies on to dst, each once the delay has
// passed since it was read (looked at again every few milliseconds, as
// the delay may change).
func (p *DelayProxy) write(dst net.Conn, in <-chan delayed) {
	defer p.copies.Done()
	defer dst.Close()
	for d := range in {
		for {
			wait := time.Until(d.read.Add(time.Duration(p.delay.Load())))
			if wait <= 0 {
				break
			}
			time.Sleep(min(wait, 5*time.Millisecond))
		}
		if _, err := dst.Write(d.data); err != nil {
			for range in { // until read returns
			}
			return
		}
	}
}
