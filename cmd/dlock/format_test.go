//go:build unix

package main

import (
	"bytes"
	"errors"
	"flag"
	"maps"
	"math"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlockio/dlock"
)

func TestFmtDur(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-time.Second:                                           "0s",
		450 * time.Millisecond:                                 "450ms",
		1600 * time.Millisecond:                                "1.6s",
		2*time.Second + 30*time.Millisecond:                    "2s",
		9*time.Second + 960*time.Millisecond:                   "10s",
		12*time.Second + 400*time.Millisecond:                  "12s",
		3*time.Minute + 12*time.Second:                         "3m12s",
		3*time.Minute + 10*time.Second:                         "3m10s",
		3 * time.Minute:                                        "3m",
		59*time.Second + 700*time.Millisecond:                  "1m", // not "1m0s"
		59*time.Minute + 59*time.Second + 700*time.Millisecond: "1h",
		2*time.Hour + 5*time.Minute:                            "2h5m",
		2*time.Hour + 10*time.Minute:                           "2h10m",
		3 * time.Hour:                                          "3h",
		3*time.Hour + 20*time.Second:                           "3h",
		3*time.Hour + 59*time.Minute + 45*time.Second:          "4h",
		1000 * time.Hour:                                       "1000h",
		2562047 * time.Hour:                                    "2562047h", // run --ttl 2562047h
		time.Duration(math.MaxInt64):                           "2562047h47m",
	} {
		if got := fmtDur(d); got != want {
			t.Errorf("fmtDur(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestHeldBy(t *testing.T) {
	now := time.Now()
	h := dlock.Holder{Metadata: `{"host":"host-a","pid":"4242","user":"bob"}`, Since: now.Add(-192 * time.Second), TTL: 12 * time.Second, Count: 1}
	info := &dlock.Info{Name: "nightly", Kind: dlock.KindLock, Holders: []dlock.Holder{h}}
	if got, want := "waiting for "+quote("nightly")+" — held by "+heldBy(info, now),
		"waiting for 'nightly' — held by host-a pid 4242 (running 3m12s, expires in 12s)"; got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	for meta, want := range map[string]string{
		"":                           "a holder with no metadata",
		"batch 7":                    "batch 7",
		`{"job":"x y","team":"ops"}`: `job="x y" team=ops`,
		`{"host":"h"}`:               "h",
	} {
		if got := whoHolds(dlock.Holder{Metadata: meta}); got != want {
			t.Errorf("whoHolds(%q) = %q, want %q", meta, got, want)
		}
	}
	if got := whoHolds(dlock.Holder{Owner: "job-1"}); got != "owner job-1" {
		t.Errorf("whoHolds of an owner = %q", got)
	}
}

func TestShellJoin(t *testing.T) {
	got := shellJoin([]string{"make", "-C", "/srv/app", "it's", "a b", "", "x=1"})
	if want := `make -C /srv/app 'it'\''s' 'a b' '' x=1`; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

func TestParseInterleaved(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	a := fs.Bool("a", false, "")
	b := fs.String("b", "", "")
	pos, err := parseInterleaved(fs, []string{"one", "--a", "two", "--b", "v", "--", "--three"})
	if err != nil || !*a || *b != "v" || !slices.Equal(pos, []string{"one", "two", "--three"}) {
		t.Errorf("pos %q, a %v, b %q, err %v", pos, *a, *b, err)
	}
}

// durationSyntax matches what time.ParseDuration reads as a duration
// (badDuration calls that out of range when it fails), and nothing else.
func TestDurationSyntax(t *testing.T) {
	for _, s := range []string{"1h", "+3s", "-1.5m", ".5s", "5.s", "1h2m3.4s", "1µs", "1μs", "1us", "10ns", "2562047h"} {
		if _, err := time.ParseDuration(s); err != nil || !durationSyntax.MatchString(s) {
			t.Errorf("%q: ParseDuration error %v, matched %v; want a duration that matches", s, err, durationSyntax.MatchString(s))
		}
	}
	for _, s := range []string{"9999999h", "-9999999h", "2562048h", "9223372036854775808ns", "2562047h48m"} {
		if _, err := time.ParseDuration(s); err == nil || !durationSyntax.MatchString(s) {
			t.Errorf("%q: ParseDuration error %v, matched %v; want one out of range that matches", s, err, durationSyntax.MatchString(s))
		}
	}
	for _, s := range []string{"1.5", "3", "1e3s", "1 h", "h", ".s", "", "1hh", "--1s", "1d", "soon"} {
		if _, err := time.ParseDuration(s); err == nil || durationSyntax.MatchString(s) {
			t.Errorf("%q: ParseDuration error %v, matched %v; want no duration, unmatched", s, err, durationSyntax.MatchString(s))
		}
	}
}

// flagError writes a flag as the user typed it, and as --name when it
// cannot tell.
func TestFlagError(t *testing.T) {
	for _, tc := range []struct {
		err  string
		args []string
		want string
	}{
		{`invalid value "x" for flag -ttl: bad`, nil, `invalid value "x" for flag --ttl: bad`},
		{`invalid value "x" for flag -ttl: bad`, []string{"-ttl", "x"}, `invalid value "x" for flag -ttl: bad`},
		{`invalid value "x" for flag -ttl: bad`, []string{"--ttl=x"}, `invalid value "x" for flag --ttl: bad`},
		{"flag provided but not defined: -x", []string{"job", "-x=1"}, "flag provided but not defined: -x"},
		{"flag provided but not defined: -x", []string{"--", "-x"}, "flag provided but not defined: --x"},
		{"flag provided but not defined: -x*", []string{"-x*"}, "flag provided but not defined: -x*"},
		{"bad flag syntax: ---x", []string{"---x"}, "bad flag syntax: ---x"},
		// A value that looks like a flag is left as it is.
		{`invalid value "k: -v" for flag -ttl: bad`, []string{"--ttl", "k: -v"}, `invalid value "k: -v" for flag --ttl: bad`},
		{`invalid value "a for -v" for flag -ttl: bad`, []string{"--ttl", "a for -v"}, `invalid value "a for -v" for flag --ttl: bad`},
		{`invalid boolean value "-x" for -json: bad`, []string{"--json=-x"}, `invalid boolean value "-x" for --json: bad`},
		{`invalid boolean value "2" for -json: parse error`, []string{"--json=2"}, `invalid boolean value "2" for --json: write true or false`},
		{"flag needs an argument: -ttl", []string{"-ttl"}, "flag needs an argument: -ttl"},
	} {
		if got := flagError(errors.New(tc.err), tc.args).Error(); got != tc.want {
			t.Errorf("flagError(%q, %q) = %q, want %q", tc.err, tc.args, got, tc.want)
		}
	}
}

func TestRedraw(t *testing.T) {
	var b bytes.Buffer
	n, _ := redraw(&b, 0, []string{"a", "b"})
	n, err := redraw(&b, n, []string{"c"})
	if want := "a\x1b[K\nb\x1b[K\n\x1b[J\r\x1b[2Ac\x1b[K\n\x1b[J"; b.String() != want || n != 1 || err != nil {
		t.Errorf("got %q (%d lines, %v), want %q", b.String(), n, err, want)
	}
	if _, err := redraw(fullWriter{}, n, []string{"d"}); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("a write that fails: %v, want %v", err, syscall.ENOSPC)
	}
}

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"redis://u:pw@h:1/2":                        "redis://u:xxxxx@h:1/2",
		"redis://:pw@h":                             "redis://:xxxxx@h",
		"redis://u@h":                               "redis://u@h",
		"redis://h/x?password=pw":                   "redis://h/x?password=xxxxx",
		"redis://h?username=u&Password=pw&db=1":     "redis://h?username=u&Password=xxxxx&db=1",
		"redis://h?sentinel_password=pw&protocol=3": "redis://h?sentinel_password=xxxxx&protocol=3",
		"unix://u:p@/run/r.sock":                    "unix://u:xxxxx@/run/r.sock",
	} {
		if got := redactURL(in); got != want || strings.Contains(got, ":pw") {
			t.Errorf("redactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestParseMetaKeepsJSONText: a value that is not a string is shown as
// written, a large number with all its digits, an object in its order.
func TestParseMetaKeepsJSONText(t *testing.T) {
	got := parseMeta(`{"id":9007199254740993,"price":1.10,"obj":{"z":1,"a":2},"e":1e3,"s":"a\"b","n":null}`)
	want := map[string]string{"id": "9007199254740993", "price": "1.10", "obj": `{"z":1,"a":2}`, "e": "1e3", "s": `a"b`, "n": "null"}
	if !maps.Equal(got, want) {
		t.Errorf("parseMeta = %q, want %q", got, want)
	}
	if got := parseMeta(`{"a":1`); got != nil {
		t.Errorf("parseMeta of bad JSON = %q, want nil", got)
	}
}
