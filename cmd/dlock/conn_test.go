//go:build unix

package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func env(kv ...string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i] == k {
				return kv[i+1], true
			}
		}
		return "", false
	}
}

func TestParseTarget(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		tg, err := (&connFlags{url: "redis://u:pw@h1:7000/3?dial_timeout=2s"}).target(env())
		if err != nil {
			t.Fatal(err)
		}
		o := tg.single
		if o == nil || o.Addr != "h1:7000" || o.Username != "u" || o.Password != "pw" || o.DB != 3 || o.DialTimeout != 2*time.Second {
			t.Errorf("%+v", o)
		}
		if tg.display != "redis://u:xxxxx@h1:7000/3?dial_timeout=2s" || tg.prefix != "dlock:" {
			t.Errorf("display %q, prefix %q", tg.display, tg.prefix)
		}
	})
	t.Run("default and environment", func(t *testing.T) {
		tg, err := (&connFlags{}).target(env("DLOCK_PASSWORD", "envpw", "DLOCK_PREFIX", ""))
		if err != nil {
			t.Fatal(err)
		}
		// An empty DLOCK_PREFIX is unset, as every variable; --prefix ''
		// gives an empty prefix.
		if tg.single.Addr != "127.0.0.1:6379" || tg.single.Password != "envpw" || tg.prefix != "dlock:" {
			t.Errorf("%+v, prefix %q", tg.single, tg.prefix)
		}
		tg, _ = (&connFlags{prefix: "", prefixSet: true}).target(env("DLOCK_PREFIX", "q:"))
		if tg.prefix != "" {
			t.Errorf("--prefix '': prefix %q", tg.prefix)
		}
		tg, _ = (&connFlags{}).target(env("DLOCK_REDIS", "redis://:urlpw@h:1", "DLOCK_PASSWORD", "envpw"))
		if tg.single.Addr != "h:1" || tg.single.Password != "urlpw" {
			t.Errorf("the URL's password must win: %+v", tg.single)
		}
		tg, _ = (&connFlags{url: "redis://h:2", prefix: "p:", prefixSet: true}).target(env("DLOCK_REDIS", "redis://h:1", "DLOCK_PREFIX", "q:"))
		if tg.single.Addr != "h:2" || tg.prefix != "p:" {
			t.Errorf("flags must win over the environment: %+v, %q", tg.single, tg.prefix)
		}
	})
	t.Run("cluster", func(t *testing.T) {
		tg, err := (&connFlags{url: "rediss://u:pw@h1:7000,h2,h3:7002?read_timeout=1s"}).target(env())
		if err != nil {
			t.Fatal(err)
		}
		o := tg.cluster
		if o == nil || !slices.Equal(o.Addrs, []string{"h1:7000", "h2:6379", "h3:7002"}) || o.Username != "u" ||
			o.Password != "pw" || o.TLSConfig == nil || o.ReadTimeout != time.Second {
			t.Errorf("%+v", o)
		}
		tg, _ = (&connFlags{url: "redis://h1:7000", cluster: true}).target(env())
		if tg.cluster == nil || !slices.Equal(tg.cluster.Addrs, []string{"h1:7000"}) {
			t.Errorf("--cluster with one seed: %+v", tg)
		}
	})
	t.Run("sentinel", func(t *testing.T) {
		tg, err := (&connFlags{url: "redis-sentinel://:pw@s1,s2:5000/mymaster/2?sentinel_password=spw"}).target(env())
		if err != nil {
			t.Fatal(err)
		}
		o := tg.failover
		if o == nil || o.MasterName != "mymaster" || !slices.Equal(o.SentinelAddrs, []string{"s1:26379", "s2:5000"}) ||
			o.Password != "pw" || o.DB != 2 || o.SentinelPassword != "spw" || o.TLSConfig != nil {
			t.Errorf("%+v", o)
		}
		tg, _ = (&connFlags{url: "rediss://s1:5000", sentinelMaster: "m"}).target(env("DLOCK_SENTINEL_PASSWORD", "spw"))
		if o := tg.failover; o == nil || o.MasterName != "m" || o.TLSConfig == nil || o.SentinelPassword != "spw" {
			t.Errorf("--sentinel-master: %+v", tg.failover)
		}
	})
	t.Run("unix", func(t *testing.T) {
		tg, err := (&connFlags{url: "unix:///run/redis.sock?db=1"}).target(env("DLOCK_PASSWORD", "pw"))
		if err != nil {
			t.Fatal(err)
		}
		if o := tg.single; o.Network != "unix" || o.Addr != "/run/redis.sock" || o.DB != 1 || o.Password != "pw" {
			t.Errorf("%+v", o)
		}
	})
	for _, tc := range []struct {
		flags connFlags
		want  string
	}{
		{connFlags{url: "ftp://h"}, `unsupported scheme "ftp"`},
		{connFlags{url: "localhost:6379"}, "not a URL"},
		{connFlags{url: "redis://h/x"}, "invalid database number"},
		{connFlags{url: "redis://h?bogus=1"}, "bogus"},
		{connFlags{url: "redis://a,b/1"}, "only database 0"},
		{connFlags{url: "redis://a,,b"}, "empty address"},
		{connFlags{url: "redis-sentinel://s1"}, "no master name"},
		{connFlags{url: "redis-sentinel://s1/m", sentinelMaster: "other"}, "--sentinel-master says"},
		{connFlags{url: "redis-sentinel://s1/m", cluster: true}, "exclude each other"},
		{connFlags{url: "unix:///s", cluster: true}, "single server"},
		{connFlags{url: "unix://h/s"}, "names no host"},
		{connFlags{url: "redis://h", tlsCA: "ca.pem"}, "not a TLS URL"},
		{connFlags{url: "rediss://h", tlsCA: "/nonexistent/ca.pem"}, "--tls-ca"},
		{connFlags{url: "rediss://h", tlsKey: "k.pem"}, "--tls-key needs --tls-cert"},
		{connFlags{url: "redis://u:secret@h:1/x"}, `bad Redis URL "redis://u:xxxxx@h:1/x" (from --redis)`},
	} {
		_, err := tc.flags.target(env())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err = %v, want it to say %q", tc.flags, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("the error shows the password: %v", err)
		}
	}
}

