package filewatch

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"
)

const (
	testDebounce = 10 * time.Millisecond
	waitSend     = 5 * time.Second        // bound on waiting for an expected send
	quiet        = 300 * time.Millisecond // window in which no send is expected
	missing      = "<missing>"
)

// start watches path until the test ends.
func start(t *testing.T, path string, debounce time.Duration) <-chan struct{} {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := Watch(ctx, path, debounce, func(err error) { t.Errorf("onError: %v", err) })
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		timeout := time.After(waitSend)
		for {
			select {
			case _, ok := <-ch:
				if !ok {
					return
				}
			case <-timeout:
				t.Error("channel not closed after cancel")
				return
			}
		}
	})
	return ch
}

func read(t *testing.T, path string) string {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return missing
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// await receives sends until, after one, the file reads as want: what a
// receiver that rereads on each send would end up with.
func await(t *testing.T, ch <-chan struct{}, path, want string) {
	t.Helper()
	timeout := time.After(waitSend)
	for {
		select {
		case <-ch:
			if read(t, path) == want {
				return
			}
		case <-timeout:
			t.Fatalf("no send after which %s reads %q (it reads %q)", path, want, read(t, path))
		}
	}
}

func expectQuiet(t *testing.T, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
		t.Fatal("unexpected send")
	case <-time.After(quiet):
	}
}

// configMap lays out and updates a directory the way the kubelet's
// AtomicWriter does for a ConfigMap volume.
type configMap struct {
	dir string
	ts  string // current timestamped directory
}

func newConfigMap(t *testing.T, dir string, files map[string]string) *configMap {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	c := &configMap{dir: dir}
	c.update(t, files, true)
	for name := range files {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// update writes files into a new timestamped directory, points ..data at it
// through ..data_tmp and, if removeOld, removes the previous one.
func (c *configMap) update(t *testing.T, files map[string]string, removeOld bool) {
	t.Helper()
	ts, err := os.MkdirTemp(c.dir, time.Now().UTC().Format("..2006_01_02_15_04_05."))
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		write(t, filepath.Join(ts, name), content)
	}
	tmp := filepath.Join(c.dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(c.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if removeOld {
		c.removeOld(t)
	}
	c.ts = ts
}

func (c *configMap) removeOld(t *testing.T) {
	t.Helper()
	if c.ts != "" {
		if err := os.RemoveAll(c.ts); err != nil {
			t.Fatal(err)
		}
	}
}

func TestConfigMapSwap(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "config")
	c := newConfigMap(t, dir, map[string]string{"ip-masq-agent": "v1", "other": "o1"})
	path := filepath.Join(dir, "ip-masq-agent")
	ch := start(t, path, testDebounce)

	for _, v := range []string{"v2", "v3"} {
		c.update(t, map[string]string{"ip-masq-agent": v, "other": "o1"}, true)
		await(t, ch, path, v)
		expectQuiet(t, ch) // one swap, one send
	}
}

func TestConfigMapUnrelatedChanges(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "config")
	c := newConfigMap(t, dir, map[string]string{"ip-masq-agent": "v1"})
	path := filepath.Join(dir, "ip-masq-agent")
	ch := start(t, path, testDebounce)

	write(t, filepath.Join(dir, "other"), "o1")
	write(t, filepath.Join(dir, "other"), "o2")
	if err := os.Mkdir(filepath.Join(dir, "..unrelated"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "..unrelated")); err != nil {
		t.Fatal(err)
	}
	expectQuiet(t, ch)

	// A swap without removing the old directory, then its removal on its own.
	old := c.ts
	c.update(t, map[string]string{"ip-masq-agent": "v2"}, false)
	await(t, ch, path, "v2")
	if err := os.RemoveAll(old); err != nil {
		t.Fatal(err)
	}
	expectQuiet(t, ch)
}

func TestInPlaceWrite(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "config")
	write(t, path, "aaa")
	ch := start(t, path, testDebounce)

	// Same size each time: the fingerprint may not change within an mtime tick.
	for _, v := range []string{"bbb", "ccc", "ddd"} {
		write(t, path, v)
		await(t, ch, path, v)
	}
}

func TestRenameOver(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "config")
	write(t, path, "v1")
	ch := start(t, path, testDebounce)

	for _, v := range []string{"v2", "v3"} {
		tmp := filepath.Join(dir, ".config.swp")
		write(t, tmp, v)
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
		await(t, ch, path, v)
	}
}

func TestDeleteRecreate(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "config")
	write(t, path, "v1")
	ch := start(t, path, testDebounce)

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	await(t, ch, path, missing)
	write(t, path, "v2")
	await(t, ch, path, "v2")
}

func TestDirectoryAppears(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "etc", "config")
	path := filepath.Join(dir, "ip-masq-agent")
	ch := start(t, path, testDebounce)

	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, path, "v1")
	await(t, ch, path, "v1")
	write(t, path, "v2") // now watched directly
	await(t, ch, path, "v2")
}

func TestConfigMapAppears(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "config")
	path := filepath.Join(dir, "ip-masq-agent")
	ch := start(t, path, testDebounce)

	c := newConfigMap(t, dir, map[string]string{"ip-masq-agent": "v1"})
	await(t, ch, path, "v1")
	c.update(t, map[string]string{"ip-masq-agent": "v2"}, true)
	await(t, ch, path, "v2")
}

