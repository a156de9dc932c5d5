package dlock

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// refusedForGood is pure logic over error trees: these are the shapes the
// wait meets, built by hand (the refusals themselves come from real Redis
// in security_test.go).
func TestRefusedForGoodLooksAtEveryError(t *testing.T) {
	server := func(msg string) error { return &ServerError{Key: "dlock:{x}", Err: errors.New(msg)} }
	for _, tc := range []struct {
		name               string
		err                error
		refused, ranInPart bool
	}{
		{"nil", nil, false, false},
		{"not obtained", fmt.Errorf("%w: held", ErrNotObtained), false, false},
		{"timeout", server("i/o timeout"), false, false},
		{"wrong password", server("WRONGPASS invalid username-password pair"), true, false},
		{"no permission", server("NOPERM this user has no permissions to run the 'evalsha' command"), true, false},
		{"no permission, 7.2", server("NOPERM User u has no permissions to run the 'fcall' command"), true, false},
		{"no permission for the keys", server("NOPERM this user has no permissions to access one of the keys used as arguments"), true, false},
		{"no permission for the keys, 7.2", server("NOPERM No permissions to access a key"), true, false},
		{"a user named for a script's refusal", server("NOPERM User run the 'eval' command has no permissions to run the 'wait' command"), true, true},
		{"no permission for WAIT, after the script", server("NOPERM this user has no permissions to run the 'wait' command"), true, true},
		{"in a script", server("ERR The user executing the script can't run this command or subcommand script: ..."), true, true},
		{"a key in a script", server("ERR The user executing the script can't access at least one of the keys mentioned in the command arguments script: ..."), true, true},
		{"a channel in a script", server("ERR The user executing the script can't publish to the channel mentioned in the command script: ..."), true, true},
		{"unauthenticated", &unauthenticated{errors.New("ERR Protocol error: unauthenticated multibulk length")}, true, false},
		{"wrapped", fmt.Errorf("attempt: %w", server("NOAUTH Authentication required.")), true, false},
		{"joined behind another failure", errors.Join(server("i/o timeout"), server("NOPERM no permissions")), true, true},
		{"unsupported", &ServerError{Key: "dlock:{x}", Err: fmt.Errorf("%w: WithReplicas needs a driver that can WAIT", ErrUnsupported)}, true, true},
		{"two wrapped", fmt.Errorf("%w: %w", server("LOADING"), server("ACL failure in script: no permission")), true, true},
		{"a command of the script unknown", server("ERR Unknown Redis command called from script script: ..."), true, true},
		{"a certificate that does not verify", &ServerError{Key: "dlock:{x}", Err: &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}}, true, false},
		{"a certificate the server refuses", &ServerError{Key: "dlock:{x}", Err: &net.OpError{Op: "remote error", Err: errors.New("tls: certificate required")}}, true, false},
	} {
		refused, ranInPart := refusedForGood(tc.err)
		if refused != tc.refused || ranInPart != tc.ranInPart {
			t.Errorf("%s: refusedForGood = %v, %v; want %v, %v", tc.name, refused, ranInPart, tc.refused, tc.ranInPart)
		}
	}
}

