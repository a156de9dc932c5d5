//go:build linux

package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// openPTY opens a pseudo-terminal: its controlling side and the terminal
// a program is given. Both close with the test.
func openPTY(t *testing.T) (ptm, pts *os.File) {
	t.Helper()
	ptm, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { _ = ptm.Close() })
	var unlock int32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, ptm.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); errno != 0 {
		t.Fatalf("unlocking the pseudo-terminal: %v", errno)
	}
	var n uint32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, ptm.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); errno != 0 {
		t.Fatalf("numbering the pseudo-terminal: %v", errno)
	}
	pts, err = os.OpenFile("/dev/pts/"+strconv.FormatUint(uint64(n), 10), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pts.Close() })
	return ptm, pts
}

// startDlockAtTerminal starts dlock as an interactive shell would: in a
// session whose controlling terminal is a pseudo-terminal, on its stdin,
// in the terminal's foreground process group.
func startDlockAtTerminal(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	_, pts := openPTY(t)
	return startProcWith(t, env, &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}, pts, dlockBin, args...)
}

// At a terminal, where the command shares dlock's process group, a lost
// lock stops the processes the command started as well: one that ignores
// SIGTERM is killed after --grace, even though the command obeyed SIGTERM
// and exited, and run exits 74 only then.
func TestRunLockLostAtATerminalStopsWhatTheCommandStarted(t *testing.T) {
	t.Parallel()
	name, dir := lockName(t), t.TempDir()
	pidfile := filepath.Join(dir, "pidfile")
	script := `sh -c "trap \"\" TERM; echo \$\$ > pidfile.tmp; mv pidfile.tmp pidfile; sleep 20"; echo after`
	p := startDlockAtTerminal(t, nil, "run", "--ttl", "600ms", "--grace", "300ms", name, "--", "sh", "-c", "cd "+dir+" && "+script)
	var pid int
	waitFor(t, "the inner shell's pid", func() bool {
		select {
		case <-p.done:
			t.Fatalf("run ended early: %s", p.stderr.String())
		default:
		}
		data, err := os.ReadFile(pidfile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(data)))
		return err == nil && pid > 0
	})
	t.Cleanup(func() { // should run fail to, not to leave the processes behind
		if pgid, err := syscall.Getpgid(pid); err == nil && alive(pid) {
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		}
	})
	if pgid, err := syscall.Getpgid(pid); err != nil || pgid != p.cmd.Process.Pid {
		t.Fatalf("the command's process group is %d (%v), want dlock's, %d: dlock did not run at a terminal", pgid, err, p.cmd.Process.Pid)
	}
	if _, err := libClient(t).ForceRelease(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	r := p.wait(t)
	if r.code != exitLost {
		t.Fatalf("exit code %d, want %d; stderr:\n%s", r.code, exitLost, r.stderr)
	}
	if !strings.Contains(r.stderr, "processes it started") || !strings.Contains(r.stderr, "sending SIGKILL") {
		t.Errorf("stderr does not say what the command started was killed:\n%s", r.stderr)
	}
	deadline := time.Now().Add(2 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d, started by the command, still runs after run exited %d", pid, exitLost)
		}
		time.Sleep(pollEvery)
	}
}
