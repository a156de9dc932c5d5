package dlock

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/dlockio/dlock/internal/causes"
)

// Errors returned by dlock. Match them with errors.Is: the returned errors
// wrap them with details such as the key or argument concerned. A name,
// key or token longer than 256 bytes is quoted in an error's text by its
// first bytes and its length, not whole.
var (
	// ErrNotObtained means the lock is held by someone else: TryLock found it
	// taken, or Lock gave up waiting.
	ErrNotObtained = errors.New("dlock: not obtained")

	// ErrNotHeld means the lock is no longer held by this Lock value: it
	// expired, was released, was taken over, or was force-released (then
	// with ErrForceReleased too, while the record of that lasts).
	ErrNotHeld = errors.New("dlock: not held")

	// ErrForceReleased comes with ErrNotHeld (and, in Err, ErrLost) when
	// the lock was lost because an operator ended its hold with
	// Client.ForceRelease (or dlock release --force), rather than by
	// expiry: when the Lock's refresh, TTL or Release finds it gone while
	// the record of the force release lasts (see Client.ForceRelease).
	ErrForceReleased = errors.New("dlock: force-released")

	// ErrWrongType means a lock key already holds Redis data that dlock did not
	// write (a string, list, …). dlock never touches such data; choose
	// another name or key prefix. The message names the lock and, when the
	// data is at one of its other keys (its fence counter, say), that key.
	ErrWrongType = errors.New("dlock: key holds data that is not a dlock lock")

	// ErrKindMismatch means the name is in use by another kind of dlock
	// primitive (for example a read/write lock where an exclusive lock was
	// asked for), or by a read/write lock of the other fairness. The
	// error's text names what uses it: `dlock: name is used by another
	// kind of lock: "jobs" is a semaphore`.
	ErrKindMismatch = errors.New("dlock: name is used by another kind of lock")

	// ErrModeMismatch means a token holds the name in another mode: a read
	// hold's token used for a write hold or the other way round (see
	// WithToken). Release, Refresh and TTL report it together with
	// ErrNotHeld, and change nothing.
	ErrModeMismatch = errors.New("dlock: token holds the name in another mode")

	// ErrInvalidArgument is the parent of every argument error: all of the
	// Err… argument errors below match it with errors.Is.
	ErrInvalidArgument = errors.New("dlock: invalid argument")

	// ErrNilContext means a nil context.Context was passed.
	ErrNilContext = fmt.Errorf("%w: nil context", ErrInvalidArgument)
	// ErrEmptyName means a lock name was empty.
	ErrEmptyName = fmt.Errorf("%w: empty name", ErrInvalidArgument)
	// ErrInvalidName means a name that starts with '}' and holds no hash tag
	// of its own, or that gives a key whose hash tag is empty with the
	// client's prefix ("p{}:", see WithPrefix): its keys could not share a
	// Redis Cluster slot. Or one with a tag that ends in a suffix of a
	// lock's other keys, such as "{x}:fence", a key of the lock "{x}" (see
	// Client.RedisKey).
	ErrInvalidName = fmt.Errorf("%w: name", ErrInvalidArgument)
	// ErrNoNames means a call on several names (LockMulti, …) was given
	// none.
	ErrNoNames = fmt.Errorf("%w: no names", ErrInvalidArgument)
	// ErrDuplicateName means a call on several names gave the same name
	// twice.
	ErrDuplicateName = fmt.Errorf("%w: duplicate name", ErrInvalidArgument)
	// ErrInvalidTTL means a TTL was under 3ms, within its own allowance for
	// clock drift, or given to Refresh of a lock refreshed automatically
	// with a deadline (the TTL less that allowance) that does not come
	// after its refresh interval.
	ErrInvalidTTL = fmt.Errorf("%w: ttl", ErrInvalidArgument)
	// ErrInvalidToken means a token given with WithToken or Attach was
	// empty, or held white space.
	ErrInvalidToken = fmt.Errorf("%w: token", ErrInvalidArgument)
	// ErrInvalidOption means an option's value is out of range, or the
	// option does not apply to the primitive; the message names the option.
	ErrInvalidOption = fmt.Errorf("%w: option", ErrInvalidArgument)
	// ErrInvalidPermits means a semaphore was given zero or fewer permits.
	ErrInvalidPermits = fmt.Errorf("%w: permits", ErrInvalidArgument)
)

