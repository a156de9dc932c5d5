package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	"github.com/redis/go-redis/v9"
)

const (
	// defaultRedis is the Redis URL when neither --redis nor DLOCK_REDIS
	// names one.
	defaultRedis = "redis://127.0.0.1:6379"
	// pingTimeout bounds the first contact with Redis.
	pingTimeout = 10 * time.Second
	// closeTimeout bounds how long a command waits, as it exits, for its
	// clients to close: for the library's clean-ups still under way
	// (leaving a waiter set, giving back what an attempt cut short may
	// have taken; up to 3s) and its subscription to close. A Redis that
	// stalls answers none of them: what is not done by then is left to
	// expire (a waiter's registration within seconds, a lock with its
	// TTL), and the process's exit closes the connections.
	closeTimeout = time.Second
)

// connFlags are the connection flags every command but version takes.
type connFlags struct {
	url, prefix, sentinelMaster    string
	tlsCA, tlsCert, tlsKey, tlsSNI string
	fenceRetention                 string // --fence-retention, unparsed: DLOCK_FENCE_RETENTION fills it in when empty
	cluster                        bool
	clusterSet                     bool // --cluster was given, possibly false: DLOCK_CLUSTER counts only when it was not
	prefixSet                      bool // --prefix was given, possibly empty
}

// register adds the flags to fs. The command's flag set registers them a
// second time after the global one has parsed, so the current values are
// the defaults.
func (f *connFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.url, "redis", f.url, "")
	fs.Func("prefix", "", func(s string) error { f.prefix, f.prefixSet = s, true; return nil })
	fs.StringVar(&f.sentinelMaster, "sentinel-master", f.sentinelMaster, "")
	fs.StringVar(&f.tlsCA, "tls-ca", f.tlsCA, "")
	fs.StringVar(&f.tlsCert, "tls-cert", f.tlsCert, "")
	fs.StringVar(&f.tlsKey, "tls-key", f.tlsKey, "")
	fs.StringVar(&f.tlsSNI, "tls-server-name", f.tlsSNI, "")
	fs.StringVar(&f.fenceRetention, "fence-retention", f.fenceRetention, "")
	fs.Var(clusterFlag{f}, "cluster", "")
}

// clusterFlag is --cluster, a boolean flag that records that it was given.
type clusterFlag struct{ f *connFlags }

func (c clusterFlag) IsBoolFlag() bool { return true }

func (c clusterFlag) String() string { return strconv.FormatBool(c.f != nil && c.f.cluster) }

func (c clusterFlag) Set(s string) error {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return errors.New("parse error")
	}
	c.f.cluster, c.f.clusterSet = b, true
	return nil
}

// target is a parsed connection: exactly one of the option structs is set.
type target struct {
	single   *redis.Options
	cluster  *redis.ClusterOptions
	failover *redis.FailoverOptions
	display  string // the URL without its password, for messages
	prefix   string
	// fenceRetention is how long the client keeps a name's fence counter
	// after its last fence (dlock.WithFenceRetention).
	fenceRetention time.Duration
}

// conn is an open connection and the dlock client on it.
type conn struct {
	rdb     redis.UniversalClient
	locks   *dlock.Client
	display string
}

// close closes the dlock client and the Redis client, as the command
// exits, waiting for them closeTimeout at most.
func (c *conn) close() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.locks.Close()
		_ = c.rdb.Close()
	}()
	t := time.NewTimer(closeTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// connect parses the connection settings, opens the Redis client and
// checks that Redis answers: on a Redis Cluster, the primary that serves
// the lock called name, unless name is "" (see open).
func (a *app) connect(ctx context.Context, name string) (*conn, error) {
	t, err := a.conn.target(a.lookupEnv)
	if err != nil {
		return nil, usage(a.cmd, "%v", err)
	}
	if err := checkName(t.prefix, name); err != nil {
		// Bad usage whatever the server: said before any contact, not
		// after a wait for a Redis that cannot be reached.
		return nil, usage(a.cmd, "%s", libMsg(err))
	}
	rdb, err := t.open(ctx, a.cmd, name)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if t.single != nil && isClusterNode(pctx, rdb) {
		// As one server it would see one node's share of the locks, and
		// be refused the others with MOVED.
		_ = rdb.Close()
		return nil, a.clusterNodeError(&conn{display: t.display})
	}
	locks := dlock.New(goredis.New(rdb), dlock.WithPrefix(t.prefix), dlock.WithFenceRetention(t.fenceRetention))
	return &conn{rdb: rdb, locks: locks, display: t.display}, nil
}

// checkName returns the library's error for a lock name that it refuses
// on any deployment with prefix (dlock.ErrInvalidArgument: "{x}:fence", a
// key of the lock "{x}"; a name that leaves its key an empty hash tag),
// and nil for any other ("" too: ls takes none). The library checks a
// name before it sends a request: it is asked here through a driver that
// sends none, so that the rule stays the library's alone.
func checkName(prefix, name string) error {
	if name == "" {
		return nil
	}
	locks := dlock.New(offline{}, dlock.WithPrefix(prefix))
	defer locks.Close()
	_, err := locks.Inspect(context.Background(), name)
	if errors.Is(err, dlock.ErrInvalidArgument) {
		return err
	}
	return nil
}

// offline is a dlock.Driver that reaches no server: every call fails
// with errOffline.
type offline struct{}

var errOffline = errors.New("no server")

func (offline) Eval(_ context.Context, calls ...*dlock.Call) {
	for _, c := range calls {
		c.Err = errOffline
	}
}

func (offline) Subscribe(context.Context, func(string, string)) (dlock.Subscription, error) {
	return nil, dlock.ErrUnsupported
}

// open opens the client of t and checks that Redis answers: on a Redis
// Cluster, with a name, the primary that serves that lock's slot (see
// ping). go-redis panics on some options it does not check (checkOptions
// refuses those it is known to): a panic is a usage error too.
func (t *target) open(ctx context.Context, cmd *command, name string) (rdb redis.UniversalClient, err error) {
	defer func() {
		if p := recover(); p != nil {
			if rdb != nil {
				_ = rdb.Close()
			}
			rdb, err = nil, usage(cmd, "go-redis cannot use the options of %s: %v", t.display, p)
		}
	}()
	// ContextTimeoutEnabled: a request already sent ends at its context's
	// deadline (a --wait's), not only at the read timeout.
	switch {
	case t.cluster != nil:
		t.cluster.ContextTimeoutEnabled = true
		rdb = redis.NewClusterClient(t.cluster)
	case t.failover != nil:
		t.failover.ContextTimeoutEnabled = true
		rdb = redis.NewFailoverClient(t.failover)
	default:
		t.single.ContextTimeoutEnabled = true
		rdb = redis.NewClient(t.single)
	}
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if err := t.ping(pctx, rdb, name); err != nil {
		_ = rdb.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if t.failover != nil && strings.Contains(err.Error(), noSentinel) {
			return nil, t.sentinelError(ctx, cmd, err)
		}
		return nil, t.pingError(cmd, err)
	}
	return rdb, nil
}

// ping checks that Redis answers. A cluster client sends a PING, which has
// no key, to the primary of a slot that go-redis draws from a generator it
// seeds alike in every process: the same primary each time, which the
// command may not need. While it was down (or stalled, until pingTimeout),
// every command failed, whatever primary served its lock. So with a name,
// the PING goes to the primary of the lock's slot, which the command
// uses; ls, which needs every primary, pings as before.
func (t *target) ping(ctx context.Context, rdb redis.UniversalClient, name string) error {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok || name == "" {
		return rdb.Ping(ctx).Err()
	}
	key := dlock.New(goredis.New(rdb), dlock.WithPrefix(t.prefix)).RedisKey(name)
	node, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return err
	}
	return node.Ping(ctx).Err()
}

