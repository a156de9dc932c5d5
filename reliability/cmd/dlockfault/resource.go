package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	"github.com/redis/go-redis/v9"
)

// resource is what the workers protect with the lock: a Redis server of
// its own that no fault touches. Holders mark when they start and stop
// acting on it (mark draws the next number of one counter, so the marks are
// in the server's order), and write to it with their fence through
// Client.SetFenced. A MONITOR connection records every write the server
// applied, in the order it applied them, so that what was accepted is read
// from the server and not from what the writers were told.
type resource struct {
	srv    *server
	rdb    *redis.Client
	locks  *dlock.Client // for SetFenced
	mon    *monitor
	writes *writeLog
}

// resourcePrefix starts the key of each name's value on the resource.
const resourcePrefix = "res:"

func startResource() (*resource, error) {
	srv, err := startServer()
	if err != nil {
		return nil, err
	}
	writes := &writeLog{}
	mon, err := startMonitor(srv.addr(), writes.handle)
	if err != nil {
		srv.stop()
		return nil, err
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.addr(), PoolSize: 32})
	return &resource{srv: srv, rdb: rdb, locks: newLocks(rdb), mon: mon, writes: writes}, nil
}

func (r *resource) close() {
	r.mon.close()
	_ = r.locks.Close()
	_ = r.rdb.Close()
	r.srv.stop()
}

// mark returns the next number of the resource's sequence and the local
// time it was returned.
func (r *resource) mark(ctx context.Context) (int64, int64, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	seq, err := r.rdb.Incr(ctx, "res:seq").Result()
	return seq, time.Now().UnixNano(), err
}

// write writes value under name with fence, and says what the writer was
// told: "ok", "stale", or "error".
func (r *resource) write(ctx context.Context, name string, fence uint64, value string) (string, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err := r.locks.SetFenced(ctx, resourcePrefix+name, fence, value)
	switch {
	case err == nil:
		return "ok", nil
	case errors.Is(err, dlock.ErrStaleFence):
		return "stale", err
	}
	return "error", err
}

// applied is one write the resource server applied.
type applied struct {
	key   string
	fence uint64
	value string
}

// writeLog keeps the writes that fenced_set applied (its HSET, run by a
// script), from a resource server's MONITOR stream.
type writeLog struct {
	mu     sync.Mutex
	writes []applied
}

func (l *writeLog) handle(args []string, lua bool) {
	if lua && len(args) == 6 && strings.EqualFold(args[0], "HSET") && strings.HasPrefix(args[1], resourcePrefix) &&
		args[2] == "fence" && args[4] == "value" {
		fence, _ := strconv.ParseUint(args[3], 10, 64)
		l.mu.Lock()
		l.writes = append(l.writes, applied{key: args[1], fence: fence, value: args[5]})
		l.mu.Unlock()
	}
}

func (l *writeLog) list() []applied {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]applied(nil), l.writes...)
}

// monitor reads a server's MONITOR stream and hands every command to a
// handler, in the order the server ran them, with lua true for the
// commands that a script ran.
type monitor struct {
	conn   net.Conn
	done   chan struct{}
	handle func(args []string, lua bool)

	mu      sync.Mutex
	markers map[string]bool
	err     error
}

func startMonitor(addr string, handle func(args []string, lua bool)) (*monitor, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		conn.Close()
		return nil, err
	}
	br := bufio.NewReaderSize(conn, 1<<16)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "+OK") {
		conn.Close()
		return nil, fmt.Errorf("MONITOR: %q %v", line, err)
	}
	_ = conn.SetReadDeadline(time.Time{})
	m := &monitor{conn: conn, done: make(chan struct{}), handle: handle, markers: map[string]bool{}}
	go m.read(br)
	return m, nil
}

func (m *monitor) read(br *bufio.Reader) {
	defer close(m.done)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			m.mu.Lock()
			m.err = err
			m.mu.Unlock()
			return
		}
		// +1795334722.712325 [0 lua] "HSET" "res:{a}" "fence" "12" "value" "v"
		head, rest, ok := strings.Cut(strings.TrimRight(line, "\r\n"), "] ")
		if !ok {
			continue
		}
		args := splitQuoted(rest)
		if len(args) == 2 && strings.EqualFold(args[0], "ECHO") && strings.HasPrefix(args[1], markerPrefix) {
			m.mu.Lock()
			m.markers[args[1]] = true
			m.mu.Unlock()
			continue
		}
		if len(args) > 0 {
			m.handle(args, strings.HasSuffix(head, " lua"))
		}
	}
}