// because returns sentinel caused by cause: it matches both, and says the
// "dlock: " that both messages start with once.
func because(sentinel, cause error) error { return causes.Because(sentinel, cause) }

// notHeldFor returns the error of a call on a lock that ended with err: it
// matches ErrNotHeld and err, and reads as err where err already says
// "not held".
func notHeldFor(err error) error { return causes.Also(ErrNotHeld, err) }

// lostNotHeld is the error of a Release of a Lock lost before it was
// called, once the server no longer has it: the loss's words, matching
// ErrNotHeld and ErrLost, and what ended it (a force release, the max
// hold), but none of what failed on the way (a refresh's or an earlier
// Release's *ServerError, a deadline): this request did not fail.
func lostNotHeld(lost error) error {
	errs := []error{ErrNotHeld, ErrLost}
	for _, s := range []error{ErrForceReleased, ErrMaxHold} {
		if errors.Is(lost, s) {
			errs = append(errs, s)
		}
	}
	msg := lost.Error()
	if !errors.Is(lost, ErrNotHeld) {
		msg = ErrNotHeld.Error() + ": " + unprefixed(lost)
	}
	return &causes.Error{Msg: msg, Errs: errs}
}

// refusal is the error of an attempt that a held name refused: it matches
// ErrNotObtained, and says which name's lock key refused it, which a
// waiting caller on several names records (see waitHub.refusedAt). Its
// message names the name and why it refused, with a note (a semaphore's
// count), and is made only when asked for: a waiting caller's attempts are
// refused again and again, and it keeps none of their errors but the
// last.
type refusal struct {
	key, name, why, note string
}

func (r *refusal) Error() string {
	return ErrNotObtained.Error() + ": " + causes.Quote(r.name) + " " + r.why + r.note
}

func (r *refusal) Unwrap() error { return ErrNotObtained }

// refusedKey returns the lock key that refused the attempt that failed
// with err, or "" when none did or it is not known.
func refusedKey(err error) string {
	var r *refusal
	if errors.As(err, &r) {
		return r.key
	}
	return ""
}

// forceReleased returns the error of a Lock whose hold on what (its names,
// quoted) an operator ended: it matches ErrNotHeld and ErrForceReleased.
func forceReleased(what string) *causes.Error {
	return &causes.Error{Msg: fmt.Sprintf("%s: %s was force-released", ErrNotHeld, what), Errs: []error{ErrNotHeld, ErrForceReleased}}
}

// unprefixed returns err's message without the "dlock: " it starts with.
func unprefixed(err error) string { return causes.Unprefixed(err) }

// ServerError is an error reply from Redis to one of dlock's requests, or a
// failure to reach Redis, together with the key it concerned.
type ServerError struct {
	Key string // the Redis key of the request, or the first of several; "" for Client.Prepare's
	Err error  // what the driver returned
}

// Error names the key and says what the driver returned.
func (e *ServerError) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("dlock: redis request failed: %v", e.Err)
	}
	return fmt.Sprintf("dlock: redis request for %s failed: %v", causes.Quote(e.Key), e.Err)
}

// Unwrap returns the driver's error.
func (e *ServerError) Unwrap() error { return e.Err }

// Is reports whether the error matches target: ErrDenied, when Err is a
// refusal by Redis that no retry changes (see ErrDenied).
func (e *ServerError) Is(target error) bool { return target == ErrDenied && denied(e.Err) }

