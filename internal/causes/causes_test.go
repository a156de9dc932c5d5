package causes

import (
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// Quote and Short give a name of up to QuoteMax bytes whole, and cut a
// longer one between runes, never past QuoteMax bytes, with its length.
func TestQuoteCutsLongNamesBetweenRunes(t *testing.T) {
	for _, s := range []string{"", "x", strings.Repeat("a", QuoteMax), "a\x00\"b\xff"} {
		if got := Quote(s); got != strconv.Quote(s) {
			t.Errorf("Quote(%q) = %s, want it whole", s, got)
		}
		if got := Short(s); got != s {
			t.Errorf("Short(%q) = %q, want it whole", s, got)
		}
	}
	for _, s := range []string{
		strings.Repeat("a", QuoteMax+1),
		strings.Repeat("€", 1000), // three bytes a rune: the cut falls inside one
		"x" + strings.Repeat("€", 1000),
		strings.Repeat("\x80", 1000), // no rune starts: cut all the same
	} {
		suffix := "… (" + strconv.Itoa(len(s)) + " bytes)"
		short := Short(s)
		if !strings.HasSuffix(short, suffix) || len(short) > QuoteMax || !strings.HasPrefix(s, strings.TrimSuffix(short, suffix)) {
			t.Errorf("Short(%.20q…) = %q", s, short)
		}
		if utf8.ValidString(s) && !utf8.ValidString(short) {
			t.Errorf("Short(%.20q…) = %q cuts a rune", s, short)
		}
		head, _ := strconv.Unquote(strings.TrimSuffix(Quote(s), suffix))
		if head != strings.TrimSuffix(short, suffix) {
			t.Errorf("Quote(%.20q…) = %s, want the bytes Short keeps, quoted", s, Quote(s))
		}
	}
	names := []string{"a", strings.Repeat("b", QuoteMax+1)}
	if got := Shorts(names[:1]); &got[0] != &names[0] {
		t.Error("Shorts copied names none of which is long")
	}
	if got := Shorts(names); got[0] != "a" || got[1] != Short(names[1]) || names[1] != strings.Repeat("b", QuoteMax+1) {
		t.Errorf("Shorts = %q, or changed its argument", got)
	}
	if got, want := QuoteAll([]string{"a", `b"`}), `["a" "b\""]`; got != want {
		t.Errorf("QuoteAll = %s, want %s", got, want)
	}
}
