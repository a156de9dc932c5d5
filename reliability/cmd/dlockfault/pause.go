package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/dlockio/dlock"
	"github.com/redis/go-redis/v9"
)

// The pause scenario: worker processes (this program, run again in worker
// mode) contend for one lock; when one of them reports that it holds the
// lock and has started acting, the scenario stops it with SIGSTOP, keeps it
// stopped past its TTL until another worker has obtained the lock and
// written to the resource with a newer fence, and continues it with
// SIGCONT. The resumed holder then looks at Done and writes with its old
// fence, which the resource must refuse.
const (
	pauseTTL     = 400 * time.Millisecond
	pauseWorkers = 3
	pauseName    = "nightly"
	pauseMax     = 10 * pauseTTL // resume even if no newer write came
	pauseMin     = 3 * pauseTTL / 2
)

// workerEnv holds a worker process's configuration, as JSON.
const workerEnv = "DLOCKFAULT_WORKER"

type pauseConfig struct {
	ID       int           `json:"id"`
	Lock     string        `json:"lock"`
	Resource string        `json:"resource"`
	Prefix   string        `json:"prefix"`
	TTL      time.Duration `json:"ttl"`
	Work     [2]time.Duration
	Until    int64  `json:"until"`
	MaxHolds int    `json:"max_holds"`
	Seed     uint64 `json:"seed"`
}

// workerEvent is one line a worker process writes on its standard output.
type workerEvent struct {
	Ev    string `json:"ev"` // holding, wrote, hold, failure, early
	PID   int    `json:"pid"`
	Hold  *hold  `json:"hold,omitempty"`
	Write *write `json:"write,omitempty"`
	Msg   string `json:"msg,omitempty"`
}