// ErrDenied means that Redis refuses the client for a reason that no retry
// changes: a setting to fix, not an outage. A *ServerError matches it, its
// message still Redis's and its Err the driver's error, when the client
// has not authenticated (NOAUTH) or its user name or password is wrong, or
// its user is off (WRONGPASS); its ACL user lacks a permission dlock
// needs, to run a command, to use a key, or to run a command inside a
// script (NOPERM); the server does not know a command that dlock sends or
// that its scripts call (ERR unknown command: a sentinel's port, a proxy,
// a command renamed away); the client's database is not one the server
// has; the client's name is one Redis refuses (a space, a newline or a
// special character in it: the Redis client sends it on every new
// connection, ERR Client names cannot contain ...); or the TLS handshake
// failed for a setting: the server's certificate did not verify (an
// authority the client does not trust, another host's name, its dates), or
// the server refused the client's (none given, or one it does not trust).
// With WithFunctions, an ErrNoFunctions for want of a permission or of the
// functions matches it too.
//
// A wait (Lock, LockMulti, Do, and those of RWMutex and Semaphore) ends at
// its first attempt that Redis denies, instead of trying again until its
// max wait. What may pass with a restart, a failover or time is no
// denial, and a wait tries again: a refused dial, a timeout, a connection
// reset (as a plain-text client's at a TLS port is), READONLY, LOADING,
// BUSY, CLUSTERDOWN, OOM, MISCONF (a server whose last RDB save failed,
// which takes writes again once a save succeeds). The watchdog logs a
// denied refresh as an error, and tries it again until the lock's
// deadline, as any failed refresh, in case the setting is fixed
// meanwhile: the lock is lost then, its Err matching ErrLost (and saying
// why in words).
var ErrDenied = errors.New("dlock: denied by Redis")

// ErrUnsupported is returned by a Driver for a capability it lacks.
var ErrUnsupported = errors.New("dlock: not supported by this driver")

// ErrClosed is returned by every acquire after Client.Close, and by
// AutoRefresh and Attach WithAutoRefresh; a wait that Close ended returns
// an error that matches it (see Client.Close). A driver's error matches it
// too when the Redis client under the driver was closed (goredis over a
// go-redis Client, Ring or cluster client; rueidis over a client of one
// server; redigo): no request can go any more, a wait ends at its next
// attempt (within half a second) instead of trying on, and the client
// stops listening for notices, for good, so that no release grants a lock
// to its waiters (close the Client before the Redis client). (A lock
// whose automatic refresh fails so is lost at its deadline, as after any
// failed refresh: its Err says why in words, and matches ErrLost only.)
var ErrClosed = errors.New("dlock: client closed")

// refusedForGood reports whether err is Redis refusing the client's
// requests for a reason that no retry changes (ErrDenied: a password, a
// permission, a command the server does not know, a database it does not
// have, a client name it refuses, a TLS handshake refused for a setting),
// or the driver being unable to do what was asked (ErrUnsupported), or the
// Redis client under the driver being closed (ErrClosed). A waiting
// acquire ends at once with such an error. ranInPart reports whether the
// request may have run in part: a permission may be missing for a command
// inside a script, after the script's earlier writes, where the other
// refusals come before anything runs; a driver may find it cannot do a
// part after the scripts ran (WAIT, for WithReplicas).
func refusedForGood(err error) (refused, ranInPart bool) {
	// Every error in err's tree counts, not only the first ServerError: a
	// refusal joined behind another failure is still final.
	var walk func(err error)
	walk = func(err error) {
		switch e := err.(type) {
		case nil:
			return
		case *unauthenticated:
			refused = true
			return
		case *ServerError:
			r, p := refusedMessage(e.Err)
			refused, ranInPart = refused || r, ranInPart || p
		case interface{ Unwrap() []error }:
			for _, e := range e.Unwrap() {
				walk(e)
			}
			return
		}
		walk(errors.Unwrap(err))
	}
	walk(err)
	return refused, ranInPart
}

// notRun reports whether err says that a request never ran: the driver
// could not connect to send it, or the server refused it before running it
// (see refusedUnrun). Such a request cannot run late. (Not a request the
// client library found no connection for, see unsent: go-redis may have
// sent it once before it tried again.)
func notRun(err error) bool {
	return refusedDial(err) || refusedUnrun(err)
}

// refusedDial reports whether err says that the driver could not connect
// to send a request: the server is down, or, in a failover, the client
// library has yet to learn of its replacement.
func refusedDial(err error) bool {
	op := (*net.OpError)(nil)
	return errors.As(err, &op) && op.Op == "dial"
}

