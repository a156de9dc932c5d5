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
		if err != nil && tg != nil {
			t.Fatalf("parseTarget(%q) returned a target and %v", raw, err)
		}
		if err == nil && tg.single == nil && tg.cluster == nil && tg.failover == nil {
			t.Fatalf("parseTarget(%q) returned an empty target", raw)
		}
		if u, uerr := url.Parse(raw); uerr == nil && u.User != nil {
			pw, _ := u.User.Password()
			checkHidden(t, raw, pw, cluster, master)
		}
	})
}

// FuzzURLPassword: whatever a URL's password holds, characters that should
// have been percent-encoded included, neither the error about the URL nor
// the text dlock shows for it holds the password. The password is what
// lies between the user name's ':' and the '@' that follows it, as a
// person writing the URL means it.
func FuzzURLPassword(f *testing.F) {
	for _, s := range [][2]string{
		{"s3cr%t", "h:1"}, {"secret", "h:port"}, {"secret", "my host:1"}, {"a/b-secret", "h:1"},
		{"a?b-secret", "h:1"}, {"a#b-secret", "h:1"}, {"1/b-secret", "h:1/0"}, {"12/cdefgh", "h:1"},
		{"p@ss/word", "h:1?client_name=a@b"}, {"secret", "h1:1,h2:2/3"}, {"secret", "/run/redis.sock"},
	} {
		f.Add(uint8(0), "u", s[0], s[1], false, "")
	}
	f.Add(uint8(2), "", "a/b-secret", "s1,s2/m/1", false, "")
	f.Add(uint8(4), "u", "secret12", "/tmp/s", false, "")
	f.Add(uint8(0), "u", "secret12", "h:1/x", true, "m")
	schemes := []string{"redis", "rediss", "redis-sentinel", "rediss-sentinel", "unix"}
	f.Fuzz(func(t *testing.T, scheme uint8, user, pw, rest string, cluster bool, master string) {
		if strings.ContainsAny(user, ":@/?#") {
			return
		}
		raw := schemes[int(scheme)%len(schemes)] + "://" + user + ":" + pw + "@" + rest
		checkHidden(t, raw, pw, cluster, master)
	})
}

// checkHidden checks that neither the error about raw nor the text shown
// for it holds pw, its password. A message whose fixed text holds pw
// would seem to show it: such a message holds pw just as well when the
// password in raw is another.
func checkHidden(t *testing.T, raw, pw string, cluster bool, master string) {
	t.Helper()
	if len(pw) < 6 || strings.Count(raw, pw) != 1 || strings.Contains(master, pw) || !verbatim(raw) || !verbatim(master) {
		return
	}
	msg := func(raw string) string {
		tg, err := (&connFlags{url: raw, cluster: cluster, sentinelMaster: master}).target(func(string) (string, bool) { return "", false })
		if err != nil {
			return err.Error()
		}
		return tg.display
	}
	if m := msg(raw); strings.Contains(m, pw) && !strings.Contains(msg(strings.Replace(raw, pw, strings.Repeat("Q", len(pw)), 1)), pw) {
		t.Fatalf("the message about %q shows the password: %s", raw, m)
	}
}

// verbatim reports whether %q leaves s as it is, so that a password is
// found in a message as it was given, and no escape makes it up.
func verbatim(s string) bool { return strconv.Quote(s) == `"`+s+`"` }

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
