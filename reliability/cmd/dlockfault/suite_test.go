package main

import (
	"path/filepath"
	"testing"
)

// Every scenario but the pauses (TestStoppedHoldersFindDoneClosed runs
// those), briefly (-quick), so that the suite keeps working; the full run
// is make reliability.
func TestScenariosQuick(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := config{quick: true, seed: 1, outDir: filepath.Join(dir, "out")}
	var run []scenario
	for _, s := range scenarios() {
		if s.key != "pause" {
			run = append(run, s)
		}
	}
	results := runScenarios(cfg, run, testLog{t})
	for _, r := range results {
		for _, p := range r.problems() {
			t.Errorf("%s: %s", r.key, p)
		}
		if r.lin == nil && r.ops.Granted == 0 {
			t.Errorf("%s: no lock was granted", r.key)
		}
	}
	report := filepath.Join(dir, "reliability.md")
	if err := writeReport(report, results, runEnv{quick: true}); err != nil {
		t.Fatal(err)
	}
}

// testLog sends the suite's progress lines to the test log.
type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(string(p))
	return len(p), nil
}
