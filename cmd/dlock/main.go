// Command dlock runs commands under a distributed lock on Redis and
// inspects the locks held.
//
//	dlock run [flags] NAME -- COMMAND [ARGS...]
//	dlock status [flags] NAME
//	dlock ls [flags] [PATTERN]
//	dlock release --force [flags] NAME
//	dlock version
//
// See `dlock help` and docs/cli.md for the flags, environment variables and
// exit codes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
)

// Exit codes. The child's own code (any, or 128+N when a signal killed
// it) passes through run; the rest are dlock's. They follow sysexits.h
// where one fits, and stay clear of the shells' 126, 127 and 128+N, which
// keep their usual meaning.
const (
	exitOK          = 0
	exitUsage       = 64  // EX_USAGE: bad flags, arguments, URL or name
	exitUnavailable = 69  // EX_UNAVAILABLE: Redis unreachable or failing, for now
	exitInternal    = 70  // EX_SOFTWARE: a failure dlock did not expect
	exitNotObtained = 73  // the lock is held by another (--no-wait, --wait ran out)
	exitDenied      = 78  // EX_CONFIG: Redis refuses us for good (dlock.ErrDenied): a setting to fix
	exitLost        = 74  // the lock was lost while the command ran
	exitCannotExec  = 126 // the command was found but could not be started
	exitNotFound    = 127 // the command was not found
	exitSignal      = 128 // + N: the command (or dlock, while waiting) died of signal N
)

// exitError ends a command with a code and, unless msg is empty, a one-line
// message on stderr.
type exitError struct {
	code int
	msg  string
	down bool // Redis could not be reached (see unreachable)
	busy bool // down, as busy or not ready for a while (see passing), or unable to save (see cannotSave)
	// words say why Redis cannot be used, as a waiting line does (see
	// downWords); "" when unreachable did not make the error.
	words string
}

func (e *exitError) Error() string { return e.msg }

func fail(code int, format string, args ...any) error {
	return &exitError{code: code, msg: fmt.Sprintf(format, args...)}
}

// exitCode ends a command with code and no message: the child's own code.
func exitCode(code int) error { return &exitError{code: code} }

// command is one subcommand.
type command struct {
	name    string
	summary string
	help    string // the body of `dlock NAME --help`, after the usage line
	usage   string // the usage line, after "dlock "
	conn    bool   // takes the connection flags
	flags   func(fs *flag.FlagSet) func(app *app, args []string) error
}

// commands are filled in by init functions, next to their actions, so
// that the actions may refer to their command.
var commands []*command

func init() {
	commands = []*command{runCommand, statusCommand, lsCommand, releaseCommand, versionCommand, helpCommand}
}

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// app is what every command can reach: its streams and environment, and
// the connection settings.
type app struct {
	stdout, stderr io.Writer
	lookupEnv      func(string) (string, bool)
	conn           connFlags
	cmd            *command // the command being run
	argv           []string // run's command, after its `--`
}

func main() {
	// go-redis logs some failures itself; dlock reports what goes wrong in
	// its own words, and keeps stderr to that.
	redis.SetLogger(discardLogger{})
	a := &app{stdout: os.Stdout, stderr: os.Stderr, lookupEnv: os.LookupEnv}
	os.Exit(a.main(os.Args[1:]))
}

type discardLogger struct{}

func (discardLogger) Printf(context.Context, string, ...any) {}

// main runs the command line args and returns the exit code.
func (a *app) main(args []string) int {
	err := a.dispatch(args)
	var ee *exitError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ee):
		if ee.msg != "" {
			fmt.Fprintf(a.stderr, "%s: %s\n", a.progName(), oneLine(ee.msg))
		}
		return ee.code
	default:
		fmt.Fprintf(a.stderr, "%s: %s\n", a.progName(), oneLine(err.Error()))
		return exitInternal
	}
}

func (a *app) progName() string {
	if a.cmd == nil || a.cmd == helpCommand {
		return "dlock"
	}
	return "dlock " + a.cmd.name
}

// oneLine keeps an error message on one line.
func oneLine(s string) string {
	return printable(strings.Join(strings.Fields(s), " "))
}

