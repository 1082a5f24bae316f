package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandwake/sandwake/lifecycle"
)

// diskFullDirEnv, when set, makes TestDiskFullOnEventLog run the scenario
// itself on the (already mounted, nearly full) directory it names: the
// parent test runs it in a child process, so that a store that crashes the
// process when the disk fills (Badger writes through mmap, and a page fault
// on a full file system is SIGBUS, not an error) fails one test with a clear
// message instead of killing the package's test binary and leaving the
// tmpfs mounted.
const diskFullDirEnv = "SANDWAKE_TEST_DISKFULL_DIR"

// TestDiskFullOnEventLog: on a 4 MiB tmpfs filled up but for a little room,
// transitions go on until one fails. The failing transition returns an error
// naming the write failure; the record read back is the last one committed,
// never half-written; once space is freed writes succeed again; and the
// reopened store holds every committed record and event.
func TestDiskFullOnEventLog(t *testing.T) {
	if dir := os.Getenv(diskFullDirEnv); dir != "" {
		diskFullScenario(t, dir)
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("blocked: mounting a tmpfs to fill needs root")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("blocked: cannot mount a 4 MiB tmpfs here: %v: %s", err, out)
	}
	// Registered after TempDir, so it runs before the directory is removed.
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestDiskFullOnEventLog$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), diskFullDirEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Logf("disk-full scenario (child process):\n%s", lastLines(out, 15))
		return
	}
	if bytes.Contains(out, []byte("SIGBUS")) {
		t.Fatalf("the store crashed the process when the disk filled, instead of returning an error from the write "+
			"(Badger writes its memtable WAL and value log through mmap; a page fault on a full file system is SIGBUS):\n%s",
			firstLines(out, 30))
	}
	t.Fatalf("disk-full scenario (child process) failed: %v\n%s", err, lastLines(out, 40))
}

// diskFullScenario runs the disk-full checks on the file system at dir.
func diskFullScenario(t *testing.T, dir string) {
	dbDir := filepath.Join(dir, "db")
	// A reserve scaled to this tiny file system (the default, 64 MiB, is
	// scaled to the default Badger files).
	opts := Options{Dir: dbDir, MinFreeBytes: 512 << 10}
	s, err := Open(opts)
	if err != nil {
		t.Fatalf("opening the store on an empty 4 MiB tmpfs: %v", err)
	}
	defer func() { s.Close() }()

	var committed []lifecycle.Event
	rec, ev, err := s.Create(newRecord("full1", "running"), "created")
	if err != nil {
		t.Fatal(err)
	}
	committed = append(committed, ev)
	last := rec

	// Fill the file system but for a little room.
	filler := filepath.Join(dir, "filler")
	room := int64(256 << 10)
	free := freeBytes(t, dir)
	if free <= room {
		t.Fatalf("only %d bytes free after opening the store, want more than %d", free, room)
	}
	if err := os.WriteFile(filler, make([]byte, free-room), 0o600); err != nil {
		t.Fatalf("writing the filler: %v", err)
	}
	t.Logf("%d bytes free after the filler", freeBytes(t, dir))

	reason := strings.Repeat("x", 100)
	var writeErr error
	for i := 0; i < 100000 && writeErr == nil; i++ {
		from, to := lifecycle.State("running"), lifecycle.State("paused")
		if last.State == "paused" {
			from, to = "paused", "running"
		}
		r, e, err := s.Transition("full1", []lifecycle.State{from}, to, fmt.Sprintf("%s %d", reason, i), nil)
		if err != nil {
			writeErr = err
			break
		}
		last = r
		committed = append(committed, e)
	}
	if writeErr == nil {
		t.Fatalf("%d transitions committed on a full file system; none failed", len(committed))
	}
	t.Logf("write %d failed: %v", len(committed)+1, writeErr)
	if !errors.Is(writeErr, syscall.ENOSPC) && !strings.Contains(writeErr.Error(), "no space left on device") {
		t.Errorf("the failing transition's error does not say the disk is full: %v", writeErr)
	}

	// Never half-written: the record and the log are as after the last
	// committed write.
	got, err := s.Get("full1")
	if err != nil {
		t.Fatalf("reading the record after the failed write: %v", err)
	}
	if !reflect.DeepEqual(got, last) {
		t.Fatalf("record after the failed write:\n%+v\nwant the last committed one:\n%+v", got, last)
	}
	if id, err := s.LastEventID(); err != nil || id != committed[len(committed)-1].ID {
		t.Fatalf("last event id after the failed write = %d (%v), want %d", id, err, committed[len(committed)-1].ID)
	}

	// Space back: writes succeed again.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	from, to := last.State, lifecycle.State("stopped")
	r, e, err := s.Transition("full1", []lifecycle.State{from}, to, "space freed", nil)
	if err != nil {
		t.Fatalf("transition after freeing space: %v", err)
	}
	last = r
	committed = append(committed, e)
	if err := s.Close(); err != nil {
		t.Fatalf("closing: %v", err)
	}

	// Reopened, the store holds every committed record and event.
	s, err = Open(opts)
	if err != nil {
		t.Fatalf("reopening: %v", err)
	}
	recs, err := s.List(nil)
	if err != nil || len(recs) != 1 || !reflect.DeepEqual(recs[0], last) {
		t.Fatalf("records after reopening: %+v (%v), want [%+v]", recs, err, last)
	}
	evs, err := s.EventsAfter(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != len(committed) {
		t.Fatalf("%d events after reopening, %d committed", len(evs), len(committed))
	}
	for i, ev := range evs {
		want := committed[i]
		if ev.ID != want.ID || ev.Type != want.Type || ev.From != want.From || ev.To != want.To || ev.Reason != want.Reason || !ev.At.Equal(want.At) {
			t.Fatalf("event %d after reopening: %+v, want %+v", i, ev, want)
		}
	}
	t.Logf("%d events committed and read back after reopening", len(evs))
}

func freeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

func firstLines(b []byte, n int) string {
	lines := strings.SplitAfter(string(b), "\n")
	return strings.Join(lines[:min(n, len(lines))], "")
}

func lastLines(b []byte, n int) string {
	lines := strings.SplitAfter(string(b), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "")
}
