package main

import (
	"fmt"

	"github.com/anishathalye/porcupine"
)

// The sequential specification that histories of one lock name are checked
// against. The state is who holds the lock (a token, "" when free) and a
// lower bound of the newest fence it has handed out. An acquire succeeds
// only on a free lock, with a fence above every fence handed out before;
// it is refused only while another token holds the lock; release and
// refresh succeed only for the holder, but a release called again after
// one whose outcome is unknown also succeeds, changing nothing, when that
// one ran (it is the same request). Locks do not expire: the runs use
// TTLs far longer than a round.
//
// An operation that returned an error may or may not have taken effect,
// at any moment from its call until the end of the round (its request may
// still have been on its way): it is recorded with the round's end as its
// return, and the model lets it either happen or not. An acquire whose
// outcome is unknown is followed by dlock's cleanup, a release with the
// same token, recorded the same way.

type lockState struct {
	holder string
	fence  uint64
}

type lockInput struct {
	Op     string `json:"op"` // acquire, release, release again, refresh, cleanup
	Name   string `json:"name"`
	Token  string `json:"token"`
	Client int    `json:"client"`
}

type lockOutput struct {
	Result string `json:"result"` // ok, held (acquire refused), not held, unknown
	Fence  uint64 `json:"fence,omitempty"`
}

func stepLock(state, input, output any) []any {
	s, in, out := state.(lockState), input.(lockInput), output.(lockOutput)
	switch in.Op {
	case "acquire":
		switch out.Result {
		case "ok":
			if s.holder == "" && out.Fence > s.fence {
				return []any{lockState{holder: in.Token, fence: out.Fence}}
			}
		case "held":
			if s.holder != "" && s.holder != in.Token {
				return []any{s}
			}
		case "unknown":
			if s.holder == "" {
				return []any{s, lockState{holder: in.Token, fence: s.fence}}
			}
			return []any{s}
		}
	case "release", "release again", "cleanup":
		switch out.Result {
		case "ok":
			if s.holder == in.Token {
				return []any{lockState{fence: s.fence}}
			}
			if in.Op == "release again" {
				// The same request as an earlier release whose outcome is
				// unknown: it answers ok, changing nothing, when that one ran.
				return []any{s}
			}
		case "not held":
			if s.holder != in.Token {
				return []any{s}
			}
		case "unknown":
			if s.holder == in.Token {
				return []any{s, lockState{fence: s.fence}}
			}
			return []any{s}
		}
	case "refresh":
		switch out.Result {
		case "ok":
			if s.holder == in.Token {
				return []any{s}
			}
		case "not held":
			if s.holder != in.Token {
				return []any{s}
			}
		case "unknown":
			return []any{s}
		}
	}
	return nil
}

// lockModel partitions a history by lock name and checks each name alone.
var lockModel = (&porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byName := map[string][]porcupine.Operation{}
		var names []string
		for _, op := range history {
			n := op.Input.(lockInput).Name
			if _, ok := byName[n]; !ok {
				names = append(names, n)
			}
			byName[n] = append(byName[n], op)
		}
		out := make([][]porcupine.Operation, 0, len(names))
		for _, n := range names {
			out = append(out, byName[n])
		}
		return out
	},
	Init: func() []any { return []any{lockState{}} },
	Step: stepLock,
	Equal: func(a, b any) bool {
		return a.(lockState) == b.(lockState)
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(lockInput), output.(lockOutput)
		s := fmt.Sprintf("%s(%s) → %s", in.Op, short(in.Token), out.Result)
		if out.Fence != 0 {
			s += fmt.Sprintf(" fence %d", out.Fence)
		}
		return s
	},
	DescribeState: func(state any) string {
		s := state.(lockState)
		if s.holder == "" {
			return fmt.Sprintf("free (fence ≥ %d)", s.fence)
		}
		return fmt.Sprintf("held by %s (fence ≥ %d)", short(s.holder), s.fence)
	},
}).ToModel()

func short(token string) string {
	if len(token) > 6 {
		return token[:6]
	}
	return token
}