// noSentinel is how go-redis says that no sentinel gave it the master's
// address: none could be reached, or those that answered do not know the
// master, or refused the sentinel password.
const noSentinel = "all sentinels specified in configuration are unreachable"

// sentinelError explains noSentinel (err) by asking each sentinel itself:
// a sentinel that does not monitor the master is a usage error; only when
// none could be reached is Redis down (see exitError.down).
func (t *target) sentinelError(ctx context.Context, cmd *command, err error) error {
	down := true
	refusedBy := "" // the sentinel whose refusal err is
	for _, addr := range t.failover.SentinelAddrs {
		s := redis.NewSentinelClient(&redis.Options{Addr: addr, Username: t.failover.SentinelUsername, Password: t.failover.SentinelPassword,
			TLSConfig: t.failover.TLSConfig, DialTimeout: t.failover.DialTimeout, MaxRetries: -1})
		sctx, cancel := context.WithTimeout(ctx, pingTimeout)
		_, serr := s.GetMasterAddrByName(sctx, t.failover.MasterName).Result()
		cancel()
		_ = s.Close()
		switch {
		case errors.Is(serr, redis.Nil):
			return usage(cmd, "the sentinel at %s does not monitor a master called %q: check --sentinel-master or the URL's master name", addr, t.failover.MasterName)
		case serr != nil && !isNetError(serr):
			err, refusedBy = serr, addr // a refusal: the password, a permission, no sentinel there
			down = false
		}
	}
	if hint := sentinelRefusalHint(err); refusedBy != "" && hint != "" {
		// A setting to fix, as the primary's own password is (see denied).
		return fail(exitDenied, "cannot use Redis at %s: the sentinel at %s refused: %s; %s", t.display, refusedBy, libMsg(err), hint)
	}
	e := t.pingError(cmd, err)
	if ee, ok := e.(*exitError); ok {
		ee.down = down
	}
	return e
}

// sentinelRefusalHint says what to fix when a sentinel refuses dlock for
// its user or password, which are the sentinels' own settings, not the
// primary's, or the server at a sentinel's address is no sentinel (a
// Redis server, which does not know SENTINEL); "" for another refusal.
func sentinelRefusalHint(err error) string {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "WRONGPASS"), strings.Contains(msg, "NOAUTH"), strings.Contains(msg, "invalid password"):
		return "check the sentinels' user and password: sentinel_username and sentinel_password in the URL, or DLOCK_SENTINEL_PASSWORD"
	case strings.Contains(msg, "NOPERM"):
		return "the sentinels' user lacks a permission: grant it the SENTINEL command"
	case strings.Contains(msg, "unknown command"):
		return "the server there is not a sentinel (a Redis server's port, say): give the sentinels' addresses (port 26379 by default), or redis://HOST:PORT for one server"
	}
	return ""
}

// pingError explains a failed first contact: a setting the server says is
// wrong is a usage error, anything else makes Redis unreachable.
func (t *target) pingError(cmd *command, err error) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "cluster support disabled"):
		return usage(cmd, "%s is not a Redis Cluster: give one address, without --cluster (or sentinels', with --sentinel-master)", t.display)
	case strings.Contains(msg, "DB index is out of range"):
		return usage(cmd, "%s names a database the server does not have (%s); pick one below its 'databases' setting (16 by default)", t.display, libMsg(err))
	}
	return unreachable(t.display, err)
}

