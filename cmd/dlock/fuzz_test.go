//go:build unix

package main

import (
	"bytes"
	"net/url"
	"strconv"
	"strings"
	"testing"
)

// FuzzParseTarget: any --redis URL is parsed or refused with an error,
// never a panic, and the text dlock shows for it never holds its password.
func FuzzParseTarget(f *testing.F) {
	for _, s := range []string{
		"redis://127.0.0.1:6379", "rediss://user:s3cret-pw@host:6380/2?dial_timeout=3s",
		"redis://a:1,b:2,c:3", "redis-sentinel://:pw-123456@s1:26379,s2:26379/mymaster/0",
		"unix:///tmp/redis.sock?db=1", "redis://[::1]:6379", "redis://:@/", "redis://%zz@h", "http://x",
		"redis://h:99999", "redis://h/?protocol=9", "rediss-sentinel://s1/",
	} {
		f.Add(s, false, "")
	}
	f.Add("redis://a:1,b:2", true, "")
	f.Add("redis://s:26379", false, "mymaster")
	f.Fuzz(func(t *testing.T, raw string, cluster bool, master string) {
		tg, err := parseTarget(raw, cluster, master, func(string) string { return "" })
		if err != nil {
			if tg != nil {
				t.Fatalf("parseTarget(%q) returned a target and %v", raw, err)
			}
			return
		}
		if tg.single == nil && tg.cluster == nil && tg.failover == nil {
			t.Fatalf("parseTarget(%q) returned an empty target", raw)
		}
		if u, err := url.Parse(raw); err == nil && u.User != nil {
			pw, _ := u.User.Password()
			if len(pw) >= 6 && strings.Count(raw, pw) == 1 && strings.Contains(tg.display, pw) {
				t.Fatalf("display %q of %q shows the password", tg.display, raw)
			}
		}
	})
}

// FuzzRunFlags: whatever run's flags say, dlock either refuses them with
// the usage exit code and a one-line message, or takes the lock and starts
// the command (here one that does not exist: exit code 127). It never
// panics.
func FuzzRunFlags(f *testing.F) {
	f.Add("10s", "30s", "5s", "host=a", 0, false)
	f.Add("0", "1ms", "-1s", "=x", -1, true)
	f.Add("1h", "", "", "k=", 3, false)
	f.Add("x", "5m", "0s", "noequals", 2, true)
	var runs int
	f.Fuzz(func(t *testing.T, wait, ttl, grace, meta string, permits int, shared bool) {
		runs++
		args := []string{"--redis", redisURL, "run"}
		for _, fl := range []struct{ name, val string }{{"wait", wait}, {"ttl", ttl}, {"grace", grace}, {"metadata", meta}} {
			if fl.val != "" {
				args = append(args, "--"+fl.name, fl.val)
			}
		}
		if permits != 0 {
			args = append(args, "--semaphore", strconv.Itoa(permits))
		}
		if shared {
			args = append(args, "--shared")
		}
		args = append(args, "--quiet", "fuzz-run-"+strconv.Itoa(runs), "--", "/nonexistent/dlock-fuzz-command")
		var stdout, stderr bytes.Buffer
		a := &app{stdout: &stdout, stderr: &stderr, lookupEnv: func(string) (string, bool) { return "", false }}
		code := a.main(args)
		switch code {
		case exitUsage, exitNotFound:
		default:
			t.Fatalf("dlock %q exited %d: %s", args, code, stderr.String())
		}
		if msg := stderr.String(); strings.Count(msg, "\n") != 1 || !strings.HasSuffix(msg, "\n") {
			t.Fatalf("dlock %q: want one line on stderr, got %q", args, msg)
		}
	})
}
