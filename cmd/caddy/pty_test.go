package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/sandwake/sandwake/internal/testenv"
)

// openPTY opens a pseudo-terminal: the controller side, which the test reads
// and types into, and the terminal side, which a program gets as its
// stdin, stdout and stderr.
func openPTY(t *testing.T) (ptm, pts *os.File) {
	t.Helper()
	ptm, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("opening /dev/ptmx: %v", err)
	}
	ioctl := func(req uintptr, arg unsafe.Pointer) error {
		if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, ptm.Fd(), req, uintptr(arg)); errno != 0 {
			return errno
		}
		return nil
	}
	var n uint32
	var unlock int32
	if err := ioctl(syscall.TIOCGPTN, unsafe.Pointer(&n)); err != nil {
		t.Fatalf("TIOCGPTN: %v", err)
	}
	if err := ioctl(syscall.TIOCSPTLCK, unsafe.Pointer(&unlock)); err != nil {
		t.Fatalf("TIOCSPTLCK: %v", err)
	}
	pts, err = os.OpenFile("/dev/pts/"+strconv.Itoa(int(n)), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("opening the terminal side: %v", err)
	}
	return ptm, pts
}

// terminalRun is a command started on a terminal of its own, as a person
// starts it in a shell: its own session with the terminal as controlling
// terminal, so that typing Ctrl-C sends SIGINT to the terminal's foreground
// process group, whatever that is by then.
type terminalRun struct {
	cmd    *exec.Cmd
	ptm    *os.File
	mu     sync.Mutex
	out    bytes.Buffer
	exited chan struct{}
	err    error         // once exited is closed
	copied chan struct{} // closed once the terminal's output is all read
}

func startOnTerminal(t *testing.T, dir string, env []string, name string, args ...string) *terminalRun {
	t.Helper()
	ptm, pts := openPTY(t)
	r := &terminalRun{ptm: ptm, exited: make(chan struct{}), copied: make(chan struct{})}
	r.cmd = exec.Command(name, args...)
	r.cmd.Dir, r.cmd.Env = dir, env
	r.cmd.Stdin, r.cmd.Stdout, r.cmd.Stderr = pts, pts, pts
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pts.Close()
	go func() {
		defer close(r.copied)
		buf := make([]byte, 4096)
		for {
			n, err := ptm.Read(buf)
			r.mu.Lock()
			r.out.Write(buf[:n])
			r.mu.Unlock()
			if err != nil {
				return // EIO once no process has the terminal open
			}
		}
	}()
	go func() {
		r.err = r.cmd.Wait()
		close(r.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-r.exited:
		default:
			// The session's processes, in whatever process group they are.
			signalSession(r.cmd.Process.Pid, syscall.SIGTERM)
			select {
			case <-r.exited:
			case <-time.After(time.Minute):
				signalSession(r.cmd.Process.Pid, syscall.SIGKILL)
				<-r.exited
			}
		}
		ptm.Close()
		select {
		case <-r.copied:
		case <-time.After(10 * time.Second):
		}
	})
	return r
}

// signalSession sends sig to every process of session sid.
func signalSession(sid int, sig syscall.Signal) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp session …; comm may hold spaces.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) > 3 && f[3] == strconv.Itoa(sid) {
			syscall.Kill(pid, sig)
		}
	}
}

// output is what the command wrote to its terminal so far.
func (r *terminalRun) output() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out.String()
}

// waitFor waits until the output contains s; it fails the test if the
// command exits first.
func (r *terminalRun) waitFor(t *testing.T, timeout time.Duration, s string) {
	t.Helper()
	testenv.Eventually(t, timeout, func() (bool, string) {
		if strings.Contains(r.output(), s) {
			return true, ""
		}
		select {
		case <-r.exited:
			t.Fatalf("exited (%v) without printing %q; output:\n%s", r.err, s, tail(r.output()))
		default:
		}
		return false, fmt.Sprintf("output without %q:\n%s", s, tail(r.output()))
	})
}

// ctrlC types Ctrl-C on the terminal and waits for the command to exit; it
// returns the exit status.
func (r *terminalRun) ctrlC(t *testing.T, ctx context.Context) int {
	t.Helper()
	if _, err := r.ptm.Write([]byte{3}); err != nil {
		t.Fatalf("typing Ctrl-C: %v", err)
	}
	select {
	case <-r.exited:
	case <-ctx.Done():
		t.Fatalf("still running after Ctrl-C; output:\n%s", tail(r.output()))
	}
	// The last words (make's, the script's) may still be in the terminal.
	select {
	case <-r.copied:
	case <-time.After(10 * time.Second):
	}
	if r.err == nil {
		return 0
	}
	if ee, ok := r.err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	t.Fatalf("waiting for the command: %v", r.err)
	return -1
}

// waitForegroundHandedOver waits until the terminal's foreground process
// group is no longer the command's own (make run hands it to Caddy once
// the banner is out), as it is by the time a person reads the banner.
func (r *terminalRun) waitForegroundHandedOver(t *testing.T, timeout time.Duration) {
	t.Helper()
	pid := r.cmd.Process.Pid
	testenv.Eventually(t, timeout, func() (bool, string) {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return false, err.Error()
		}
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		// state ppid pgrp session tty_nr tpgid
		return len(f) > 5 && f[5] != "-1" && f[5] != f[2], fmt.Sprintf("terminal foreground group %s, the command's %s", f[5], f[2])
	})
}