// printable writes s for a terminal: the characters that are not printable
// (controls, an ESC that would start a terminal sequence, a tab that would
// shift a table's columns) and the bytes that are not UTF-8 (0xff is
// tabwriter's escape) as Go escapes, the rest as they are. Names and
// metadata are anyone's bytes.
func printable(s string) string {
	if utf8.ValidString(s) && strings.IndexFunc(s, notPrintable) < 0 {
		return s
	}
	var b strings.Builder
	for i, r := range s {
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], string(utf8.RuneError)):
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case notPrintable(r):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func notPrintable(r rune) bool { return r != ' ' && !unicode.IsPrint(r) }

func (a *app) dispatch(args []string) error {
	// Connection flags may come before the command name too:
	// dlock --redis URL ls.
	global := flag.NewFlagSet("dlock", flag.ContinueOnError)
	global.SetOutput(io.Discard)
	a.conn.register(global)
	showVersion := global.Bool("version", false, "")
	if err := global.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) || wantsHelp(args) {
			// Asked for help, with a flag it does not know: help.
			return a.helpFlag(global)
		}
		return usage(nil, "%v", flagError(err, args))
	}
	rest := global.Args()
	if *showVersion {
		// --version is version, which takes no arguments: a command after
		// it is a mistake, not one to ignore. The connection flags around
		// it are global, and ignored, as version ignores those before it
		// (an alias may hold them).
		if len(rest) > 0 {
			return usage(versionCommand, "unexpected argument %q after --version", rest[0])
		}
		return printVersion(a.stdout)
	}
	if len(rest) == 0 {
		return usage(nil, "missing the command: run, status, ls, release, version or help")
	}
	a.cmd = lookup(rest[0])
	if a.cmd == nil {
		return noSuchCommand(rest[0])
	}
	fs := flag.NewFlagSet(a.cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if a.cmd.conn {
		a.conn.register(fs)
	}
	action := a.cmd.flags(fs)
	cmdArgs := rest[1:]
	var tail []string // run's command, after "--"
	if a.cmd == runCommand {
		i := indexOf(cmdArgs, "--")
		if i < 0 {
			if wantsHelp(cmdArgs) {
				return a.printHelp(a.stdout, a.cmd)
			}
			return usage(a.cmd, "missing `--` before the command: write dlock run NAME -- COMMAND [ARGS...]")
		}
		cmdArgs, tail = cmdArgs[:i], cmdArgs[i+1:]
	}
	pos, err := parseInterleaved(fs, cmdArgs)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) || wantsHelp(cmdArgs) {
			return a.printHelp(a.stdout, a.cmd)
		}
		return usage(a.cmd, "%v%s", flagError(err, cmdArgs), dashNameHint(a.cmd, err, cmdArgs))
	}
	if a.cmd == runCommand {
		if len(pos) == 0 && len(tail) >= 2 && tail[1] == "--" {
			// dlock run -- NAME -- COMMAND: the first `--` ended the flags,
			// before a NAME (one that starts with '-', say, or `--`
			// itself), as for status.
			pos, tail = tail[:1], tail[2:]
		}
		a.argv = tail
	}
	return action(a, pos)
}

// wantsHelp reports whether args ask for help, before any "--": a help
// flag shows help whatever else is there, a flag not defined among them.
func wantsHelp(args []string) bool {
	for _, s := range args {
		if s == "--" {
			return false
		}
		if s == "-h" || s == "-help" || s == "--help" {
			return true
		}
	}
	return false
}

func indexOf(args []string, s string) int {
	for i, v := range args {
		if v == s {
			return i
		}
	}
	return -1
}

// parseInterleaved parses flags wherever they stand among the positional
// arguments, which it returns in order; everything after a "--" is
// positional.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// flagError rewrites the flag package's errors, which write every flag
// as -name, with the flag as typed in args: -name or --name (--name, as
// the help writes flags, when it is not found there).
func flagError(err error, args []string) error {
	msg := flagName.ReplaceAllStringFunc(err.Error(), func(m string) string {
		sub := flagName.FindStringSubmatch(m)
		typed, _ := typedFlag(sub[2], args)
		return sub[1] + typed
	})
	if strings.HasPrefix(msg, "invalid boolean value ") && strings.HasSuffix(msg, ": parse error") {
		// strconv.ParseBool's error says only that.
		msg = strings.TrimSuffix(msg, "parse error") + "write true or false"
	}
	return errors.New(msg)
}

