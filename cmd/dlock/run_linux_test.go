//go:build linux

package main

import (
	"context"
	"fmt"
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

// terminalRun is dlock run at a terminal, as an interactive shell runs it:
// in the foreground process group of a session whose controlling terminal
// is a pseudo-terminal. The session's leader, a shell standing for the
// interactive one, outlives dlock: were dlock the leader, its exit would
// hang up the terminal, and the hang-up would stop what it left running.
type terminalRun struct {
	p   *proc
	dir string
	pid int // dlock's
}

// startDlockAtTerminal starts dlock run at a terminal with args.
func startDlockAtTerminal(t *testing.T, args ...string) *terminalRun {
	t.Helper()
	_, pts := openPTY(t)
	r := &terminalRun{dir: t.TempDir()}
	script := `"$@" 2> "$D/stderr" & echo $! > "$D/pid.tmp"; mv "$D/pid.tmp" "$D/pid"; wait $!; echo $? > "$D/code.tmp"; mv "$D/code.tmp" "$D/code"; sleep 60`
	r.p = startProcWith(t, []string{"D=" + r.dir}, &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}, pts,
		"sh", append([]string{"-c", script, "sh", dlockBin}, args...)...)
	r.pid = waitPID(t, r.p, filepath.Join(r.dir, "pid"))
	return r
}

// wait waits for dlock to exit, at most procTimeout.
func (r *terminalRun) wait(t *testing.T) result {
	t.Helper()
	var code int
	waitFor(t, "dlock to exit", func() bool {
		data, err := os.ReadFile(filepath.Join(r.dir, "code"))
		code, _ = strconv.Atoi(strings.TrimSpace(string(data)))
		return err == nil
	})
	stderr, _ := os.ReadFile(filepath.Join(r.dir, "stderr"))
	return result{code: code, stderr: string(stderr)}
}

// At a terminal, where the command shares dlock's process group, a lost
// lock stops the processes the command started as well: one that ignores
// SIGTERM is killed after --grace, even though the command obeyed SIGTERM
// and exited, and run exits 74 only then.
func TestRunLockLostAtATerminalStopsWhatTheCommandStarted(t *testing.T) {
	t.Parallel()
	name, dir := lockName(t), t.TempDir()
	script := `sh -c "trap \"\" TERM; echo \$\$ > pidfile.tmp; mv pidfile.tmp pidfile; sleep 20"; echo after`
	r := startDlockAtTerminal(t, "run", "--ttl", "600ms", "--grace", "300ms", name, "--", "sh", "-c", "cd "+dir+" && "+script)
	pid := waitPID(t, r.p, filepath.Join(dir, "pidfile"))
	if pgid, err := syscall.Getpgid(pid); err != nil || pgid != r.p.cmd.Process.Pid {
		t.Fatalf("the command's process group is %d (%v), want the session's, %d: dlock did not run at a terminal", pgid, err, r.p.cmd.Process.Pid)
	}
	if _, err := libClient(t).ForceRelease(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	res := r.wait(t)
	if res.code != exitLost {
		t.Fatalf("exit code %d, want %d; stderr:\n%s", res.code, exitLost, res.stderr)
	}
	if !strings.Contains(res.stderr, "processes it started") || !strings.Contains(res.stderr, "sending SIGKILL") {
		t.Errorf("stderr does not say what the command started was killed:\n%s", res.stderr)
	}
	gone(t, pid, "run exited")
}

// waitPID waits for the pid the command wrote to file, failing if run ends
// first; the process is killed when the test ends, should run not do it.
func waitPID(t *testing.T, p *proc, file string) int {
	t.Helper()
	var pid int
	waitFor(t, "the pid in "+file, func() bool {
		select {
		case <-p.done:
			t.Fatalf("run ended early: %s", p.stderr.String())
		default:
		}
		data, err := os.ReadFile(file)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(data)))
		return err == nil && pid > 0
	})
	killLater(t, pid, false)
	return pid
}

// gone waits for pid to end, failing after two seconds.
func gone(t *testing.T, pid int, after string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d, started by the command, still runs after %s", pid, after)
		}
		time.Sleep(pollEvery)
	}
}