// A bad URL is code 64 and an unreachable Redis 69, each with one line,
// for every command.
func TestConnectErrors(t *testing.T) {
	t.Parallel()
	closed := "redis://" + closedAddr(t)
	for _, args := range [][]string{
		{"run", "--no-wait", "job", "--", helperBin, "exit", "0"}, // a run that waits retries: see TestRunWaitsForRedisToBeReachable
		{"status", "job"},
		{"ls"},
		{"release", "--force", "job"},
	} {
		r := dlockRun(t, []string{"DLOCK_REDIS=" + closed}, args...)
		checkOneLine(t, r, exitUnavailable, "cannot use Redis at "+closed+": ")
		if !strings.Contains(r.stderr, "connection refused; check --redis or DLOCK_REDIS") {
			t.Errorf("%v: %s", args, r.stderr)
		}
		r = dlockRun(t, nil, append([]string{"--redis", "htp://127.0.0.1"}, args...)...)
		checkOneLine(t, r, exitUsage, `bad Redis URL "htp://127.0.0.1" (from --redis): unsupported scheme "htp"`)
	}
	r := dlockRun(t, []string{"DLOCK_REDIS=" + closed + "/x"}, "ls")
	checkOneLine(t, r, exitUsage, `(from DLOCK_REDIS): invalid database number: "x"`)
}

// TestFenceRetentionFlag: --fence-retention, or DLOCK_FENCE_RETENTION,
// sets how long a name's fence counter is kept after run's fence, as
// dlock.WithFenceRetention; 0 keeps none, and a bad value is a usage error.
func TestFenceRetentionFlag(t *testing.T) {
	t.Parallel()
	rdb := rawClient(t)
	ctx := context.Background()
	ran := filepath.Join(t.TempDir(), "ran")
	for i, tc := range []struct {
		flags, env []string
		min, max   time.Duration // the counter's TTL; 0: no counter
	}{
		{flags: []string{"--fence-retention", "1h"}, min: 59 * time.Minute, max: time.Hour},
		{env: []string{"DLOCK_FENCE_RETENTION=2h"}, min: 119 * time.Minute, max: 2 * time.Hour},
		{flags: []string{"--fence-retention", "1h"}, env: []string{"DLOCK_FENCE_RETENTION=2h"}, min: 59 * time.Minute, max: time.Hour},
		{flags: []string{"--fence-retention", "0"}},
		{env: []string{"DLOCK_FENCE_RETENTION="}, min: 1439 * time.Minute, max: 24 * time.Hour}, // empty: unset
	} {
		name := lockName(t) + ":" + strconv.Itoa(i)
		if r := dlockRun(t, tc.env, runArgs(tc.flags, name, "job", ran, "0")...); r.code != 0 {
			t.Fatalf("%v %v: exit %d: %s", tc.flags, tc.env, r.code, r.stderr)
		}
		ttl, err := rdb.PTTL(ctx, "dlock:{"+name+"}:fence").Result()
		if err != nil {
			t.Fatal(err)
		}
		if tc.max == 0 && ttl != -2*time.Nanosecond || tc.max != 0 && (ttl < tc.min || ttl > tc.max) {
			t.Errorf("%v %v: fence counter TTL %v, want %v to %v (0: no counter)", tc.flags, tc.env, ttl, tc.min, tc.max)
		}
	}
	for _, tc := range []struct {
		flags, env []string
		want       string
	}{
		{[]string{"--fence-retention", "soon"}, nil, `bad fence retention "soon" (from --fence-retention): not a duration`},
		{[]string{"--fence-retention", "-1h"}, nil, `bad fence retention "-1h" (from --fence-retention): negative; write 0 to keep no fence counters`},
		{nil, []string{"DLOCK_FENCE_RETENTION=1 day"}, `bad fence retention "1 day" (from DLOCK_FENCE_RETENTION): not a duration`},
		{nil, []string{"DLOCK_FENCE_RETENTION=9999999h"}, `bad fence retention "9999999h" (from DLOCK_FENCE_RETENTION): out of range (at most 2562047h, about 292 years)`},
	} {
		r := dlockRun(t, tc.env, runArgs(tc.flags, lockName(t), "job", ran, "0")...)
		checkOneLine(t, r, exitUsage, tc.want)
	}
	if _, err := os.Stat(ran); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(ran); strings.Count(string(data), "start ") != 5 {
		t.Errorf("the command ran %d times, want 5 (none with a bad fence retention):\n%s", strings.Count(string(data), "start "), data)
	}
}

func TestConnectUnixSocket(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "redis.sock")
	redistest.Start(t, redistest.WithArgs("--unixsocket", sock, "--unixsocketperm", "700"))
	url := "DLOCK_REDIS=unix://" + sock
	if r := dlockRun(t, []string{url}, runArgs(nil, "job", "exit", "3")...); r.code != 3 {
		t.Errorf("run over a unix socket: code %d, stderr %s", r.code, r.stderr)
	}
	if r := dlockRun(t, []string{url}, "ls", "--json"); r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("ls over a unix socket: code %d, stdout %q, stderr %s", r.code, r.stdout, r.stderr)
	}
}

