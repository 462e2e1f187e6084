// Package filewatch reports changes to a file, following symlinks such as
// the ones of a Kubernetes ConfigMap volume.
//
// It watches directories, not the file: atomic updates replace the file's
// inode, and a watch on the file would be lost. The watched directories are
// the parents of every name the path resolves through (each symlink and the
// final file), so a ConfigMap's ..data swap, an editor's rename-over and a
// symlink pointing anywhere are all seen. If part of the path does not exist,
// the nearest existing ancestor is watched instead, so the file's appearance
// is seen at once rather than by polling.
//
// Any event in a watched directory schedules a check. A check re-resolves the
// path, moves the watches to match, and signals only if a fingerprint of the
// file changed (or it was written in place), so unrelated events (another
// key's file, the removal of the ConfigMap's old timestamped directory) cause
// no send.
package filewatch

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
)

// maxLinks bounds symlink resolution, like the kernel's ELOOP limit.
const maxLinks = 40

// Watch reports changes to the file at path (following symlinks, including a
// Kubernetes ConfigMap volume's ..data swap) on the returned channel. Events
// are coalesced: a burst of changes within `debounce` yields one send, and the
// last change of a burst is never missed (a change that happens while the
// receiver is busy results in at least one later send). The channel has
// capacity 1 and is closed when ctx is done. Errors from the underlying
// watcher are passed to onError (may be nil) and do not stop watching.
//
// Watch has set up its watches when it returns, so a caller that reads the
// file after calling Watch misses no change; it fails if a directory it needs
// cannot be watched (e.g. no permission, inotify limits).
//
// The debounce window starts at the first event and is not extended by later
// ones, so a check happens at most `debounce` after the first event of a
// burst, however long the burst lasts.
func Watch(ctx context.Context, path string, debounce time.Duration, onError func(error)) (<-chan struct{}, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	w := &watcher{fs: fw, path: abs, onError: onError, out: make(chan struct{}, 1)}
	if err := w.sync(); err != nil {
		fw.Close()
		return nil, err
	}
	w.last = fingerprintOf(abs)
	go w.run(ctx, debounce)
	return w.out, nil
}

type watcher struct {
	fs      *fsnotify.Watcher
	path    string
	onError func(error)
	out     chan struct{}

	file string      // what path resolved to at the last check
	last fingerprint // of path at the last check
}

func (w *watcher) run(ctx context.Context, debounce time.Duration) {
	defer close(w.out)
	debounced(ctx, w.fs, debounce, w.report,
		// An in-place write of the same size within one mtime tick leaves
		// the fingerprint equal: signal anyway. (Not so for creates: a
		// check may already have seen and reported the change before its
		// event arrives, and inode, path or mtime differ for a replacement.)
		func(ev fsnotify.Event) bool { return ev.Has(fsnotify.Write) && filepath.Clean(ev.Name) == w.file },
		w.check)
}

// debounced runs a watcher's event loop until ctx is done or the watcher
// closes: each event or error schedules one call of check, debounce after
// the first; check is forced when an event says so (forces) or events were
// lost. It closes fs.
func debounced(ctx context.Context, fs *fsnotify.Watcher, debounce time.Duration, report func(error),
	forces func(fsnotify.Event) bool, check func(force bool)) {
	defer fs.Close()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	pending, force := false, false
	schedule := func() {
		if !pending {
			pending = true
			timer.Reset(debounce)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-fs.Events:
			if !ok {
				return
			}
			force = force || forces(ev)
			schedule()
		case err, ok := <-fs.Errors:
			if !ok {
				return
			}
			report(err)
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				force = true // events were lost
			}
			schedule()
		case <-timer.C:
			pending = false
			check(force)
			force = false
		}
	}
}

func (w *watcher) check(force bool) {
	w.report(w.sync())
	fp := fingerprintOf(w.path)
	if fp == w.last && !force {
		return
	}
	w.last = fp
	select {
	case w.out <- struct{}{}:
	default: // a send is pending; the receiver has yet to read the file
	}
}

func (w *watcher) report(err error) {
	if err != nil && w.onError != nil {
		w.onError(err)
	}
}

// sync resolves the path and watches the directories that resolution looked
// at. It repeats until a resolution needed no new watch: from then on any
// change to what it looked at produces an event.
func (w *watcher) sync() error {
	var t target
	var errs error
	for range 8 {
		t = resolve(w.path)
		added, err := w.watchDirs(t.dirs)
		errs = errors.Join(errs, err)
		if !added {
			break
		}
	}
	w.file = t.path
	return errs
}

// watchDirs makes dirs the watched set. It reports whether it added a watch
// or found a directory gone, either of which calls for resolving again.
func (w *watcher) watchDirs(dirs []string) (added bool, err error) {
	want := make(map[string]bool, len(dirs))
	for _, d := range dirs {
		want[d] = true
	}
	have := map[string]bool{}
	for _, d := range w.fs.WatchList() {
		have[d] = true
		if !want[d] {
			w.fs.Remove(d) // fails only if the kernel dropped it already
		}
	}
	for d := range want {
		if have[d] {
			continue
		}
		switch e := w.fs.Add(d); {
		case e == nil, errors.Is(e, fs.ErrNotExist), errors.Is(e, syscall.ENOTDIR):
			added = true
		default:
			err = errors.Join(err, e)
		}
	}
	return added, err
}

// target is what a path resolved to.
type target struct {
	path string   // the resolved file; "" if some component is missing
	dirs []string // the parents of each symlink followed and of path, or of the missing component
}

// resolve follows path like filepath.EvalSymlinks, recording the directories
// whose entries decided the result. They are symlink-free, so fsnotify's event
// names under them compare equal to path.
func resolve(path string) target {
	var t target
	dir, rest, links := "/", path, 0
	for rest != "" {
		var name string
		name, rest, _ = strings.Cut(rest, "/")
		switch name {
		case "", ".":
			continue
		case "..":
			dir = filepath.Dir(dir)
			continue
		}
		p := filepath.Join(dir, name)
		fi, err := os.Lstat(p)
		if err != nil {
			t.dirs = append(t.dirs, dir) // nearest existing ancestor
			return t
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			dir = p
			continue
		}
		links++
		t.dirs = append(t.dirs, dir)
		dest, err := os.Readlink(p)
		if err != nil || links > maxLinks {
			return t
		}
		if filepath.IsAbs(dest) {
			dir = "/"
		}
		rest = dest + "/" + rest
	}
	t.path = dir
	t.dirs = append(t.dirs, filepath.Dir(dir))
	return t
}

// fingerprint identifies a version of a file cheaply; the zero value means
// missing.
type fingerprint struct {
	dev, ino uint64
	size     int64
	mtime    int64
}

// fingerprintOf stats path, letting the kernel follow the symlinks: its walk
// is atomic with respect to renames, while resolve's is not (amid a ..data
// swap it can see the old ..data and then find the old directory removed).
func fingerprintOf(path string) fingerprint {
	fi, err := os.Stat(path)
	if err != nil {
		return fingerprint{}
	}
	fp := fingerprint{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		fp.dev, fp.ino = uint64(st.Dev), st.Ino
	}
	return fp
}
