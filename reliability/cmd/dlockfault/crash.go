package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The crash scenarios: workers contend for locks on one Redis server that
// is killed (SIGKILL) and restarted on the same port again and again, once
// without persistence (every lock is lost) and once with an append-only
// file synced on every write (locks survive, and may expire while it is
// down).
const (
	crashTTL      = time.Second
	crashWorkers  = 4
	crashMaxHolds = 5000
)

var crashNames = []string{"report", "invoice"}

func runCrash(cfg config, persistent bool) *result {
	variant, args := "no persistence", []string(nil)
	if persistent {
		variant, args = "AOF, appendfsync always", []string{"--appendonly", "yes", "--appendfsync", "always"}
	}
	r := &result{key: "crash/" + map[bool]string{false: "volatile", true: "aof"}[persistent], title: "Redis crash and restart: " + variant,
		short: "Redis killed and restarted, " + variant}
	dur := cfg.pick(35*time.Second, 4*time.Second)
	gap := [2]time.Duration{2 * time.Second, 4 * time.Second}
	down := [2]time.Duration{50 * time.Millisecond, 3 * crashTTL / 2}
	if cfg.quick {
		gap = [2]time.Duration{time.Second, 2 * time.Second}
	}
	r.injected = fmt.Sprintf("SIGKILL of the Redis server every %v–%v, restarted on the same port (same directory) after %v–%v; %s",
		gap[0], gap[1], down[0], down[1], variant)
	r.setup = fmt.Sprintf("%d workers contend for %d locks (Lock, WithTTL(%v), WithAutoRefresh), each acting %v–%v under a lock, one time in three %v–%v, "+
		"and writing to the fenced resource (a separate server that is never killed); %v",
		crashWorkers, len(crashNames), crashTTL, crashTTL/50, crashTTL/5, crashTTL/2, 2*crashTTL, dur)
	start := time.Now()
	defer func() { r.took = time.Since(start) }()

	lockSrv, err := startServer(args...)
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
	view := redis.NewClient(&redis.Options{Addr: lockSrv.addr(), MaxRetries: -1})
	defer view.Close()

	prefix := "dlock:"
	rec := newRecorder()
	restarts := &restartLog{persistent: persistent}
	f := &fleet{rec: rec, res: res, view: view, prefix: prefix, restarts: restarts}
	until := time.Now().Add(dur)
	ctx, cancel := context.WithTimeout(context.Background(), dur+time.Minute)
	defer cancel()

	var workers sync.WaitGroup
	for i := range crashWorkers {
		w := workerSpec{id: i + 1, addr: lockSrv.addr(), names: crashNames, ttl: crashTTL, work: [2]time.Duration{crashTTL / 50, crashTTL / 5}, long: [2]time.Duration{crashTTL / 2, 2 * crashTTL},
			until: until, maxHolds: crashMaxHolds, lateWrite: true}
		workers.Add(1)
		go func() {
			defer workers.Done()
			f.run(ctx, w, cfg.seed)
		}()
	}
	rng := rand.New(rand.NewPCG(cfg.seed, 0xc7a5))
	for time.Sleep(between(rng, gap)); time.Now().Add(down[1]).Before(until); time.Sleep(between(rng, gap)) {
		restarts.killing()
		if err := lockSrv.restart(between(rng, down)); err != nil {
			r.err = err
			break
		}
		restarts.up()
	}
	workers.Wait()
	r.finish(rec, res, restarts, nil, lockSrv.addr(), prefix, crashTTL+leakMargin)
	r.crashFigures(rec, restarts)
	r.notes = append(r.notes, "How soon a holder is back after a restart depends on the client as much as on dlock: "+
		"once as many dials as its pool size have failed, go-redis v9.7.3 fails every command at once and dials again only "+
		"once a second (internal/pool, tryDial), so a client may stay cut off for up to a second after Redis is back, "+
		"and locks whose TTL is not much longer than that are lost across even a short restart.")
	return r
}

// crashFigures reports what became of the holds that spanned a restart:
// how their holders learned of it.
func (r *result) crashFigures(rec *recorder, restarts *restartLog) {
	events := restarts.list()
	rec.mu.Lock()
	holds := append([]*hold(nil), rec.holds...)
	rec.mu.Unlock()
	var spanned, byDone, byRelease, kept, failed int
	var notice []time.Duration
	for _, h := range holds {
		var up int64
		for _, e := range events {
			if e[0] > h.Since && e[0] < h.ExitAt {
				up = e[1]
			}
		}
		if up == 0 {
			continue
		}
		spanned++
		switch {
		case h.DoneAt != 0:
			byDone++
			if h.DoneAt > up {
				notice = append(notice, time.Duration(h.DoneAt-up))
			}
		case h.End == "not held":
			byRelease++
		case h.End == "released":
			kept++
		default:
			failed++
		}
	}
	downs := make([]time.Duration, len(events))
	for i, e := range events {
		downs[i] = time.Duration(e[1] - e[0])
	}
	r.figure("restarts", fmt.Sprintf("%d (down %s)", len(events), spread(downs)))
	r.figure("holds that spanned a restart", itoa(spanned))
	r.figure("… whose holder saw Done close (lock lost)", itoa(byDone))
	r.figure("… whose Release then said ErrNotHeld", itoa(byRelease))
	r.figure("… kept through the restart and released normally", itoa(kept))
	if failed > 0 {
		r.figure("… whose Release failed with an error", itoa(failed))
	}
	if len(notice) > 0 {
		r.figure("Done closed after the server was back up, within", spread(notice))
	}
}

// spread renders the least, median and greatest of ds.
func spread(ds []time.Duration) string {
	if len(ds) == 0 {
		return "–"
	}
	ds = append([]time.Duration(nil), ds...)
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	rd := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	if len(ds) == 1 {
		return rd(ds[0]).String()
	}
	return fmt.Sprintf("%v–%v, median %v", rd(ds[0]), rd(ds[len(ds)-1]), rd(ds[len(ds)/2]))
}