// flagName matches a flag where the flag package names one: after its
// message's lead, or after the quoted value ("…" for flag -name), never
// inside that value.
var flagName = regexp.MustCompile(`(^flag provided but not defined: |^flag needs an argument: |" for flag |" for )-([^\s:=-][^\s:=]*)`)

// typedFlag finds the flag called name among args, before any "--", and
// returns it as typed, without its value (-name or --name), and the whole
// argument; "--name" and "" when it is not there.
func typedFlag(name string, args []string) (typed, arg string) {
	for _, s := range args {
		if s == "--" {
			break
		}
		rest, ok := strings.CutPrefix(s, "-")
		if !ok {
			continue
		}
		dashes := "-"
		if r, ok := strings.CutPrefix(rest, "-"); ok {
			rest, dashes = r, "--"
		}
		if n, _, _ := strings.Cut(rest, "="); n == name {
			return dashes + name, s
		}
	}
	return "--" + name, ""
}

// dashNameHint is the hint for a flag c does not know that was typed with
// one dash: it may be a name (or ls's pattern) that starts with '-',
// which goes after a "--" of its own.
func dashNameHint(c *command, err error, args []string) string {
	name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -")
	if !ok {
		return ""
	}
	typed, arg := typedFlag(name, args)
	if strings.HasPrefix(typed, "--") || arg == "" {
		return ""
	}
	what, example := "NAME", "dlock "+c.name+" -- "+shellJoin([]string{arg})
	switch c {
	case runCommand:
		example += " -- COMMAND"
	case releaseCommand:
		example = "dlock release --force -- " + shellJoin([]string{arg})
	case lsCommand:
		what = "PATTERN"
	case statusCommand:
	default:
		return ""
	}
	return fmt.Sprintf("; a %s that starts with '-' goes after a `--`: %s", what, example)
}

// durationFlag defines a duration flag whose error says how to write one.
func durationFlag(fs *flag.FlagSet, p *time.Duration, name string) {
	fs.Func(name, "", func(s string) error {
		d, err := time.ParseDuration(s)
		if err != nil {
			return badDuration(s, "500ms, 30s, 5m or 1h")
		}
		*p = d
		return nil
	})
}

// badDuration is the error of s, which time.ParseDuration refused: one
// written as a duration is out of range, anything else is not a duration,
// and examples show how to write one. It is a flag value's: the flag
// package's message quotes s before it.
func badDuration(s, examples string) error {
	if durationSyntax.MatchString(s) {
		return fmt.Errorf("out of range (%s)", maxDurationText)
	}
	return fmt.Errorf("not a duration; write one such as %s", examples)
}

// maxDurationText says how long a duration can be: time.Duration's
// largest, 2562047h47m16.854775807s.
const maxDurationText = "at most 2562047h, about 292 years"

// durationSyntax matches what time.ParseDuration reads as a duration,
// whether or not it fits in one.
var durationSyntax = regexp.MustCompile(`^[-+]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:ns|us|µs|μs|ms|s|m|h))+$`)

// usage returns a bad-usage error that says where to find help.
func usage(c *command, format string, args ...any) error {
	see := "dlock --help"
	if c != nil {
		see = "dlock " + c.name + " --help"
	}
	return fail(exitUsage, "%s (see '%s')", fmt.Sprintf(format, args...), see)
}

// wantName checks that args are one lock name, not empty: an empty one
// is bad usage before any contact with Redis.
func wantName(c *command, args []string) error {
	if err := wantArgs(c, args, 1, 1, "the lock's NAME"); err != nil {
		return err
	}
	if args[0] == "" {
		return usage(c, "the lock's NAME is empty")
	}
	return nil
}

// wantArgs checks the number of positional arguments.
func wantArgs(c *command, args []string, min, max int, what string) error {
	switch {
	case len(args) < min:
		return usage(c, "missing %s", what)
	case len(args) > max:
		return usage(c, "unexpected argument %q", args[max])
	}
	return nil
}
