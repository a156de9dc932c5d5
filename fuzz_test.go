package dlock

import (
	"context"
	"errors"
	"path"
	"strings"
	"testing"
	"time"
)

// The fuzz targets run their seeds with every `go test`; `go test -fuzz
// FuzzX` explores further.

// FuzzKeys: every name maps to a key under the prefix that maps back to the
// name, and the lock's keys share one Redis Cluster hash tag.
func FuzzKeys(f *testing.F) {
	for _, s := range []string{"orders:42", "{order:42}:pay", "a{}b", "}{", "{", "}", "{}", "x{y}z{w}", "ünïcode", "a\x00b", "{a}{b}", "a}{b", "{a{}", "a{"} {
		f.Add(s)
	}
	c := New(sendsNothing{})
	f.Fuzz(func(t *testing.T, name string) {
		if err := checkName(name); err != nil {
			if !isFinal(err) {
				t.Fatalf("checkName(%q) = %v, not an argument error", name, err)
			}
			return
		}
		key := c.RedisKey(name)
		if !strings.HasPrefix(key, DefaultPrefix) {
			t.Fatalf("RedisKey(%q) = %q, not under the prefix", name, key)
		}
		// "{x}" and "x" are one lock; names without braces map back exactly,
		// any other to a name of the same key.
		got := c.nameOf(key)
		if got != name && !strings.ContainsAny(name, "{}") || c.RedisKey(got) != key {
			t.Fatalf("nameOf(RedisKey(%q)) = %q", name, got)
		}
		if k, w, fk, lk := c.lockKeys(name); k != key || w != key+":waiters" || fk != key+":fence" || lk != key+":late" {
			t.Fatalf("lockKeys(%q) = %q, %q, %q, %q; want %q and its waiter set, fence counter and clean-ups' record", name, k, w, fk, lk, key)
		}
		for _, k := range describeKeys(key) { // every key of every kind
			if hashTag(k) != hashTag(key) {
				t.Fatalf("keys of %q do not share a hash tag: %q and %q", name, key, k)
			}
		}
		if hashTag(key) == "" {
			t.Fatalf("key %q of %q has no hash tag", key, name)
		}
	})
}

// TestNameOf: a key with two names is shown by the one a caller most
// likely used: without the added braces, unless those hold braces
// themselves and the key is a name with a plain hash tag.
func TestNameOf(t *testing.T) {
	c := New(sendsNothing{})
	for name, want := range map[string]string{
		"x": "x", "{x}": "x", "{order:42}:pay": "{order:42}:pay",
		"{a}{b}": "{a}{b}", "a}{b": "{a}{b}", "x{y}z{w}": "x{y}z{w}",
		"a{": "a{", "{a{}": "a{", "{}": "{}", "}{": "}{",
	} {
		if got := c.nameOf(c.RedisKey(name)); got != want {
			t.Errorf("nameOf(RedisKey(%q)) = %q, want %q", name, got, want)
		}
	}
}

// sendsNothing is the driver of a Client whose test sends nothing.
type sendsNothing struct{}

func (sendsNothing) Eval(context.Context, ...*Call) { panic("sendsNothing: Eval") }

func (sendsNothing) Subscribe(context.Context, func(string, string)) (Subscription, error) {
	return nil, ErrUnsupported
}

// hashTag returns the part of key that Redis Cluster hashes when it holds a
// non-empty {tag}, else "".
func hashTag(key string) string {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return ""
	}
	j := strings.IndexByte(key[i+1:], '}')
	if j <= 0 {
		return ""
	}
	return key[i+1 : i+1+j]
}

// FuzzGlob: the glob matcher agrees with path.Match where their syntaxes
// agree (ASCII, no '/', no backslash, no classes: Redis matches bytes,
// path.Match runes), and never panics.
func FuzzGlob(f *testing.F) {
	for _, s := range [][2]string{{"jobs:*", "jobs:nightly"}, {"*:?", "orders:1"}, {"[a-c]x", "bx"}, {"[^a]", "a"}, {"\\*", "*"}, {"*a*a*a*b", "aaaaaaaaaaaaaaaaaaaa"}, {"[", "["},
		{"*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b", strings.Repeat("a", 200)}, {"[]a]", "]a]"}, {"a*[b", "a[b"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, name string) {
		got := globMatch(pattern, name)
		if strings.ContainsAny(pattern+name, "/\\[]") || !ascii(pattern+name) {
			return
		}
		if want, err := path.Match(pattern, name); err == nil && got != want {
			t.Fatalf("globMatch(%q, %q) = %v, path.Match says %v", pattern, name, got, want)
		}
	})
}

