// Package causes builds errors that join a sentinel and what caused it
// without repeating the "dlock: " both messages start with.
package causes

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Error reads as Msg and matches each of Errs.
type Error struct {
	Msg  string
	Errs []error
}

func (e *Error) Error() string   { return e.Msg }
func (e *Error) Unwrap() []error { return e.Errs }

// Because returns sentinel caused by cause: it matches both, and reads as
// sentinel's message, then cause's without the "dlock: " it starts with.
func Because(sentinel, cause error) error {
	return &Error{Msg: sentinel.Error() + ": " + Unprefixed(cause), Errs: []error{sentinel, cause}}
}

// Unprefixed returns err's message without the "dlock: " it starts with.
func Unprefixed(err error) string { return strings.TrimPrefix(err.Error(), "dlock: ") }

// Also returns err as an error that matches sentinel too: it reads as err
// alone when err already matches sentinel, and as Because says otherwise.
func Also(sentinel, err error) error {
	if errors.Is(err, sentinel) {
		return &Error{Msg: err.Error(), Errs: []error{sentinel, err}}
	}
	return Because(sentinel, err)
}

// QuoteMax is the longest name, key or token, in bytes, that errors and log
// records give whole; a longer one is cut to its first bytes, followed by
// its length, so that a huge name does not make a huge error.
const QuoteMax = 256

// Quote returns s quoted as fmt's %q quotes it, for an error's text; one
// longer than QuoteMax bytes is cut to its first bytes (whole runes) and
// followed by its length: "abc…"… (1048576 bytes).
func Quote(s string) string {
	if len(s) <= QuoteMax {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:cut(s)]) + length(s)
}

// QuoteAll returns names quoted as fmt's %q quotes a slice of strings,
// each name as Quote quotes it.
func QuoteAll(names []string) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, n := range names {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(Quote(n))
	}
	b.WriteByte(']')
	return b.String()
}

// Short returns s for a log record: s itself when at most QuoteMax bytes,
// else its first bytes (whole runes), "…" and its length.
func Short(s string) string {
	if len(s) <= QuoteMax {
		return s
	}
	return s[:cut(s)] + length(s)
}

// Shorts returns names for a log record, each as Short returns it: names
// itself when none is longer than QuoteMax bytes.
func Shorts(names []string) []string {
	for i, n := range names {
		if len(n) > QuoteMax {
			out := slices.Clone(names)
			for j := i; j < len(out); j++ {
				out[j] = Short(out[j])
			}
			return out
		}
	}
	return names
}

// cut returns how many of s's first bytes Quote and Short keep: at most
// QuoteMax less room for the length, ending at the end of a rune.
func cut(s string) int {
	n := QuoteMax - 32
	for i := 1; i < utf8.UTFMax && !utf8.RuneStart(s[n]); i++ {
		n--
	}
	return n
}

// length is what Quote and Short put after the bytes they keep of s.
func length(s string) string { return "… (" + strconv.Itoa(len(s)) + " bytes)" }