// unsent reports whether err says that the client library found no
// connection for the request (a pool at its limit), as an error of the
// driver's with a NotSent method that returns true says (see Driver). The
// request may go a little later. It may have been sent before, by a
// library that tries again after a connection failed: a release or a
// clean-up, which may run twice, is sent again, but nothing counts the
// request as not run.
func unsent(err error) bool {
	var ns interface{ NotSent() bool }
	return errors.As(err, &ns) && ns.NotSent()
}

// tryLater reports whether err is a failure that a clean-up sent again a
// little later may get past: a refusal or a failure to send (sendLater),
// or no answer in time (isTimeout). (Not a refused dial: see followUp.)
func tryLater(err error) bool { return err != nil && (sendLater(err) || isTimeout(err)) }

// tryLaterDialing is tryLater, and with dial a refused dial too: for a
// give-back of a lock that was held, or the clean-up of an acquisition
// that reached the server (see followUp).
func tryLaterDialing(err error, dial bool) bool { return tryLater(err) || dial && refusedDial(err) }

// sendLater reports whether err is a refusal, or a failure to send, that a
// request may meet no more a little later (see refusedUnrun and unsent).
func sendLater(err error) bool {
	return refusedUnrun(err) || unsent(err)
}

// refusedUnrun reports whether err is the server's refusal of a request
// before running it: its slot moving or split between nodes (TRYAGAIN,
// MOVED, ASK that the client library did not follow, or followed to no
// avail), the cluster down, the server loading its data or busy with
// another script (BUSY). Or before writing anything: a script's first
// write refused, as all after it would be, by a replica (READONLY) or a
// primary short of replicas (NOREPLICAS, min-replicas-to-write). The
// request may run when sent again a little later.
func refusedUnrun(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		msg := e.Error()
		for _, p := range []string{"TRYAGAIN ", "CLUSTERDOWN ", "MOVED ", "ASK ", "LOADING ", "BUSY ", "READONLY ", "NOREPLICAS "} {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
	}
	return false
}

// isTimeout reports whether err says that a request got no reply in time:
// a network timeout, or a deadline.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// refusedMessage is refusedForGood for one driver error.
func refusedMessage(err error) (refused, ranInPart bool) {
	if err == nil {
		return false, false
	}
	if errors.Is(err, ErrUnsupported) {
		// A driver may find it cannot do a part after the scripts ran;
		// a redirection its client follows not came before anything did.
		return true, !redirection(err)
	}
	if errors.Is(err, ErrNoFunctions) {
		// FCALL unknown (Redis 6) or refused: the script never ran.
		return true, false
	}
	if errors.Is(err, ErrClosed) {
		// The Redis client under the driver was closed: a request under
		// way as it closed may have run (go-redis sends it again, to be
		// refused so).
		return true, true
	}
	return deniedBy(err)
}

// denied reports whether err, or an error it wraps, is a refusal by Redis
// that no retry changes (see ErrDenied).
func denied(err error) bool {
	d, _ := deniedBy(err)
	return d
}

// deniedBy reports whether err, or an error it wraps, is a refusal by
// Redis that no retry changes (see ErrDenied), and whether the request may
// have run in part (see refusedForGood).
func deniedBy(err error) (denied, ranInPart bool) {
	for ; err != nil; err = errors.Unwrap(err) {
		switch e := err.(type) {
		case *unauthenticated:
			return true, false
		case *tls.CertificateVerificationError, x509.UnknownAuthorityError, x509.HostnameError, x509.CertificateInvalidError:
			// The handshake failed: no request went.
			return true, false
		case *net.OpError:
			if e.Op == "remote error" && e.Err != nil && refusingAlert(e.Err.Error()) {
				return true, false
			}
		case interface{ Unwrap() []error }:
			for _, e := range e.Unwrap() {
				d, p := deniedBy(e)
				denied, ranInPart = denied || d, ranInPart || p
			}
			return denied, ranInPart
		}
		if d, p := deniedReply(err.Error()); d {
			return d, p
		}
	}
	return false, false
}