// run gives its command the connection flags in the variables that stand
// for them, replacing those in its environment, and leaves the rest.
func TestChildEnv(t *testing.T) {
	cwd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	base := []string{"PATH=/bin", "DLOCK_REDIS=redis://elsewhere:1", "DLOCK_PREFIX=env:", "DLOCK_CLUSTER=1", "DLOCK_SENTINEL_MASTER=envm"}
	for _, tc := range []struct {
		name  string
		flags connFlags
		env   []string
		want  []string
	}{
		{"no flags", connFlags{}, base, base},
		{"every flag", connFlags{url: "redis://h:1/2?dial_timeout=2s", prefix: "app:", prefixSet: true, sentinelMaster: "m",
			tlsCA: "/etc/ca.pem", tlsCert: "certs/c.pem", tlsKey: "/k.pem", tlsSNI: "redis.internal", fenceRetention: "1h", clusterSet: true},
			base, []string{"PATH=/bin", "DLOCK_FENCE_RETENTION=1h", "DLOCK_PREFIX=app:", "DLOCK_REDIS=redis://h:1/2?dial_timeout=2s",
				"DLOCK_SENTINEL_MASTER=m", "DLOCK_TLS_CA=/etc/ca.pem", "DLOCK_TLS_CERT=" + filepath.Join(cwd, "certs/c.pem"),
				"DLOCK_TLS_KEY=/k.pem", "DLOCK_TLS_SERVER_NAME=redis.internal"}},
		{"empty prefix, cluster", connFlags{prefixSet: true, cluster: true, clusterSet: true}, []string{"DLOCK_PREFIX=env:"},
			[]string{"DLOCK_CLUSTER=1", "DLOCK_NO_PREFIX=1"}},
		{"a prefix replaces DLOCK_NO_PREFIX", connFlags{prefix: "p:", prefixSet: true}, []string{"DLOCK_NO_PREFIX=1"}, []string{"DLOCK_PREFIX=p:"}},
		{"a password stays in the URL", connFlags{url: "redis://u:p%40ss@h1:1,h2:2/0?x=1"}, []string{"DLOCK_PASSWORD="},
			[]string{"DLOCK_PASSWORD=", "DLOCK_REDIS=redis://u:p%40ss@h1:1,h2:2/0?x=1"}},
		{"sentinels", connFlags{url: "redis-sentinel://:pw@s1,s2/m?a=1&sentinel_password=s%26p&b=2#f"}, nil,
			[]string{"DLOCK_REDIS=redis-sentinel://:pw@s1,s2/m?a=1&sentinel_password=s%26p&b=2#f"}},
		{"--cluster=false", connFlags{clusterSet: true}, []string{"DLOCK_CLUSTER=1"}, []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.flags.childEnv(tc.env); !slices.Equal(got, tc.want) {
				t.Errorf("childEnv:\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

// run's help says what childEnv does with a password in --redis's URL: it
// stays in DLOCK_REDIS ("a password stays in the URL" above), as the README
// and dlock help say; it is not moved to DLOCK_PASSWORD.
func TestRunHelpSaysTheURLPassesAsWritten(t *testing.T) {
	help := strings.Join(strings.Fields(runCommand.help), " ")
	if !strings.Contains(help, "--redis as DLOCK_REDIS, as written") || strings.Contains(help, "out of the URL") {
		t.Errorf("run's help does not say that --redis reaches the command as written:\n%s", runCommand.help)
	}
}

// What run puts in its command's environment reads as the flags did.
func TestChildEnvReadsAsTheFlags(t *testing.T) {
	for _, f := range []connFlags{
		{url: "redis://u:p%40ss@h1:1,h2:2/0?dial_timeout=2s", prefix: "app:", prefixSet: true},
		{url: "redis://:pw@h:1", prefixSet: true, fenceRetention: "1h"},
		{url: "redis-sentinel://:pw@s1,s2/m/2?sentinel_password=s%26p", prefix: "p:", prefixSet: true},
		{url: "redis://h:1", cluster: true, clusterSet: true},
		{url: "unix://u:pw@/run/redis.sock?db=1"},
	} {
		want, err := f.target(env("DLOCK_PREFIX", "env:", "DLOCK_PASSWORD", "pw"))
		if err != nil {
			t.Fatal(err)
		}
		child := f.childEnv([]string{"DLOCK_PREFIX=env:", "DLOCK_PASSWORD=pw", "DLOCK_NO_PREFIX=0"})
		var kv []string
		for _, e := range child {
			k, v, _ := strings.Cut(e, "=")
			kv = append(kv, k, v)
		}
		got, err := (&connFlags{}).target(env(kv...))
		if err != nil {
			t.Fatalf("%+v: the child's environment %q: %v", f, child, err)
		}
		want.display, got.display = "", ""
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%+v: the child's environment %q reads as\n%+v\n%+v\n%+v, want\n%+v\n%+v\n%+v", f, child,
				got, got.single, got.cluster, want, want.single, want.failover)
		}
	}
}

// DLOCK_CLUSTER, DLOCK_NO_PREFIX and DLOCK_TLS_SERVER_NAME stand for
// --cluster, an empty --prefix and --tls-server-name, which win over
// them.
func TestConnectionVariables(t *testing.T) {
	tg, err := (&connFlags{url: "redis://h:1"}).target(env("DLOCK_CLUSTER", "1", "DLOCK_NO_PREFIX", "true"))
	if err != nil || tg.cluster == nil || tg.prefix != "" {
		t.Errorf("DLOCK_CLUSTER=1 DLOCK_NO_PREFIX=true: %+v, %v; want a cluster, no prefix", tg, err)
	}
	tg, err = (&connFlags{url: "redis://h:1", clusterSet: true, prefix: "p:", prefixSet: true}).target(env("DLOCK_CLUSTER", "1", "DLOCK_NO_PREFIX", "1"))
	if err != nil || tg.cluster != nil || tg.prefix != "p:" {
		t.Errorf("--cluster=false --prefix p: over the variables: %+v, %v", tg, err)
	}
	tg, err = (&connFlags{url: "redis://h:1"}).target(env("DLOCK_CLUSTER", "0", "DLOCK_NO_PREFIX", "0"))
	if err != nil || tg.single == nil || tg.prefix != "dlock:" {
		t.Errorf("DLOCK_CLUSTER=0 DLOCK_NO_PREFIX=0: %+v, %v", tg, err)
	}
	tg, err = (&connFlags{url: "rediss://h:1"}).target(env("DLOCK_TLS_SERVER_NAME", "redis.internal"))
	if err != nil || tg.single.TLSConfig.ServerName != "redis.internal" {
		t.Errorf("DLOCK_TLS_SERVER_NAME: %+v, %v", tg.single, err)
	}
	tg, err = (&connFlags{url: "rediss://h:1", tlsSNI: "flag.internal"}).target(env("DLOCK_TLS_SERVER_NAME", "redis.internal"))
	if err != nil || tg.single.TLSConfig.ServerName != "flag.internal" {
		t.Errorf("--tls-server-name over DLOCK_TLS_SERVER_NAME: %+v, %v", tg.single, err)
	}
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"DLOCK_CLUSTER", "yes"}, `bad DLOCK_CLUSTER "yes": write 1 to treat a single address as a seed of a Redis Cluster, or 0 (or leave it unset) for none`},
		{[]string{"DLOCK_NO_PREFIX", "y"}, `bad DLOCK_NO_PREFIX "y": write 1 for an empty key prefix`},
		{[]string{"DLOCK_NO_PREFIX", "1", "DLOCK_PREFIX", "p:"}, `DLOCK_PREFIX "p:" and DLOCK_NO_PREFIX exclude each other: unset one`},
		{[]string{"DLOCK_CLUSTER", "1", "DLOCK_SENTINEL_MASTER", "m"}, "--cluster (DLOCK_CLUSTER) and a sentinel URL or --sentinel-master exclude each other"},
		{[]string{"DLOCK_TLS_SERVER_NAME", "x"}, "not a TLS URL"},
	} {
		if _, err := (&connFlags{url: "redis://h:1"}).target(env(tc.env...)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want it to say %q", tc.env, err, tc.want)
		}
	}
}