// A *ServerError matches ErrDenied when the driver's error, or one it
// wraps, is a refusal by Redis that no retry changes: not an outage, nor a
// failure of the driver or of the client itself.
func TestServerErrorMatchesErrDenied(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"no password", errors.New("NOAUTH Authentication required."), true},
		{"no password, a large request", &unauthenticated{errors.New("ERR Protocol error: unauthenticated multibulk length")}, true},
		{"wrong password", errors.New("WRONGPASS invalid username-password pair or user is disabled."), true},
		{"no permission", errors.New("NOPERM this user has no permissions to run the 'evalsha' command"), true},
		{"no permission in a script (7.0)", errors.New("ERR The user executing the script can't run this command or subcommand"), true},
		{"no permission in a script (7.2)", errors.New("ERR ACL failure in script: ..."), true},
		{"no script command", errors.New("ERR unknown command 'evalsha', with args beginning with: ..."), true},
		{"no command of the script", errors.New("ERR Unknown Redis command called from script"), true},
		{"no such database", errors.New("ERR DB index is out of range"), true},
		{"a client name refused", errors.New("ERR Client names cannot contain spaces, newlines or special characters."), true},
		{"a client name refused, rueidis", errors.New("Client names cannot contain spaces, newlines or special characters."), true},
		{"wrapped by the driver", fmt.Errorf("redigo: %w", errors.New("WRONGPASS invalid")), true},
		{"no functions, for want of a permission", fmt.Errorf("%w: %w", ErrNoFunctions, errors.New("NOPERM this user has no permissions to run the 'fcall' command")), true},
		{"an unknown authority", &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}, true},
		{"another name", x509.HostnameError{Host: "redis.example"}, true},
		{"expired", x509.CertificateInvalidError{Reason: x509.Expired}, true},
		{"a certificate the server requires", &net.OpError{Op: "remote error", Err: errors.New("tls: certificate required")}, true},
		{"a certificate the server does not trust", &net.OpError{Op: "remote error", Err: errors.New("tls: unknown certificate authority")}, true},
		{"a server's internal error", &net.OpError{Op: "remote error", Err: errors.New("tls: internal error")}, false},
		{"connection refused", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, false},
		{"reset", &net.OpError{Op: "read", Err: syscall.ECONNRESET}, false},
		{"timeout", &net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}, false},
		{"deadline", context.DeadlineExceeded, false},
		{"MISCONF", errors.New("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk."), false},
		{"OOM", errors.New("OOM command not allowed when used memory > 'maxmemory'."), false},
		{"READONLY", errors.New("READONLY You can't write against a read only replica."), false},
		{"LOADING", errors.New("LOADING Redis is loading the dataset in memory"), false},
		{"BUSY", errors.New("BUSY Redis is busy running a script."), false},
		{"CLUSTERDOWN", errors.New("CLUSTERDOWN The cluster is down"), false},
		{"a client closed", fmt.Errorf("%w: closed", ErrClosed), false},
		{"a driver without WAIT", fmt.Errorf("%w: WithReplicas", ErrUnsupported), false},
		{"a script error", errors.New("ERR user_script:1: Script attempted to access nonexistent global variable"), false},
	} {
		err := error(&ServerError{Key: "dlock:{x}", Err: tc.err})
		if got := errors.Is(err, ErrDenied); got != tc.want {
			t.Errorf("%s: errors.Is(%v, ErrDenied) = %v, want %v", tc.name, err, got, tc.want)
		}
		if got := errors.Is(fmt.Errorf("wait: %w", errors.Join(context.DeadlineExceeded, err)), ErrDenied); got != tc.want {
			t.Errorf("%s: wrapped and joined: errors.Is = %v, want %v", tc.name, got, tc.want)
		}
		if errors.Is(err, ErrNotObtained) || errors.Is(err, ErrClosed) != errors.Is(tc.err, ErrClosed) {
			t.Errorf("%s: %v matches another sentinel", tc.name, err)
		}
	}
	if errors.Is(errors.New("NOPERM no permissions"), ErrDenied) {
		t.Error("a driver's error outside a *ServerError matches ErrDenied")
	}
}

