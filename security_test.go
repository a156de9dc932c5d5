package dlock_test

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	"github.com/dlockio/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// aclRules is the ACL of a Redis user that can do everything dlock does
// with the default prefix, and nothing else; the README shows it.
var aclRules = []string{
	"on", ">s3cret", "resetkeys", "~dlock:*", "resetchannels", "&dlock:*",
	"-@all", "+evalsha", "+eval", "+subscribe", "+unsubscribe", "+scan", "+ping", "+hello",
	// the commands dlock's scripts run
	"+exists", "+hmget", "+hget", "+hset", "+hlen", "+hincrby", "+del", "+get", "+set", "+time",
	"+pexpire", "+pttl", "+zadd", "+zrem", "+zrangebyscore", "+zpopmin", "+publish", "+pubsub|numsub",
	// and those of the read/write locks' and semaphores' scripts
	"+hdel", "+zscore", "+zrange", "+zcard", "+zcount", "+zremrangebyscore",
}

func TestACLUserLimitedToThePrefix(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := "ACL SETUSER locker " + strings.Join(aclRules, " ") + "\n"; !strings.Contains(string(readme), want) {
		t.Errorf("the README does not show these rules:\n%s", want)
	}
	srv := redistest.Start(t)
	srv.Do(t, append([]string{"ACL", "SETUSER", "locker"}, aclRules...)...)
	srv.Do(t, "SET", "app:secret", "x")
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "locker", Password: "s3cret"})
	t.Cleanup(func() { _ = rdb.Close() })
	c := dlock.New(goredis.New(rdb))
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// Everything dlock does works.
	l, err := c.TryLock(ctx, "job", dlock.WithRefreshInterval(50*time.Millisecond), dlock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := lockAndRelease(c, "job", 10*time.Second)
	awaitWaiting(t, c, "job", 1)
	if _, err := c.Inspect(ctx, "job"); err != nil {
		t.Errorf("Inspect: %v", err)
	}
	if infos, err := c.List(ctx, "*"); err != nil || len(infos) != 1 {
		t.Errorf("List = %v, %v", infos, err)
	}
	if err := l.Refresh(ctx, time.Second); err != nil {
		t.Errorf("Refresh: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}
	if err := <-got; err != nil {
		t.Errorf("waiter: %v", err)
	}
	if _, err := c.ForceRelease(ctx, "job"); err != nil {
		t.Errorf("ForceRelease: %v", err)
	}
	// SetFenced, on a data key the user may write (here under the prefix),
	// and its refusal of other data there.
	if err := c.SetFenced(ctx, "dlock:data:report", l.Fence(), "v"); err != nil {
		t.Errorf("SetFenced: %v", err)
	}
	srv.Do(t, "HSET", "dlock:data:user", "name", "bob")
	if err := c.SetFenced(ctx, "dlock:data:user", l.Fence(), "v"); !errors.Is(err, dlock.ErrWrongType) {
		t.Errorf("SetFenced on another hash: err = %v, want ErrWrongType", err)
	}
	// Read/write locks of both fairness, and semaphores, with a waiter each.
	for _, opts := range [][]dlock.RWOption{nil, {dlock.Fair()}} {
		m := c.RWMutex("doc", opts...)
		r, err := m.TryRLock(ctx)
		if err != nil {
			t.Fatalf("TryRLock: %v", err)
		}
		got := waitInBackground(func(ctx context.Context) (*dlock.Lock, error) { return m.Lock(ctx) })
		awaitWaiting(t, c, "doc", 1)
		if _, err := c.Inspect(ctx, "doc"); err != nil {
			t.Errorf("Inspect: %v", err)
		}
		if err := r.Refresh(ctx, time.Second); err != nil {
			t.Errorf("Refresh: %v", err)
		}
		if _, err := r.TTL(ctx); err != nil {
			t.Errorf("TTL: %v", err)
		}
		if err := r.Release(ctx); err != nil {
			t.Errorf("read Release: %v", err)
		}
		if err := <-got; err != nil {
			t.Errorf("writer: %v", err)
		}
		if _, err := m.TryLock(ctx); err != nil {
			t.Errorf("TryLock: %v", err)
		}
		if _, err := c.ForceRelease(ctx, "doc"); err != nil {
			t.Errorf("ForceRelease: %v", err)
		}
	}
	s := c.Semaphore("pool", 1)
	p, err := s.TryAcquire(ctx)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	got = waitInBackground(func(ctx context.Context) (*dlock.Lock, error) { return s.Acquire(ctx) })
	awaitWaiting(t, c, "pool", 1)
	if err := p.Release(ctx); err != nil {
		t.Errorf("permit Release: %v", err)
	}
	if err := <-got; err != nil {
		t.Errorf("waiting for a permit: %v", err)
	}
	// No command inside dlock's scripts was refused (a script that asks
	// with redis.pcall would go on without saying).
	if log := srv.Do(t, "ACL", "LOG"); log != "" {
		t.Errorf("ACL LOG after dlock's calls:\n%s", log)
	}

	// And nothing else.
	for _, cmd := range [][]any{
		{"GET", "app:secret"}, {"SET", "app:other", "1"}, {"SCRIPT", "FLUSH"}, {"FUNCTION", "FLUSH"},
		{"FLUSHALL"}, {"KEYS", "*"}, {"CONFIG", "GET", "*"},
	} {
		if err := rdb.Do(ctx, cmd...).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("%v: err = %v, want NOPERM", cmd, err)
		}
	}
	other := dlock.New(goredis.New(rdb), dlock.WithPrefix("app:"))
	defer other.Close()
	if _, err := other.TryLock(ctx, "secret"); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("a lock under another prefix: err = %v, want NOPERM", err)
	}
}