// redirected reports whether err is a cluster node's MOVED or ASK, which
// the driver turns into dlock.ErrUnsupported for a client that follows no
// redirection: a cluster node given as one server, which connect did not
// tell (its Redis user may not run INFO).
func redirected(err error) bool {
	msg := err.Error()
	return errors.Is(err, dlock.ErrUnsupported) && (strings.Contains(msg, "MOVED ") || strings.Contains(msg, "ASK "))
}

// clusterNodeError is the usage error of a cluster node given as one
// server.
func (a *app) clusterNodeError(c *conn) error {
	return usage(a.cmd, "%s is a node of a Redis Cluster: add --cluster, or list several of its nodes in the URL", c.display)
}

// isClusterNode reports whether the server rdb reaches has cluster mode
// on; false when it cannot tell (INFO is not allowed, say).
func isClusterNode(ctx context.Context, rdb redis.UniversalClient) bool {
	info, err := rdb.Info(ctx, "cluster").Result()
	return err == nil && strings.Contains(info, "cluster_enabled:1")
}

// unreachable describes a failure to talk to Redis, with the likely fix.
func unreachable(display string, err error) error {
	msg := err.Error()
	const unknown = "check --redis or DLOCK_REDIS, and that Redis is running"
	hint := unknown
	switch {
	case notReplicated(err):
		hint = "fewer of the primary's replicas than --replicas confirmed the lock within --replicas-timeout: check that it has that many, linked and in sync (INFO replication; a primary just promoted by a failover has fewer until the old one rejoins as its replica), or give a lower --replicas"
	case strings.Contains(msg, "WRONGPASS"), strings.Contains(msg, "NOAUTH"), strings.Contains(msg, "invalid password"):
		hint = "check the user and password in the URL, or DLOCK_PASSWORD"
	case strings.Contains(msg, "NOPERM") && strings.Contains(msg, "'wait' command"):
		hint = "the Redis user may not run WAIT, which --replicas sends after each acquire and refresh: grant it WAIT (+wait)"
	case strings.Contains(msg, "NOPERM"), strings.Contains(msg, "The user executing the script can't "), strings.Contains(msg, "ACL failure in script"):
		// The last two: a command, a key or a channel inside a script
		// (Redis 7.0, and 7.2 on).
		hint = "the Redis user lacks a permission dlock needs: grant it the keys and channels under the prefix, and the scripting commands"
	case strings.Contains(msg, "unknown command"), strings.Contains(msg, "Unknown Redis command called from"):
		hint = "the server does not know a command dlock needs: check that --redis or DLOCK_REDIS names a Redis server (not a sentinel, nor a proxy without scripts), and that no command dlock uses is renamed away"
		if m := unknownCommand.FindStringSubmatch(msg); m != nil {
			c := strings.ToUpper(m[1])
			hint = fmt.Sprintf("the server does not know %s, a command dlock needs: check that --redis or DLOCK_REDIS names a Redis server (not a sentinel, nor a proxy without scripts), and that %s is not renamed away (rename-command)", c, c)
		}
	case strings.Contains(msg, "certificate is valid for"), strings.Contains(msg, "certificate is not valid for"),
		strings.Contains(msg, "IP SANs"):
		hint = "the server's certificate names another host: give the name it holds with --tls-server-name"
	case strings.Contains(msg, "x509"), strings.Contains(msg, "tls:"), strings.Contains(msg, "certificate"):
		hint = "check --tls-ca, --tls-cert and --tls-key, and that the URL says rediss://"
	case strings.HasPrefix(display, "rediss") && !strings.Contains(msg, "dial ") &&
		(strings.Contains(msg, "deadline exceeded") || strings.Contains(msg, "timeout")):
		hint = "no TLS handshake: check that the server expects TLS, or write redis:// for one that does not"
	case strings.Contains(msg, "sentinel"):
		hint = "check the sentinel addresses and the master name they monitor"
	case strings.Contains(msg, "connection reset"), strings.Contains(msg, "EOF"):
		hint = "check the address, and whether the server expects TLS (rediss://)"
	case readOnly(err):
		hint = "the server is a replica, which takes no locks (a failover may have made it one): give its primary's address, or the sentinels' (redis-sentinel://HOST:PORT/MASTER) to follow failovers"
	case clusterDown(err):
		hint = "the Redis Cluster is down: no node serves some of its slots (a primary failed with no replica to take its place, or a node is cut off from the majority): check its health with redis-cli --cluster check HOST:PORT" + waitsForIt(err)
	case passing(err):
		hint = "Redis is busy or not ready (a long script, loading its data, a failover, a slot being moved)" + waitsForIt(err)
	case full(err):
		hint = "Redis is at its maxmemory and refuses new locks (held ones are still refreshed and released): free memory or raise maxmemory"
	case cannotSave(err):
		hint = "Redis refuses writes, and PING, while it cannot save to disk (its last RDB save or AOF write failed): check its disk and its log (INFO persistence)" + waitsForIt(err)
	}
	code := exitUnavailable
	if denied(err) {
		code = exitDenied
	}
	e := fail(code, "cannot use Redis at %s: %s; %s", display, libMsg(err), hint).(*exitError)
	// Down, not refusing us: no answer, with no sign of a setting to fix.
	// A connection closed at once is not: it hints at a server expecting
	// TLS. (For sentinels, see sentinelError.)
	// So is one busy or not ready for a while, which passes by itself.
	e.busy = passing(err) || cannotSave(err)
	e.down = hint == unknown && isNetError(err) || e.busy
	e.words = downWords(err)
	return e
}

// unknownCommand matches the command that Redis says it does not know
// (a script's command, which it does not name, is not matched).
var unknownCommand = regexp.MustCompile(`unknown command '([A-Za-z][A-Za-z0-9_|.-]*)'`)