// TLS with a CA and a client certificate, and the README's ACL user, whose
// password comes from DLOCK_PASSWORD.
func TestConnectTLSAndACL(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certs := writeCerts(t, dir)
	srv := redistest.Start(t, redistest.WithTLSPort(), redistest.WithArgs(
		"--tls-cert-file", certs.serverCert, "--tls-key-file", certs.serverKey,
		"--tls-ca-cert-file", certs.ca, "--tls-auth-clients", "yes"))
	port := srv.TLSPort()
	srv.Do(t, append([]string{"ACL", "SETUSER", "locker"}, readmeACL(t)...)...)
	url := "rediss://locker@127.0.0.1:" + strconv.Itoa(port)
	tlsFlags := []string{"--redis", url, "--tls-ca", certs.ca, "--tls-cert", certs.clientCert, "--tls-key", certs.clientKey}
	envTLS := []string{"DLOCK_PASSWORD=s3cret", "DLOCK_TLS_CA=" + certs.ca, "DLOCK_TLS_CERT=" + certs.clientCert,
		"DLOCK_TLS_KEY=" + certs.clientKey, "DLOCK_REDIS=" + url}

	// Everything the command does, as the README's least-privileged user:
	// hold, wait, inspect, list, force-release.
	file := filepath.Join(t.TempDir(), "child")
	holder := startDlock(t, []string{"DLOCK_PASSWORD=s3cret"}, append(tlsFlags, runArgs(nil, "job", "signals", file, "0")...)...)
	waitForLine(t, file, "ready ")
	waiting := startDlock(t, envTLS, runArgs(nil, "job", "exit", "5")...)
	waitFor(t, "the waiting line", func() bool { return strings.Contains(waiting.stderr.String(), "waiting for 'job' — held by ") })
	if r := dlockRun(t, envTLS, "status", "job"); r.code != 0 || !strings.Contains(r.stdout, "held by:") {
		t.Errorf("status: code %d, stdout %s, stderr %s", r.code, r.stdout, r.stderr)
	}
	if r := dlockRun(t, envTLS, "ls"); r.code != 0 || !strings.Contains(r.stdout, "job ") {
		t.Errorf("ls: code %d, stdout %s, stderr %s", r.code, r.stdout, r.stderr)
	}
	holder.signal(t, os.Interrupt)
	if r := holder.wait(t); r.code != 0 {
		t.Errorf("run over TLS: code %d, stderr %s", r.code, r.stderr)
	}
	if r := waiting.wait(t); r.code != 5 {
		t.Errorf("waiting run over TLS: code %d, stderr %s", r.code, r.stderr)
	}
	holder = startDlock(t, envTLS, runArgs([]string{"--ttl", "600ms"}, "job", "signals", file+"2", "0")...)
	waitForLine(t, file+"2", "ready ")
	if r := dlockRun(t, envTLS, "release", "--force", "job"); r.code != 0 || !strings.Contains(r.stdout, "removed holder") {
		t.Errorf("release --force: code %d, stdout %s, stderr %s", r.code, r.stdout, r.stderr)
	}
	if r := holder.wait(t); r.code != exitLost {
		t.Errorf("run after release --force: code %d, stderr %s", r.code, r.stderr)
	}

	// A setting Redis or the TLS handshake refuses is code 78, not 69.
	r := dlockRun(t, []string{"DLOCK_PASSWORD=wrong"}, append(tlsFlags, "ls")...)
	checkOneLine(t, r, exitDenied, "check the user and password in the URL, or DLOCK_PASSWORD")
	if strings.Contains(r.stderr, "wrong") {
		t.Errorf("the error shows the password: %s", r.stderr)
	}
	r = dlockRun(t, []string{"DLOCK_PASSWORD=s3cret"}, "--redis", url, "--tls-cert", certs.clientCert, "--tls-key", certs.clientKey, "ls")
	checkOneLine(t, r, exitDenied, "check --tls-ca")
	// No client certificate: the server's refusal (78), or a reset that
	// overtook it (69), as the server closes the connection after it.
	r = dlockRun(t, []string{"DLOCK_PASSWORD=s3cret"}, "--redis", url, "--tls-ca", certs.ca, "ls")
	if r.code == exitUnavailable && strings.Contains(r.stderr, "reset") {
		r.code = exitDenied
	}
	checkOneLine(t, r, exitDenied, "cannot use Redis at "+url)
	r = dlockRun(t, nil, "--redis", "redis://127.0.0.1:"+strconv.Itoa(port), "--tls-ca", certs.ca, "ls")
	checkOneLine(t, r, exitUsage, "not a TLS URL; write rediss://")
	r = dlockRun(t, envTLS, "--tls-server-name", "elsewhere.example", "ls")
	checkOneLine(t, r, exitDenied, "give the name it holds with --tls-server-name")
	// TLS to the server's plain port: no handshake comes back.
	r = dlockRun(t, []string{"DLOCK_PASSWORD=s3cret"}, "--redis", "rediss://locker@"+srv.Addr(), "--tls-ca", certs.ca, "ls")
	checkOneLine(t, r, exitUnavailable, "no TLS handshake")
}

func TestConnectCluster(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3, 0)
	url := "DLOCK_REDIS=redis://" + strings.Join(c.Addrs(), ",")
	// Names in several slots, so on several primaries.
	names := []string{"alpha", "bravo", "charlie", "delta"}
	var procs []*proc
	for _, name := range names {
		file := filepath.Join(t.TempDir(), "child")
		procs = append(procs, startDlock(t, []string{url}, runArgs(nil, name, "signals", file, "0")...))
		waitForLine(t, file, "ready ")
	}
	r := dlockRun(t, []string{url}, "ls", "--json")
	var infos []infoJSON
	if err := json.Unmarshal([]byte(r.stdout), &infos); err != nil || r.code != 0 {
		t.Fatalf("ls --json on a cluster: code %d, %q, stderr %s: %v", r.code, r.stdout, r.stderr, err)
	}
	var got []string
	for _, info := range infos {
		got = append(got, info.Name)
	}
	if !slices.Equal(got, names) {
		t.Errorf("ls on a cluster listed %v, want %v", got, names)
	}
	seed := "redis://" + c.Addrs()[2]
	if r := dlockRun(t, nil, "--cluster", "--redis", seed, "status", "--json", "alpha"); r.code != 0 || !strings.Contains(r.stdout, `"held": true`) {
		t.Errorf("status through one seed with --cluster: code %d, stdout %s, stderr %s", r.code, r.stdout, r.stderr)
	}
	// Without --cluster, one node would list its share of the locks only.
	r = dlockRun(t, nil, "--redis", seed, "ls")
	checkOneLine(t, r, exitUsage, "is a node of a Redis Cluster: add --cluster")
	r = dlockRun(t, []string{"DLOCK_CLUSTER=1"}, "--cluster=false", "--redis", seed, "ls")
	checkOneLine(t, r, exitUsage, "is a node of a Redis Cluster: add --cluster")
	// DLOCK_CLUSTER=1 stands for --cluster, which run passes on to its
	// command in it: a nested run reaches the same cluster.
	if r := dlockRun(t, []string{"DLOCK_CLUSTER=1", "DLOCK_REDIS=" + seed}, "status", "--json", "alpha"); r.code != 0 || !strings.Contains(r.stdout, `"held": true`) {
		t.Errorf("status through one seed with DLOCK_CLUSTER=1: code %d, stdout %s, stderr %s", r.code, r.stdout, r.stderr)
	}
	r = dlockRun(t, nil, append([]string{"--cluster", "--redis", seed, "run", "nested", "--", dlockBin, "run", "--no-wait", "nested", "--"}, helper("exit", "0")...)...)
	if r.code != exitNotObtained || !strings.Contains(r.stderr, "dlock run: 'nested' is held by ") {
		t.Errorf("a nested run of the same name with --cluster: code %d, stderr %q; want it refused (%d)", r.code, r.stderr, exitNotObtained)
	}
	for _, p := range procs {
		p.signal(t, os.Interrupt)
		if r := p.wait(t); r.code != 0 {
			t.Errorf("run on a cluster: code %d, stderr %s", r.code, r.stderr)
		}
	}
}