// deniedReply reports whether msg, a driver's error, is an error reply by
// which Redis refuses the client for good (see ErrDenied), and whether the
// request may have run in part.
func deniedReply(msg string) (denied, ranInPart bool) {
	switch {
	case strings.HasPrefix(msg, "NOAUTH "), strings.HasPrefix(msg, "WRONGPASS "),
		// The client's database (go-redis DB, redigo DialDatabase) is not
		// one of the server's: its SELECT is refused on every connection.
		strings.HasPrefix(msg, "ERR DB index is out of range"),
		// The client's name (go-redis ClientName, redigo DialClientName,
		// rueidis ClientName) has a space or a character Redis refuses:
		// its CLIENT SETNAME, or HELLO's SETNAME, is refused on every
		// new connection, before any request of dlock's. (rueidis's
		// NewClient fails on it already, without the ERR.)
		strings.HasPrefix(strings.TrimPrefix(msg, "ERR "), "Client names cannot contain "):
		return true, false
	case strings.HasPrefix(msg, "ERR unknown command "):
		// Not a Redis that runs scripts (a sentinel, a proxy, EVALSHA
		// renamed away): no retry gives it the command. The script may
		// have run when the command is another of the pipeline's, after
		// it (WAIT, for WithReplicas).
		return true, !scriptCommandUnknown(msg)
	case strings.HasPrefix(msg, "NOPERM "):
		// Refused before it ran: the script's own command or its keys.
		// A command of the pipeline after it (WAIT) follows a script
		// that may have run.
		return true, !scriptRefused(msg)
	case
		// A command inside a script, or its key or channel: Redis 7.0,
		// and 7.2 on.
		strings.Contains(msg, "The user executing the script can't "),
		strings.Contains(msg, "ACL failure in script"),
		// A command the scripts call renamed away ("from Lua script"
		// before Redis 7), after their earlier writes.
		strings.Contains(msg, "Unknown Redis command called from "):
		return true, true
	}
	return false, false
}

// refusingAlert reports whether alert, the text of a TLS alert that the
// server sent in the handshake, refuses the client for a setting: its
// certificate (none, or one the server does not trust), or the versions
// and ciphers it offers.
func refusingAlert(alert string) bool {
	switch alert {
	case "tls: certificate required", "tls: bad certificate", "tls: unsupported certificate",
		"tls: revoked certificate", "tls: expired certificate", "tls: unknown certificate",
		"tls: unknown certificate authority", "tls: access denied", "tls: handshake failure",
		"tls: protocol version not supported", "tls: insufficient security level":
		return true
	}
	return false
}

// redirection reports whether err, or an error it wraps, is a MOVED or
// ASK reply: a cluster node's refusal of a request for a slot it does not
// serve, before running it.
func redirection(err error) bool {
	switch e := err.(type) {
	case nil:
		return false
	case interface{ Unwrap() []error }:
		for _, e := range e.Unwrap() {
			if redirection(e) {
				return true
			}
		}
		return false
	}
	if msg := err.Error(); strings.HasPrefix(msg, "MOVED ") || strings.HasPrefix(msg, "ASK ") {
		return true
	}
	return redirection(errors.Unwrap(err))
}

// scriptCommandUnknown reports whether msg, an "ERR unknown command"
// reply, names a command that runs a script (Redis 7 quotes it with ',
// Redis 6 with `): then nothing ran.
func scriptCommandUnknown(msg string) bool {
	m := strings.ToLower(strings.TrimPrefix(msg, "ERR unknown command "))
	for _, c := range []string{"evalsha", "eval", "fcall"} {
		if strings.HasPrefix(m, "'"+c+"'") || strings.HasPrefix(m, "`"+c+"`") {
			return true
		}
	}
	return false
}