// isWorker reports whether this process was started as a worker, and if
// so runs it and exits.
func isWorker() {
	spec := os.Getenv(workerEnv)
	if spec == "" {
		return
	}
	var cfg pauseConfig
	if err := json.Unmarshal([]byte(spec), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "dlockfault worker:", err)
		os.Exit(2)
	}
	if err := pauseWorker(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "dlockfault worker:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func pauseWorker(cfg pauseConfig) error {
	out := json.NewEncoder(os.Stdout)
	var outMu sync.Mutex
	emit := func(ev workerEvent) {
		ev.PID = os.Getpid()
		outMu.Lock()
		defer outMu.Unlock()
		_ = out.Encode(ev)
	}
	locks, closeClient := newLockClient(cfg.Lock, cfg.Prefix)
	defer closeClient()
	rdb := redis.NewClient(&redis.Options{Addr: cfg.Resource})
	defer rdb.Close()
	res := &resource{rdb: rdb, locks: newLocks(rdb)}
	view := redis.NewClient(&redis.Options{Addr: cfg.Lock})
	defer view.Close()
	rec := newRecorder()
	f := &fleet{rec: rec, res: res, view: view, prefix: cfg.Prefix}
	r := rand.New(rand.NewPCG(cfg.Seed, uint64(cfg.ID)))
	ctx := context.Background()
	until := time.Unix(0, cfg.Until)

	for n := 0; n < cfg.MaxHolds && time.Now().Before(until); n++ {
		id := fmt.Sprintf("p%d#%d", cfg.ID, n)
		sent := time.Now()
		actx, cancel := context.WithTimeout(ctx, 4*cfg.TTL)
		l, err := locks.Lock(actx, pauseName, dlock.WithTTL(cfg.TTL), dlock.WithAutoRefresh(), dlock.WithMetadata(id))
		cancel()
		granted := time.Now()
		if err != nil {
			emit(workerEvent{Ev: "acquire", Msg: err.Error()})
			continue
		}
		emit(workerEvent{Ev: "acquire"})
		h := &hold{ID: id, Worker: cfg.ID, Name: pauseName, Fence: l.Fence(), Sent: sent.UnixNano(), Grant: granted.UnixNano(), Since: granted.UnixNano()}
		if since, ok := f.checkHeld(ctx, locks, l, h, "Lock returned it"); ok {
			h.Since = since
		}
		h.Enter, _, _ = res.mark(ctx)
		emit(workerEvent{Ev: "holding", Hold: h})

		work := time.NewTimer(between(r, cfg.Work))
		select {
		case <-work.C:
		case <-l.Done():
			h.DoneAt = time.Now().UnixNano()
		}
		work.Stop()
		// A stopped worker gets here when it is continued.
		if h.DoneAt == 0 {
			if isClosed(l.Done()) {
				h.DoneAt = time.Now().UnixNano()
			} else if !time.Now().Before(l.Deadline()) {
				h.DoneLate = true
			}
		}
		if h.DoneAt == 0 && !h.DoneLate {
			f.checkHeld(ctx, locks, l, h, "before its write")
		}
		// Write whether or not the lease has ended: the fence decides.
		late := h.DoneAt != 0 || h.DoneLate
		value := id
		if late {
			value += "/late"
		}
		result, err := res.write(ctx, pauseName, h.Fence, value)
		w := write{Hold: id, Value: value, Fence: h.Fence, Result: result, Late: late}
		if err != nil && result == "error" {
			w.Err = err.Error()
		}
		emit(workerEvent{Ev: "wrote", Write: &w})
		h.Exit, h.ExitAt, _ = res.mark(ctx)
		f.release(ctx, locks, l, h, cfg.TTL)
		h.Deadline = l.Deadline().UnixNano()
		emit(workerEvent{Ev: "hold", Hold: h})
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, m := range rec.unreported {
		emit(workerEvent{Ev: "failure", Msg: m})
	}
	for _, m := range rec.early {
		emit(workerEvent{Ev: "early", Msg: m})
	}
	for _, n := range rec.notHeld {
		emit(workerEvent{Ev: "early", Msg: n.msg})
	}
	for _, m := range rec.kept {
		emit(workerEvent{Ev: "kept", Msg: m})
	}
	for k, n := range rec.errs {
		emit(workerEvent{Ev: "error", Msg: fmt.Sprintf("%d× %s", n, k)})
	}
	return nil
}

// pauseRec is one SIGSTOP … SIGCONT of a worker.
type pauseRec struct {
	pid          int
	hold         string
	fence        uint64
	stop, resume time.Time
	newerWrite   bool // another worker wrote with a newer fence meanwhile
}

func runPause(cfg config) *result {
	r := &result{key: "pause", title: "Process pauses", short: "holders stopped (SIGSTOP) past their TTL"}
	dur := cfg.pick(40*time.Second, 6*time.Second)
	target := cfg.pickInt(20, 3)
	if cfg.pauses > 0 {
		target, dur = cfg.pauses, time.Duration(cfg.pauses)*2*time.Second
	}
	r.injected = fmt.Sprintf("SIGSTOP of the worker process that holds the lock, as soon as it reports acting; SIGCONT once another "+
		"worker has written to the resource with a newer fence, at least %v and at most %v later (TTL %v); up to %d pauses",
		pauseMin, pauseMax, pauseTTL, target)
	r.setup = fmt.Sprintf("%d worker processes contend for one lock (Lock, WithTTL(%v), WithAutoRefresh), each acting %v–%v under it; "+
		"after its work a worker looks at Done and then writes with its fence whatever it saw, so a resumed holder's write reaches "+
		"the resource; %v", pauseWorkers, pauseTTL, pauseTTL/4, 3*pauseTTL/4, dur)
	start := time.Now()
	defer func() { r.took = time.Since(start) }()

	lockSrv, err := startServer()
	if err != nil {
		r.err = err
		return r
	}
	defer lockSrv.stop()
	res, err := startResource()
	if err != nil {
		r.err = err
		return r
	}
	defer res.close()
	self, err := os.Executable()
	if err != nil {
		r.err = err
		return r
	}

	prefix := "dlock:"
	until := time.Now().Add(dur)
	type line struct {
		ev  workerEvent
		eof bool
	}
	events := make(chan line, 256)
	var procs []*exec.Cmd
	stderr := make([]*bytes.Buffer, pauseWorkers)
	var readers sync.WaitGroup
	for i := range pauseWorkers {
		spec, _ := json.Marshal(pauseConfig{ID: i + 1, Lock: lockSrv.addr(), Resource: res.srv.addr(), Prefix: prefix, TTL: pauseTTL,
			Work: [2]time.Duration{pauseTTL / 4, 3 * pauseTTL / 4}, Until: until.UnixNano(), MaxHolds: 1000, Seed: cfg.seed})
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), workerEnv+"="+string(spec))
		cmd.SysProcAttr = workerProcAttr()
		stderr[i] = new(bytes.Buffer)
		cmd.Stderr = stderr[i]
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			r.err = err
			break
		}
		if err := cmd.Start(); err != nil {
			r.err = err
			break
		}
		procs = append(procs, cmd)
		readers.Add(1)
		go func(out io.Reader) {
			defer readers.Done()
			sc := bufio.NewScanner(out)
			sc.Buffer(make([]byte, 1<<16), 1<<20)
			for sc.Scan() {
				var ev workerEvent
				if json.Unmarshal(sc.Bytes(), &ev) == nil {
					events <- line{ev: ev}
				}
			}
			events <- line{eof: true}
		}(stdout)
	}
	defer func() {
		for _, p := range procs { // only ours, by PID
			_ = p.Process.Signal(syscall.SIGCONT)
			_ = p.Process.Kill()
			_ = p.Wait()
		}
	}()

	rec := newRecorder()
	var pauses []*pauseRec
	var cur *pauseRec
	var lastResume time.Time
	byPID := map[int]*exec.Cmd{}
	for _, p := range procs {
		byPID[p.Process.Pid] = p
	}
	resume := func() {
		if err := byPID[cur.pid].Process.Signal(syscall.SIGCONT); err != nil && r.err == nil {
			r.err = fmt.Errorf("SIGCONT %d: %w", cur.pid, err)
		}
		cur.resume, lastResume = time.Now(), time.Now()
		cur = nil
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	hardStop := time.After(dur + time.Minute)
	for open := len(procs); open > 0; {
		select {
		case l := <-events:
			if l.eof {
				open--
				continue
			}
			ev := l.ev
			switch ev.Ev {
			case "acquire":
				if ev.Msg == "" {
					rec.acquired(nil)
				} else {
					rec.acquired(fmt.Errorf("%w: %s", dlock.ErrNotObtained, ev.Msg))
				}
			case "holding":
				if cur == nil && len(pauses) < target && time.Since(lastResume) > 2*pauseTTL && time.Now().Before(until.Add(-pauseMax)) {
					if err := byPID[ev.PID].Process.Signal(syscall.SIGSTOP); err == nil {
						cur = &pauseRec{pid: ev.PID, hold: ev.Hold.ID, fence: ev.Hold.Fence, stop: time.Now()}
						pauses = append(pauses, cur)
					}
				}
			case "wrote":
				rec.wrote(*ev.Write)
				if cur != nil && ev.PID != cur.pid && ev.Write.Result == "ok" && ev.Write.Fence > cur.fence {
					cur.newerWrite = true
				}
			case "hold":
				rec.addHold(ev.Hold)
				switch ev.Hold.End {
				case "released":
					rec.released(nil)
				case "not held":
					rec.released(dlock.ErrNotHeld)
				default:
					rec.released(errors.New("release failed"))
				}
			case "failure":
				rec.failure("%s", ev.Msg)
			case "early":
				rec.earlyLoss("%s", ev.Msg)
			case "kept":
				rec.keptAlive("%s", ev.Msg)
			}
		case <-tick.C:
			if cur != nil && (cur.newerWrite && time.Since(cur.stop) >= pauseMin || time.Since(cur.stop) >= pauseMax) {
				resume()
			}
		case <-hardStop:
			r.err = fmt.Errorf("worker processes still running %v after the scenario's end; killed", time.Minute)
			open = 0
		}
	}
	if cur != nil {
		resume()
	}
	readers.Wait()
	for i, p := range procs {
		if err := p.Wait(); err != nil && r.err == nil {
			r.err = fmt.Errorf("worker %d: %v: %s", i+1, err, stderr[i].String())
		}
	}
	procs = nil
	r.pauseFigures(rec, pauses)
	r.finish(rec, res, nil, nil, lockSrv.addr(), prefix, pauseTTL+leakMargin)
	return r
}

