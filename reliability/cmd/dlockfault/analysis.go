package main

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/dlockio/dlock"
	"github.com/redis/go-redis/v9"
)

// Why two holders acted at once, when the guarantees page explains it.
const (
	whyPaused  = "the first holder's process was stopped (SIGSTOP) past its TTL"
	whyRestart = "Redis restarted without persistence while the first held the lock"
	whyLate    = "the first holder's deadline had passed before the second obtained the lock; it stopped acting late"
)

// overlap is two holders of one name acting at once on the resource.
type overlap struct {
	a, b *hold // a started acting first
	why  string
}

func (o overlap) String() string {
	ms := func(ns int64) time.Duration { return time.Duration(ns).Round(time.Millisecond) }
	s := fmt.Sprintf("%q: %s (fence %d) and %s (fence %d): ", o.a.Name, o.a.ID, o.a.Fence, o.b.ID, o.b.Fence)
	if d := o.b.Since - o.a.Deadline; d >= 0 {
		s += fmt.Sprintf("the second obtained it %v after the first's deadline", ms(d))
	} else {
		s += fmt.Sprintf("the second obtained it %v before the first's deadline", ms(-d))
	}
	if o.a.ExitAt > o.a.Deadline {
		s += fmt.Sprintf("; the first stopped acting %v after its deadline", ms(o.a.ExitAt-o.a.Deadline))
	}
	return s
}

// overlaps finds every pair of holds of one name whose acting intervals
// (between their marks on the resource, in the server's order) overlap,
// and explains each if it can.
func overlaps(holds []*hold, restarts *restartLog) []overlap {
	byName := map[string][]*hold{}
	for _, h := range holds {
		byName[h.Name] = append(byName[h.Name], h)
	}
	var out []overlap
	for _, hs := range byName {
		sort.Slice(hs, func(i, j int) bool { return hs[i].Enter < hs[j].Enter })
		for i, a := range hs {
			end := a.Exit
			if end == 0 {
				end = 1 << 62
			}
			for _, b := range hs[i+1:] {
				if b.Enter > end {
					break
				}
				out = append(out, overlap{a: a, b: b, why: explain(a, b, restarts)})
			}
		}
	}
	return out
}

func explain(a, b *hold, restarts *restartLog) string {
	switch {
	case a.Paused:
		return whyPaused
	case restarts.explains(a.Sent, b.Grant):
		return whyRestart
	case a.Deadline <= b.Since:
		return whyLate
	}
	return ""
}

// leakMargin is how long past the longest TTL the leak check waits.
const leakMargin = 300 * time.Millisecond

// leakCheck waits until every lock should have expired, then lists what is
// still held under prefix, and any lock key or waiter set without a TTL.
func leakCheck(addr, prefix string, wait time.Duration) ([]string, error) {
	time.Sleep(wait)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	c := newLocks(rdb, dlock.WithPrefix(prefix))
	defer c.Close()
	infos, err := c.List(ctx, "*")
	if err != nil {
		return nil, err
	}
	var leaks []string
	for _, info := range infos {
		for _, h := range info.Holders {
			leaks = append(leaks, fmt.Sprintf("%q still held by %s, %v left, %v after every client stopped", info.Name, h.Metadata, h.TTL, wait))
		}
	}
	iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		key := iter.Val()
		typ, err := rdb.Type(ctx, key).Result()
		if err != nil || typ == "string" || typ == "none" {
			continue // fence counters and release markers: strings, not locks
		}
		if pttl, err := rdb.PTTL(ctx, key).Result(); err == nil && pttl == -1 {
			leaks = append(leaks, fmt.Sprintf("%s (%s) has no TTL", key, typ))
		}
	}
	return leaks, iter.Err()
}
