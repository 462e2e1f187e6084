package filewatch

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func ipMasq(name string) bool { return strings.HasPrefix(name, "ip-masq") }

func startDir(t *testing.T, dir string) <-chan struct{} {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ch, err := WatchDir(ctx, dir, ipMasq, 10*time.Millisecond, func(err error) { t.Errorf("watch error: %v", err) })
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

func dirSignal(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("no signal after %s", what)
	}
}

func dirQuiet(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatalf("a signal after %s", what)
	case <-time.After(100 * time.Millisecond):
	}
}

func mustWrite(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// projected lays out a projected volume of keys, kubelet-style, and swaps
// ..data to a new timestamped directory on each call.
type projected struct {
	dir string
	n   int
}

func (p *projected) update(t *testing.T, files map[string]string) {
	t.Helper()
	p.n++
	ts := fmt.Sprintf("..2026_11_22_10_00_%02d.000000001", p.n)
	if err := os.Mkdir(filepath.Join(p.dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		mustWrite(t, filepath.Join(p.dir, ts, name), content)
		link := filepath.Join(p.dir, name)
		if _, err := os.Lstat(link); err != nil {
			if err := os.Symlink("..data/"+name, link); err != nil {
				t.Fatal(err)
			}
		}
	}
	old, _ := os.Readlink(filepath.Join(p.dir, "..data"))
	if err := os.Symlink(ts, filepath.Join(p.dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(p.dir, "..data_tmp"), filepath.Join(p.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if old != "" {
		os.RemoveAll(filepath.Join(p.dir, old))
	}
}

func TestWatchDirProjectedVolume(t *testing.T) {
	p := &projected{dir: t.TempDir()}
	p.update(t, map[string]string{"ip-masq-agent": "a", "ip-masq-agent-reconciled": "b"})
	ch := startDir(t, p.dir)
	dirQuiet(t, ch, "nothing")

	p.update(t, map[string]string{"ip-masq-agent": "a", "ip-masq-agent-reconciled": "b2"})
	dirSignal(t, ch, "the ..data swap")
	dirQuiet(t, ch, "one swap (one signal)")

	// A file that does not match changes: no signal.
	mustWrite(t, filepath.Join(p.dir, "README"), "x")
	dirQuiet(t, ch, "a write to a file not named ip-masq*")
	// Nor does a sibling of the directory.
	mustWrite(t, filepath.Join(filepath.Dir(p.dir), "sibling-"+filepath.Base(p.dir)), "x")
	t.Cleanup(func() { os.Remove(filepath.Join(filepath.Dir(p.dir), "sibling-"+filepath.Base(p.dir))) })
	dirQuiet(t, ch, "a change next to the directory")
}

func TestWatchDirPlainFiles(t *testing.T) {
	dir := t.TempDir()
	mustWrite(t, filepath.Join(dir, "ip-masq-agent"), "a")
	ch := startDir(t, dir)

	mustWrite(t, filepath.Join(dir, "ip-masq-agent"), "b") // in place, same size
	dirSignal(t, ch, "a write in place")

	mustWrite(t, filepath.Join(dir, "ip-masq-user"), "c")
	dirSignal(t, ch, "a new file")

	tmp := filepath.Join(dir, ".tmp")
	mustWrite(t, tmp, "d")
	if err := os.Rename(tmp, filepath.Join(dir, "ip-masq-user")); err != nil {
		t.Fatal(err)
	}
	dirSignal(t, ch, "a rename over")

	os.Remove(filepath.Join(dir, "ip-masq-user"))
	dirSignal(t, ch, "a removal")
}

func TestWatchDirReplaced(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "config")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(dir, "ip-masq-agent"), "a")
	ch := startDir(t, dir)

	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	dirSignal(t, ch, "the directory's removal")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(dir, "ip-masq-agent"), "b")
	dirSignal(t, ch, "the directory's re-creation")
	// Watched again: a later write is seen.
	time.Sleep(50 * time.Millisecond)
	for len(ch) > 0 {
		<-ch
	}
	mustWrite(t, filepath.Join(dir, "ip-masq-agent"), "c")
	dirSignal(t, ch, "a write in the re-created directory")
}

func TestWatchDirClosedOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := WatchDir(ctx, t.TempDir(), ipMasq, time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case _, ok := <-ch:
		if ok {
			<-ch
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the channel was not closed")
	}
}