// scriptRefused reports whether msg, a NOPERM reply, refuses a script's
// own request: its command (EVALSHA, EVAL, FCALL), or its keys (only the
// scripts' requests name keys). Redis 7.0 says "this user has no
// permissions to run the 'evalsha' command" and "… to access one of the
// keys used as arguments", 7.2 on "User u has no permissions to run the
// 'evalsha' command" and "No permissions to access a key".
// The words are read at the end of the reply, after the user's name.
func scriptRefused(msg string) bool {
	m := strings.ToLower(strings.TrimSpace(msg))
	for _, c := range []string{"evalsha", "eval", "fcall"} {
		if strings.HasSuffix(m, "run the '"+c+"' command") {
			return true
		}
	}
	return strings.HasSuffix(m, "access one of the keys used as arguments") || strings.HasSuffix(m, "access a key")
}

// unauthenticated is Redis's refusal of a request from a client that has
// not authenticated: "NOAUTH Authentication required", or, for a request
// of more than 10 arguments (as a waiting acquire's is), "ERR Protocol
// error: unauthenticated multibulk length", after which Redis closes the
// connection. Both mean the driver's Redis client has no password, and
// the message says so.
type unauthenticated struct{ err error }

func (e *unauthenticated) Error() string {
	closed := ""
	if isProtocolUnauthenticated(e.err) {
		closed = ", and closed its connection"
	}
	return "not authenticated (NOAUTH): Redis refused the request of a client that has not authenticated" + closed +
		" (" + e.err.Error() + "); give the Redis client the server's user and password"
}

func (e *unauthenticated) Unwrap() error { return e.err }

// isUnauthenticated reports whether err is Redis's refusal of a request
// from a client that has not authenticated (see unauthenticated).
func isUnauthenticated(err error) bool {
	return isProtocolUnauthenticated(err) || strings.Contains(err.Error(), "NOAUTH ")
}

// isProtocolUnauthenticated reports whether err is the protocol error by
// which Redis refuses a large request of a client that has not
// authenticated.
func isProtocolUnauthenticated(err error) bool {
	return strings.Contains(err.Error(), "Protocol error: unauthenticated ")
}

// scriptError turns a failed script call into a dlock error. The scripts
// report data they refuse to touch as "DLOCK_WRONGTYPE i", "DLOCK_KIND i"
// or "DLOCK_MODE i", i being the 1-based index of the key, which name turns
// into the name for the message, and keyOf into the name's key. A
// "DLOCK_WRONGTYPE i" followed by a suffix (":fence", say) says that the
// name's key with that suffix holds the data, and the message names it; a
// "DLOCK_KIND i" followed by the kind found says what uses the name (see
// kindFound). Anything else is a *ServerError about key.
func scriptError(err error, key string, name func(i int64) string, keyOf func(name string) string) error {
	msg := err.Error()
	for _, c := range [...]struct {
		code     string
		sentinel error
	}{{"DLOCK_WRONGTYPE ", ErrWrongType}, {"DLOCK_KIND ", ErrKindMismatch}, {"DLOCK_MODE ", ErrModeMismatch}} {
		if at := strings.Index(msg, c.code); at >= 0 {
			fields := strings.Fields(msg[at+len(c.code):] + " ")
			i, _ := strconv.ParseInt(fields[0], 10, 64)
			n := name(i)
			if c.sentinel == ErrWrongType && len(fields) > 1 && strings.HasPrefix(fields[1], ":") {
				return fmt.Errorf("%w: %s (at its key %s)", c.sentinel, causes.Quote(n), causes.Quote(keyOf(n)+fields[1]))
			}
			if c.sentinel == ErrKindMismatch && len(fields) > 1 {
				if found := kindFound(fields[1]); found != "" {
					return fmt.Errorf("%w: %s is %s", c.sentinel, causes.Quote(n), found)
				}
			}
			return fmt.Errorf("%w: %s", c.sentinel, causes.Quote(n))
		}
	}
	return &ServerError{Key: key, Err: err}
}

// kindFound names the kind of lock a DLOCK_KIND error found on a name, as
// the scripts spell it (see kind_error in replies.lua); "" for a kind it
// does not know.
func kindFound(kind string) string {
	switch kind {
	case "lock":
		return "an exclusive lock"
	case "semaphore":
		return "a semaphore"
	case "rwlock:1":
		return "a fair read/write lock"
	case "rwlock:0":
		return "a writer-preferring read/write lock"
	case "rwlock":
		return "a read/write lock"
	}
	return ""
}
