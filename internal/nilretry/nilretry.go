// Package nilretry tells the retry strategies that WithRetry refuses, for
// the core package and redlock alike.
package nilretry

import (
	"reflect"
	"time"
)

// Strategy is what a retry strategy built from a nil one is
// (dlock.Jitter(nil, …)): it never retries, and WithRetry refuses it,
// naming the function it came from.
type Strategy string

// NextBackoff never retries.
func (Strategy) NextBackoff(int) (time.Duration, bool) { return 0, false }

// Refused returns how WithRetry names the strategy s when it refuses it: s
// is nil, a nil function (a nil dlock.RetryFunc), or built from one. It
// returns "" for a strategy WithRetry takes.
func Refused(s any) string {
	if s == nil {
		return "WithRetry(nil)"
	}
	if from, ok := s.(Strategy); ok {
		return "WithRetry(" + string(from) + "(nil, …))"
	}
	if v := reflect.ValueOf(s); v.Kind() == reflect.Func && v.IsNil() {
		return "WithRetry(nil)"
	}
	return ""
}