// A process of the command's tree that a signal to its group does not
// reach is stopped too when the lock is lost: one in a session of its own
// (setsid, as timeout or a daemon would), and one left behind by a parent
// that exited before the loss, at a terminal.
func TestRunLockLostStopsWhatLeftTheGroup(t *testing.T) {
	t.Parallel()
	inner := `sh -c "trap \"\" TERM; echo \$\$ > pid.tmp; mv pid.tmp pid; sleep 20"`
	for _, c := range []struct {
		what, script string
		terminal     bool
	}{
		{"a session of its own", "setsid " + inner + " & wait", false},
		{"an orphan, at a terminal", "(" + inner + " &); sleep 20", true},
		{"an orphan, without a terminal", "(setsid " + inner + " &); sleep 20", false},
	} {
		t.Run(c.what, func(t *testing.T) {
			t.Parallel()
			name, dir := lockName(t), t.TempDir()
			args := []string{"run", "--ttl", "600ms", "--grace", "300ms", name, "--", "sh", "-c", "cd " + dir + " && " + c.script}
			var pid int
			var wait func(*testing.T) result
			if c.terminal {
				r := startDlockAtTerminal(t, args...)
				pid, wait = waitPID(t, r.p, filepath.Join(dir, "pid")), r.wait
			} else {
				p := startDlock(t, nil, args...)
				pid, wait = waitPID(t, p, filepath.Join(dir, "pid")), p.wait
			}
			if _, err := libClient(t).ForceRelease(context.Background(), name); err != nil {
				t.Fatal(err)
			}
			r := wait(t)
			if r.code != exitLost || !strings.Contains(r.stderr, "sending SIGKILL") {
				t.Fatalf("exit code %d, want %d after SIGKILL; stderr:\n%s", r.code, exitLost, r.stderr)
			}
			gone(t, pid, "run exited")
		})
	}
}

// At a terminal, a signal dlock passes on to the command reaches what the
// command started too, as it would their process group without one.
func TestRunAtATerminalPassesSignalsOnToWhatTheCommandStarted(t *testing.T) {
	t.Parallel()
	name, dir := lockName(t), t.TempDir()
	r := startDlockAtTerminal(t, "run", name, "--", "sh", "-c", "cd "+dir+" && sleep 30 & echo $! > "+filepath.Join(dir, "cmdpid")+"; wait")
	pid := waitPID(t, r.p, filepath.Join(dir, "cmdpid"))
	if err := syscall.Kill(r.pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	res := r.wait(t)
	if res.code != exitSignal+int(syscall.SIGTERM) {
		t.Errorf("exit code %d, want %d; stderr:\n%s", res.code, exitSignal+int(syscall.SIGTERM), res.stderr)
	}
	gone(t, pid, "the command was stopped by SIGTERM")
}

// A child dlock's process had before it ran the command (a wrapper
// started it, then exec'd dlock) is not the command's, nor is one such a
// child starts later and leaves to dlock: a lost lock leaves them alone,
// though dlock adopts orphans.
func TestRunLockLostLeavesAloneWhatDlockHadBefore(t *testing.T) {
	t.Parallel()
	name, dir := lockName(t), t.TempDir()
	other, late := filepath.Join(dir, "other"), filepath.Join(dir, "late")
	// The late child starts once the command has (its pid file, $2,
	// exists): dlock is running it by then, and adopts orphans.
	script := `sleep 30 >/dev/null 2>&1 & echo $! > "$0.tmp"; mv "$0.tmp" "$0"
(while [ ! -e "$2" ]; do sleep 0.02; done; sleep 30 >/dev/null 2>&1 & echo $! > "$1.tmp"; mv "$1.tmp" "$1") >/dev/null 2>&1 &
shift 2; exec "$@"`
	p := startProc(t, nil, "sh", "-c", script, other, late, filepath.Join(dir, "pid"), dlockBin, "run", "--ttl", "600ms", "--grace", "300ms", name, "--",
		"sh", "-c", "cd "+dir+" && sleep 20 & echo $! > "+filepath.Join(dir, "pid")+"; wait")
	otherPID, latePID := waitPID(t, p, other), waitPID(t, p, late)
	pid := waitPID(t, p, filepath.Join(dir, "pid"))
	waitFor(t, "dlock to adopt the late child", func() bool {
		info, ok := procStat(latePID)
		return ok && info.ppid == p.cmd.Process.Pid
	})
	if _, err := libClient(t).ForceRelease(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	r := p.wait(t)
	if r.code != exitLost {
		t.Fatalf("exit code %d, want %d; stderr:\n%s", r.code, exitLost, r.stderr)
	}
	gone(t, pid, "run exited")
	for _, k := range []int{otherPID, latePID} {
		if !alive(k) {
			t.Errorf("pid %d, the wrapper's, was stopped with the command", k)
		}
	}
}

// A line for a terminal is cut to its width, so that it never wraps: ls
// --watch redraws its frame in place, and a wrapped line (the error line
// of a Redis it cannot reach, about 170 characters) piled frames up.
func TestFitWidthCutsALineToTheTerminal(t *testing.T) {
	_, pts := openPTY(t)
	ws := struct{ row, col, x, y uint16 }{row: 24, col: 20}
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, pts.Fd(), syscall.TIOCSWINSZ, uintptr(unsafe.Pointer(&ws))); errno != 0 {
		t.Fatalf("sizing the pseudo-terminal: %v", errno)
	}
	long := strings.Repeat("x", 30)
	if got, want := fitWidth(pts, long), strings.Repeat("x", 18)+"…"; got != want {
		t.Errorf("at a 20-column terminal: %q, want %q", got, want)
	}
	if got := fitWidth(pts, "short"); got != "short" {
		t.Errorf("a short line: %q", got)
	}
	if got := fitWidth(new(strings.Builder), long); got != long {
		t.Errorf("not a terminal: %q, want the line whole", got)
	}
	if got, want := fitWidth(pts, "waiting for 日本語の名前の長いロック"), "waiting for 日本語…"; got != want {
		t.Errorf("wide characters at a 20-column terminal: %q, want %q (19 cells)", got, want)
	}
}

// ls --watch's frame keeps to the terminal's height, its last line saying
// how many lines it left out: a frame that scrolled would be drawn again
// below the last one rather than over it.
func TestFitFrameKeepsToTheTerminalsHeight(t *testing.T) {
	_, pts := openPTY(t)
	ws := struct{ row, col, x, y uint16 }{row: 6, col: 40}
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, pts.Fd(), syscall.TIOCSWINSZ, uintptr(unsafe.Pointer(&ws))); errno != 0 {
		t.Fatalf("sizing the pseudo-terminal: %v", errno)
	}
	var lines []string
	for i := range 10 {
		lines = append(lines, fmt.Sprintf("line %d", i))
	}
	got := fitFrame(pts, lines)
	if len(got) != 5 || strings.Join(got[:4], ",") != "line 0,line 1,line 2,line 3" || !strings.HasPrefix(got[4], "… 6 more lines") {
		t.Errorf("10 lines at a 6-line terminal: %q, want 4 lines and how many more", got)
	}
	if got := fitFrame(pts, lines[:5]); len(got) != 5 {
		t.Errorf("5 lines at a 6-line terminal: %q, want them all", got)
	}
	if got := fitFrame(pts, lines[:6]); len(got) != 5 || !strings.HasPrefix(got[4], "… 2 more lines") {
		t.Errorf("6 lines at a 6-line terminal: %q, want 4 lines and how many more", got)
	}
	ws.row = 2
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, pts.Fd(), syscall.TIOCSWINSZ, uintptr(unsafe.Pointer(&ws))); errno != 0 {
		t.Fatalf("sizing the pseudo-terminal: %v", errno)
	}
	if got := fitFrame(pts, lines[:3]); len(got) != 1 || !strings.HasPrefix(got[0], "… 3 more lines") {
		t.Errorf("3 lines at a 2-line terminal: %q, want only how many there are", got)
	}
	if got := fitFrame(new(strings.Builder), lines); len(got) != 10 {
		t.Errorf("not a terminal: %q, want every line", got)
	}
}

