// Package causes builds errors that join a sentinel and what caused it
// without repeating the "dlock: " both messages start with.
package causes

import (
	"errors"
	"strings"
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