// clusterACLRules are what the README adds to aclRules on a Redis
// Cluster: the cluster clients read the slot map (CLUSTER SLOTS, or
// SHARDS), and waiters listen on shard channels.
var clusterACLRules = []string{"+cluster|slots", "+cluster|shards", "+command|info", "+spublish", "+ssubscribe", "+sunsubscribe", "+pubsub|shardnumsub"}

// TestAUserWithoutZPOPMINStillHasLocksGranted: a user set up with the ACL
// line of an older dlock, without +zpopmin, still has the lock granted to
// its waiting client by the release, which finds that client as it did
// before (ZRANGEBYSCORE, then ZREM) once ZPOPMIN is refused.
func TestAUserWithoutZPOPMINStillHasLocksGranted(t *testing.T) {
	srv := redistest.Start(t)
	rules := []string{"ACL", "SETUSER", "older"}
	for _, r := range aclRules {
		if r != "+zpopmin" {
			rules = append(rules, r)
		}
	}
	srv.Do(t, rules...)
	newClient := func() *dlock.Client {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "older", Password: "s3cret"})
		t.Cleanup(func() { _ = rdb.Close() })
		c := dlock.New(goredis.New(rdb))
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	holder, waiter := newClient(), newClient()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := holder.TryLock(ctx, "job", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *dlock.Lock, 1)
	go func() {
		l, err := waiter.Lock(ctx, "job", dlock.WithTTL(time.Minute))
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	awaitWaiting(t, waiter, "job", 1)
	awaitCond(t, 5*time.Second, func() bool { return srv.Do(t, "ZCARD", "dlock:{job}:waiters") == "1" })
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Granted by the release itself: the waiter sleeps until its notice.
	if tok := srv.Do(t, "HGET", "dlock:{job}", "token"); tok == "" || tok == "(nil)" {
		t.Errorf("the release left the lock free (token %q), want it granted to the waiting client", tok)
	}
	granted := <-got
	if granted == nil {
		t.FailNow()
	}
	if err := granted.Release(ctx); err != nil {
		t.Error(err)
	}
	if log := srv.Do(t, "ACL", "LOG"); !strings.Contains(log, "zpopmin") {
		t.Errorf("ACL LOG shows no refused ZPOPMIN:\n%s", log)
	}
	if got := srv.Do(t, "ZCARD", "dlock:{job}:waiters"); got != "0" {
		t.Errorf("%s clients registered once the waiter was served, want 0", got)
	}
}