// TestConnectClusterWithAPrimaryDown: a command on one name needs only the
// primary that serves it. dlock checked that a cluster answers with a PING
// without a key, which go-redis sends to the primary of a slot it draws
// from a generator seeded alike in every process, so the same primary each
// time: while that one was down (or stalled, for 10s), status, release
// --force and run --no-wait failed with 69 on names the other primaries
// serve, and a waiting run started only at a later try.
func TestConnectClusterWithAPrimaryDown(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3, 0)
	for _, n := range c.Nodes {
		// The others neither fail over nor stop serving while one is down.
		n.Do(t, "CONFIG", "SET", "cluster-node-timeout", "60000")
	}
	names := map[*redistest.Server]string{} // a name on each primary
	for i := 0; len(names) < len(c.Nodes); i++ {
		name := "n" + strconv.Itoa(i)
		if p := c.PrimaryOf(t, "dlock:{"+name+"}"); names[p] == "" {
			names[p] = name
		}
	}
	env := []string{"DLOCK_REDIS=redis://" + strings.Join(c.Addrs(), ",")}
	for _, down := range c.Nodes {
		down.Kill(t)
		for p, name := range names {
			if p == down {
				continue
			}
			for _, args := range [][]string{{"status", name}, runArgs([]string{"--no-wait"}, name, "exit", "0"), {"release", "--force", name}} {
				if r := dlockRun(t, env, args...); r.code != 0 {
					t.Errorf("with %s down, dlock %q on a name %s serves: code %d, stderr %s", down.Addr(), args, p.Addr(), r.code, r.stderr)
				}
			}
		}
		down.Restart(t)
		waitFor(t, "the cluster to serve every slot again", func() bool {
			for _, n := range c.Nodes {
				if !strings.Contains(n.Do(t, "CLUSTER", "INFO"), "cluster_state:ok") {
					return false
				}
			}
			return true
		})
	}
}

// TestAClusterNodeThatMayNotRunINFOIsAUsageError: a cluster node given as
// one server, to a Redis user that may not run INFO (by which dlock tells
// a cluster node as it connects), is a usage error with the --cluster hint
// once a lock's node answers MOVED: it was reported as Redis unreachable
// (69), with a hint to use a go-redis ClusterClient.
func TestAClusterNodeThatMayNotRunINFOIsAUsageError(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	for _, n := range c.Nodes {
		n.Do(t, "ACL", "SETUSER", "noinfo", "on", ">pw", "~*", "&*", "+@all", "-info")
	}
	name := "n"
	for c.PrimaryOf(t, "dlock:{"+name+"}") == c.Nodes[0] {
		name += "x"
	}
	env := []string{"DLOCK_REDIS=redis://noinfo:pw@" + c.Nodes[0].Addr()}
	for _, args := range [][]string{runArgs([]string{"--no-wait"}, name, "exit", "0"), runArgs(nil, name, "exit", "0"), {"status", name}, {"release", "--force", name}} {
		r := dlockRun(t, env, args...)
		checkOneLine(t, r, exitUsage, "is a node of a Redis Cluster: add --cluster")
	}
}

func TestConnectSentinel(t *testing.T) {
	t.Parallel()
	rs := redistest.StartReplicated(t, 0, 1)
	sentinel := rs.SentinelAddrs()[0]
	r := dlockRun(t, []string{"DLOCK_REDIS=redis-sentinel://" + sentinel + "/" + rs.MasterName}, runArgs(nil, "job", "exit", "4")...)
	if r.code != 4 {
		t.Errorf("run through a sentinel URL: code %d, stderr %s", r.code, r.stderr)
	}
	r = dlockRun(t, nil, "--redis", "redis://"+sentinel, "--sentinel-master", rs.MasterName, "status", "job")
	if r.code != 0 || !strings.Contains(r.stdout, "held by:  nobody") {
		t.Errorf("status through --sentinel-master: code %d, stdout %s, stderr %s", r.code, r.stdout, r.stderr)
	}
	// A master the sentinels do not monitor is a setting to fix, which
	// ls --watch does not wait out.
	for _, args := range [][]string{{"ls"}, {"ls", "--watch"}} {
		r = dlockRun(t, nil, append([]string{"--redis", "redis://" + sentinel, "--sentinel-master", "nosuchmaster"}, args...)...)
		checkOneLine(t, r, exitUsage, "the sentinel at "+sentinel+` does not monitor a master called "nosuchmaster"`)
	}
}

// A sentinel that refuses its own password (sentinel_password in the URL,
// DLOCK_SENTINEL_PASSWORD) is named, with the settings to check: the hint
// was the one for the primary's password (the URL's, DLOCK_PASSWORD), which
// was right.
func TestConnectSentinelRefusesItsPassword(t *testing.T) {
	t.Parallel()
	rs := redistest.StartReplicated(t, 0, 1)
	sentinel := rs.SentinelAddrs()[0]
	rs.Sentinels[0].Do(t, "ACL", "SETUSER", "watcher", "on", ">sentinel-pw", "+@all")
	rs.Sentinels[0].Do(t, "ACL", "SETUSER", "default", "off")
	url := "redis-sentinel://" + sentinel + "/" + rs.MasterName + "?sentinel_username=watcher"
	if r := dlockRun(t, []string{"DLOCK_SENTINEL_PASSWORD=sentinel-pw"}, "--redis", url, "status", "x"); r.code != 0 {
		t.Fatalf("status with the sentinel's password: code %d, stderr %s", r.code, r.stderr)
	}
	for _, tc := range []struct {
		env []string
		url string
	}{
		{[]string{"DLOCK_SENTINEL_PASSWORD=wrong-pw"}, url},
		{nil, url + "&sentinel_password=wrong-pw"},
		{nil, "redis-sentinel://" + sentinel + "/" + rs.MasterName}, // no password: NOAUTH
	} {
		r := dlockRun(t, tc.env, "--redis", tc.url, "run", "x", "--", "true")
		checkOneLine(t, r, exitDenied, "the sentinel at "+sentinel+" refused")
		if !strings.Contains(r.stderr, "sentinel_password in the URL, or DLOCK_SENTINEL_PASSWORD") || strings.Contains(r.stderr, "wrong-pw") {
			t.Errorf("the sentinel refused its password (%s): %s", tc.url, r.stderr)
		}
	}
}

