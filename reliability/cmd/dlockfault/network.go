package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The network scenarios: workers contend for a few locks while a fault
// proxy in front of the lock's Redis server delays, cuts, drops or
// partitions the traffic of half of them; the other half reach the server
// directly and take every lock the faulted half lets go of, so a lock that
// is given up too early, or believed held too long, shows as two holders
// acting at once.
const (
	netTTL      = 500 * time.Millisecond
	netFaulted  = 4 // workers through the proxy
	netDirect   = 4 // workers straight to the server
	netMaxHolds = 5000
)

var netNames = []string{"report", "invoice", "payroll"}

func runNetwork(cfg config, flt fault) *result {
	r := &result{key: "network/" + flt.name, title: "Network: " + flt.name, injected: flt.describe, short: flt.short}
	dur := cfg.pick(40*time.Second, 3*time.Second)
	r.setup = fmt.Sprintf("%d workers through the fault proxy and %d straight to Redis contend for %d locks (Lock, WithTTL(%v), "+
		"WithAutoRefresh), each acting %v–%v under a lock, one time in three %v–%v, and writing to the fenced resource; a holder that sees Done close "+
		"stops acting and then writes anyway, as a late writer would; %v",
		netFaulted, netDirect, len(netNames), netTTL, netTTL/50, netTTL/5, netTTL/2, 2*netTTL, dur)
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
	px, err := newFaultProxy("redis", lockSrv.addr())
	if err != nil {
		r.err = err
		return r
	}
	defer px.close()
	view := redis.NewClient(&redis.Options{Addr: lockSrv.addr()})
	defer view.Close()
	record := newServerRecord()
	mon, err := startMonitor(lockSrv.addr(), record.handle)
	if err != nil {
		r.err = err
		return r
	}
	defer mon.close()

	prefix := "dlock:"
	rec := newRecorder()
	f := &fleet{rec: rec, res: res, view: view, prefix: prefix}
	until := time.Now().Add(dur)
	ctx, cancel := context.WithTimeout(context.Background(), dur+time.Minute)
	defer cancel()

	stop := make(chan struct{})
	var faultErr error
	var faults sync.WaitGroup
	faults.Add(1)
	go func() {
		defer faults.Done()
		r.faults, faultErr = runFaults(px, flt, until, stop, cfg.seed)
	}()
	var workers sync.WaitGroup
	for i := range netFaulted + netDirect {
		addr := lockSrv.addr()
		if i < netFaulted {
			addr = px.addr()
		}
		w := workerSpec{id: i + 1, addr: addr, names: netNames, ttl: netTTL, work: [2]time.Duration{netTTL / 50, netTTL / 5}, long: [2]time.Duration{netTTL / 2, 2 * netTTL},
			until: until, maxHolds: netMaxHolds, lateWrite: true}
		workers.Add(1)
		go func() {
			defer workers.Done()
			f.run(ctx, w, cfg.seed)
		}()
	}
	workers.Wait()
	close(stop)
	faults.Wait()
	if faultErr != nil {
		r.err = faultErr
	}
	if err := mon.sync(view); err != nil {
		r.err = err
	}
	r.finish(rec, res, nil, record, lockSrv.addr(), prefix, netTTL+leakMargin)
	r.figure("fault windows", fmt.Sprintf("%d, %v in all", r.faults.windows, r.faults.total.Round(100*time.Millisecond)))
	return r
}