// FuzzOptions: any option values give a valid configuration or an error
// matching ErrInvalidArgument, never a panic.
func FuzzOptions(f *testing.F) {
	f.Add(int64(time.Second), int64(0), int64(0), int64(0), "tok", "owner")
	f.Add(int64(0), int64(-1), int64(time.Second), int64(-5), "", "")
	f.Add(int64(500*time.Microsecond), int64(time.Hour), int64(time.Millisecond), int64(time.Minute), "t", "")
	f.Fuzz(func(t *testing.T, ttl, interval, maxHold, maxWait int64, token, owner string) {
		opts := []Option{WithTTL(time.Duration(ttl)), WithMaxWait(time.Duration(maxWait)), WithToken(token), WithOwner(owner)}
		if interval != 0 {
			opts = append(opts, WithRefreshInterval(time.Duration(interval)))
		}
		if maxHold != 0 {
			opts = append(opts, WithMaxHold(time.Duration(maxHold)))
		}
		o := newOptions(opts)
		if o.err != nil {
			if !isFinal(o.err) {
				t.Fatalf("option error %v does not match ErrInvalidArgument", o.err)
			}
			return
		}
		if o.ttl < MinTTL || (o.auto && o.refreshInterval() >= o.ttl) || (o.maxHold > 0 && o.maxHold < o.ttl) {
			t.Fatalf("accepted an invalid configuration: %+v", o)
		}
	})
}

// FuzzRetry: strategies never ask for a negative wait.
func FuzzRetry(f *testing.F) {
	f.Add(int64(time.Millisecond), int64(time.Second), 5, 0.5)
	f.Add(int64(-1), int64(0), 1000000, 2.0)
	f.Fuzz(func(t *testing.T, a, b int64, failed int, frac float64) {
		for _, s := range []RetryStrategy{
			ConstantBackoff(time.Duration(a)), LinearBackoff(time.Duration(a), time.Duration(b)),
			ExponentialBackoff(time.Duration(a), time.Duration(b)), Intervals(time.Duration(a), time.Duration(b)),
			Jitter(ExponentialBackoff(time.Duration(a), time.Duration(b)), frac), LimitRetry(ConstantBackoff(time.Duration(a)), int(b%100)),
		} {
			if d, _ := s.NextBackoff(failed); d < 0 {
				t.Fatalf("negative wait %v", d)
			}
		}
	})
}

func ascii(s string) bool {
	for i := range len(s) {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// TestEveryPrefixKeepsALocksKeysInOneSlot: under any prefix, a name is
// either refused (ErrInvalidName) or gets keys that share one non-empty
// hash tag.
func TestEveryPrefixKeepsALocksKeysInOneSlot(t *testing.T) {
	prefixes := []string{"", "dlock:", "p{", "p}", "{t}:", "p{}", "p{}:", "{", "}", "{}", "dlock:{", "a{b", "s|"}
	names := []string{"x", "{x}", "}x", "}a{b}", "a}b", "{}", "{}{x}", "a{}{b}", "{a{}", "x{y}z", "\x00{w}"}
	for _, prefix := range prefixes {
		c := New(sendsNothing{}, WithPrefix(prefix))
		for _, name := range names {
			key := c.RedisKey(name)
			err := c.checkName(name)
			if err != nil {
				if !errors.Is(err, ErrInvalidName) {
					t.Errorf("prefix %q, name %q: %v, want ErrInvalidName", prefix, name, err)
				}
				if hashTag(key) != "" && checkName(name) == nil {
					t.Errorf("prefix %q, name %q refused, though its key %q has the tag %q", prefix, name, key, hashTag(key))
				}
				continue
			}
			if hashTag(key) == "" {
				t.Errorf("prefix %q, name %q: key %q has no hash tag", prefix, name, key)
			}
			for _, k := range describeKeys(key) {
				if hashTag(k) != hashTag(key) {
					t.Errorf("prefix %q, name %q: keys %q and %q do not share a hash tag", prefix, name, key, k)
				}
			}
		}
	}
}