// waitsForIt is the end of the hint of a refusal that passes by itself,
// which a run that waits waits for: nothing once err is that of a wait
// that ended (see waitEnded).
func waitsForIt(err error) string {
	var ended *waitEnded
	if errors.As(err, &ended) {
		return ""
	}
	return "; a run that waits (no --no-wait) waits for it"
}

// denied reports whether err is Redis refusing dlock for good, a setting
// to fix (see dlock.ErrDenied): a wrong password, a missing permission, a
// command the server does not know, a TLS certificate refused. The
// library classifies so the errors of its own requests, *ServerErrors; a
// go-redis error of dlock's (the first PING) is put in one to be
// classified alike.
func denied(err error) bool {
	return errors.Is(&dlock.ServerError{Err: err}, dlock.ErrDenied)
}

// notReplicated reports whether err is that of an acquire or refresh that
// fewer replicas confirmed than --replicas asks for (dlock.ErrNotReplicated),
// or a message that quotes it.
func notReplicated(err error) bool {
	return errors.Is(err, dlock.ErrNotReplicated) || strings.Contains(err.Error(), libMsg(dlock.ErrNotReplicated))
}

// full reports whether err is the refusal of a server at its maxmemory
// (OOM), or a message that quotes one: it answers, and is not unreachable.
func full(err error) bool {
	return redis.HasErrorPrefix(err, "OOM") || strings.Contains(err.Error(), "OOM command not allowed")
}

// cannotSave reports whether err is the refusal of a server that cannot
// save to disk (MISCONF: its last RDB save or AOF write failed), or a
// message that quotes one: it refuses writes, and PING, until a save
// succeeds.
func cannotSave(err error) bool {
	return redis.HasErrorPrefix(err, "MISCONF") || strings.Contains(err.Error(), "MISCONF ")
}

// clusterDown reports whether err is the refusal of a Redis Cluster node
// while no node serves some slots, or none the request's (CLUSTERDOWN), or
// a message that quotes one: it passes once every slot is served again.
func clusterDown(err error) bool {
	return redis.HasErrorPrefix(err, "CLUSTERDOWN") || strings.Contains(err.Error(), "CLUSTERDOWN ")
}

// readOnly reports whether err is a replica's refusal of a write
// (READONLY), or a message that quotes one: the server answers, and is not
// the primary.
func readOnly(err error) bool {
	return redis.HasErrorPrefix(err, "READONLY") || strings.Contains(err.Error(), "READONLY You can't write")
}