// TestACLUserOnACluster: the README's user, with its additions for a
// cluster, takes, waits for (woken by a sharded notice), lists and
// force-releases locks on every primary, and on several slots at once,
// with no command refused on any node.
func TestACLUserOnACluster(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := "`" + strings.Join(clusterACLRules, " ") + "`"; !strings.Contains(string(readme), want) {
		t.Errorf("the README does not show the cluster's rules %s", want)
	}
	cluster := redistest.StartCluster(t, 3, 0)
	for _, n := range cluster.Nodes {
		n.Do(t, append([]string{"ACL", "SETUSER", "locker"}, append(append([]string(nil), aclRules...), clusterACLRules...)...)...)
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), Username: "locker", Password: "s3cret", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	c := dlock.New(goredis.New(rdb))
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	names := []string{"job-a", "job-b", "job-c", "job-d", "job-e", "job-f"}
	for _, name := range names {
		l, err := c.TryLock(ctx, name)
		if err != nil {
			t.Fatalf("TryLock(%q): %v", name, err)
		}
		got := lockAndRelease(c, name, 10*time.Second)
		awaitWaiting(t, c, name, 1)
		if err := l.Release(ctx); err != nil {
			t.Errorf("Release(%q): %v", name, err)
		}
		if err := <-got; err != nil {
			t.Errorf("waiter for %q: %v", name, err)
		}
	}
	multi, err := c.TryLockMulti(ctx, names)
	if err != nil {
		t.Fatalf("TryLockMulti: %v", err)
	}
	if infos, err := c.List(ctx, "job-*"); err != nil || len(infos) != len(names) {
		t.Errorf("List = %d locks, %v; want %d", len(infos), err, len(names))
	}
	if err := multi.Release(ctx); err != nil {
		t.Errorf("Release of several names: %v", err)
	}
	p, err := c.Semaphore("pool", 1).TryAcquire(ctx)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	got := waitInBackground(func(ctx context.Context) (*dlock.Lock, error) { return c.Semaphore("pool", 1).Acquire(ctx) })
	awaitWaiting(t, c, "pool", 1)
	if err := p.Release(ctx); err != nil {
		t.Errorf("permit Release: %v", err)
	}
	if err := <-got; err != nil {
		t.Errorf("waiting for a permit: %v", err)
	}
	if _, err := c.TryLock(ctx, "forced"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ForceRelease(ctx, "forced"); err != nil {
		t.Errorf("ForceRelease: %v", err)
	}
	for _, n := range cluster.Nodes {
		if log := n.Do(t, "ACL", "LOG"); log != "" {
			t.Errorf("ACL LOG of %s after dlock's calls:\n%s", n.Addr(), log)
		}
	}
	// The user with a wrong password is denied at once, by every node.
	wrong := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), Username: "locker", Password: "wrong", MaxRetries: -1})
	t.Cleanup(func() { _ = wrong.Close() })
	denied := dlock.New(goredis.New(wrong))
	t.Cleanup(func() { _ = denied.Close() })
	deniedAtOnce(t, denied, "WRONGPASS", false)
}

// TestACLUserOnAClusterWithoutShardChannels: the README's user with the
// cluster's additions but SSUBSCRIBE still takes and waits for locks, the
// waiters woken by their timers, and dlock logs why. The refusal went
// unseen over go-redis: the subscription took it for a failed connection
// and subscribed anew, every 250ms, for as long as a waiter waited.
func TestACLUserOnAClusterWithoutShardChannels(t *testing.T) {
	cluster := redistest.StartCluster(t, 3, 0)
	var rules []string
	for _, r := range append(append([]string(nil), aclRules...), clusterACLRules...) {
		if r != "+ssubscribe" {
			rules = append(rules, r)
		}
	}
	for _, n := range cluster.Nodes {
		n.Do(t, append([]string{"ACL", "SETUSER", "locker"}, rules...)...)
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), Username: "locker", Password: "s3cret", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	var buf redistest.Buffer
	c := dlock.New(goredis.New(rdb), dlock.WithLogger(slog.New(slog.NewTextHandler(&buf, nil))))
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := c.TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	got := lockAndRelease(c, "job", 10*time.Second)
	awaitWaiting(t, c, "job", 1)
	awaitCond(t, 10*time.Second, func() bool {
		logged := buf.String()
		return strings.Contains(logged, "cannot subscribe to shard channels") && strings.Contains(logged, "NOPERM")
	})
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Errorf("the waiter: %v", err)
	}
}

// waitInBackground obtains a hold with acquire on a goroutine, within 10s,
// and releases it; the channel gets the first error, or nil.
func waitInBackground(acquire func(ctx context.Context) (*dlock.Lock, error)) <-chan error {
	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		l, err := acquire(ctx)
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	return got
}