// A sentinel URL that names a Redis server instead of its sentinels (the
// primary's port, say) is a setting to fix, 78: the message names the
// address and says to give the sentinels'. The server does not know the
// SENTINEL command, and the hint was that of a server that does not know
// the scripts' ("names a Redis server (not a sentinel …)"), the other way
// round.
func TestConnectSentinelURLNamingARedisServer(t *testing.T) {
	t.Parallel()
	addr := strings.TrimPrefix(redisURL, "redis://")
	for _, args := range [][]string{{"status", "x"}, {"ls"}, runArgs(nil, "x", "exit", "0")} {
		r := dlockRun(t, []string{"DLOCK_REDIS=redis-sentinel://" + addr + "/mymaster"}, args...)
		checkOneLine(t, r, exitDenied, "the sentinel at "+addr+" refused")
		if !strings.Contains(r.stderr, "is not a sentinel") || strings.Contains(r.stderr, "not a sentinel, nor a proxy") {
			t.Errorf("%q: %s; want a hint that the address is not a sentinel's", args, r.stderr)
		}
	}
}

// readmeACL returns the rules of the README's least-privileged ACL user.
func readmeACL(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rules, ok := strings.CutPrefix(line, "ACL SETUSER locker "); ok {
			return strings.Fields(rules)
		}
	}
	t.Fatal("the README has no ACL SETUSER locker line")
	return nil
}

type certFiles struct{ ca, serverCert, serverKey, clientCert, clientKey string }

// writeCerts writes a CA, a server certificate for 127.0.0.1 and a client
// certificate, all signed by the CA, as PEM files in dir.
func writeCerts(t *testing.T, dir string) certFiles {
	t.Helper()
	return writeCertsFor(t, dir, []net.IP{net.ParseIP("127.0.0.1")}, nil)
}

// writeCertsFor is writeCerts with a server certificate for ips and dns.
func writeCertsFor(t *testing.T, dir string, ips []net.IP, dns []string) certFiles {
	t.Helper()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	writeKey := func(name string, k *ecdsa.PrivateKey) string {
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return write(name, "PRIVATE KEY", der)
	}
	now := time.Now()
	caKey := newKey()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "dlock test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	leaf := func(serial int64, cn string, usage x509.ExtKeyUsage, ips []net.IP, dns []string) ([]byte, *ecdsa.PrivateKey) {
		k := newKey()
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips, DNSNames: dns,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return der, k
	}
	srvDER, srvKey := leaf(2, "localhost", x509.ExtKeyUsageServerAuth, ips, dns)
	cliDER, cliKey := leaf(3, "dlock client", x509.ExtKeyUsageClientAuth, nil, nil)
	return certFiles{
		ca:         write("ca.crt", "CERTIFICATE", caDER),
		serverCert: write("server.crt", "CERTIFICATE", srvDER), serverKey: writeKey("server.key", srvKey),
		clientCert: write("client.crt", "CERTIFICATE", cliDER), clientKey: writeKey("client.key", cliKey),
	}
}

// No error about a URL shows its password: not when go-redis cannot parse
// it (its errors quote the whole URL), nor when the password holds a
// character that should have been percent-encoded, which moves where the
// user information seems to end.
func TestURLErrorsHidePassword(t *testing.T) {
	for _, tc := range []struct {
		raw, pw string
		flags   connFlags
	}{
		{raw: "redis://u:s3cr%t@h:1", pw: "s3cr%t"},
		{raw: "redis://u:secret@h:port", pw: "secret"},
		{raw: "redis://u:secret@my host:1", pw: "secret"},
		{raw: "redis://u:a/b-secret@h:1", pw: "a/b-secret"},
		{raw: "redis://u:a?b-secret@h:1", pw: "a?b-secret"},
		{raw: "redis://u:a#b-secret@h:1", pw: "a#b-secret"},
		{raw: "redis://u:1/b-secret@h:1", pw: "1/b-secret"},
		{raw: "redis://u:1?b-secret@h:1", pw: "1?b-secret"},
		{raw: "redis://u:a]b/secret@h", pw: "a]b/secret"},
		{raw: "redis-sentinel://u:12/cdefgh@h:1", pw: "12/cdefgh"},
		{raw: "redis://u:12/0#cdefgh@h:1", pw: "12/0#cdefgh"},
		{raw: "redis://u:secret@h:1/x", pw: "secret"},
		{raw: "redis://u:secret@h:1?bogus=1", pw: "secret"},
		{raw: "redis://u:se%zzcret@h:1", pw: "se%zzcret"},
		{raw: "unix://u:a/b-secret@/run/redis.sock", pw: "a/b-secret"},
		{raw: "unix://u:s3cr%t@/run/redis.sock", pw: "s3cr%t"},
		{raw: "unix://u:1/b-secret@/run/redis.sock", pw: "1/b-secret"},
		{raw: "unix://u:p@ss/w0rd@/run/redis.sock", pw: "p@ss/w0rd"},
		{raw: "unix://u:@/secret@/run/redis.sock", pw: "@/secret"},
		{raw: "redis-sentinel://s1/m?sentinel_password=secret", pw: "secret"},
		{raw: "redis-sentinel://s1/m?sentinel%5Fpassword=secret", pw: "secret"},
		{raw: "redis-sentinel://s1/m?sentinel_password=secret&bogus=1", pw: "secret"},
		{raw: "redis-sentinel://s1/m?sentinel_password=se%zzcret", pw: "se%zzcret"},
		{raw: "redis-sentinel://s1/m?sentinel_password=p@ssword&bogus=1", pw: "p@ssword"},
		{raw: "u:secret@h:1", pw: "secret"},
		{raw: "//:secret@h", pw: "secret"},
		{raw: "redis://u:secret@h:1", pw: "secret", flags: connFlags{tlsCA: "ca.pem"}},
		{raw: "redis://u:secret@h:1/2", pw: "secret", flags: connFlags{cluster: true}},
	} {
		f := tc.flags
		f.url = tc.raw
		tg, err := f.target(env())
		if err == nil {
			if strings.Contains(tg.display, tc.pw) {
				t.Errorf("%q: display %q shows the password", tc.raw, tg.display)
			}
			continue
		}
		if strings.Contains(err.Error(), tc.pw) {
			t.Errorf("%q: the error shows the password: %v", tc.raw, err)
		}
		if !strings.HasPrefix(err.Error(), "bad Redis URL ") && !strings.Contains(err.Error(), "not a TLS URL") {
			t.Errorf("%q: err = %v", tc.raw, err)
		}
	}
}

