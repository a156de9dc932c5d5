package harness

import (
	"context"
	"encoding/xml"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"

	"github.com/dlockio/dlock/internal/redistest"
)

func TestMain(m *testing.M) { redistest.VerifyNoLeaks(m) }

// TestTinyRun runs every scenario once with every library, a few hundred
// operations in all, on a redis-server of its own. It keeps the harness
// compiling and working; it asserts nothing about timings.
func TestTinyRun(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("redis-server not installed: run `make redis` (or apt-get install redis-server)")
	}
	srv, err := StartServer(ServerOptions{CPU: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()

	var log strings.Builder
	rep, err := Run(context.Background(), Tiny(), srv, Libraries(), Scenarios(), &log)
	if err != nil {
		t.Fatal(err)
	}
	rep.Preset = "tiny"
	rep.Machine = DescribeMachine(srv, "not pinned")
	t.Log("\n" + log.String())

	if len(rep.Results) != 6 {
		t.Fatalf("%d results, want 6", len(rep.Results))
	}
	for _, res := range rep.Results {
		for _, lib := range Libraries() {
			if res.Row(lib.Name) == nil {
				t.Errorf("%s: no row for %s", res.Scenario.Title, lib.Name)
			}
		}
		for _, row := range res.Rows {
			name := res.Scenario.Title + "/" + row.Library
			if row.Unsupported {
				if res.Scenario.ID != 6 || (row.Library != "redislock" && row.Library != "redsync") {
					t.Errorf("%s: unexpectedly not supported", name)
				}
				continue
			}
			if row.Rounds != 1 {
				t.Errorf("%s: %d rounds completed, want 1; notes: %v", name, row.Rounds, row.Notes)
			}
			for _, m := range res.Scenario.Metrics {
				if _, ok := row.Values[m.Key]; !ok && row.Rounds > 0 {
					t.Errorf("%s: no value for %s", name, m.Key)
				}
			}
			for _, n := range row.Notes {
				if strings.Contains(n, "exclusion") {
					t.Errorf("%s: %s", name, n)
				}
			}
		}
	}
	dlocks := []string{"dlock", "dlock-rueidis", "dlock-redigo"}
	for _, lib := range append([]string{"floor"}, dlocks...) {
		if row := rep.result(6).Row(lib); row == nil || row.Unsupported || row.Values["lost"] != 0 {
			t.Errorf("auto-refresh %s row: %+v", lib, row)
		}
	}
	// Every dlock row's client counts its requests: each row of scenario 1
	// sends at least a request per pair, and refreshes in scenario 6.
	for _, lib := range dlocks {
		if row := rep.result(1).Row(lib); row == nil || row.Values["reqs"] < 1 {
			t.Errorf("uncontended %s row: requests not counted: %+v", lib, row)
		}
		if row := rep.result(6).Row(lib); row == nil || row.Values["reqs"] == 0 || row.Values["rtts"] == 0 {
			t.Errorf("auto-refresh %s row: requests not counted: %+v", lib, row)
		}
	}

	md := rep.Markdown()
	for _, want := range []string{"## Summary", "## 1. uncontended", "## 6. auto-refresh",
		"| dlock |", "| dlock-rueidis |", "| dlock-redigo |", "| rueidislock |"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	svg := rep.SVG()
	dec := xml.NewDecoder(strings.NewReader(svg))
	for {
		if _, err := dec.Token(); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("chart is not well-formed XML: %v", err)
		}
	}
	if !strings.Contains(svg, "<rect") {
		t.Error("chart has no bars")
	}
}

func TestMedianAndPercentile(t *testing.T) {
	if m := median([]float64{3, 1, 2}); m != 2 {
		t.Errorf("median = %v", m)
	}
	if m := median([]float64{4, 1, 2, 3}); m != 2.5 {
		t.Errorf("median = %v", m)
	}
	if got := formatNum(1234567); got != "1,234,567" {
		t.Errorf("formatNum = %q", got)
	}
}
