package main

import (
	"strings"
	"testing"
)

// Wide characters take two cells, combining marks and joiners none, and a
// line is cut by the cells it takes, not by its characters.
func TestDisplayWidth(t *testing.T) {
	for s, want := range map[string]int{
		"":                 0,
		"cron:nightly":     12,
		"日本語":              6,
		"결제":               4,
		"ｆｕｌｌ":             8,
		"e\u0301":          1, // e and a combining acute accent
		"🔒 lock":           7,
		"👩\u200d💻":         4, // two pictures joined: terminals differ, dlock counts both
		`\x1b[31m`:         8, // printable's escape, as ls shows it
		"naïve-über-ß":     12,
		"\u3000ideo\u3000": 8,
	} {
		if got := displayWidth(s); got != want {
			t.Errorf("displayWidth(%q) = %d, want %d", s, got, want)
		}
	}
	for _, tc := range []struct {
		s     string
		width int
		want  string
	}{
		{"short", 10, "short"},
		{"exactly-10", 10, "exactly-10"},
		{"eleven-char", 10, "eleven-ch…"},
		{"日本語の名前", 12, "日本語の名前"},
		{"日本語の名前", 11, "日本語の名…"},
		{"日本語の名前", 10, "日本語の…"}, // a wide character does not fit in the one cell left
		{"ab日本", 4, "ab…"},
	} {
		got := cutWidth(tc.s, tc.width)
		if got != tc.want || displayWidth(got) > tc.width {
			t.Errorf("cutWidth(%q, %d) = %q, want %q", tc.s, tc.width, got, tc.want)
		}
	}
}

// ls's columns line up on a terminal whatever the names' characters.
func TestColumnsLineUpByCells(t *testing.T) {
	lines := columns([][]string{
		{"NAME", "KIND", "FENCE"},
		{"report:日本", "lock", "7"},
		{"e\u0301t\u00e9", "semaphore", "12"},
	})
	want := []string{
		"NAME         KIND       FENCE",
		"report:日本  lock       7",
		"e\u0301té          semaphore  12",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("columns:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	for i, kind := range []string{"KIND", "lock", "semaphore"} {
		if at := strings.Index(lines[i], kind); at < 0 || displayWidth(lines[i][:at]) != 13 {
			t.Errorf("the second column of %q does not start at cell 13", lines[i])
		}
	}
}
