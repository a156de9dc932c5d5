//go:build unix

package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/dlockio/dlock"
)

// redisReply is an error reply of Redis, as go-redis returns one.
type redisReply string

func (e redisReply) Error() string { return string(e) }
func (redisReply) RedisError()     {}

// exitConsts returns the exit codes main.go names (exitOK, exitUsage, …),
// by their values.
func exitConsts(t *testing.T) map[int]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "main.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	codes := map[int]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || len(vs.Values) != 1 || !strings.HasPrefix(vs.Names[0].Name, "exit") {
			return true
		}
		if lit, ok := vs.Values[0].(*ast.BasicLit); ok && lit.Kind == token.INT {
			n, err := strconv.Atoi(lit.Value)
			if err != nil {
				t.Fatal(err)
			}
			codes[n] = vs.Names[0].Name
		}
		return true
	})
	return codes
}

// helpEntries returns the entries of the exit codes' help, by code: 64,
// 1-255, 128+N.
func helpEntries() map[string]string {
	entries := map[string]string{}
	code := ""
	for _, line := range strings.Split(exitHelp(nil), "\n")[1:] {
		if m := helpCode.FindStringSubmatch(line); m != nil {
			code = m[1]
		} else if !strings.HasPrefix(line, "           ") {
			code = "" // the closing line
		}
		if code != "" {
			entries[code] += " " + strings.TrimSpace(line)
		}
	}
	return entries
}

var helpCode = regexp.MustCompile(`^  (\d+(?:-\d+|\+N)?)\s`)

// docEntries returns the rows of docs/cli.md's table of exit codes, by
// code.
func docEntries(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("../../docs/cli.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(b), "\n## Exit codes\n")
	if !ok {
		t.Fatal("docs/cli.md has no section Exit codes")
	}
	entries := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^\| ([0-9N+–-]+) \| (.*) \|$`).FindAllStringSubmatch(table, -1) {
		entries[strings.ReplaceAll(m[1], "–", "-")] = m[2]
	}
	return entries
}

// The help of run, and docs/cli.md, list every exit code dlock has, and
// no other.
func TestTheExitCodesHelpListsEveryCode(t *testing.T) {
	consts := exitConsts(t)
	if len(consts) < 5 {
		t.Fatalf("found only the exit codes %v in main.go", consts)
	}
	for what, entries := range map[string]map[string]string{"run --help": helpEntries(), "docs/cli.md": docEntries(t)} {
		for code, name := range consts {
			key := strconv.Itoa(code)
			if code == exitSignal {
				key = "128+N"
			}
			if entries[key] == "" {
				t.Errorf("%s does not list %s, %s", what, key, name)
			}
		}
		for key := range entries {
			n, err := strconv.Atoi(key)
			if key != "1-255" && key != "128+N" && (err != nil || consts[n] == "") {
				t.Errorf("%s lists the exit code %s, which main.go does not name", what, key)
			}
		}
	}
}

// Every refusal of Redis that dlock tells apart ends with the code whose
// entry in the help of run, and in docs/cli.md, names it: a replica
// (READONLY) and a Redis that cannot save (MISCONF), which exit with 69,
// were missing from the help, and docs/cli.md named no refusal of a
// cluster (CLUSTERDOWN, TRYAGAIN) or of a replica without its primary
// (MASTERDOWN), 69 too.
func TestTheExitCodesHelpNamesEveryRefusal(t *testing.T) {
	help, docs := helpEntries(), docEntries(t)
	for _, tc := range []struct{ reply, named string }{
		{"BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.", "BUSY"},
		{"LOADING Redis is loading the dataset in memory", "LOADING"},
		{"MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.", "MASTERDOWN"},
		{"CLUSTERDOWN The cluster is down", "CLUSTERDOWN"},
		{"CLUSTERDOWN Hash slot not served", "CLUSTERDOWN"},
		{"TRYAGAIN Multiple keys request during rehashing of slot", "TRYAGAIN"},
		{"OOM command not allowed when used memory > 'maxmemory'.", "OOM"},
		{"READONLY You can't write against a read only replica.", "READONLY"},
		{"MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.", "MISCONF"},
		{"NOPERM this user has no permissions to run the 'evalsha' command", "NOPERM"},
		{"WRONGPASS invalid username-password pair or user is disabled.", "WRONGPASS"},
		{"NOAUTH Authentication required.", "NOAUTH"},
		{"ERR unknown command 'evalsha', with args beginning with: 'x' ", "unknown command"},
	} {
		err := unreachable("redis://h:1", &dlock.ServerError{Key: "dlock:{job}", Err: redisReply(tc.reply)})
		code := strconv.Itoa(err.(*exitError).code)
		for what, entries := range map[string]map[string]string{"run --help": help, "docs/cli.md": docs} {
			if !strings.Contains(entries[code], tc.named) {
				t.Errorf("%q ends with %s, whose entry in %s does not name %s: %s", tc.reply, code, what, tc.named, entries[code])
			}
			for other, entry := range entries {
				if other != code && other != "1-255" && strings.Contains(entry, tc.named) {
					t.Errorf("%q ends with %s, but %s names %s under %s too: %s", tc.reply, code, what, tc.named, other, entry)
				}
			}
		}
	}
}