// passing reports whether err is a server's refusal that passes by itself:
// busy with another client's script (BUSY), loading its data (LOADING), a
// replica without its primary (MASTERDOWN), a cluster not serving (CLUSTERDOWN,
// TRYAGAIN).
func passing(err error) bool {
	for _, p := range []string{"BUSY", "LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN"} {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	return false
}

// redisError turns an error of a Redis request into an exit: ServerErrors
// and network errors are Redis's, argument errors are usage errors.
func (a *app) redisError(c *conn, err error) error {
	var se *dlock.ServerError
	switch {
	case redirected(err):
		return a.clusterNodeError(c)
	case errors.Is(err, dlock.ErrWrongType):
		return a.wrongTypeError(c, err)
	case errors.Is(err, dlock.ErrKindMismatch) && a.cmd == runCommand:
		return usage(a.cmd, "%s; run takes an exclusive lock, --shared or --write a read or write hold of a read/write lock (--fair for a fair one), --semaphore N a permit: use the one the name's other users use", libMsg(err))
	case errors.Is(err, dlock.ErrKindMismatch), errors.Is(err, dlock.ErrInvalidArgument):
		// dlock gives the library one name: which of several it was says
		// nothing.
		return usage(a.cmd, "%s", strings.Replace(libMsg(err), " (name 1 of 1)", "", 1))
	case errors.As(err, &se), isNetError(err):
		return unreachable(c.display, err)
	}
	return err
}

// wrongTypeError explains an ErrWrongType: which key of the name holds
// data dlock did not write. The library's message names the name and, when
// it is not the name's own key, that key; a message of another form is
// reported as it is.
func (a *app) wrongTypeError(c *conn, err error) error {
	m := wrongTypeMsg.FindStringSubmatch(err.Error())
	if m == nil {
		return usage(a.cmd, "%s; pick another name or --prefix", libMsg(err))
	}
	name, uerr := strconv.Unquote(m[1])
	if uerr != nil {
		return usage(a.cmd, "%s; pick another name or --prefix", libMsg(err))
	}
	key := c.locks.RedisKey(name)
	if m[2] != "" {
		if k, err := strconv.Unquote(m[2]); err == nil {
			key = k
		}
	}
	return usage(a.cmd, "%s: its key %q holds data dlock did not write; pick another name or --prefix", quote(name), key)
}

// wrongTypeMsg matches the end of the library's ErrWrongType message: the
// name quoted, and the key at fault quoted when it is not the name's own.
var wrongTypeMsg = regexp.MustCompile(`: ("(?:[^"\\]|\\.)*")(?: \(at its key ("(?:[^"\\]|\\.)*")\))?$`)

// fenceKey is the key of the fence counter of the name whose key is key.
func fenceKey(key string) string { return key + ":fence" }

// foreignFence reports whether a fence counter holds data dlock did not
// write, as its scripts tell: anything but a string that reads as a number
// below 2^53, where dlock stops issuing fences. False when it cannot tell.
func foreignFence(ctx context.Context, rdb redis.UniversalClient, key string) bool {
	v, err := rdb.Get(ctx, key).Result()
	if err != nil {
		return strings.HasPrefix(err.Error(), "WRONGTYPE")
	}
	v = strings.TrimSpace(v) // as Lua's tonumber reads it
	var f float64
	if h, ok := strings.CutPrefix(strings.ToLower(v), "0x"); ok {
		n, perr := strconv.ParseUint(h, 16, 64)
		f, err = float64(n), perr
	} else {
		f, err = strconv.ParseFloat(v, 64)
	}
	return err != nil || math.IsNaN(f) || f >= 1<<53
}

func isNetError(err error) bool {
	var ne net.Error
	return errors.As(err, &ne)
}

// target resolves the flags and environment into a connection.
func (f *connFlags) target(lookupEnv func(string) (string, bool)) (*target, error) {
	getenv := func(k string) string { v, _ := lookupEnv(k); return v }
	raw, from := f.url, "--redis"
	if raw == "" {
		raw, from = getenv("DLOCK_REDIS"), "DLOCK_REDIS"
	}
	if raw == "" {
		raw, from = defaultRedis, "the default"
	}
	cluster := f.cluster
	if !f.clusterSet && !cluster {
		c, err := envBool(getenv, "DLOCK_CLUSTER", "1 to treat a single address as a seed of a Redis Cluster")
		if err != nil {
			return nil, err
		}
		cluster = c
	}
	t, err := parseTarget(raw, cluster, or(f.sentinelMaster, getenv("DLOCK_SENTINEL_MASTER")), getenv)
	if err != nil {
		return nil, fmt.Errorf("bad Redis URL %q (from %s): %w", redactBadURL(raw), from, err)
	}
	noPrefix, err := envBool(getenv, "DLOCK_NO_PREFIX", "1 for an empty key prefix")
	if err != nil {
		return nil, err
	}
	t.prefix = dlock.DefaultPrefix
	switch p := getenv("DLOCK_PREFIX"); {
	case f.prefixSet:
		t.prefix = f.prefix
	case p != "" && noPrefix:
		return nil, fmt.Errorf("DLOCK_PREFIX %q and DLOCK_NO_PREFIX exclude each other: unset one", p)
	case p != "":
		// An empty one counts as unset, as every variable: one blank in
		// a template must not put the locks of some hosts elsewhere.
		// DLOCK_NO_PREFIX says "no prefix" in so many words.
		t.prefix = p
	case noPrefix:
		t.prefix = ""
	}
	t.fenceRetention = dlock.DefaultFenceRetention
	s, from := f.fenceRetention, "--fence-retention"
	if s == "" {
		s, from = getenv("DLOCK_FENCE_RETENTION"), "DLOCK_FENCE_RETENTION"
	}
	if s != "" {
		d, err := time.ParseDuration(s)
		switch {
		case err != nil && durationSyntax.MatchString(s):
			return nil, fmt.Errorf("bad fence retention %q (from %s): out of range (%s)", s, from, maxDurationText)
		case err != nil:
			return nil, fmt.Errorf("bad fence retention %q (from %s): not a duration; write one such as 1h or 24h, or 0 to keep no fence counters", s, from)
		case d < 0:
			return nil, fmt.Errorf("bad fence retention %q (from %s): negative; write 0 to keep no fence counters", s, from)
		}
		t.fenceRetention = d
	}
	if err := f.applyTLS(t, getenv); err != nil {
		return nil, err
	}
	return t, nil
}

// envBool reads the boolean variable name: unset or empty is false, and
// a value strconv.ParseBool does not read is an error that says to write
// what, such as "1 to ...".
func envBool(getenv func(string) string, name, what string) (bool, error) {
	v := getenv(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("bad %s %q: write %s, or 0 (or leave it unset) for none", name, v, what)
	}
	return b, nil
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// errUnclearUserinfo is the error of a URL that has an '@' after where its
// authority seems to end: a password holding an unencoded '/', '?' or '#'
// looks like that, so the error quotes none of the URL.
var errUnclearUserinfo = errors.New("an '@' after the host; if it ends a user name or password, percent-encode any '/', '?', '#', '@' or '%' in them (as %2F, %3F, %23, %40, %25)")

// errWithheld replaces the error of a URL that could not be parsed when
// the error might quote part of its password (see errUnclearUserinfo).
var errWithheld = errors.New("cannot be parsed (the details are withheld: with an '@' after the host they could show part of a password); percent-encode any '/', '?', '#', '@' or '%' in the user name and password (as %2F, %3F, %23, %40, %25)")

// parseTarget parses a Redis URL: redis://, rediss://, unix://, several
// comma-separated addresses for a cluster, or redis-sentinel:// and
// rediss-sentinel:// (MASTER as the first path segment).
//
// Its errors never quote the URL's password. The user information ends at
// the last '@' of the authority, which ends at the first '/', '?' or '#'; a
// password holding one of those unencoded would end it early and put part
// of the password where a host, a path or a query is expected. So an '@'
// in the path or the fragment is refused, and when the query holds one,
// every error is replaced by errWithheld.
func parseTarget(raw string, cluster bool, master string, getenv func(string) string) (*target, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, errors.New("not a URL; write it as redis://HOST:PORT")
	}
	authority, tail := splitAuthority(rest)
	switch scheme {
	case "unix":
		if cluster || master != "" {
			return nil, errors.New("a unix:// socket is a single server; drop --cluster (DLOCK_CLUSTER) and --sentinel-master")
		}
		// A unix:// URL has no host: one there is more likely a password
		// cut short by a '/'. A socket's path may hold an '@', but not
		// after a user name or password, where it may be the password's.
		if host := authority[strings.LastIndex(authority, "@")+1:]; host != "" && host != "localhost" {
			return nil, errors.New("a unix:// URL names no host; write unix:///path/to/socket, or unix://USER:PASSWORD@/path/to/socket with any '/', '?', '#', '@' or '%' in the user name and password percent-encoded (as %2F, %3F, %23, %40, %25)")
		}
		if strings.Contains(authority, "@") && strings.Contains(tail, "@") {
			return nil, errUnclearUserinfo
		}
		o, err := redis.ParseURL(raw)
		if err != nil {
			return nil, parseError(err)
		}
		if err := checkOptions(o); err != nil {
			return nil, err
		}
		o.Password = or(o.Password, getenv("DLOCK_PASSWORD"))
		return &target{single: o, display: redactURL(raw)}, nil
	case "redis", "rediss", "redis-sentinel", "rediss-sentinel":
	default:
		return nil, fmt.Errorf("unsupported scheme %q; use redis://, rediss://, unix://, redis-sentinel:// or rediss-sentinel://", scheme)
	}
	path, query, _ := strings.Cut(tail, "?")
	path, frag, _ := strings.Cut(path, "#")
	_, qfrag, _ := strings.Cut(query, "#")
	if strings.Contains(path+frag+qfrag, "@") {
		return nil, errUnclearUserinfo
	}
	t, err := parseNetTarget(scheme, authority, tail, cluster, master, getenv)
	if err != nil {
		if hasStrayAt(tail) {
			return nil, errWithheld
		}
		return nil, err
	}
	t.display = redactURL(raw)
	return t, nil
}

// splitAuthority splits what follows "scheme://" into the authority, up
// to the first '/', '?' or '#', and the rest.
func splitAuthority(rest string) (authority, tail string) {
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	return rest[:end], rest[end:]
}

// parseNetTarget parses a URL of a scheme other than unix://, split into
// its authority and what follows it.
func parseNetTarget(scheme, authority, tail string, cluster bool, master string, getenv func(string) string) (*target, error) {
	sentinel := strings.HasSuffix(scheme, "-sentinel")
	base := strings.TrimSuffix(scheme, "-sentinel")

	// Split the authority by hand: net/url does not take several hosts.
	userinfo, hosts := "", authority
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		userinfo, hosts = authority[:i+1], authority[i+1:]
	}
	path, query, _ := strings.Cut(tail, "?")
	path, _, _ = strings.Cut(path, "#") // a fragment means nothing here
	query, _, _ = strings.Cut(query, "#")
	q, err := url.ParseQuery(query)
	if err != nil {
		return nil, fmt.Errorf("bad query: %w", parseError(err))
	}
	sentinelUser, sentinelPass := takeQuery(q, "sentinel_username"), takeQuery(q, "sentinel_password")

	if sentinel {
		segs := strings.FieldsFunc(path, func(r rune) bool { return r == '/' })
		switch {
		case len(segs) == 0 && master == "":
			return nil, fmt.Errorf("no master name; write %s://HOST:PORT/MASTER", scheme)
		case len(segs) > 2:
			return nil, fmt.Errorf("path %q has too many parts; write %s://HOST:PORT/MASTER[/DB]", path, scheme)
		}
		if len(segs) > 0 {
			if master != "" && master != segs[0] {
				return nil, fmt.Errorf("the URL names master %q but --sentinel-master says %q", segs[0], master)
			}
			master, segs = segs[0], segs[1:]
		}
		path = "/" + strings.Join(segs, "/")
	}
	if sentinel || master != "" {
		if cluster {
			return nil, errors.New("--cluster (DLOCK_CLUSTER) and a sentinel URL or --sentinel-master exclude each other")
		}
	}

	var addrs []string
	for _, h := range strings.Split(hosts, ",") {
		if h == "" {
			if hosts == "" {
				h = "127.0.0.1"
			} else {
				return nil, errors.New("an empty address in the comma-separated list")
			}
		}
		port := "6379"
		if master != "" {
			port = "26379" // the sentinels' usual port
		}
		if _, p, err := net.SplitHostPort(h); err != nil {
			if strings.Contains(err.Error(), "missing port") {
				h = net.JoinHostPort(strings.Trim(h, "[]"), port)
			} else {
				return nil, fmt.Errorf("bad address %q: %v", h, err)
			}
		} else if !validPort(p) {
			return nil, fmt.Errorf("bad port %q in address %q: write a number from 1 to 65535", p, h)
		}
		addrs = append(addrs, h)
	}
	// Let go-redis read the user, password, database and options from a
	// one-address form of the URL.
	one := base + "://" + userinfo + addrs[0] + path
	if enc := q.Encode(); enc != "" {
		one += "?" + enc
	}
	o, err := redis.ParseURL(one)
	if err != nil {
		return nil, parseError(err)
	}
	if err := checkOptions(o); err != nil {
		return nil, err
	}
	o.Password = or(o.Password, getenv("DLOCK_PASSWORD"))
	if o.TLSConfig != nil {
		// Verify each connection against the address it dials, unless
		// --tls-server-name says otherwise: with several nodes, the first
		// one's name would be wrong for the others.
		o.TLSConfig.ServerName = ""
	}
	t := &target{}
	switch {
	case master != "":
		t.failover = &redis.FailoverOptions{
			MasterName: master, SentinelAddrs: addrs,
			SentinelUsername: sentinelUser, SentinelPassword: or(sentinelPass, getenv("DLOCK_SENTINEL_PASSWORD")),
			Username: o.Username, Password: o.Password, DB: o.DB, Protocol: o.Protocol, ClientName: o.ClientName,
			MaxRetries: o.MaxRetries, MinRetryBackoff: o.MinRetryBackoff, MaxRetryBackoff: o.MaxRetryBackoff,
			DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout,
			PoolFIFO: o.PoolFIFO, PoolSize: o.PoolSize, PoolTimeout: o.PoolTimeout,
			MinIdleConns: o.MinIdleConns, MaxIdleConns: o.MaxIdleConns, MaxActiveConns: o.MaxActiveConns,
			ConnMaxIdleTime: o.ConnMaxIdleTime, ConnMaxLifetime: o.ConnMaxLifetime, TLSConfig: o.TLSConfig,
		}
	case cluster || len(addrs) > 1:
		if o.DB != 0 {
			return nil, fmt.Errorf("a Redis Cluster has only database 0, not %d; drop the database from the URL", o.DB)
		}
		t.cluster = &redis.ClusterOptions{
			Addrs: addrs, Username: o.Username, Password: o.Password, Protocol: o.Protocol, ClientName: o.ClientName,
			MaxRetries: o.MaxRetries, MinRetryBackoff: o.MinRetryBackoff, MaxRetryBackoff: o.MaxRetryBackoff,
			DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout,
			PoolFIFO: o.PoolFIFO, PoolSize: o.PoolSize, PoolTimeout: o.PoolTimeout,
			MinIdleConns: o.MinIdleConns, MaxIdleConns: o.MaxIdleConns, MaxActiveConns: o.MaxActiveConns,
			ConnMaxIdleTime: o.ConnMaxIdleTime, ConnMaxLifetime: o.ConnMaxLifetime, TLSConfig: o.TLSConfig,
		}
	default:
		t.single = o
	}
	return t, nil
}