func TestTLS(t *testing.T) {
	certs := redistest.NewTLS(t)
	srv := redistest.Start(t, redistest.WithTLS(certs))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), TLSConfig: certs.ClientConfig()})
	t.Cleanup(func() { _ = rdb.Close() })
	c := dlock.New(goredis.New(rdb))
	t.Cleanup(func() { _ = c.Close() })
	l, err := c.TryLock(ctx, "secure")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	untrusting := redis.NewClient(&redis.Options{Addr: srv.Addr(), TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12}, MaxRetries: -1})
	t.Cleanup(func() { _ = untrusting.Close() })
	if _, err := dlock.New(goredis.New(untrusting)).TryLock(ctx, "secure"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("client without the CA: err = %v, want a certificate error", err)
	}
	plain := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = plain.Close() })
	if _, err := dlock.New(goredis.New(plain)).TryLock(ctx, "secure"); err == nil {
		t.Error("a plain-text client reached the TLS-only server")
	}
}

// TestTokensNeverLogged logs everything, debug included, through a lock's
// whole life, its loss among it, and looks for the token.
func TestTokensNeverLogged(t *testing.T) {
	e := newEnv(t)
	var buf redistest.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c := e.newClient(t, dlock.WithLogger(logger))
	ctx := context.Background()
	l, err := c.Lock(ctx, "secret", dlock.WithRefreshInterval(20*time.Millisecond), dlock.WithToken("tok-7f3a9e"))
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Do(t, "DEL", "dlock:{secret}")
	waitDone(t, l, 5*time.Second)
	_ = l.Release(ctx)
	if l, err := c.Lock(ctx, "secret", dlock.WithMaxWait(5*time.Second)); err != nil {
		t.Fatal(err)
	} else {
		_ = l.Release(ctx)
	}
	logged := buf.String()
	if logged == "" {
		t.Fatal("nothing was logged")
	}
	if strings.Contains(logged, "tok-7f3a9e") {
		t.Errorf("the token was logged:\n%s", logged)
	}
}

// TestAWaitEndsAtOnceWhenRedisRefusesTheClient: a missing or wrong
// password, or a missing permission, or a server that does not know the
// script commands (a sentinel's port, a proxy) or a command the scripts
// call (renamed away), or a database it does not have, or a client name
// it refuses (one with a space, which go-redis sends on every new
// connection), is not a Redis that is down for a while: every waiting
// acquire ends at its first attempt with Redis's refusal, not at the end
// of its wait with the refusal hidden behind it, and the error matches
// ErrDenied, as TryLock's does.
func TestAWaitEndsAtOnceWhenRedisRefusesTheClient(t *testing.T) {
	srv := redistest.Start(t)
	noScripts := redistest.Start(t, redistest.WithArgs("--rename-command", "EVALSHA", "", "--rename-command", "EVAL", ""))
	noExpire := redistest.Start(t, redistest.WithArgs("--rename-command", "PEXPIRE", ""))
	srv.Do(t, "ACL", "SETUSER", "noscripts", "on", ">s3cret", "~*", "&*", "+@all", "-evalsha", "-eval")
	srv.Do(t, "ACL", "SETUSER", "noexpiry", "on", ">s3cret", "~*", "&*", "+@all", "-pexpire")
	srv.Do(t, "ACL", "SETUSER", "nokeys", "on", ">s3cret", "&*", "+@all")
	srv.Do(t, "CONFIG", "SET", "requirepass", "pw") // last: srv.Do has no password
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: "pw"})
	t.Cleanup(func() { _ = admin.Close() })
	for _, tc := range []struct {
		name string
		opts redis.Options
		want string
		srv  *redistest.Server // srv when nil
	}{
		// A waiting acquire has more than 10 arguments, which Redis refuses
		// from an unauthenticated client with a protocol error.
		{"no password", redis.Options{}, "not authenticated (NOAUTH)", nil},
		{"wrong password", redis.Options{Password: "wrong"}, "WRONGPASS", nil},
		{"no permission", redis.Options{Username: "noscripts", Password: "s3cret"}, "NOPERM", nil},
		{"no permission for the keys", redis.Options{Username: "nokeys", Password: "s3cret"}, "NOPERM", nil},
		// A command inside the script: the script may have run in part.
		{"no permission inside the script", redis.Options{Username: "noexpiry", Password: "s3cret"}, "can't run this command", nil},
		{"no script commands", redis.Options{}, "unknown command", noScripts},
		{"a command of the scripts renamed away", redis.Options{}, "Unknown Redis command called from script", noExpire},
		// A database the server does not have: every connection's SELECT
		// is refused.
		{"no such database", redis.Options{Password: "pw", DB: 99}, "DB index is out of range", nil},
		// A client name Redis refuses: every connection's CLIENT SETNAME
		// is refused.
		{"a client name with a space", redis.Options{Password: "pw", ClientName: "my app"}, "Client names cannot contain spaces", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := tc.opts
			opts.Addr, opts.MaxRetries = cmp.Or(tc.srv, srv).Addr(), -1
			rdb := redis.NewClient(&opts)
			t.Cleanup(func() { _ = rdb.Close() })
			c := dlock.New(goredis.New(rdb))
			t.Cleanup(func() { _ = c.Close() })
			// Redis closes the connection after its refusal of a client
			// without a password: a reset may reach the client before the
			// refusal does, and that alone is retried.
			deniedAtOnce(t, c, tc.want, tc.name == "no password")
			// A name refused its TTL is not left in Redis for good (an
			// exclusive lock would be held for good).
			keys, err := admin.Keys(context.Background(), "dlock:*").Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range keys {
				if ms := admin.PTTL(context.Background(), k).Val(); ms == -1 {
					t.Errorf("%s is left without a TTL", k)
				}
			}
		})
	}
}