// A lock lost while dlock was suspended (SIGSTOP), during which the
// command exited by itself, is seen only once dlock goes on: it stops
// nothing, and says so. It sent SIGTERM to the exited command and said it
// was stopped (exit code 0). The loss and the command's end are seen
// together, in either order: a few runs try both.
func TestRunLockLostAfterTheCommandExited(t *testing.T) {
	t.Parallel()
	for i := range 4 {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			t.Parallel()
			name, file := lockName(t), filepath.Join(t.TempDir(), "child")
			c := libClient(t)
			p := startDlock(t, nil, runArgs([]string{"--ttl", "1s"}, name, "signals", file, "0")...)
			pid, err := strconv.Atoi(waitForLine(t, file, "ready ")[1])
			if err != nil {
				t.Fatal(err)
			}
			p.signal(t, syscall.SIGSTOP)
			waitFor(t, "dlock to stop", func() bool { return procState(p.cmd.Process.Pid) == "T" })
			if isFree(t, c, name) {
				t.Fatal("the lock was lost before dlock stopped")
			}
			if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			waitForLine(t, file, "got SIGTERM")
			waitFor(t, "the lock to expire", func() bool { return isFree(t, c, name) })
			p.signal(t, syscall.SIGCONT)
			r := p.wait(t)
			checkOneLine(t, r, exitLost, "lock '"+name+"' was found lost after the command exited (")
			if !strings.HasSuffix(r.stderr, "and may have been lost while it ran; the command's status was exit code 0\n") {
				t.Errorf("stderr %q does not give the command's own status", r.stderr)
			}
			if data, _ := os.ReadFile(file); strings.Count(string(data), "got ") != 1 {
				t.Errorf("the command got more signals than the test's SIGTERM:\n%s", data)
			}
		})
	}
}

// procState returns the state of process pid, as /proc/PID/stat gives it
// ("R", "S", "T" for stopped, "Z"…), or "" when it is gone.
func procState(pid int) string {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	// The state follows the command's name, which is in parentheses.
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(fields) == 0 {
		return ""
	}
	return fields[0]
}