// Every option go-redis reads from a URL's query reaches a cluster's and a
// sentinel setup's options, as it does a single server's.
func TestQueryOptionsReachEveryKind(t *testing.T) {
	const query = "?protocol=2&client_name=cli&max_retries=4&min_retry_backoff=5ms&max_retry_backoff=6ms" +
		"&dial_timeout=7s&read_timeout=8s&write_timeout=9s&pool_fifo=true&pool_size=11&pool_timeout=12s" +
		"&min_idle_conns=13&max_idle_conns=14&max_active_conns=15&conn_max_idle_time=16s&conn_max_lifetime=17s"
	single, err := (&connFlags{url: "redis://u:pw@h1:7000" + query}).target(env())
	if err != nil {
		t.Fatal(err)
	}
	cluster, err := (&connFlags{url: "redis://u:pw@h1:7000,h2:7001" + query}).target(env())
	if err != nil {
		t.Fatal(err)
	}
	sentinel, err := (&connFlags{url: "redis-sentinel://u:pw@s1/mymaster" + query}).target(env())
	if err != nil {
		t.Fatal(err)
	}
	o := reflect.ValueOf(*single.single)
	for i := range o.NumField() {
		f := o.Type().Field(i)
		if !f.IsExported() || o.Field(i).IsZero() || f.Name == "Network" || f.Name == "Addr" {
			continue
		}
		for kind, v := range map[string]reflect.Value{
			"cluster":  reflect.ValueOf(*cluster.cluster),
			"sentinel": reflect.ValueOf(*sentinel.failover),
		} {
			got := v.FieldByName(f.Name)
			if !got.IsValid() {
				t.Errorf("%s options have no field %s", kind, f.Name)
				continue
			}
			if !reflect.DeepEqual(got.Interface(), o.Field(i).Interface()) {
				t.Errorf("%s options: %s = %v, want %v as for a single server", kind, f.Name, got.Interface(), o.Field(i).Interface())
			}
		}
	}
	if !single.single.PoolFIFO || single.single.ConnMaxLifetime != 17*time.Second {
		t.Errorf("the single server's options lack the query's: %+v", single.single)
	}
}

// Query options that go-redis would panic on, or send nothing with, are
// code 64 naming the option, as are a database or a cluster the server
// does not have.
func TestConnectBadOptions(t *testing.T) {
	t.Parallel()
	addr := strings.TrimPrefix(redisURL, "redis://")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--redis", redisURL + "?pool_size=-1", "status", "x"}, "pool_size=-1 must not be negative"},
		{[]string{"--redis", redisURL + "," + addr + "?pool_size=-1", "status", "x"}, "pool_size=-1 must not be negative"},
		{[]string{"--cluster", "--redis", redisURL + "?min_idle_conns=-1", "ls"}, "min_idle_conns=-1 must not be negative"},
		{[]string{"--redis", redisURL + "?max_idle_conns=-3", "ls"}, "max_idle_conns=-3 must not be negative"},
		{[]string{"--redis", redisURL + "?max_active_conns=-1", "ls"}, "max_active_conns=-1 must not be negative"},
		{[]string{"--redis", redisURL + "?pool_size=100000000000", "ls"}, "pool_size=100000000000 is more connections than one process can use"},
		{[]string{"--redis", redisURL + "?max_retries=-2", "status", "x"}, "max_retries=-2 is out of range"},
		{[]string{"--redis", redisURL + "?dial_timeout=0", "ls"}, "dial_timeout must be a positive duration"},
		{[]string{"--redis", redisURL + "?read_timeout=0", "ls"}, "read_timeout must be a positive duration: with none, a request to a server that stalls waits as long as it stalls"},
		{[]string{"--redis", redisURL + "?read_timeout=-1s", "status", "x"}, "read_timeout must be a positive duration"},
		{[]string{"--redis", redisURL + "," + addr + "?write_timeout=0", "ls"}, "write_timeout must be a positive duration"},
		{[]string{"--redis", "redis-sentinel://" + addr + "/m?write_timeout=-2", "ls"}, "write_timeout must be a positive duration"},
		{[]string{"--redis", redisURL + "?min_retry_backoff=-5ms", "ls"}, "min_retry_backoff must not be a negative duration"},
		{[]string{"--redis", redisURL + "/-1", "ls"}, "database -1 does not exist"},
		{[]string{"--redis", redisURL + "/99", "ls"}, "names a database the server does not have"},
		{[]string{"--cluster", "--redis", redisURL, "status", "x"}, "is not a Redis Cluster: give one address, without --cluster"},
		{append([]string{"--redis", redisURL + "," + addr}, runArgs(nil, "x", "exit", "0")...), "is not a Redis Cluster"},
		// Ports that cannot be dialled, and a client name Redis refuses,
		// are the URL's fault, not the server's.
		{[]string{"--redis", "redis://127.0.0.1:99999", "status", "x"}, `bad Redis URL "redis://127.0.0.1:99999" (from --redis): bad port "99999" in address "127.0.0.1:99999": write a number from 1 to 65535`},
		{[]string{"--redis", "redis://127.0.0.1:0", "ls"}, `bad port "0"`},
		{[]string{"--redis", "redis://127.0.0.1:+80", "ls"}, `bad port "+80"`},
		{[]string{"--redis", "redis://[::1]:65536", "ls"}, `bad port "65536"`},
		{[]string{"--redis", redisURL + ",127.0.0.1:70000", "ls"}, `bad port "70000" in address "127.0.0.1:70000"`},
		{[]string{"--redis", "redis-sentinel://127.0.0.1:99999/m", "ls"}, `bad port "99999"`},
		{[]string{"--redis", redisURL + "?client_name=a%20b", "status", "x"}, `client_name="a b" is not a name Redis takes: use printable ASCII without spaces`},
		{[]string{"--redis", redisURL + "?client_name=a%0Ab", "ls"}, `client_name="a\nb" is not a name Redis takes`},
		{[]string{"--redis", "unix:///run/redis.sock?client_name=a%20b", "ls"}, `client_name="a b" is not a name Redis takes`},
	} {
		r := dlockRun(t, nil, tc.args...)
		checkOneLine(t, r, exitUsage, tc.want)
	}
	// Options fine by the URL are still fine.
	if r := dlockRun(t, nil, "--redis", redisURL+"?max_retries=-1&pool_size=2&dial_timeout=3s&min_retry_backoff=0&client_name=cron-a:1&read_timeout=0s&write_timeout=2", "ls"); r.code != 0 {
		t.Errorf("good options: code %d, stderr %s", r.code, r.stderr)
	}
}