// TestAnAcquireRefusedItsScriptSendsNoCleanUp: Redis refusing a client
// the script command itself, or the keys it names (NOPERM), ran nothing,
// so the failed acquire sends no clean-up, which Redis would refuse too
// (each a line in ACL LOG) and the client log as a clean-up that failed.
func TestAnAcquireRefusedItsScriptSendsNoCleanUp(t *testing.T) {
	srv := redistest.Start(t)
	srv.Do(t, "ACL", "SETUSER", "noscripts", "on", ">s3cret", "~*", "&*", "+@all", "-evalsha", "-eval")
	srv.Do(t, "ACL", "SETUSER", "nokeys", "on", ">s3cret", "&*", "+@all")
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = admin.Close() })
	for _, user := range []string{"noscripts", "nokeys"} {
		t.Run(user, func(t *testing.T) {
			srv.Do(t, "ACL", "LOG", "RESET")
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: user, Password: "s3cret", MaxRetries: -1})
			t.Cleanup(func() { _ = rdb.Close() })
			logger, logs := captureLogs(slog.LevelDebug)
			c := dlock.New(goredis.New(rdb), dlock.WithLogger(logger))
			if _, err := c.TryLock(context.Background(), "x"); !errors.Is(err, dlock.ErrDenied) {
				t.Fatalf("TryLock: err = %v, want ErrDenied", err)
			}
			_ = c.Close() // waits for any clean-up
			if n, err := admin.Do(context.Background(), "ACL", "LOG").Slice(); err != nil || len(n) != 1 {
				t.Errorf("ACL LOG has %d entries (err %v), want 1 (the acquire's): %v", len(n), err, n)
			}
			if l := logs(); strings.Contains(l, "clean up") {
				t.Errorf("a clean-up was sent:\n%s", l)
			}
		})
	}
}

// TestATLSHandshakeRefusedEndsAWaitAtOnce: a TLS handshake that fails for
// a setting (the server's certificate signed by an authority the client
// does not trust, or made out to another name; a server that asks for a
// client certificate the client does not have) fails every request alike
// until the setting is fixed: a wait ends at its first attempt with an
// error that matches ErrDenied, as a wrong password's does. It tried again
// until its max wait, a minute by default.
func TestATLSHandshakeRefusedEndsAWaitAtOnce(t *testing.T) {
	certs := redistest.NewTLS(t)
	srv := redistest.Start(t, redistest.WithTLSPort(), redistest.WithArgs("--tls-cert-file", certs.CertFile,
		"--tls-key-file", certs.KeyFile, "--tls-ca-cert-file", certs.CAFile, "--tls-auth-clients", "yes"))
	otherName := certs.ClientConfig()
	otherName.ServerName = "redis.example"
	for _, tc := range []struct {
		name   string
		config *tls.Config
		want   string
	}{
		{"unknown authority", &tls.Config{MinVersion: tls.VersionTLS12}, "certificate signed by unknown authority"},
		{"another name", otherName, "not redis.example"},
		// The server closes the connection after its alert: a reset may
		// reach the client before the alert does, and that alone is
		// retried.
		{"no client certificate", certs.ClientConfig(), "tls: certificate required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(srv.TLSPort()), TLSConfig: tc.config, MaxRetries: -1})
			t.Cleanup(func() { _ = rdb.Close() })
			c := dlock.New(goredis.New(rdb))
			t.Cleanup(func() { _ = c.Close() })
			deniedAtOnce(t, c, tc.want, tc.name == "no client certificate")
		})
	}
}

