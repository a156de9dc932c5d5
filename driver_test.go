package dlock_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/friend"
)

// TestEvalAgainSendsEachScriptOnceARound: of calls answered NOSCRIPT, the
// first of each script goes again by EVAL and the others by EVALSHA
// behind it, a call alone by EVAL; a server that forgets the scripts
// between rounds (SCRIPT FLUSH again and again) has them go again so, for
// 16 rounds at most, the last all by EVAL. Calls by FCALL never go by EVAL
// here.
func TestEvalAgainSendsEachScriptOnceARound(t *testing.T) {
	a, b := dlock.NewScript("a", "return 1"), dlock.NewScript("b", "return 2")
	fn := dlock.NewScript("f", "return 3")
	fn.Function = "dlock_f"
	calls := []*dlock.Call{{Script: a}, {Script: b}, {Script: a}, {Script: fn, Lib: &dlock.Library{}}, {Script: b}, {Script: a}}
	var rounds [][]bool
	err := dlock.EvalAgain(calls, func(calls []*dlock.Call, byEval []bool) error {
		rounds = append(rounds, append([]bool(nil), byEval...))
		for i, c := range calls {
			if byEval[i] || c.Lib != nil {
				c.Val, c.Err = int64(1), nil
			} else {
				c.Val, c.Err = nil, errors.New("NOSCRIPT No matching script") // flushed since the EVAL
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rounds) != 3 {
		t.Fatalf("%d rounds, want 3", len(rounds))
	}
	if got, want := rounds[0], []bool{true, true, false, false, false, false}; !slices.Equal(got, want) {
		t.Errorf("first round by EVAL: %v, want %v", got, want)
	}
	if got, want := rounds[1], []bool{true, true, false}; !slices.Equal(got, want) { // a, b, a
		t.Errorf("second round by EVAL: %v, want %v", got, want)
	}
	if got, want := rounds[2], []bool{true}; !slices.Equal(got, want) { // the last a, alone: by EVAL
		t.Errorf("third round by EVAL: %v, want %v", got, want)
	}
	for i, c := range calls {
		if c.Err != nil || c.Val != int64(1) {
			t.Errorf("call %d: Val %v, Err %v", i, c.Val, c.Err)
		}
	}

	// A server that keeps forgetting, with many calls of one script: the
	// last round sends them all by EVAL.
	many := make([]*dlock.Call, 40)
	for i := range many {
		many[i] = &dlock.Call{Script: a}
	}
	rounds = nil
	_ = dlock.EvalAgain(many, func(calls []*dlock.Call, byEval []bool) error {
		rounds = append(rounds, append([]bool(nil), byEval...))
		for i, c := range calls {
			if !byEval[i] {
				c.Err = errors.New("NOSCRIPT No matching script")
			}
		}
		return nil
	})
	if last := rounds[len(rounds)-1]; len(rounds) != 16 || len(last) != 40-15 || slices.Contains(last, false) {
		t.Errorf("%d rounds, the last by EVAL %v; want 16, the last of 25 calls all by EVAL", len(rounds), last)
	}
}

// TestEvalAgainEndsAtAFailedPass: a pass that fails ends the rounds; the
// calls it answered NOSCRIPT, which were to go again, get its error,
// never NOSCRIPT or an empty reply.
func TestEvalAgainEndsAtAFailedPass(t *testing.T) {
	a := dlock.NewScript("a", "return 1")
	calls := []*dlock.Call{{Script: a}, {Script: a}, {Script: a}}
	failed := errors.New("WAIT: i/o timeout")
	passes := 0
	err := dlock.EvalAgain(calls, func(calls []*dlock.Call, byEval []bool) error {
		passes++
		for i, c := range calls {
			if byEval[i] {
				c.Val, c.Err = int64(1), nil
			} else {
				c.Val, c.Err = nil, errors.New("NOSCRIPT No matching script")
			}
		}
		return failed
	})
	if err != failed || passes != 1 {
		t.Fatalf("EvalAgain returned %v after %d passes; want %v after 1", err, passes, failed)
	}
	if calls[0].Err != nil || calls[0].Val != int64(1) {
		t.Errorf("the call that ran: Val %v, Err %v", calls[0].Val, calls[0].Err)
	}
	for _, c := range calls[1:] {
		if c.Err != failed || c.Val != nil {
			t.Errorf("a call not sent again: Val %v, Err %v; want the pass's error", c.Val, c.Err)
		}
	}
}

// TestAScriptIsSentByItsFieldsOfTheMoment: the drivers send a script's
// SHA1 and function name boxed once (friend.ScriptArg), and a Script whose
// fields changed since, or that was made without NewScript, is sent by
// its fields as they are.
func TestAScriptIsSentByItsFieldsOfTheMoment(t *testing.T) {
	s := dlock.NewScript("a", "return 1")
	check := func(function bool, want string) {
		t.Helper()
		if got, _ := friend.ScriptArg(s, function).(string); got != want {
			t.Errorf("ScriptArg(%q, %v) = %q, want %q", s.Name, function, got, want)
		}
	}
	check(false, s.SHA1)
	s.SHA1 = dlock.NewScript("b", "return 2").SHA1
	check(false, s.SHA1)
	check(true, "")
	s.Function = "dlock_a"
	check(true, "dlock_a")
	s = &dlock.Script{Name: "c", Src: "return 3", SHA1: "e2b7f7b7b7c7d7b7b7b7b7b7b7b7b7b7b7b7b7b7", Function: "dlock_c"}
	check(false, s.SHA1)
	check(true, "dlock_c")
}
