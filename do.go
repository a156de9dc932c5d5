package dlock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
)

// Do runs fn while holding the exclusive lock called name: it obtains the
// lock as Lock does (waiting as opts say), refreshes it automatically,
// runs fn with a context that is cancelled as soon as the lock is known
// lost (at its local deadline, or at the refresh that finds it gone),
// and releases the lock when fn returns. It returns fn's error, joined with
// the loss (matching ErrLost) if the lock was lost while fn ran. If fn
// panics, Do releases the lock and lets the panic go on.
//
// opts are those of Lock; WithAutoRefresh is implied.
func (c *Client) Do(ctx context.Context, name string, fn func(ctx context.Context) error, opts ...Option) error {
	if fn == nil {
		return fmt.Errorf("%w: Do with a nil function", ErrInvalidArgument)
	}
	l, err := c.Lock(ctx, name, append([]Option{WithAutoRefresh()}, opts...)...)
	if err != nil {
		return err
	}
	returned := false
	defer func() {
		if !returned {
			// fn panicked (or called runtime.Goexit): release now, or a
			// caller that recovers the panic (net/http does) would leave
			// the lock held and refreshed for good.
			if err := l.releaseAfter(ctx); err != nil && !errors.Is(err, ErrNotHeld) {
				c.log.WarnContext(ctx, "dlock: could not release after the function panicked; the lock expires with its TTL", "names", l.names, "err", err)
			}
		}
	}()
	err = fn(l.Context(ctx))
	returned = true
	lost := l.Err()
	if rerr := l.releaseAfter(ctx); rerr != nil && lost == nil {
		// A release that finds the lock gone ends it as lost, which
		// says so (ErrLost); a failed one says why.
		lost = cmp.Or(l.Err(), rerr)
	}
	return errors.Join(err, lost)
}
