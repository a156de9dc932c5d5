package dlock_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	"github.com/dlockio/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestLogRecordsNameTheLockAlike: every record about a lock, from its
// acquisition, a refused attempt, a refresh by the watchdog, its loss and
// a release, names it with the same attribute, "names", a list of names
// (not the Redis key, nor a quoted string), so that one query finds them
// all.
func TestLogRecordsNameTheLockAlike(t *testing.T) {
	e := newEnv(t)
	logger, logs := captureLogs(slog.LevelDebug)
	c := e.newClient(t, dlock.WithLogger(logger))
	ctx := context.Background()
	logged := func(msg string) bool { return strings.Contains(logs(), `"msg":"`+msg+`"`) }

	l, err := c.Lock(ctx, "log-x", dlock.WithRefreshInterval(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	awaitCond(t, 5*time.Second, func() bool { return logged("dlock: refreshed") })
	wctx, giveUp, cancel := untilRefused(ctx)
	_, err = c.Lock(wctx, "log-x", giveUp)
	cancel()
	if !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("second Lock: err = %v, want ErrNotObtained", err)
	}
	e.srv.Do(t, "DEL", "dlock:{log-x}")
	waitDone(t, l, 5*time.Second)
	// Logged after Done closes.
	awaitCond(t, 5*time.Second, func() bool { return logged("dlock: lock lost") })
	l, err = c.TryLock(ctx, "log-x")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(logs()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
		msg, _ := rec["msg"].(string)
		seen[msg] = true
		if _, ok := rec["key"]; ok {
			t.Errorf("%s: a key attribute: %s", msg, line)
		}
		names, ok := rec["names"].([]any)
		if !ok || !slices.Equal(names, []any{"log-x"}) {
			t.Errorf("%s: names = %#v, want [\"log-x\"]", msg, rec["names"])
		}
	}
	for _, msg := range []string{"dlock: obtained", "dlock: refreshed", "dlock: attempt failed", "dlock: lock lost", "dlock: released"} {
		if !seen[msg] {
			t.Errorf("no record %q", msg)
		}
	}
}

// TestAHugeNameIsCutShortInErrorsAndLogs: a name of a megabyte (of
// two-byte runes) is quoted in errors, and given in log records, by its
// first bytes, cut between runes, and its length, not whole: refused,
// held by data dlock did not write, invalid, with an invalid token.
func TestAHugeNameIsCutShortInErrorsAndLogs(t *testing.T) {
	e := newEnv(t)
	logger, logs := captureLogs(slog.LevelDebug)
	c := e.newClient(t, dlock.WithLogger(logger))
	ctx := context.Background()
	huge := strings.Repeat("é", 1<<19) + "-x"
	cutShort := func(what string, err error, sentinel error, length int) {
		t.Helper()
		if !errors.Is(err, sentinel) {
			t.Fatalf("%s: err = %v, want %v", what, err, sentinel)
		}
		msg := err.Error()
		if len(msg) > 1000 || !utf8.ValidString(msg) || !strings.Contains(msg, fmt.Sprintf("… (%d bytes)", length)) {
			t.Errorf("%s: the error's text (%d bytes) does not cut the name short: %.400q", what, len(msg), msg)
		}
	}

	l, err := c.TryLock(ctx, huge)
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.c.TryLock(ctx, huge)
	cutShort("refused", err, dlock.ErrNotObtained, len(huge))
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	e.srv.Do(t, "SET", "dlock:{"+huge+"}", "not a lock")
	_, err = c.TryLock(ctx, huge)
	cutShort("wrong type", err, dlock.ErrWrongType, len(huge))
	_, err = c.TryLock(ctx, "}"+huge)
	cutShort("invalid name", err, dlock.ErrInvalidName, len(huge)+1)
	_, err = c.TryLock(ctx, "other", dlock.WithToken(huge+" "))
	cutShort("invalid token", err, dlock.ErrInvalidToken, len(huge)+1)

	records := 0
	for _, line := range strings.Split(strings.TrimSpace(logs()), "\n") {
		if len(line) > 2000 {
			t.Errorf("a record of %d bytes: %.400s", len(line), line)
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
		names, _ := rec["names"].([]any)
		for _, n := range names {
			s, _ := n.(string)
			if !strings.HasPrefix(s, "éé") || !strings.HasSuffix(s, fmt.Sprintf("… (%d bytes)", len(huge))) {
				t.Errorf("%s: a name %.80q…, want the name's first bytes, … and its length", rec["msg"], s)
			}
			records++
		}
	}
	if records < 2 {
		t.Errorf("%d records name the lock, want its acquisition and its release at least", records)
	}
}

// TestNoRetryIsLoggedForALockThatEnded: a refresh under way when the
// lock's deadline passes (Redis paused) fails as the lock ends as lost, or
// after; no "retrying" warning comes with the loss, as nothing is retried.
// With a client that honours its context the refresh fails at the very
// deadline; with one that does not, at its read timeout (go-redis: 3s).
func TestNoRetryIsLoggedForALockThatEnded(t *testing.T) {
	for _, honour := range []bool{true, false} {
		t.Run(fmt.Sprintf("context honoured %v", honour), func(t *testing.T) {
			e := newEnv(t)
			logger, logs := captureLogs(slog.LevelInfo)
			failed := make(chan struct{}, 1)
			rdb := redis.NewClient(&redis.Options{Addr: e.srv.Addr(), MaxRetries: -1, ContextTimeoutEnabled: honour})
			t.Cleanup(func() { _ = rdb.Close() })
			c := dlock.New(goredis.New(rdb), dlock.WithLogger(logger), dlock.WithHooks(dlock.Hooks{
				Refresh: func(_ context.Context, _ dlock.HookInfo, err error) {
					if err != nil {
						select {
						case failed <- struct{}{}:
						default:
						}
					}
				},
			}))
			t.Cleanup(func() { _ = c.Close() })
			ctx := context.Background()
			l, err := c.Lock(ctx, "log-paused", dlock.WithTTL(300*time.Millisecond), dlock.WithRefreshInterval(100*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			e.srv.Pause(t)
			waitDone(t, l, 5*time.Second)
			// The failed refresh's hook comes after its log record.
			select {
			case <-failed:
			case <-time.After(10 * time.Second):
				t.Fatal("no refresh failed")
			}
			e.srv.Resume(t)
			// Logged after Done closes.
			awaitCond(t, 5*time.Second, func() bool { return strings.Contains(logs(), `"msg":"dlock: lock lost"`) })
			if out := logs(); strings.Contains(out, "refresh failed; retrying") {
				t.Errorf("a retry logged with the loss:\n%s", out)
			}
		})
	}
}

// TestADeniedRefreshIsLoggedAsAnError: an automatic refresh that Redis
// denies (the ACL user lost a permission) is logged as an error that says
// so, not as the warning of a refresh that failed for a while (an outage):
// the lock is lost at its deadline unless the setting is fixed meanwhile.
// The refreshes are still retried until then, and the lock is lost as
// after any failed refresh: its Err matches ErrLost, and says why in words.
func TestADeniedRefreshIsLoggedAsAnError(t *testing.T) {
	e := newEnv(t)
	e.srv.Do(t, "ACL", "SETUSER", "u", "on", ">pw", "~*", "&*", "+@all")
	logger, logs := captureLogs(slog.LevelInfo)
	rdb := redis.NewClient(&redis.Options{Addr: e.srv.Addr(), Username: "u", Password: "pw", MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	c := dlock.New(goredis.New(rdb), dlock.WithLogger(logger))
	t.Cleanup(func() { _ = c.Close() })
	l, err := c.TryLock(context.Background(), "log-denied", dlock.WithTTL(600*time.Millisecond), dlock.WithRefreshInterval(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Do(t, "ACL", "SETUSER", "u", "-evalsha", "-eval")
	waitDone(t, l, 5*time.Second)
	if err := l.Err(); !errors.Is(err, dlock.ErrLost) || errors.Is(err, dlock.ErrDenied) || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("Err = %v, want ErrLost (only) saying NOPERM", err)
	}
	// Logged after Done closes.
	awaitCond(t, 5*time.Second, func() bool { return strings.Contains(logs(), `"msg":"dlock: lock lost"`) })
	denied, failed := 0, ""
	for _, line := range strings.Split(strings.TrimSpace(logs()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
		msg, _ := rec["msg"].(string)
		errText, _ := rec["err"].(string)
		switch {
		case strings.HasPrefix(msg, "dlock: refresh denied by Redis"):
			denied++
			if rec["level"] != "ERROR" || !strings.Contains(errText, "NOPERM") {
				t.Errorf("a denied refresh logged at %v, err %q; want ERROR, with Redis's NOPERM", rec["level"], errText)
			}
		case strings.HasPrefix(msg, "dlock: refresh failed"):
			failed = line
		}
	}
	if failed != "" {
		t.Errorf("a denied refresh logged as one that failed: %s", failed)
	}
	if denied == 0 {
		t.Errorf("no denied refresh logged:\n%s", logs())
	}
}

// captureLogs returns a logger that writes JSON records at level and up,
// and a function that returns what it wrote so far.
func captureLogs(level slog.Level) (*slog.Logger, func() string) {
	var buf redistest.Buffer
	return slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: level})), buf.String
}

// A logger that panics as a wait logs a failed attempt leaves nothing
// behind either, as a retry strategy that panics: the acquisition is
// abandoned (a waiting writer's pending acquire goes), and the panic goes
// on.
func TestAPanickingLoggerLeavesNoWaitBehind(t *testing.T) {
	e := newEnv(t)
	c := e.newClient(t, dlock.WithLogger(slog.New(panickingHandler{msg: "dlock: attempt failed"})))
	writerPanicsInItsWait(t, e, c, "logged", "the logger's")
}

// panickingHandler is a slog handler that panics on the records of one
// message and drops the others.
type panickingHandler struct{ msg string }

func (h panickingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h panickingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		panic("boom")
	}
	return nil
}

func (h panickingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h panickingHandler) WithGroup(string) slog.Handler      { return h }
