package dlockrueidis_test

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/redistest"
	dlockrueidis "github.com/dlockio/dlock/rueidis"
	"github.com/redis/rueidis"
)

// TestARefusalForGoodEndsAWaitAtOnce: over rueidis, a refusal that no
// retry changes ends a wait at its first attempt with an error that
// matches dlock.ErrDenied and keeps Redis's words: a missing permission, a
// server without the script commands, and, met by a client that had
// connected (rueidis refuses to make a client that cannot), a password
// changed under it and a server certificate replaced by one the client
// does not trust. The last one tried again until the max wait.
func TestARefusalForGoodEndsAWaitAtOnce(t *testing.T) {
	srv := redistest.Start(t)
	srv.Do(t, "ACL", "SETUSER", "noscripts", "on", ">s3cret", "~*", "&*", "+@all", "-evalsha", "-eval")
	srv.Do(t, "ACL", "SETUSER", "changed", "on", ">s3cret", "~*", "&*", "+@all")
	noScripts := redistest.Start(t, redistest.WithArgs("--rename-command", "EVALSHA", "", "--rename-command", "EVAL", ""))
	certs, other := redistest.NewTLS(t), redistest.NewTLS(t)
	tlsSrv := redistest.Start(t, redistest.WithTLSPort(), redistest.WithArgs("--tls-cert-file", certs.CertFile,
		"--tls-key-file", certs.KeyFile, "--tls-ca-cert-file", certs.CAFile, "--tls-auth-clients", "no"))
	tlsOpt := single("127.0.0.1:" + strconv.Itoa(tlsSrv.TLSPort()))
	tlsOpt.TLSConfig = certs.ClientConfig()
	for _, tc := range []struct {
		name   string
		opt    rueidis.ClientOption
		change func() // what makes Redis refuse the client once it is made
		want   string
	}{
		{"no permission", withUser(single(srv.Addr()), "noscripts"), nil, "NOPERM"},
		{"no script commands", single(noScripts.Addr()), nil, "unknown command"},
		{"a password changed", withUser(single(srv.Addr()), "changed"), func() {
			srv.Do(t, "ACL", "SETUSER", "changed", "resetpass", ">other")
			srv.Do(t, "CLIENT", "KILL", "USER", "changed")
		}, "WRONGPASS"},
		{"a certificate replaced", tlsOpt, func() {
			tlsSrv.Do(t, "CONFIG", "SET", "tls-cert-file", other.CertFile, "tls-key-file", other.KeyFile)
			tlsSrv.Do(t, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
		}, "certificate signed by unknown authority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, err := rueidis.NewClient(tc.opt)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(client.Close)
			c := dlock.New(dlockrueidis.New(client))
			t.Cleanup(func() { _ = c.Close() })
			if tc.change != nil {
				tc.change()
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			retried := false
			_, err = c.Lock(ctx, "x", dlock.WithOnRetry(func(_ int, err error) {
				if closedOnIt(err) {
					return // the connection the server closed, before the refusal
				}
				retried = true
				cancel() // the wait would go on
			}))
			var se *dlock.ServerError
			if retried || !errors.As(err, &se) || !errors.Is(err, dlock.ErrDenied) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Lock: retried %v, err = %v; want no retry and a *ServerError saying %q that matches ErrDenied", retried, err, tc.want)
			}
			// TryLock, after the wait has met the refusal.
			tctx, tcancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer tcancel()
			if _, err := c.TryLock(tctx, "y"); !errors.Is(err, dlock.ErrDenied) {
				t.Errorf("TryLock: err = %v, want one that matches ErrDenied", err)
			}
		})
	}
}

// single returns the options of a client of one server, which the ACL
// users here may use (see TestTheREADMEsACLUser).
func single(addr string) rueidis.ClientOption {
	return rueidis.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true, DisableCache: true}
}

// withUser returns opt with the user name and the password s3cret.
func withUser(opt rueidis.ClientOption, user string) rueidis.ClientOption {
	opt.Username, opt.Password = user, "s3cret"
	return opt
}

// closedOnIt reports whether err is that of a connection the server closed
// under the request: reset, or ended before the reply.
func closedOnIt(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, syscall.EPIPE) ||
		strings.Contains(err.Error(), "connection reset") || strings.Contains(err.Error(), "broken pipe")
}
