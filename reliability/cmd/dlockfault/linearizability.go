package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/dlockio/dlock"
	"github.com/redis/go-redis/v9"
)

// The linearizability scenario: workers run TryLock, Refresh and Release on
// a few names, four through the fault proxy and one straight to Redis, in
// one round per kind of network fault. Every call and its answer is
// recorded with its start and end on one clock, and each round's history
// is checked with porcupine against the lock model in model.go.
const (
	linTTL      = 2 * time.Minute // no lock expires during a round
	linFaulted  = 4
	linDirect   = 1
	linMaxOps   = 3000
	linFaultTTL = 400 * time.Millisecond // scales the fault windows
	linSettle   = 2 * time.Second        // after the faults end, for requests still on their way
)

var linNames = []string{"a", "b", "c"}

// linResult is what the linearizability rounds found.
type linResult struct {
	rounds []linRound
}

type linRound struct {
	fault       string
	ops         int
	counts      map[string]int // "acquire ok" …
	unknown     int
	resolved    int      // unknown outcomes settled from the server's record
	contradicts []string // answers the server's record contradicts
	verdict     porcupine.CheckResult
	checked     time.Duration
	saved       string // where a failing history was saved
	leftover    int    // names still held at the end (released by ForceRelease)
	noTTL       int
	err         error
}

func (l *linResult) problems() []string {
	var out []string
	for _, r := range l.rounds {
		switch {
		case r.err != nil:
			out = append(out, fmt.Sprintf("linearizability round %s: %v", r.fault, r.err))
		case r.verdict == porcupine.Illegal:
			out = append(out, fmt.Sprintf("linearizability round %s: history not linearizable, saved to %s", r.fault, r.saved))
		}
		for _, c := range r.contradicts {
			out = append(out, fmt.Sprintf("linearizability round %s: %s", r.fault, c))
		}
		if r.noTTL > 0 {
			out = append(out, fmt.Sprintf("linearizability round %s: %d lock keys without a TTL", r.fault, r.noTTL))
		}
	}
	return out
}

// history records operations on one clock.
type history struct {
	start time.Time
	mu    sync.Mutex
	ops   []porcupine.Operation
}

func (h *history) now() int64 { return time.Since(h.start).Nanoseconds() }

func (h *history) add(in lockInput, call int64, out lockOutput, ret int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if out.Result == "unknown" {
		ret = -1 // set to the round's end
	}
	h.ops = append(h.ops, porcupine.Operation{ClientId: in.Client, Input: in, Call: call, Output: out, Return: ret})
}

func runLinearizability(cfg config) *result {
	r := &result{key: "linearizability", title: "Linearizability", lin: &linResult{}}
	round := cfg.pick(12*time.Second, 1500*time.Millisecond)
	r.injected = "one round per network fault of the network scenarios (latency, cuts, blackhole, partition), " +
		fmt.Sprintf("with windows scaled to %v", linFaultTTL)
	r.setup = fmt.Sprintf("%d workers through the fault proxy and %d straight to Redis run TryLock (WithTTL(%v), a token of their own), "+
		"Refresh and Release on %d names, each call with a deadline of 100–600ms and sent once (go-redis MaxRetries -1); %v per round; "+
		"porcupine checks each name's history",
		linFaulted, linDirect, linTTL, len(linNames), round)
	start := time.Now()
	defer func() { r.took = time.Since(start) }()

	lockSrv, err := startServer()
	if err != nil {
		r.err = err
		return r
	}
	defer lockSrv.stop()
	px, err := newFaultProxy("redis", lockSrv.addr())
	if err != nil {
		r.err = err
		return r
	}
	defer px.close()
	rec := newServerRecord()
	mon, err := startMonitor(lockSrv.addr(), rec.handle)
	if err != nil {
		r.err = err
		return r
	}
	defer mon.close()
	view := redis.NewClient(&redis.Options{Addr: lockSrv.addr()})
	defer view.Close()
	for i, flt := range networkFaults(linFaultTTL) {
		lr := linRunRound(cfg, lockSrv, px, flt, fmt.Sprintf("lin%d:", i), round, func() (*serverRecord, error) {
			return rec, mon.sync(view)
		})
		r.lin.rounds = append(r.lin.rounds, lr)
	}
	return r
}

// linRunRound runs one round; record returns the server's record once it
// holds everything the server ran.
func linRunRound(cfg config, lockSrv *server, px *faultProxy, flt fault, prefix string, dur time.Duration, record func() (*serverRecord, error)) linRound {
	lr := linRound{fault: flt.name, counts: map[string]int{}}
	h := &history{start: time.Now()}
	until := time.Now().Add(dur)
	stop := make(chan struct{})
	var faultErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, faultErr = runFaults(px, flt, until, stop, cfg.seed)
	}()
	var workers sync.WaitGroup
	for i := range linFaulted + linDirect {
		addr := lockSrv.addr()
		if i < linFaulted {
			addr = px.addr()
		}
		workers.Add(1)
		go func() {
			defer workers.Done()
			linWorker(i, addr, prefix, until, h, mrand.New(mrand.NewPCG(cfg.seed, uint64(i))))
		}()
	}
	workers.Wait()
	close(stop)
	wg.Wait()
	time.Sleep(cfg.pick(linSettle, linSettle/2))
	end := h.now()
	if faultErr != nil {
		lr.err = faultErr
		return lr
	}

	h.mu.Lock()
	ops := h.ops
	h.mu.Unlock()
	for i := range ops {
		in, out := ops[i].Input.(lockInput), ops[i].Output.(lockOutput)
		if ops[i].Return < 0 {
			ops[i].Return = end
			lr.unknown++
		}
		lr.counts[in.Op+" "+out.Result]++
	}
	lr.ops = len(ops)
	rec, err := record()
	if err != nil {
		lr.err = err
		return lr
	}
	ops, lr.resolved, lr.contradicts = resolve(ops, rec)
	lr.leftover, lr.noTTL, lr.err = linCleanup(lockSrv.addr(), prefix)

	checkStart := time.Now()
	verdict, info := porcupine.CheckOperationsVerbose(lockModel, ops, cfg.pick(60*time.Second, 15*time.Second))
	lr.checked, lr.verdict = time.Since(checkStart), verdict
	if verdict == porcupine.Illegal {
		lr.saved = saveHistory(cfg.outDir, "linearizability-"+flt.name, ops, info)
	}
	return lr
}