// markerPrefix starts the ECHO arguments that sync sends.
const markerPrefix = "dlockfault-sync-"

// sync returns once the monitor has read everything the server ran before
// it was called: it sends a marker through the server and waits for it.
func (m *monitor) sync(rdb *redis.Client) error {
	marker := markerPrefix + strconv.FormatInt(time.Now().UnixNano(), 36)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rdb.Echo(ctx, marker).Err(); err != nil {
		return err
	}
	for {
		m.mu.Lock()
		seen, err := m.markers[marker], m.err
		m.mu.Unlock()
		if seen {
			return nil
		}
		if err != nil {
			return fmt.Errorf("MONITOR stream: %w", err)
		}
		select {
		case <-ctx.Done():
			return errors.New("MONITOR did not show the marker within 10s")
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (m *monitor) close() {
	m.conn.Close()
	<-m.done
}

// splitQuoted splits MONITOR's rendering of a command, "A" "b\"c", into
// its arguments.
func splitQuoted(s string) []string {
	var args []string
	for {
		i := strings.IndexByte(s, '"')
		if i < 0 {
			return args
		}
		s = s[i+1:]
		var b strings.Builder
		j := 0
		for ; j < len(s) && s[j] != '"'; j++ {
			if s[j] == '\\' && j+1 < len(s) {
				j++
				switch s[j] {
				case 'n':
					b.WriteByte('\n')
				case 'r':
					b.WriteByte('\r')
				case 't':
					b.WriteByte('\t')
				case 'x':
					if j+2 < len(s) {
						if v, err := strconv.ParseUint(s[j+1:j+3], 16, 8); err == nil {
							b.WriteByte(byte(v))
							j += 2
							continue
						}
					}
					b.WriteByte('x')
				default:
					b.WriteByte(s[j])
				}
				continue
			}
			b.WriteByte(s[j])
		}
		args = append(args, b.String())
		if j >= len(s) {
			return args
		}
		s = s[j+1:]
	}
}

// fenceAudit is what the resource's own record says of the writes.
type fenceAudit struct {
	applied int      // writes the server applied
	stale   []string // writes applied although a newer fence had been applied before them
	// unreported are writes the writer was told succeeded that the server
	// never applied; misreported, writes refused as stale that it applied.
	unreported, misreported []string
}

// audit compares the writes the server applied with what the writers were
// told.
func audit(appliedWrites []applied, told []write) fenceAudit {
	a := fenceAudit{applied: len(appliedWrites)}
	newest := map[string]uint64{}
	seen := map[string]bool{}
	for _, w := range appliedWrites {
		if n, ok := newest[w.key]; ok && w.fence < n {
			a.stale = append(a.stale, fmt.Sprintf("%s: %q written with fence %d after fence %d", w.key, w.value, w.fence, n))
		}
		newest[w.key] = max(newest[w.key], w.fence)
		seen[w.value] = true
	}
	for _, w := range told {
		switch {
		case w.Result == "ok" && !seen[w.Value]:
			a.unreported = append(a.unreported, fmt.Sprintf("SetFenced of %q (fence %d) returned nil, but the server never applied it", w.Value, w.Fence))
		case w.Result == "stale" && seen[w.Value]:
			a.misreported = append(a.misreported, fmt.Sprintf("SetFenced of %q (fence %d) returned ErrStaleFence, but the server applied it", w.Value, w.Fence))
		}
	}
	return a
}

// functionsEnv, set to 1, makes every client of the suite run dlock's
// scripts as Redis Functions (the -functions flag).
const functionsEnv = "DLOCKFAULT_FUNCTIONS"

// newLocks returns the dlock client of the suite over rdb, with opts, and
// WithFunctions under -functions.
func newLocks(rdb *redis.Client, opts ...dlock.ClientOption) *dlock.Client {
	if os.Getenv(functionsEnv) == "1" {
		opts = append(opts, dlock.WithFunctions())
	}
	return dlock.New(goredis.New(rdb), opts...)
}
