package dlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/dlockio/dlock/internal/causes"
)

// ErrStaleFence means a write carried a fencing token older than the newest
// the resource has seen: the writer's lock has passed to another holder
// since.
var ErrStaleFence = errors.New("dlock: stale fencing token")

// SetFenced writes value to the Redis hash at key, a resource that the lock
// holder with the given fence protects, and records the fence with it
// (fields "value" and "fence"). A write whose fence is older than the one
// recorded is refused with ErrStaleFence and changes nothing; a write with
// the same or a newer fence goes through. One script, one round trip.
//
// The key is used as given, without the client's prefix: it is the
// caller's data. On Redis Cluster it may live in any slot. A key that
// holds other data (another type, or a hash with fields besides "value"
// and "fence"), a lock's own key among them (its fence is the lock's), is
// refused with ErrWrongType and left as it is. An empty key, and a fence of
// 0, are refused with ErrInvalidArgument: no lock issues fence 0, and a
// Lock without a fence (a read hold, a semaphore's permit) reports it.
//
// The same check protects any store that can compare and write at once; in
// SQL, for example:
//
//	UPDATE reports SET body = $2, fence = $1 WHERE id = $3 AND fence <= $1
//
// where no updated row means a stale holder (fence a 64-bit column: see
// Lock.Fence); over HTTP, send the fence in
// a header and have the server answer 409 Conflict to one older than the
// newest it accepted.
func (c *Client) SetFenced(ctx context.Context, key string, fence uint64, value string) error {
	c.made()
	if ctx == nil {
		return ErrNilContext
	}
	if key == "" {
		return fmt.Errorf("%w: SetFenced with an empty key", ErrInvalidArgument)
	}
	if fence == 0 {
		return fmt.Errorf("%w: SetFenced with fence 0: a read hold or a permit has no fence", ErrInvalidArgument)
	}
	v, err := c.eval(ctx, scriptFencedSet, []string{key}, strconv.FormatUint(fence, 10), value)
	if err != nil {
		return fencedError(err, key)
	}
	r, _ := v.([]any)
	if len(r) == 0 {
		return &ServerError{Key: key, Err: fmt.Errorf("unexpected reply %#v", v)}
	}
	if ok, _ := r[0].(int64); ok == 1 {
		return nil
	}
	newest := ""
	if len(r) > 1 {
		newest, _ = r[1].(string)
	}
	return fmt.Errorf("%w: %s has seen fence %s, the write carried %d", ErrStaleFence, causes.Quote(key), newest, fence)
}

// GetFenced reads the value that SetFenced wrote at key, and the fence it
// was written with. A key that does not exist gives "" and fence 0 (no
// lock issues fence 0): nothing was written there. A key that holds other
// data is refused with ErrWrongType, as SetFenced refuses it; an empty key
// with ErrInvalidArgument. The key is used as given, without the client's
// prefix. One script, one round trip, that writes nothing.
//
// A value read is the newest written when it is read; a holder that must
// act on what it read does so under its lock, and writes back with its
// own fence, which SetFenced refuses once a newer holder has written.
func (c *Client) GetFenced(ctx context.Context, key string) (value string, fence uint64, err error) {
	c.made()
	if ctx == nil {
		return "", 0, ErrNilContext
	}
	if key == "" {
		return "", 0, fmt.Errorf("%w: GetFenced with an empty key", ErrInvalidArgument)
	}
	v, err := c.eval(ctx, scriptFencedGet, []string{key})
	if err != nil {
		return "", 0, fencedError(err, key)
	}
	r, _ := v.([]any)
	if len(r) == 0 {
		return "", 0, nil
	}
	value, _ = r[0].(string)
	var text string
	if len(r) > 1 {
		text, _ = r[1].(string)
	}
	if fence, err = strconv.ParseUint(text, 10, 64); err != nil {
		return "", 0, &ServerError{Key: key, Err: fmt.Errorf("unexpected reply %#v", v)}
	}
	return value, fence, nil
}

// fencedError turns the failed script call of SetFenced or GetFenced on
// key into their error: notFenced for data that is not a fenced value.
func fencedError(err error, key string) error {
	err = scriptError(err, key, func(int64) string { return key }, func(k string) string { return k })
	if errors.Is(err, ErrWrongType) {
		return notFenced(key)
	}
	return err
}

// notFenced is SetFenced's and GetFenced's ErrWrongType: its key is the caller's data,
// which holds something else than a fenced value, not a lock's key.
type notFenced string

func (key notFenced) Error() string {
	return fmt.Sprintf(`dlock: key holds data that is not a fenced value: %s (a hash of "value" and "fence" only)`, causes.Quote(string(key)))
}

// Is makes a notFenced match ErrWrongType.
func (notFenced) Is(target error) bool { return target == ErrWrongType }
