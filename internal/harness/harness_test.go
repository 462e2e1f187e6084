package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// sh starts `sh -c script` as a Daemon; the test stops it.
func sh(t *testing.T, script string) *Daemon {
	t.Helper()
	d := New(exec.Command("sh", "-c", script))
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Stop() })
	return d
}

func TestWaitLineTimesTheWrite(t *testing.T) {
	d := sh(t, `echo first; sleep 0.2; echo 'level=INFO msg="applied config" took=1ms'; exec sleep 60`)
	line, at, err := d.WaitLine(context.Background(), 10*time.Second, "nothing like it", `msg="applied config"`)
	if err != nil {
		t.Fatal(err)
	}
	if line != `level=INFO msg="applied config" took=1ms` {
		t.Errorf("line %q", line)
	}
	// The second write came after the sleep: its time, not the first's.
	if at.Sub(d.Started) < 200*time.Millisecond || time.Since(at) < 0 {
		t.Errorf("the line's write at %s after the start, want 200ms or more", at.Sub(d.Started))
	}
	if err := d.WaitCount(context.Background(), 10*time.Second, "first", 1); err != nil {
		t.Error(err)
	}
}

func TestWaitFailsWhenTheProcessExits(t *testing.T) {
	d := sh(t, `echo going; exit 3`)
	err := d.WaitCount(context.Background(), time.Minute, "never", 1)
	if err == nil || !strings.Contains(err.Error(), "exited (exit status 3)") || !strings.Contains(err.Error(), "going") {
		t.Errorf("Wait on an exited process: %v", err)
	}
	// What it wrote last still counts.
	if err := d.WaitCount(context.Background(), time.Minute, "going", 1); err != nil {
		t.Errorf("Wait for the last words of an exited process: %v", err)
	}
}

func TestWaitTimesOutAndCancels(t *testing.T) {
	d := sh(t, `exec sleep 60`)
	if err := d.WaitCount(context.Background(), 50*time.Millisecond, "never", 1); err == nil || !strings.Contains(err.Error(), "within 50ms") {
		t.Errorf("Wait past its timeout: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := d.WaitCount(ctx, time.Minute, "never", 1); err != context.Canceled {
		t.Errorf("Wait with a cancelled context: %v", err)
	}
}

func TestStop(t *testing.T) {
	d := sh(t, `trap 'echo bye; exit 0' TERM; echo up; while :; do sleep 0.05; done`)
	if err := d.WaitCount(context.Background(), 10*time.Second, "up", 1); err != nil {
		t.Fatal(err)
	}
	if err := d.Stop(); err != nil {
		t.Errorf("Stop of a process that exits 0 on SIGTERM: %v", err)
	}
	if !strings.Contains(d.Output(), "bye") {
		t.Errorf("no SIGTERM seen: %q", d.Output())
	}
	// A process SIGTERM kills: its exit error.
	d = sh(t, `echo up; exec sleep 60`)
	if err := d.WaitCount(context.Background(), 10*time.Second, "up", 1); err != nil {
		t.Fatal(err)
	}
	if err := d.Stop(); err == nil || !strings.Contains(err.Error(), "terminated") {
		t.Errorf("Stop: %v, want the signal", err)
	}
	// KillToStop: SIGKILL.
	d = New(exec.Command("sh", "-c", `trap '' TERM; echo up; exec sleep 60`))
	d.KillToStop = true
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	if err := d.WaitCount(context.Background(), 10*time.Second, "up", 1); err != nil {
		t.Fatal(err)
	}
	if err := d.Stop(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("Stop with KillToStop: %v, want killed", err)
	}
	if st := d.Cmd.ProcessState.Sys().(syscall.WaitStatus); st.Signal() != syscall.SIGKILL {
		t.Errorf("stopped by %v", st.Signal())
	}
}

func TestMaxLog(t *testing.T) {
	d := New(exec.Command("sh", "-c", `echo 0123456789; sleep 0.1; echo dropped; exec sleep 60`))
	d.MaxLog = 5
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	err := d.WaitCount(context.Background(), 500*time.Millisecond, "dropped", 1)
	if err == nil || d.Output() != "0123456789\n" {
		t.Errorf("a write past MaxLog was kept: %v %q", err, d.Output())
	}
}

func TestVolume(t *testing.T) {
	dir := t.TempDir()
	v, err := NewVolume(dir, map[string]string{"a": "one", "b": "two"})
	if err != nil {
		t.Fatal(err)
	}
	read := func(key string) string {
		b, err := os.ReadFile(v.Path(key))
		if err != nil {
			return err.Error()
		}
		return string(b)
	}
	if read("a") != "one" || read("b") != "two" {
		t.Fatalf("a=%q b=%q", read("a"), read("b"))
	}
	if l, _ := os.Readlink(v.Path("a")); l != "..data/a" {
		t.Errorf("a -> %q, want ..data/a", l)
	}
	first, _ := os.Readlink(filepath.Join(dir, "..data"))
	before := time.Now()
	at, err := v.Update(map[string]string{"a": "three"})
	if err != nil {
		t.Fatal(err)
	}
	if at.Before(before) || time.Since(at) < 0 {
		t.Errorf("swap time %s not within the call", at)
	}
	if read("a") != "three" || read("b") != "two" {
		t.Errorf("after the update a=%q b=%q", read("a"), read("b"))
	}
	if _, err := os.Stat(filepath.Join(dir, first)); !os.IsNotExist(err) {
		t.Errorf("the old directory %s is still there: %v", first, err)
	}
	if _, err := v.Place("a", func(p string) error { return os.Symlink("/dev/null", p) }); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(v.Path("a")); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		t.Errorf("a placed as /dev/null: %v %v", fi, err)
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) != 4 { // a, b, ..data, one timestamped directory
		t.Errorf("the volume holds %q", names)
	}
}

func TestEventually(t *testing.T) {
	n := 0
	Eventually(t, 10*time.Second, "three polls", func() bool { n++; return n == 3 })
	f := &fatal{TB: t}
	func() {
		defer func() { recover() }()
		Eventually(f, 30*time.Millisecond, "never", func() bool { return false })
	}()
	if !strings.Contains(f.msg, "timed out (30ms) waiting for never") {
		t.Errorf("Eventually that never holds: %q", f.msg)
	}
}

// fatal records Fatalf and stops the caller (a panic the test recovers).
type fatal struct {
	testing.TB
	msg string
}

func (f *fatal) Helper() {}
func (f *fatal) Fatalf(format string, a ...any) {
	f.msg = fmt.Sprintf(format, a...)
	panic(f.msg)
}