// TestOutagesAreNotDenials: what passes with a restart, a failover or
// time is retried by a wait until it ends, and does not match ErrDenied:
// a server that cannot be reached, a connection reset (as a plain-text
// client's at a TLS port is), a server whose last RDB save failed
// (MISCONF: writes come back with the next save that succeeds).
func TestOutagesAreNotDenials(t *testing.T) {
	certs := redistest.NewTLS(t)
	tlsOnly := redistest.Start(t, redistest.WithTLS(certs))
	misconf := redistest.Start(t)
	// The RDB file cannot take the place of a directory of that name: the
	// save fails, and the server refuses writes.
	if err := os.MkdirAll(filepath.Join(misconf.Dir(), "dump.rdb", "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	misconf.Do(t, "CONFIG", "SET", "save", "3600 1")
	misconf.Do(t, "BGSAVE")
	awaitCond(t, 10*time.Second, func() bool {
		return strings.Contains(misconf.Do(t, "INFO", "persistence"), "rdb_last_bgsave_status:err")
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	for _, tc := range []struct {
		name, addr, want string
	}{
		{"unreachable", closed, "connection refused"},
		{"plain text at a TLS port", tlsOnly.Addr(), "reset"},
		{"MISCONF", misconf.Addr(), "MISCONF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb := redis.NewClient(&redis.Options{Addr: tc.addr, MaxRetries: -1})
			t.Cleanup(func() { _ = rdb.Close() })
			c := dlock.New(goredis.New(rdb))
			t.Cleanup(func() { _ = c.Close() })
			ctx := context.Background()
			if _, err := c.TryLock(ctx, "x"); err == nil || errors.Is(err, dlock.ErrDenied) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("TryLock: err = %v, want one saying %q that does not match ErrDenied", err, tc.want)
			}
			retried := 0
			_, err := c.Lock(ctx, "x", dlock.WithMaxWait(300*time.Millisecond), dlock.WithOnRetry(func(int, error) { retried++ }))
			if retried == 0 || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, dlock.ErrDenied) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Lock: %d retries, err = %v; want retries until the max wait, and an error saying %q that does not match ErrDenied", retried, err, tc.want)
			}
		})
	}
}

// deniedAtOnce checks that every waiting acquire of c (and Do, and
// TryLock) ends at its first attempt, with a *ServerError that says want
// and matches ErrDenied. With resets, an attempt that meets a connection
// the server closed (its refusal's own close overtaking it) may be
// retried, and no other, and TryLock may fail so.
func deniedAtOnce(t *testing.T, c *dlock.Client, want string, resets bool) {
	t.Helper()
	for _, p := range []struct {
		name    string
		acquire func(ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error)
	}{
		{"Lock", func(ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error) { return c.Lock(ctx, "x", opts...) }},
		{"Do", func(ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error) {
			return nil, c.Do(ctx, "do", func(context.Context) error { t.Error("Do ran its function"); return nil }, opts...)
		}},
		{"LockMulti", func(ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error) {
			return c.LockMulti(ctx, []string{"m1", "m2"}, opts...)
		}},
		{"RLock", c.RWMutex("rw").RLock},
		{"RWMutex.Lock", c.RWMutex("rw-write").Lock},
		{"fair RLock", c.RWMutex("fair", dlock.Fair()).RLock},
		{"Acquire", c.Semaphore("sem", 2).Acquire},
		{"TryLock", func(ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error) {
			return c.TryLock(ctx, "x", opts...)
		}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		retried := false
		_, err := p.acquire(ctx, dlock.WithOnRetry(func(_ int, err error) {
			if resets && closedOnIt(err) {
				return
			}
			retried = true
			cancel() // the wait would go on
		}))
		cancel()
		if resets && p.name == "TryLock" && err != nil && closedOnIt(err) {
			continue // its one attempt met the close, not the refusal
		}
		var se *dlock.ServerError
		if retried || err == nil || !errors.As(err, &se) || !errors.Is(err, dlock.ErrDenied) || errors.Is(err, dlock.ErrNotObtained) ||
			errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: retried %v, err = %v; want no retry and a *ServerError saying %q that matches ErrDenied", p.name, retried, err, want)
		}
	}
}

