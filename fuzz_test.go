package dlock

import (
	"context"
	"errors"
	"math"
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

// FuzzRetry: strategies never ask for a negative wait, nor one past their
// cap, whatever their parameters; and Jitter, over any of them (uncapped,
// exponential, saturated at the longest duration, nested), stops where the
// strategy stops and draws a wait in [(1-fraction)×d, d] of the strategy's
// d.
func FuzzRetry(f *testing.F) {
	f.Add(int64(time.Millisecond), int64(time.Second), 5, 0.5)
	f.Add(int64(-1), int64(0), 1000000, 2.0)
	f.Add(int64(math.MaxInt64), int64(0), math.MaxInt, 1.0)
	f.Add(int64(time.Hour), int64(-1), 64, 0.999999999)
	f.Add(int64(math.MaxInt64/3), int64(math.MaxInt64), 3, 1e-300)
	f.Add(int64(1), int64(math.MinInt64), math.MinInt, math.Inf(1))
	f.Add(int64(math.MinInt64), int64(1), 0, math.NaN())
	f.Fuzz(func(t *testing.T, a, b int64, failed int, frac float64) {
		da, db := time.Duration(a), time.Duration(b)
		for _, c := range []struct {
			name  string
			s     RetryStrategy
			limit time.Duration // the documented cap, 0 for none
		}{
			{"ConstantBackoff(a)", ConstantBackoff(da), 0},
			{"LinearBackoff(a, b)", LinearBackoff(da, db), max(db, 0)},
			{"LinearBackoff(a, 0)", LinearBackoff(da, 0), 0},
			{"ExponentialBackoff(a, b)", ExponentialBackoff(da, db), max(db, 0)},
			{"ExponentialBackoff(a, 0)", ExponentialBackoff(da, 0), 0},
			{"ExponentialBackoff(a, MaxInt64)", ExponentialBackoff(da, math.MaxInt64), 0},
			{"Intervals(a, b)", Intervals(da, db), 0},
			{"LimitRetry(ExponentialBackoff(a, 0), b)", LimitRetry(ExponentialBackoff(da, 0), int(b%100)), 0},
			{"Jitter(LinearBackoff(a, 0))", Jitter(LinearBackoff(da, 0), frac), 0},
		} {
			d0, ok0 := c.s.NextBackoff(failed)
			if d0 < 0 || c.limit > 0 && d0 > c.limit {
				t.Fatalf("%s.NextBackoff(%d) = %v, outside [0, %v]", c.name, failed, d0, c.limit)
			}
			if monotone := c.limit == 0 && !strings.HasPrefix(c.name, "Jitter") && !strings.HasPrefix(c.name, "Intervals"); monotone && ok0 && failed >= 1 && failed < math.MaxInt {
				// Uncapped waits never shrink as failures add up.
				if d1, ok1 := c.s.NextBackoff(failed + 1); ok1 && d1 < d0 {
					t.Fatalf("%s: NextBackoff(%d) = %v after NextBackoff(%d) = %v", c.name, failed+1, d1, failed, d0)
				}
			}
			if strings.HasPrefix(c.name, "Jitter") {
				continue // random: no d0 to compare with below
			}
			d, ok := Jitter(c.s, frac).NextBackoff(failed)
			if ok != ok0 {
				t.Fatalf("Jitter(%s, %v).NextBackoff(%d) goes on %v, the strategy %v", c.name, frac, failed, ok, ok0)
			}
			if !ok {
				continue
			}
			if d < 0 || d > d0 {
				t.Fatalf("Jitter(%s, %v).NextBackoff(%d) = %v, outside [0, %v]", c.name, frac, failed, d, d0)
			}
			f := min(max(frac, 0), 1)
			if math.IsNaN(frac) {
				f = 0
			}
			// (1-f)×d0, less a float's rounding.
			if least := float64(d0)*(1-f) - float64(d0)*1e-9 - 1; float64(d) < least {
				t.Fatalf("Jitter(%s, %v).NextBackoff(%d) = %v, under (1-fraction)×%v", c.name, frac, failed, d, d0)
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
