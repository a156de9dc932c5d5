package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

var helpCommand = new(command)

func init() {
	*helpCommand = command{
		name:    "help",
		summary: "show the help of a command",
		usage:   "help [COMMAND]",
		help: `Shows the help of COMMAND, or the overview. So do dlock --help [COMMAND]
and dlock COMMAND --help.

Examples:
  dlock help
  dlock help run
`,
		flags: func(fs *flag.FlagSet) func(*app, []string) error {
			return func(a *app, args []string) error {
				if err := wantArgs(helpCommand, args, 0, 1, "command"); err != nil {
					return err
				}
				if len(args) == 0 {
					return a.printTopHelp(a.stdout)
				}
				return a.helpOf(args[0])
			}
		},
	}
}

// helpOf writes the help of the command called name; one dlock does not
// have is bad usage.
func (a *app) helpOf(name string) error {
	c := lookup(name)
	if c == nil {
		return noSuchCommand(name)
	}
	return a.printHelp(a.stdout, c)
}

// noSuchCommand is the bad usage of naming a command dlock does not have.
func noSuchCommand(name string) error {
	return usage(nil, "unknown command %q; the commands are run, status, ls, release, version and help", name)
}

// helpFlag answers `dlock [FLAGS] --help [FLAGS] [COMMAND [ARGS...]]`,
// once global has stopped at the --help (or -h), or at a flag it does not
// know beside one: the help of COMMAND, as `dlock help COMMAND` and
// `dlock COMMAND --help` show it, else the overview. The flags up to
// COMMAND are read to find it (one that does not parse is passed over, as
// a single argument); what follows COMMAND is not read, as
// `dlock COMMAND --help ARGS...` reads none of ARGS.
func (a *app) helpFlag(global *flag.FlagSet) error {
	for {
		// A flag it does not know, or another help flag, is passed over
		// (the flag package has taken it off Args): help is what was asked.
		if err := global.Parse(global.Args()); err == nil {
			break
		}
	}
	rest := global.Args()
	if len(rest) == 0 {
		return a.printTopHelp(a.stdout)
	}
	return a.helpOf(rest[0])
}

const connHelp = `Connection flags (every command but version; also accepted before the command):
  --redis URL              the Redis deployment; default $DLOCK_REDIS, else redis://127.0.0.1:6379
                             redis://[USER[:PASSWORD]@]HOST:PORT[/DB]      one server
                             rediss://...                                  the same over TLS
                             unix://[USER[:PASSWORD]@]/PATH/TO.sock[?db=N]  a Unix socket
                             redis://HOST:PORT,HOST:PORT,...               a Redis Cluster (its seed nodes)
                             redis-sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB]
                                                                           the primary named MASTER, found
                                                                           through these sentinels
                                                                           (rediss-sentinel:// for TLS)
                           go-redis options may follow as a query, such as ?dial_timeout=2s
  --cluster                treat a single address as a seed of a Redis Cluster ($DLOCK_CLUSTER=1)
  --sentinel-master NAME   the addresses are sentinels; connect to the primary they call NAME
                           ($DLOCK_SENTINEL_MASTER)
  --prefix PREFIX          the key prefix, as dlock.WithPrefix; default $DLOCK_PREFIX, else "dlock:"
                           (only --prefix '' or DLOCK_NO_PREFIX=1 gives an empty prefix)
  --fence-retention D      how long a name's fence counter is kept after its last fence, as
                           dlock.WithFenceRetention; 0 keeps none ($DLOCK_FENCE_RETENTION;
                           default 24h). Use the same as the services that lock those names
  --tls-ca FILE            PEM CA certificates to verify the server with ($DLOCK_TLS_CA)
  --tls-cert FILE          PEM client certificate, for servers that ask for one ($DLOCK_TLS_CERT)
  --tls-key FILE           PEM key of --tls-cert ($DLOCK_TLS_KEY)
  --tls-server-name NAME   the name to verify the server's certificate against (default: the
                           host of each address dialled; $DLOCK_TLS_SERVER_NAME)
`

const envHelp = `Environment:
  DLOCK_REDIS              the Redis URL, when --redis is not given
  DLOCK_PASSWORD           the Redis password, when the URL has none (keeps it out of ps and history)
  DLOCK_SENTINEL_PASSWORD  the sentinels' password, when they need one
  DLOCK_PREFIX             the key prefix, when --prefix is not given (empty counts as unset)
  DLOCK_NO_PREFIX=1        an empty key prefix, when --prefix is not given (as --prefix '')
  DLOCK_CLUSTER=1          as --cluster, when --cluster is not given
  DLOCK_SENTINEL_MASTER, DLOCK_FENCE_RETENTION, DLOCK_TLS_CA, DLOCK_TLS_CERT,
  DLOCK_TLS_KEY, DLOCK_TLS_SERVER_NAME
                           as the flags of the same names
  run sets DLOCK_NAME, DLOCK_TOKEN and DLOCK_FENCE (0 for --shared and --semaphore)
  for the command it runs, and the variables above for the connection flags
  given to it (--redis as written, with any password in it); the command gets
  the rest of dlock's environment as it is.
`