// Should go-redis panic on options checkOptions lets through, the panic is
// a usage error.
func TestOpenRecoversPanic(t *testing.T) {
	tg := &target{single: &redis.Options{Addr: strings.TrimPrefix(redisURL, "redis://"), PoolSize: -1}, display: redisURL}
	rdb, err := tg.open(context.Background(), statusCommand, "x")
	var ee *exitError
	if rdb != nil || !errors.As(err, &ee) || ee.code != exitUsage || !strings.Contains(ee.msg, "go-redis cannot use the options of "+redisURL) {
		t.Errorf("open with pool_size -1: %v, %v", rdb, err)
	}
}

// A certificate without the IP address dialled gets the hint of any other
// certificate for another name: --tls-server-name, which then works.
func TestConnectTLSCertificateWithoutIP(t *testing.T) {
	t.Parallel()
	certs := writeCertsFor(t, t.TempDir(), nil, []string{"localhost"})
	srv := redistest.Start(t, redistest.WithTLSPort(), redistest.WithArgs(
		"--tls-cert-file", certs.serverCert, "--tls-key-file", certs.serverKey,
		"--tls-ca-cert-file", certs.ca, "--tls-auth-clients", "no"))
	port := srv.TLSPort()
	flags := []string{"--redis", "rediss://127.0.0.1:" + strconv.Itoa(port), "--tls-ca", certs.ca}
	r := dlockRun(t, nil, append(flags, "ls")...)
	checkOneLine(t, r, exitDenied, "IP SANs; the server's certificate names another host: give the name it holds with --tls-server-name")
	if r := dlockRun(t, nil, append(flags, "--tls-server-name", "localhost", "ls")...); r.code != 0 {
		t.Errorf("with --tls-server-name: code %d, stderr %s", r.code, r.stderr)
	}
	// run passes --tls-server-name on in DLOCK_TLS_SERVER_NAME: a nested
	// run of the same name, given the rest as variables, is refused.
	env := []string{"DLOCK_REDIS=" + flags[1], "DLOCK_TLS_CA=" + certs.ca}
	r = dlockRun(t, env, append([]string{"--tls-server-name", "localhost", "run", "nested", "--", dlockBin, "run", "--no-wait", "nested", "--"}, helper("exit", "0")...)...)
	if r.code != exitNotObtained || !strings.Contains(r.stderr, "dlock run: 'nested' is held by ") {
		t.Errorf("a nested run of the same name with --tls-server-name: code %d, stderr %q; want it refused (%d)", r.code, r.stderr, exitNotObtained)
	}
	if r := dlockRun(t, append(env, "DLOCK_TLS_SERVER_NAME=localhost"), "ls"); r.code != 0 {
		t.Errorf("with DLOCK_TLS_SERVER_NAME: code %d, stderr %s", r.code, r.stderr)
	}
}

// A name the library refuses is code 64, in the words of a single name.
func TestBadNameIsUsage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{runArgs(nil, "}x", "exit", "0"), {"status", "}x"}, {"release", "--force", "}x"}} {
		r := dlockRun(t, nil, args...)
		checkOneLine(t, r, exitUsage, `invalid argument: name: "}x" starts with '}' and has no hash tag of its own (see 'dlock `+args[0]+` --help')`)
	}
	// A prefix whose hash tag is empty, for any kind of lock.
	for _, args := range [][]string{runArgs([]string{"--shared"}, "x", "exit", "0"), runArgs([]string{"--semaphore", "2"}, "x", "exit", "0"), {"status", "x"}} {
		r := dlockRun(t, nil, append([]string{"--prefix", "p{}:"}, args...)...)
		checkOneLine(t, r, exitUsage, `invalid argument: name: "x" with the prefix "p{}:" makes the key "p{}:{x}", whose hash tag is empty: the lock's keys would fall in different Redis Cluster slots (see 'dlock `+args[0]+` --help')`)
	}
}

// A name one of whose keys holds data dlock did not write is code 64, with
// one message naming that key.
func TestForeignDataNamesTheKey(t *testing.T) {
	t.Parallel()
	rdb := rawClient(t)
	ctx := context.Background()
	base := lockName(t)
	for _, tc := range []struct {
		name, key string
		set       func(key string) error
		what      string
		commands  [][]string
	}{
		{"string", "dlock:{%s}", func(k string) error { return rdb.Set(ctx, k, "x", time.Minute).Err() }, "its key",
			[][]string{runArgs(nil, "%s", "exit", "0"), {"status", "%s"}, {"release", "--force", "%s"}}},
		{"hash", "dlock:{%s}", func(k string) error { return rdb.HSet(ctx, k, "foo", "bar").Err() }, "its key",
			[][]string{runArgs(nil, "%s", "exit", "0"), {"status", "%s"}, {"release", "--force", "%s"}}},
		{"fence-string", "dlock:{%s}:fence", func(k string) error { return rdb.Set(ctx, k, "notanumber", time.Minute).Err() }, "its key",
			[][]string{runArgs(nil, "%s", "exit", "0"), runArgs([]string{"--write"}, "%s", "exit", "0")}},
		{"fence-hash", "dlock:{%s}:fence", func(k string) error { return rdb.HSet(ctx, k, "foo", "bar").Err() }, "its key",
			[][]string{runArgs(nil, "%s", "exit", "0")}},
	} {
		name := base + ":" + tc.name
		key := fmt.Sprintf(tc.key, name)
		if err := tc.set(key); err != nil {
			t.Fatal(err)
		}
		defer rdb.Del(ctx, key)
		for _, args := range tc.commands {
			args = slices.Clone(args)
			for i, a := range args {
				if a == "%s" {
					args[i] = name
				}
			}
			r := dlockRun(t, nil, args...)
			checkOneLine(t, r, exitUsage, fmt.Sprintf("dlock %s: '%s': %s %q holds data dlock did not write; pick another name or --prefix (see 'dlock %s --help')",
				args[0], name, tc.what, key, args[0]))
		}
	}
	// Another of a read/write lock's keys.
	name := base + ":pending"
	l, err := libClient(t).RWMutex(name).TryRLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	key := "dlock:{" + name + "}"
	if err := rdb.Set(ctx, key+":pending", "x", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	defer rdb.Del(ctx, key+":pending")
	r := dlockRun(t, nil, "status", name)
	checkOneLine(t, r, exitUsage, fmt.Sprintf("dlock status: '%s': its key %q holds data dlock did not write; pick another name or --prefix", name, key+":pending"))
}