func TestConnectionClosed(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{io.EOF, true},
		{fmt.Errorf("read: %w", syscall.ECONNRESET), true},
		{&net.OpError{Op: "write", Err: syscall.EPIPE}, true},
		{&net.OpError{Op: "write", Err: net.ErrClosed}, true},
		{&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, false},
		{&net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}, false},
		{errors.New("ERR something"), false},
	} {
		if got := ConnectionClosed(tc.err); got != tc.want {
			t.Errorf("ConnectionClosed(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// timerLate is a context whose deadline has passed while its timer has not
// fired yet (Err is nil), as a loaded machine shows for a moment.
type timerLate struct {
	context.Context
	deadline time.Time
}

func (c timerLate) Deadline() (time.Time, bool) { return c.deadline, true }

// An attempt that ctx's deadline cut short is no answer from Redis, even
// when the driver's network call saw the deadline before ctx's timer
// fired: a dial ends then with net's "i/o timeout", which matches
// context.DeadlineExceeded but not os.ErrDeadlineExceeded.
func TestCutShortKnowsADeadlineBeforeItsTimerFires(t *testing.T) {
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	_, dialErr := (&net.Dialer{}).DialContext(expired, "tcp", "127.0.0.1:1")
	if !errors.Is(dialErr, context.DeadlineExceeded) || errors.Is(dialErr, os.ErrDeadlineExceeded) {
		t.Fatalf("dial under an expired context: %v, want net's i/o timeout", dialErr)
	}
	server := func(err error) error { return &ServerError{Key: "dlock:{x}", Err: err} }
	ioTimeout := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	now := time.Now()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want bool
	}{
		{"dial, deadline just passed", timerLate{context.Background(), now.Add(-time.Millisecond)}, server(dialErr), true},
		{"read, deadline just passed", timerLate{context.Background(), now.Add(-time.Millisecond)}, server(ioTimeout), true},
		{"dial, deadline long passed", timerLate{context.Background(), now.Add(-time.Second)}, server(dialErr), false},
		{"dial, deadline to come", timerLate{context.Background(), now.Add(time.Second)}, server(dialErr), false},
		{"dial, no deadline", context.Background(), server(dialErr), false},
		{"refused, deadline just passed", timerLate{context.Background(), now.Add(-time.Millisecond)}, server(&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}), false},
		{"expired context", expired, server(context.DeadlineExceeded), true},
	} {
		if got := cutShort(tc.ctx, tc.err); got != tc.want {
			t.Errorf("%s: cutShort = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// The end of a wait at the default max wait says how to wait longer; one
// the caller gave does not. Both match context.DeadlineExceeded.
func TestMaxWaitPassedSaysHowToWaitLonger(t *testing.T) {
	for _, given := range []bool{false, true} {
		err := maxWaitPassed(time.Minute, given)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("given %v: %v does not match context.DeadlineExceeded", given, err)
		}
		if says := strings.Contains(err.Error(), "WithMaxWait"); says == given {
			t.Errorf("given %v: %q", given, err)
		}
	}
}

// Errors of bad options say what to give instead, or where a value the
// caller did not give came from.
func TestBadOptionErrorsSayWhatToDo(t *testing.T) {
	for _, tc := range []struct {
		name     string
		err      error
		sentinel error
		says     string
	}{
		{"nil retry", newOptions([]Option{WithRetry(nil)}).err, ErrInvalidOption, "NoRetry()"},
		{"max hold under the default TTL", newOptions([]Option{WithMaxHold(time.Second)}).err, ErrInvalidOption, "TTL 10s (the default: see WithTTL)"},
		{"max hold under a TTL given", newOptions([]Option{WithTTL(time.Minute), WithMaxHold(time.Second)}).err, ErrInvalidOption, "TTL 1m0s"},
		{"refresh interval past the default TTL", newOptions([]Option{WithRefreshInterval(time.Minute)}).err, ErrInvalidOption, "TTL 10s (the default: see WithTTL)"},
		{"no permits", new(Semaphore).SetPermits(0), ErrInvalidPermits, "at least 1"},
	} {
		if !errors.Is(tc.err, tc.sentinel) || !strings.Contains(tc.err.Error(), tc.says) {
			t.Errorf("%s: %v, want %v saying %q", tc.name, tc.err, tc.sentinel, tc.says)
		}
	}
	if err := newOptions([]Option{WithTTL(time.Minute), WithMaxHold(time.Second)}).err; strings.Contains(err.Error(), "default") {
		t.Errorf("a TTL given called the default: %v", err)
	}
}