// exitRows are the exit codes, as the help lists them: all of them in
// the overview and in run's help, and those that are not run's alone in the
// help of the other commands that use Redis (status, ls, release).
var exitRows = []struct {
	text    string // the row: its code and what it means, wrapped
	runOnly bool   // only run exits with it
}{
	{`  0        success; run: the command exited 0
`, false},
	{`  1-255    run: the command's own exit code, passed through whatever it is; it may
           be one of the codes below (an exit 130 looks like SIGINT's): dlock's own
           come with its line on stderr
`, true},
	{`  126      run: the command was found but could not be executed
`, true},
	{`  127      run: the command was not found
`, true},
	{`  128+N    run: the command was killed by signal N (or dlock was, while waiting
           or before the command started); status, ls, release: signal N
           (SIGINT, SIGTERM, SIGHUP, SIGQUIT) stopped it before Redis answered
`, false},
	{`  64       bad usage: a flag, argument, URL or name is wrong (also a name whose key
           holds other data or that another kind of lock uses, a database or
           cluster the server does not have, and a Redis Cluster node given as
           one server, without --cluster); the message says which
`, false},
	{`  69       Redis could not be used, for now: unreachable (also when --wait ran
           out while it failed), busy or not ready (BUSY, LOADING; MASTERDOWN:
           a replica without its primary), a Redis Cluster down or resharding
           (CLUSTERDOWN, TRYAGAIN), full (OOM), a replica, which takes no
           locks (READONLY), unable to save to disk (MISCONF), short of
           replicas (run --replicas N: fewer than N confirmed the lock), or a
           connection closed at once (a TLS port reached without rediss://) or
           left without a TLS handshake (rediss:// to a plain-text port)
`, false},
	{`  70       an unexpected failure
`, false},
	{`  73       run: the lock was not obtained (--no-wait, or --wait ran out)
`, true},
	{`  74       run: the lock was lost while the command ran; the command was stopped
           (or, found lost only once it had exited, was not)
`, true},
	{`  78       Redis refuses dlock for good, a setting to fix (a run gives up at
           once, however long it may wait): a wrong or missing password
           (WRONGPASS, NOAUTH), a missing permission (NOPERM), a command the
           server does not know (ERR unknown command: a sentinel's port, a
           proxy, a command renamed away), a TLS certificate refused
           (--tls-ca, --tls-server-name; --tls-cert and --tls-key for the
           server)
`, false},
}

// exitHelp returns the exit codes' help: for c, those it can exit with;
// for nil, every one.
func exitHelp(c *command) string {
	var b strings.Builder
	b.WriteString("Exit codes:\n")
	for _, r := range exitRows {
		if c == nil || c == runCommand || !r.runOnly {
			b.WriteString(r.text)
		}
	}
	b.WriteString("  When dlock exits with a code of its own it prints one line on stderr saying why.\n")
	return b.String()
}

// printTopHelp writes the overview to w; its error is the write's.
func (a *app) printTopHelp(w io.Writer) error {
	var b strings.Builder
	b.WriteString(`dlock runs commands under a distributed lock on Redis, and inspects the locks.

Usage:
  dlock [CONNECTION FLAGS] COMMAND [FLAGS] [ARGS]

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(&b, "  %-9s %s\n", c.name, c.summary)
	}
	b.WriteString(`
Examples:
  dlock run nightly -- ./nightly-report.sh        run the job, one host at a time
  dlock run --no-wait nightly -- make report      skip the run if another host is at it
  dlock status nightly                            who holds it, since when
  dlock ls 'billing:*'                            every lock under billing:
  DLOCK_REDIS=rediss://locks.internal:6380 DLOCK_PASSWORD=... dlock ls

`)
	b.WriteString(connHelp)
	b.WriteString("\n")
	b.WriteString(envHelp)
	b.WriteString("\n")
	b.WriteString(exitHelp(nil))
	b.WriteString("\nRun 'dlock COMMAND --help' for the flags of a command.\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// printHelp writes the help of c to w; its error is the write's.
func (a *app) printHelp(w io.Writer, c *command) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Usage: dlock %s\n\n", c.usage)
	b.WriteString(c.help)
	if c.conn {
		b.WriteString("\n")
		b.WriteString(connHelp)
		b.WriteString("\n")
		b.WriteString(envHelp)
	}
	if c.conn {
		// The commands that use Redis have codes of their own; help and
		// version have only 0, 64 and 70.
		b.WriteString("\n")
		b.WriteString(exitHelp(c))
	}
	_, err := io.WriteString(w, b.String())
	return err
}