// linWorker runs random operations until the round ends.
func linWorker(id int, addr, prefix string, until time.Time, h *history, r *mrand.Rand) {
	// Every request goes out once: the history is of dlock's calls, not of
	// go-redis sending a script again after a lost reply (which the network
	// scenarios count, and TestReleaseRunTwiceReportsSuccess shows).
	locks, closeClient := newLockClientRetries(addr, prefix, -1)
	defer closeClient()
	held := map[string]*dlock.Lock{}
	// Every Release of one Lock is the same request (it carries the Lock's
	// release id): one called again after an unknown outcome is recorded
	// as "release again", which may answer ok because the first ran.
	releasing := map[*dlock.Lock]bool{}
	releaseOp := func(l *dlock.Lock) string {
		if releasing[l] {
			return "release again"
		}
		return "release"
	}
	for n := 0; n < linMaxOps && time.Now().Before(until); n++ {
		name := linNames[r.IntN(len(linNames))]
		ctx, cancel := context.WithTimeout(context.Background(), between(r, [2]time.Duration{100 * time.Millisecond, 600 * time.Millisecond}))
		if l := held[name]; l != nil {
			in := lockInput{Op: "refresh", Name: name, Token: l.Token(), Client: id}
			call := h.now()
			var err error
			if r.IntN(3) == 0 {
				in.Op = releaseOp(l)
				err = l.Release(ctx)
				releasing[l] = true
			} else {
				err = l.Refresh(ctx, linTTL)
			}
			ret := h.now()
			out := lockOutput{Result: releaseResult(err)}
			if out.Result == "not held" || out.Result == "ok" && isRelease(in.Op) {
				delete(held, name)
			}
			h.add(in, call, out, ret)
		} else {
			token := newToken()
			in := lockInput{Op: "acquire", Name: name, Token: token, Client: id}
			call := h.now()
			l, err := locks.TryLock(ctx, name, dlock.WithTTL(linTTL), dlock.WithToken(token))
			ret := h.now()
			switch {
			case err == nil:
				held[name] = l
				h.add(in, call, lockOutput{Result: "ok", Fence: l.Fence()}, ret)
			case errors.Is(err, dlock.ErrNotObtained) && strings.HasSuffix(err.Error(), " is held"):
				h.add(in, call, lockOutput{Result: "held"}, ret)
			default:
				h.add(in, call, lockOutput{Result: "unknown"}, ret)
				// TryLock released what the attempt may have taken, with a
				// request that may itself have been lost or delayed.
				h.add(lockInput{Op: "cleanup", Name: name, Token: token, Client: id}, call, lockOutput{Result: "unknown"}, ret)
			}
		}
		cancel()
		time.Sleep(time.Duration(r.IntN(10)) * time.Millisecond)
	}
	// Give back what is held, so that only locks taken unseen or whose
	// release was lost remain.
	for name, l := range held {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		in := lockInput{Op: releaseOp(l), Name: name, Token: l.Token(), Client: id}
		call := h.now()
		err := l.Release(ctx)
		ret := h.now()
		cancel()
		h.add(in, call, lockOutput{Result: releaseResult(err)}, ret)
	}
}

// releaseResult is the model's name for what Release or Refresh returned.
func releaseResult(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, dlock.ErrNotHeld):
		return "not held"
	}
	return "unknown"
}

// linCleanup counts the names still held after a round and the lock keys
// without a TTL, then frees every name of the round.
func linCleanup(addr, prefix string) (held, noTTL int, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	c := newLocks(rdb, dlock.WithPrefix(prefix))
	defer c.Close()
	infos, err := c.List(ctx, "*")
	if err != nil {
		return 0, 0, err
	}
	for _, info := range infos {
		held++
		for _, hd := range info.Holders {
			if hd.TTL <= 0 {
				noTTL++
			}
		}
		if _, err := c.ForceRelease(ctx, info.Name); err != nil {
			return held, noTTL, err
		}
	}
	return held, noTTL, nil
}

// saveHistory writes a failing history as porcupine's HTML visualisation
// and as JSON, and returns the HTML file's path.
func saveHistory(dir, name string, ops []porcupine.Operation, info porcupine.LinearizationInfo) string {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "(not saved: " + err.Error() + ")"
	}
	path := filepath.Join(dir, name+".html")
	if err := porcupine.VisualizePath(lockModel, info, path); err != nil {
		return "(not saved: " + err.Error() + ")"
	}
	type op struct {
		Client int        `json:"client"`
		Input  lockInput  `json:"input"`
		Call   int64      `json:"call_ns"`
		Output lockOutput `json:"output"`
		Return int64      `json:"return_ns"`
	}
	out := make([]op, len(ops))
	for i, o := range ops {
		out[i] = op{o.ClientId, o.Input.(lockInput), o.Call, o.Output.(lockOutput), o.Return}
	}
	if b, err := json.MarshalIndent(out, "", " "); err == nil {
		_ = os.WriteFile(filepath.Join(dir, name+".json"), b, 0o644)
	}
	return path
}

// newToken returns 128 random bits, base64url-encoded, as dlock's are.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}
