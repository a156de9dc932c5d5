package main

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/anishathalye/porcupine"
	"github.com/dlockio/dlock"
)

// serverRecord is what the lock's server ran, read from its MONITOR
// stream: which tokens the acquire script wrote a lock for, with which
// fence, and how many times the release script deleted a lock held with a
// token. A script runs atomically, so the commands it runs follow its own
// EVALSHA (or EVAL, or FCALL of its function under -functions) line in the
// stream.
type serverRecord struct {
	mu       sync.Mutex
	script   string // the script whose commands follow: "acquire", "release" or ""
	token    string // its token
	acquired map[string]uint64
	deleted  map[string]int
}

// scriptNames are dlock's scripts' names by their SHA1.
var scriptNames = func() map[string]string {
	m := map[string]string{}
	for _, sc := range dlock.Scripts() {
		m[sc.SHA1] = sc.Name
	}
	return m
}()

// functionNames are dlock's scripts' names by the names of their functions
// in dlock.FunctionLibrary.
var functionNames = func() map[string]string {
	m := map[string]string{}
	for _, sc := range dlock.Scripts() {
		m[sc.Function] = sc.Name
	}
	return m
}()

func newServerRecord() *serverRecord {
	return &serverRecord{acquired: map[string]uint64{}, deleted: map[string]int{}}
}

func (s *serverRecord) handle(args []string, lua bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !lua {
		s.script, s.token = "", ""
		cmd := strings.ToUpper(args[0])
		if (cmd != "EVALSHA" && cmd != "EVAL" && cmd != "FCALL") || len(args) < 3 {
			return
		}
		n, err := strconv.Atoi(args[2])
		if err != nil || len(args) < 3+n {
			return
		}
		// The scripts are told apart by their SHA1 (EVAL's by its
		// source's), or by their function's name: the first argument of
		// acquire and release is the request token (of the acquisition a
		// release gives up: the token of the hold it made, as the fault
		// suite uses no owners).
		sha := args[1]
		if cmd == "EVAL" {
			sum := sha1.Sum([]byte(args[1]))
			sha = hex.EncodeToString(sum[:])
		}
		name := scriptNames[strings.ToLower(sha)]
		if cmd == "FCALL" {
			name = functionNames[args[1]]
		}
		if (name == "acquire" || name == "release") && len(args) > 3+n {
			s.script, s.token = name, args[3+n]
		}
		return
	}
	if !strings.EqualFold(args[0], "HSET") || s.script == "" {
		return
	}
	var token string
	var fence uint64
	set, made := false, false
	for i := 2; i+1 < len(args); i += 2 {
		switch args[i] {
		case "token":
			token, set = args[i+1], true
		case "fence":
			fence, _ = strconv.ParseUint(args[i+1], 10, 64)
		case "kind":
			made = true
		}
	}
	switch {
	case !set:
	case s.script == "release" && made:
		// A free hash made for a name the acquisition found empty, to
		// record that it ended: nothing was held.
	case s.script == "acquire" && token == s.token:
		s.acquired[token] = fence
	case s.script == "release":
		// Freed: the hash stays, with an empty token; or granted to the
		// waiter whose request token it is now held with.
		s.deleted[s.token]++
		if token != "" {
			s.acquired[token] = fence
		}
	}
}

// deletedBy reports whether the release script deleted a lock held with
// token.
func (s *serverRecord) deletedBy(token string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deleted[token] > 0
}

// resolve settles, from the server's record, the effect of the operations
// that returned an error: an acquire whose token the acquire script wrote
// took effect, with the fence it wrote, and one whose token it never wrote
// did not; a release (or cleanup) of a token that the release script
// deleted took effect, unless another release of that token is known to
// have; one of a token never deleted did not. An operation that took
// effect keeps an uncertain time (until the round's end); one that did not
// is left out. It also returns the answers the record contradicts.
func resolve(ops []porcupine.Operation, rec *serverRecord) (out []porcupine.Operation, resolved int, contradicts []string) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	type group struct{ known, unknown int }
	releases := map[string]*group{}
	for _, op := range ops {
		in, o := op.Input.(lockInput), op.Output.(lockOutput)
		if !isRelease(in.Op) && in.Op != "cleanup" {
			continue
		}
		g := releases[in.Token]
		if g == nil {
			g = &group{}
			releases[in.Token] = g
		}
		switch {
		case o.Result == "ok" && in.Op != "release again":
			// A release called again may answer ok because the first ran:
			// it does not tell that it took effect itself.
			g.known++
		case o.Result == "unknown":
			g.unknown++
		}
	}
	for _, op := range ops {
		in, o := op.Input.(lockInput), op.Output.(lockOutput)
		fence, acquired := rec.acquired[in.Token]
		deleted := rec.deleted[in.Token]
		switch {
		case in.Op == "acquire" && o.Result == "ok" && (!acquired || fence != o.Fence):
			contradicts = append(contradicts, fmt.Sprintf("TryLock of %q returned fence %d, but the server wrote no lock with its token (or another fence)", in.Name, o.Fence))
		case isRelease(in.Op) && o.Result == "ok" && deleted == 0:
			contradicts = append(contradicts, fmt.Sprintf("Release of %q returned nil, but the server never deleted the lock held with its token", in.Name))
		case o.Result != "unknown" || in.Op == "refresh":
		case in.Op == "acquire":
			resolved++
			if !acquired {
				continue
			}
			op.Output = lockOutput{Result: "ok", Fence: fence}
		case isRelease(in.Op) || in.Op == "cleanup":
			g := releases[in.Token]
			switch {
			case deleted == 0 || g.known > 0:
				resolved++
				continue
			case g.unknown == 1:
				resolved++
				op.Output = lockOutput{Result: "ok"}
			}
		}
		out = append(out, op)
	}
	return out, resolved, contradicts
}

// isRelease reports whether op is a Release: the first, or one called again
// on the same Lock.
func isRelease(op string) bool { return op == "release" || op == "release again" }