// validPort reports whether p is a TCP port one can dial: a number from 1
// to 65535, in digits only.
func validPort(p string) bool {
	if p == "" || strings.Trim(p, "0123456789") != "" {
		return false
	}
	n, err := strconv.Atoi(p)
	return err == nil && n >= 1 && n <= 65535
}

// validClientName reports whether Redis takes name in CLIENT SETNAME:
// printable ASCII without spaces.
func validClientName(name string) bool {
	for i := 0; i < len(name); i++ {
		if name[i] < '!' || name[i] > '~' {
			return false
		}
	}
	return true
}

// maxConns bounds the connection counts of a URL: go-redis makes room for
// pool_size at once, and a huge one ends the process out of memory.
const maxConns = 1 << 16

// checkOptions refuses the values go-redis takes from a URL without a
// word and then panics on (a negative pool_size), sends nothing with
// (max_retries below -1), fails every dial with (a dial_timeout of 0 or
// less), waits forever with (a read_timeout or write_timeout of 0 or
// less: none, so a server that stalls is waited for as long as it
// stalls) or ignores (a negative database), and a client_name the server
// refuses at every connection. -1 is go-redis's "none" for
// max_retries and the backoffs; a duration written as a plain 0 or
// negative number reads as -1ns, that none.
func checkOptions(o *redis.Options) error {
	for _, c := range []struct {
		name string
		n    int
	}{{"pool_size", o.PoolSize}, {"min_idle_conns", o.MinIdleConns}, {"max_idle_conns", o.MaxIdleConns}, {"max_active_conns", o.MaxActiveConns}} {
		if c.n < 0 {
			return fmt.Errorf("%s=%d must not be negative (0, or leaving it out, means go-redis's default)", c.name, c.n)
		}
		if c.n > maxConns {
			return fmt.Errorf("%s=%d is more connections than one process can use; give at most %d", c.name, c.n, maxConns)
		}
	}
	switch {
	case o.MaxRetries < -1:
		return fmt.Errorf("max_retries=%d is out of range: write -1 for no retries, or a count", o.MaxRetries)
	case o.DialTimeout < 0:
		return errors.New("dial_timeout must be a positive duration: with none, every dial fails at once (leave it out for go-redis's default, 5s)")
	case o.ReadTimeout < 0:
		return errors.New("read_timeout must be a positive duration: with none, a request to a server that stalls waits as long as it stalls (leave it out for go-redis's default, 3s)")
	case o.WriteTimeout < 0:
		return errors.New("write_timeout must be a positive duration: with none, a request to a server that stalls waits as long as it stalls (leave it out for the read timeout)")
	case o.MinRetryBackoff < -1:
		return errors.New("min_retry_backoff must not be a negative duration; write 0 for no backoff")
	case o.MaxRetryBackoff < -1:
		return errors.New("max_retry_backoff must not be a negative duration; write 0 for no backoff")
	case o.DB < 0:
		return fmt.Errorf("database %d does not exist: write a number from 0", o.DB)
	case !validClientName(o.ClientName):
		return fmt.Errorf("client_name=%q is not a name Redis takes: use printable ASCII without spaces", o.ClientName)
	}
	return nil
}

