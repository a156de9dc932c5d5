package redlock

import (
	"log/slog"
	"time"
)

// DueOf returns the quorum deadline l's clock check trusts (see
// expireIfDue), the zero time when none.
func DueOf(l *Lock) time.Time {
	if d := l.due.Load(); d != nil {
		return *d
	}
	return time.Time{}
}

// LoggerOf returns the logger r logs through (see WithLogger).
func LoggerOf(r *Locker) *slog.Logger { return r.log }

// ContextsKept returns how many contexts made by l's Context the lock
// keeps, to cancel them when it ends.
func ContextsKept(l *Lock) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.onEnd)
}