func TestDirectoryRecreated(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "config")
	path := filepath.Join(dir, "ip-masq-agent")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, path, "v1")
	ch := start(t, path, testDebounce)

	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	await(t, ch, path, missing)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, path, "v2")
	await(t, ch, path, "v2")
	write(t, path, "v3") // the new directory is watched
	await(t, ch, path, "v3")
}

func TestSymlinkElsewhere(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	for _, d := range []string{"etc", "a", "b"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	a, b := filepath.Join(root, "a", "real"), filepath.Join(root, "b", "real")
	write(t, a, "a1")
	write(t, b, "b1")
	path := filepath.Join(root, "etc", "config")
	if err := os.Symlink(a, path); err != nil {
		t.Fatal(err)
	}
	ch := start(t, path, testDebounce)

	write(t, a, "a2") // in place, in the target's directory
	await(t, ch, path, "a2")

	tmp := filepath.Join(root, "etc", "config.tmp") // retarget atomically
	if err := os.Symlink(b, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	await(t, ch, path, "b1")

	write(t, a, "a3") // no longer the target
	expectQuiet(t, ch)
	write(t, b, "b2")
	await(t, ch, path, "b2")
}

func TestBurst(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "config")
	write(t, path, "start")
	const debounce = 20 * time.Millisecond
	ch := start(t, path, debounce)

	begin := time.Now()
	for i := range 100 {
		write(t, path, "v"+strconv.Itoa(i))
	}
	elapsed := time.Since(begin)

	// Read after every send, like the agent, until the sends stop.
	sends, got := 0, ""
	timeout := time.After(waitSend)
	for done := false; !done; {
		select {
		case <-ch:
			sends++
			got = read(t, path)
		case <-time.After(quiet):
			done = sends > 0
		case <-timeout:
			t.Fatal("no send")
		}
	}
	if got != "v99" {
		t.Errorf("after the last send the file reads %q, want v99", got)
	}
	// Each check ends a window of at least debounce that started with an
	// event; some slack for events delivered after the writes returned.
	if limit := int(elapsed/debounce) + 3; sends > limit {
		t.Errorf("%d sends for 100 writes in %v, want at most %d", sends, elapsed, limit)
	}
	t.Logf("%d sends for 100 writes in %v", sends, elapsed)
}

func TestClosedOnCancel(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := Watch(ctx, filepath.Join(t.TempDir(), "config"), testDebounce, nil)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case _, ok := <-ch:
		if ok {
			t.Fatal("send instead of close")
		}
	case <-time.After(waitSend):
		t.Fatal("channel not closed")
	}
}

func TestResolve(t *testing.T) {
	t.Parallel()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	newConfigMap(t, dir, map[string]string{"k": "v"})
	data, _ := filepath.EvalSymlinks(filepath.Join(dir, "..data"))
	tg := resolve(filepath.Join(dir, "k"))
	want := target{path: filepath.Join(data, "k"), dirs: []string{dir, dir, data}}
	if tg.path != want.path || !slices.Equal(tg.dirs, want.dirs) {
		t.Errorf("resolve = %+v, want %+v", tg, want)
	}

	tg = resolve(filepath.Join(dir, "no", "such", "file"))
	if tg.path != "" || !slices.Equal(tg.dirs, []string{dir}) {
		t.Errorf("resolve(missing) = %+v, want only dirs [%s]", tg, dir)
	}
}

// BenchmarkDataSwapLatency measures the time from the rename of ..data_tmp
// over ..data to the receipt of the send, with the kubelet's full sequence
// (new timestamped dir, ..data_tmp, rename, removal of the old dir).
func BenchmarkDataSwapLatency(b *testing.B) {
	const debounce = 5 * time.Millisecond // recommended
	dir := filepath.Join(b.TempDir(), "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	swap := func(n int) (renamed time.Time) {
		old, _ := filepath.EvalSymlinks(filepath.Join(dir, "..data"))
		ts, err := os.MkdirTemp(dir, time.Now().UTC().Format("..2006_01_02_15_04_05."))
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ts, "ip-masq-agent"), []byte(strconv.Itoa(n)), 0o644); err != nil {
			b.Fatal(err)
		}
		if err := os.Symlink(filepath.Base(ts), filepath.Join(dir, "..data_tmp")); err != nil {
			b.Fatal(err)
		}
		renamed = time.Now()
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			b.Fatal(err)
		}
		if old != "" {
			if err := os.RemoveAll(old); err != nil {
				b.Fatal(err)
			}
		}
		return renamed
	}
	swap(-1)
	if err := os.Symlink("..data/ip-masq-agent", filepath.Join(dir, "ip-masq-agent")); err != nil {
		b.Fatal(err)
	}
	ch, err := Watch(b.Context(), filepath.Join(dir, "ip-masq-agent"), debounce, func(err error) { b.Error(err) })
	if err != nil {
		b.Fatal(err)
	}

	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for n := range b.N {
		renamed := swap(n)
		select {
		case <-ch:
			lat = append(lat, time.Since(renamed))
		case <-time.After(waitSend):
			b.Fatal("no send")
		}
		// Let the watcher go idle, as between real ConfigMap updates.
		b.StopTimer()
		time.Sleep(3 * debounce)
		select {
		case <-ch:
			b.Fatal("extra send")
		default:
		}
		b.StartTimer()
	}
	b.StopTimer()
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(q(1), "max-ms")
}