// takeQuery removes a parameter go-redis would not know from q.
func takeQuery(q url.Values, name string) string {
	v := q.Get(name)
	q.Del(name)
	return v
}

// parseError turns an error of go-redis's ParseURL, or of net/url, into
// dlock's words: without "redis: ", without the whole URL (password and
// all) that net/url quotes, and without the text of a bad %-escape, which
// may be in the password.
func parseError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var ee url.EscapeError
	if errors.As(err, &ee) {
		return errors.New("a '%' that does not start a %-escape; write a '%' as %25")
	}
	return errors.New(strings.TrimPrefix(err.Error(), "redis: "))
}

// redactURL hides the passwords of a URL that parsed, for messages: the
// one in its user information, which ends at the last '@' of the
// authority, and the sentinel_password of its query.
func redactURL(raw string) string { return redact(raw, false) }

// redactBadURL hides the passwords of a URL that did not parse, whose
// password may hold an unencoded '/', '?' or '#', and so reach past where
// the authority seems to end: it hides all from the first ':' after the
// scheme to the last '@'.
func redactBadURL(raw string) string { return redact(raw, true) }

func redact(raw string, loose bool) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	start := len(scheme) + len("://")
	if !ok { // not a URL, but perhaps one without its scheme
		rest, start = raw, 0
	}
	hidden := make([]bool, len(raw))
	hide := func(from, to int) {
		for i := from; i < to; i++ {
			hidden[i] = true
		}
	}
	authority, tail := splitAuthority(rest)
	at := strings.LastIndex(authority, "@")
	if loose {
		at = strings.LastIndex(rest, "@")
	}
	if colon := strings.IndexByte(rest, ':'); at >= 0 && colon >= 0 && colon < at {
		hide(start+colon+1, start+at)
	}
	// The values of sentinel_password, of any key that names a password
	// (a ?password= other clients take, which go-redis refuses as an
	// unknown option, quoting the URL), and of keys that do not unescape.
	if q := strings.IndexByte(tail, '?'); q >= 0 {
		off := start + len(authority) + q + 1
		query, _, _ := strings.Cut(tail[q+1:], "#")
		for _, p := range strings.Split(query, "&") {
			k, v, _ := strings.Cut(p, "=")
			if key, err := url.QueryUnescape(k); (err != nil || strings.Contains(strings.ToLower(key), "password")) && v != "" {
				hide(off+len(k)+1, off+len(p))
			}
			off += len(p) + 1
		}
	}
	var b strings.Builder
	for i := 0; i < len(raw); i++ {
		if !hidden[i] {
			b.WriteByte(raw[i])
			continue
		}
		b.WriteString("xxxxx")
		for i+1 < len(raw) && hidden[i+1] {
			i++
		}
	}
	return b.String()
}

