package redistest

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// AwaitUnread waits until a connection to s holds bytes that s has not
// read, as the kernel's socket tables (/proc/net/tcp and tcp6) show them:
// a request sent to a paused server. It fails tb after timeout. Tests use
// it to know that a client's request reached a server they paused. It
// skips tb where the tables cannot be read.
func (s *Server) AwaitUnread(tb testing.TB, timeout time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		n, err := unread(s.port)
		if err != nil {
			tb.Skipf("redistest: cannot read the socket tables: %v", err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redistest: no request reached %s within %v", s.describe(), timeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// unread counts the established connections whose local port is port and
// whose receive queue is not empty.
func unread(port int) (int, error) {
	n := 0
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(table)
		if err != nil {
			if table == "/proc/net/tcp6" && os.IsNotExist(err) {
				continue
			}
			return 0, err
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			f := strings.Fields(line)
			// sl local_address rem_address st tx_queue:rx_queue ...
			if len(f) < 5 || f[3] != "01" {
				continue
			}
			_, local, ok := strings.Cut(f[1], ":")
			if !ok {
				continue
			}
			if p, err := strconv.ParseUint(local, 16, 16); err != nil || int(p) != port {
				continue
			}
			_, rx, ok := strings.Cut(f[4], ":")
			if q, err := strconv.ParseUint(rx, 16, 64); ok && err == nil && q > 0 {
				n++
			}
		}
	}
	return n, nil
}