// pauseFigures marks the paused holds and reports what their holders saw
// and what became of their writes.
func (r *result) pauseFigures(rec *recorder, pauses []*pauseRec) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	holds := map[string]*hold{}
	for _, h := range rec.holds {
		holds[h.ID] = h
	}
	writes := map[string]write{}
	for _, w := range rec.writes {
		writes[w.Hold] = w
	}
	var missed, doneFired, doneLate, refused, accepted, newer int
	var lengths []time.Duration
	for _, p := range pauses {
		h := holds[p.hold]
		if h == nil || h.ExitAt < p.stop.UnixNano() {
			missed++ // the worker had finished acting before the signal landed
			continue
		}
		h.Paused = true
		lengths = append(lengths, p.resume.Sub(p.stop))
		if p.newerWrite {
			newer++
		}
		switch {
		case h.DoneAt != 0:
			doneFired++
		case h.DoneLate:
			doneLate++
		}
		switch writes[h.ID].Result {
		case "stale":
			refused++
		case "ok":
			accepted++
		}
	}
	paused := len(pauses) - missed
	r.figure("holders paused while acting", fmt.Sprintf("%d (stopped %s)", paused, spread(lengths)))
	r.figure("… during whose pause another holder wrote with a newer fence", itoa(newer))
	r.figure("… whose Done had closed when they looked after resuming", itoa(doneFired))
	r.figure("… whose deadline had passed but whose Done was still open when they looked", itoa(doneLate))
	for _, p := range pauses {
		if h := holds[p.hold]; h != nil && h.Paused && h.DoneLate {
			r.unreported = append(r.unreported, fmt.Sprintf("%s: resumed after %v stopped, past its deadline, and found Done still open",
				h.ID, p.resume.Sub(p.stop).Round(time.Millisecond)))
		}
	}
	r.figure("… whose write the resource refused as stale", itoa(refused))
	r.figure("… whose write the resource accepted", itoa(accepted))
	if missed > 0 {
		r.figure("pauses that landed after the holder had finished acting (not counted)", itoa(missed))
	}
}