// hasStrayAt reports whether tail, the part of a URL after its authority,
// holds an '@' outside the values of sentinel_password.
func hasStrayAt(tail string) bool {
	return strings.Contains(redact("x://"+tail, false), "@")
}

// applyTLS adds the CA and client certificate to a TLS connection.
func (f *connFlags) applyTLS(t *target, getenv func(string) string) error {
	ca := or(f.tlsCA, getenv("DLOCK_TLS_CA"))
	cert := or(f.tlsCert, getenv("DLOCK_TLS_CERT"))
	key := or(f.tlsKey, getenv("DLOCK_TLS_KEY"))
	sni := or(f.tlsSNI, getenv("DLOCK_TLS_SERVER_NAME"))
	if ca == "" && cert == "" && key == "" && sni == "" {
		return nil
	}
	var cfg *tls.Config
	switch {
	case t.single != nil:
		cfg = t.single.TLSConfig
	case t.cluster != nil:
		cfg = t.cluster.TLSConfig
	default:
		cfg = t.failover.TLSConfig
	}
	if cfg == nil {
		return fmt.Errorf("TLS settings given for %s, which is not a TLS URL; write rediss:// (or rediss-sentinel://)", t.display)
	}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return fmt.Errorf("reading the CA certificates (--tls-ca): %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("no PEM certificate found in %s (--tls-ca)", ca)
		}
		cfg.RootCAs = pool
	}
	if cert != "" || key != "" {
		if cert == "" {
			return errors.New("--tls-key needs --tls-cert")
		}
		pair, err := tls.LoadX509KeyPair(cert, or(key, cert))
		if err != nil {
			return fmt.Errorf("loading the client certificate (--tls-cert, --tls-key): %v", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	cfg.ServerName = sni
	return nil
}

// childEnv returns env, the environment run gives its command, with the
// connection flags in the variables that stand for them (each replacing
// any there), so that a dlock the command runs reaches the same Redis, and
// the same locks, as run: the variables alone would send it elsewhere.
// The settings that no flag gave pass on as they are, in env already.
// --redis passes on as it was written, with any password in it: moved to
// DLOCK_PASSWORD, a password would go to every other Redis a dlock there
// names without one. An empty --prefix is DLOCK_NO_PREFIX=1, an empty
// DLOCK_PREFIX counting as unset; files are given by absolute path, for a
// command that changes directory.
func (f *connFlags) childEnv(env []string) []string {
	set := map[string]string{}
	var unset []string
	if f.prefixSet {
		if f.prefix == "" {
			set["DLOCK_NO_PREFIX"] = "1"
			unset = append(unset, "DLOCK_PREFIX")
		} else {
			set["DLOCK_PREFIX"] = f.prefix
			unset = append(unset, "DLOCK_NO_PREFIX")
		}
	}
	if f.clusterSet {
		if f.cluster {
			set["DLOCK_CLUSTER"] = "1"
		} else {
			unset = append(unset, "DLOCK_CLUSTER")
		}
	}
	for name, v := range map[string]string{
		"DLOCK_REDIS": f.url, "DLOCK_SENTINEL_MASTER": f.sentinelMaster, "DLOCK_FENCE_RETENTION": f.fenceRetention,
		"DLOCK_TLS_SERVER_NAME": f.tlsSNI,
	} {
		if v != "" {
			set[name] = v
		}
	}
	for name, file := range map[string]string{"DLOCK_TLS_CA": f.tlsCA, "DLOCK_TLS_CERT": f.tlsCert, "DLOCK_TLS_KEY": f.tlsKey} {
		if file != "" {
			if abs, err := filepath.Abs(file); err == nil {
				file = abs
			}
			set[name] = file
		}
	}
	out := make([]string, 0, len(env)+len(set))
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if _, ok := set[name]; !ok && !slices.Contains(unset, name) {
			out = append(out, kv)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(set)) {
		out = append(out, name+"="+set[name])
	}
	return out
}