// closedOnIt reports whether err is that of a connection the server closed
// under the request: reset, or ended before the reply.
func closedOnIt(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, syscall.EPIPE) ||
		strings.Contains(err.Error(), "connection reset") || strings.Contains(err.Error(), "broken pipe")
}

// TestAReadRefusedInsideAScriptIsNotForeignData: an ACL user that may not
// run one of the reads inside dlock's scripts (its ACL line lacks one
// command of the README's) gets Redis's refusal from every acquire, and
// from Inspect, that comes to that read: not ErrWrongType, which would
// blame an innocent key of the name for holding data dlock did not write,
// nor a refusal as if the name were held, nor a success that read nothing.
// The name is left as it was (see nameState): the scripts read before they
// write.
func TestAReadRefusedInsideAScriptIsNotForeignData(t *testing.T) {
	srv := redistest.Start(t)
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = admin.Close() })
	full := dlock.New(goredis.New(admin))
	t.Cleanup(func() { _ = full.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hold := dlock.WithTTL(time.Minute)

	// held makes name held by another client (holders has its Lock),
	// with a release marker when it has one: that of a second hold, taken
	// and released, so that an acquire reads every key of the name.
	holders := map[string]*dlock.Lock{}
	held := func(name string, take func(ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error)) {
		l, err := take(ctx, hold)
		if err != nil {
			t.Fatal(err)
		}
		holders[name] = l
		l, err = take(ctx, hold)
		if errors.Is(err, dlock.ErrNotObtained) {
			return // an exclusive lock
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	type op struct {
		name  string
		setup func(name string)
		run   func(c *dlock.Client, name string) error
	}
	lock := func(n string) {
		held(n, func(ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error) {
			return full.TryLock(ctx, n, opts...)
		})
	}
	rw := func(fair bool) func(n string) {
		return func(n string) {
			var opts []dlock.RWOption
			if fair {
				opts = append(opts, dlock.Fair())
			}
			held(n, full.RWMutex(n, opts...).TryRLock)
		}
	}
	sem := func(n string) { held(n, full.Semaphore(n, 3).TryAcquire) }
	ops := []op{
		{"lock", lock, func(c *dlock.Client, n string) error { _, err := c.TryLock(ctx, n); return err }},
		// ttl.lua, which reads the lock as release and refresh do.
		{"attach", lock, func(c *dlock.Client, n string) error { _, err := c.Attach(ctx, n, holders[n].Token()); return err }},
		{"rlock", rw(false), func(c *dlock.Client, n string) error { _, err := c.RWMutex(n).TryRLock(ctx); return err }},
		{"wlock", rw(false), func(c *dlock.Client, n string) error { _, err := c.RWMutex(n).TryLock(ctx); return err }},
		{"fair-rlock", rw(true), func(c *dlock.Client, n string) error {
			_, err := c.RWMutex(n, dlock.Fair()).TryRLock(ctx)
			return err
		}},
		{"fair-wlock", rw(true), func(c *dlock.Client, n string) error {
			_, err := c.RWMutex(n, dlock.Fair()).TryLock(ctx)
			return err
		}},
		{"sem", sem, func(c *dlock.Client, n string) error { _, err := c.Semaphore(n, 3).TryAcquire(ctx); return err }},
		{"inspect-lock", lock, func(c *dlock.Client, n string) error { _, err := c.Inspect(ctx, n); return err }},
		{"inspect-rw", rw(true), func(c *dlock.Client, n string) error { _, err := c.Inspect(ctx, n); return err }},
		{"inspect-sem", sem, func(c *dlock.Client, n string) error { _, err := c.Inspect(ctx, n); return err }},
	}
	acquires := []string{"lock", "rlock", "wlock", "fair-rlock", "fair-wlock", "sem"}
	holds := []string{"rlock", "wlock", "fair-rlock", "fair-wlock", "sem"}
	inspects := []string{"inspect-lock", "inspect-rw", "inspect-sem"}
	for _, tc := range []struct {
		cmd     string
		refused []string // the operations that come to a read with cmd
	}{
		{"hmget", append(append(acquires, "attach"), inspects...)},
		{"zrangebyscore", append(holds, "inspect-rw", "inspect-sem")},
		{"zscore", holds},
		{"zrange", []string{"wlock", "fair-rlock", "fair-wlock"}},
		{"pttl", append(acquires, "attach", "inspect-lock")},
		{"zcount", inspects},
		{"get", inspects},
	} {
		t.Run(tc.cmd, func(t *testing.T) {
			user := "no" + tc.cmd
			rules := []string{"ACL", "SETUSER", user}
			for _, r := range aclRules {
				if r != "+"+tc.cmd {
					rules = append(rules, r)
				}
			}
			if len(rules) != len(aclRules)+2 {
				t.Fatalf("+%s is not in the README's ACL line", tc.cmd)
			}
			// The scripts as Redis Functions too: the user may load and
			// call them.
			srv.Do(t, append(rules, "+fcall", "+function|load")...)
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: user, Password: "s3cret", MaxRetries: -1})
			t.Cleanup(func() { _ = rdb.Close() })
			for _, c := range []struct {
				name string
				*dlock.Client
			}{
				{"eval", dlock.New(goredis.New(rdb))},
				{"fcall", dlock.New(goredis.New(rdb), dlock.WithFunctions())},
			} {
				t.Cleanup(func() { _ = c.Close() })
				for _, o := range ops {
					n := tc.cmd + "-" + c.name + "-" + o.name
					o.setup(n)
					before := nameState(ctx, t, admin, full, n)
					err := o.run(c.Client, n)
					mustRefuse := false
					for _, r := range tc.refused {
						mustRefuse = mustRefuse || r == o.name
					}
					switch {
					case refusedInScript(err):
						if after := nameState(ctx, t, admin, full, n); after != before {
							t.Errorf("%s by %s: the name changed under a refusal:\nbefore %q\nafter  %q", o.name, c.name, before, after)
						}
					case mustRefuse:
						t.Errorf("%s by %s: err = %v, want Redis's refusal of %s", o.name, c.name, err, strings.ToUpper(tc.cmd))
					case err != nil && !errors.Is(err, dlock.ErrNotObtained):
						t.Errorf("%s by %s: err = %v, want the operation's outcome or Redis's refusal of %s",
							o.name, c.name, err, strings.ToUpper(tc.cmd))
					}
				}
			}
		})
	}
}

// refusedInScript reports whether err is Redis's refusal of a command
// inside a script to the client's ACL user (in the words of Redis 7.0, or of
// later versions), and not dlock's error for foreign data.
func refusedInScript(err error) bool {
	if err == nil || errors.Is(err, dlock.ErrWrongType) || errors.Is(err, dlock.ErrNotObtained) {
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, "can't run this command") || strings.Contains(msg, "ACL failure in script") ||
		strings.Contains(msg, "NOPERM")
}

// nameState returns what the keys of name hold, for comparison, but for
// the records that an acquisition ended which its clean-up leaves, in a
// lock hash's release records ('rel' to 'rel4', 'late') and as a release marker's 'r:' members (see release.lua
// and holds_release.lua): they take nothing.
func nameState(ctx context.Context, t *testing.T, rdb *redis.Client, c *dlock.Client, name string) string {
	t.Helper()
	var b strings.Builder
	key := c.RedisKey(name)
	for _, k := range []string{key, key + ":fence", key + ":waiters", key + ":holds", key + ":pending", key + ":queue", key + ":released"} {
		var v any
		var err error
		switch typ := rdb.Type(ctx, k).Val(); typ {
		case "none":
			continue
		case "hash":
			var h map[string]string
			h, err = rdb.HGetAll(ctx, k).Result()
			for _, f := range releaseRecordFields {
				delete(h, f)
			}
			delete(h, "late")
			v = h
		case "zset":
			var z []redis.Z
			z, err = rdb.ZRangeWithScores(ctx, k, 0, -1).Result()
			kept := z[:0]
			for _, m := range z {
				if !strings.HasPrefix(m.Member.(string), "r:") {
					kept = append(kept, m)
				}
			}
			v = kept
		default:
			v, err = rdb.Dump(ctx, k).Result()
		}
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s=%v\n", k, v)
	}
	return b.String()
}
