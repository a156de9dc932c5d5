package dlockotel_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// TestREADMETables: the instruments that the hooks record, with their
// kinds, units and attributes, are those README.md's table of metrics
// lists; the attributes on metrics, spans and events are those of its
// table of attributes.
func TestREADMETables(t *testing.T) {
	e := newEnv(t)
	useEveryHook(e)
	tables := readmeTables(t)

	var got []string
	keys := map[string]bool{}
	for _, m := range e.metrics() {
		kind, points := describe(t, m.Data)
		var attrs []string
		for _, set := range points {
			for _, kv := range set.ToSlice() {
				keys[string(kv.Key)] = true
				if !slices.Contains(attrs, string(kv.Key)) {
					attrs = append(attrs, string(kv.Key))
				}
			}
		}
		slices.Sort(attrs)
		got = append(got, fmt.Sprintf("%s %s %s %s", m.Name, kind, m.Unit, strings.Join(attrs, ",")))
	}
	var want []string
	for _, row := range tables["Metrics"] {
		attrs := strings.Split(row[3], ", ")
		slices.Sort(attrs)
		want = append(want, fmt.Sprintf("%s %s %s %s", row[0], row[1], row[2], strings.Join(attrs, ",")))
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("instruments (name kind unit attributes):\n  %s\nREADME.md lists:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}

	for _, s := range e.spans.Ended() {
		for _, kv := range s.Attributes() {
			keys[string(kv.Key)] = true
		}
		for _, ev := range s.Events() {
			if ev.Name == "exception" {
				continue // recorded by RecordError, with the attributes it sets
			}
			for _, kv := range ev.Attributes {
				keys[string(kv.Key)] = true
			}
		}
	}
	var documented []string
	for _, row := range tables["Attributes"] {
		documented = append(documented, row[0])
	}
	seen := make([]string, 0, len(keys))
	for k := range keys {
		seen = append(seen, k)
	}
	slices.Sort(seen)
	slices.Sort(documented)
	if !slices.Equal(seen, documented) {
		t.Errorf("attributes recorded:\n  %s\nREADME.md lists:\n  %s", strings.Join(seen, "\n  "), strings.Join(documented, "\n  "))
	}
}

// useEveryHook makes each hook fire with each outcome.
func useEveryHook(e *env) {
	t, ctx := e.t, context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}

	// Obtained at once, refreshed, released.
	l, err := e.locks.TryLock(ctx, e.name("a"))
	must(err)
	must(l.Refresh(ctx, time.Minute))
	must(l.Release(ctx))

	// Not obtained at once; obtained after the holder's TTL ran out.
	name := e.name("contended")
	_, err = e.other.TryLock(ctx, name, dlock.WithTTL(300*time.Millisecond))
	must(err)
	if _, err := e.locks.TryLock(ctx, name); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock of a held lock: %v", err)
	}
	l, err = e.locks.Lock(ctx, name)
	must(err)
	must(l.Release(ctx))

	// Redis errors: retried, in a refresh, in a release.
	e.drv.fail.Store(1)
	l, err = e.locks.Lock(ctx, e.name("flaky"))
	must(err)
	e.drv.fail.Store(1)
	if err := l.Refresh(ctx, time.Minute); !errors.Is(err, errInjected) {
		t.Fatalf("Refresh: %v", err)
	}
	e.drv.fail.Store(2) // Release sends a failed request once more
	if err := l.Release(ctx); !errors.Is(err, errInjected) {
		t.Fatalf("Release: %v", err)
	}
	must(l.Release(ctx))

	// An error that is not retried.
	must(e.rdb.Set(ctx, key(e.name("wrong")), "x", 0).Err())
	if _, err := e.locks.Lock(ctx, e.name("wrong")); !errors.Is(err, dlock.ErrWrongType) {
		t.Fatalf("Lock of a foreign key: %v", err)
	}

	// Lost, as a refresh finds; the release finds it gone too.
	l, err = e.locks.TryLock(ctx, e.name("lost"))
	must(err)
	must(e.rdb.Del(ctx, key(e.name("lost"))).Err())
	if err := l.Refresh(ctx, time.Minute); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Refresh of a lost lock: %v", err)
	}
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Release of a lost lock: %v", err)
	}
}

// describe returns the kind of instrument that produced data, as the
// README names it, and the attribute sets of its points.
func describe(t *testing.T, data metricdata.Aggregation) (string, []attribute.Set) {
	var sets []attribute.Set
	switch d := data.(type) {
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			sets = append(sets, p.Attributes)
		}
		return "Histogram", sets
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			sets = append(sets, p.Attributes)
		}
		if d.IsMonotonic {
			return "Counter", sets
		}
		return "UpDownCounter", sets
	}
	t.Fatalf("unexpected aggregation %T", data)
	return "", nil
}

// readmeTables returns the rows of README.md's tables by the heading of
// their section, each cell without its backquotes; only the rows whose
// first cell is code.
func readmeTables(t *testing.T) map[string][][]string {
	f, err := os.Open("README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tables := map[string][][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if h, ok := strings.CutPrefix(line, "## "); ok {
			section = h
			continue
		}
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		for i, c := range cells {
			cells[i] = strings.ReplaceAll(strings.TrimSpace(c), "`", "")
		}
		tables[section] = append(tables[section], cells)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(tables["Metrics"]) == 0 || len(tables["Attributes"]) == 0 {
		t.Fatalf("README.md: no tables of metrics and attributes found")
	}
	return tables
}
