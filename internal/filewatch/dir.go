package filewatch

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
)

// WatchDir is Watch for a directory of config files, such as a projected
// volume of several ConfigMaps: it reports changes to the files of dir
// whose names satisfy match, following symlinks (a ConfigMap volume's keys
// are symlinks through ..data), and their appearance and removal. It
// watches dir itself (entries created, removed, renamed, written: the
// kubelet's ..data swap is a rename in dir), dir's parent (dir replaced or
// removed), and the directories holding the files the entries resolve to
// (in-place writes there). A check runs at most debounce after the first
// event of a burst and signals only if a fingerprint of the matching files
// changed, or if a watched file was written in place. The channel has
// capacity 1 and is closed when ctx is done.
func WatchDir(ctx context.Context, dir string, match func(name string) bool, debounce time.Duration, onError func(error)) (<-chan struct{}, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	w := &dirWatcher{fs: fw, dir: abs, match: match, onError: onError, out: make(chan struct{}, 1)}
	if err := w.sync(); err != nil {
		fw.Close()
		return nil, err
	}
	w.last = w.fingerprint()
	go w.run(ctx, debounce)
	return w.out, nil
}

type dirWatcher struct {
	fs      *fsnotify.Watcher
	dir     string
	match   func(string) bool
	onError func(error)
	out     chan struct{}
	last    string
}

func (w *dirWatcher) run(ctx context.Context, debounce time.Duration) {
	defer close(w.out)
	debounced(ctx, w.fs, debounce, w.report,
		// A write in place of the same size within one mtime tick leaves
		// the fingerprint equal: signal anyway.
		func(ev fsnotify.Event) bool {
			return ev.Has(fsnotify.Write) && w.match(filepath.Base(ev.Name)) && filepath.Dir(ev.Name) != filepath.Dir(w.dir)
		},
		func(force bool) {
			w.report(w.sync())
			if fp := w.fingerprint(); fp != w.last || force {
				w.last = fp
				select {
				case w.out <- struct{}{}:
				default: // a send is pending
				}
			}
		})
}

func (w *dirWatcher) report(err error) {
	if err != nil && w.onError != nil {
		w.onError(err)
	}
}

// files returns the matching entries of dir, sorted.
func (w *dirWatcher) files() []string {
	entries, err := os.ReadDir(w.dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		if w.match(e.Name()) {
			out = append(out, filepath.Join(w.dir, e.Name()))
		}
	}
	return out
}

// sync makes the watched directories: dir's parent, dir, and the
// directories of the files its matching entries resolve to.
func (w *dirWatcher) sync() error {
	want := map[string]bool{filepath.Dir(w.dir): true, w.dir: true}
	for _, f := range w.files() {
		if real, err := filepath.EvalSymlinks(f); err == nil {
			want[filepath.Dir(real)] = true
		}
	}
	var errs error
	have := map[string]bool{}
	for _, d := range w.fs.WatchList() { // without the ones the kernel dropped
		have[d] = true
		if !want[d] {
			w.fs.Remove(d)
		}
	}
	for d := range want {
		if have[d] {
			continue
		}
		switch err := w.fs.Add(d); {
		case err == nil:
		case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
			// not there (yet): the parent's watch sees it appear
		default:
			errs = errors.Join(errs, err)
		}
	}
	return errs
}

// fingerprint identifies the directory and the versions of its matching files.
func (w *dirWatcher) fingerprint() string {
	var b strings.Builder
	if fi, err := os.Stat(w.dir); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			fmt.Fprintf(&b, "%d:%d\n", st.Dev, st.Ino)
		}
	}
	files := w.files()
	sort.Strings(files)
	for _, f := range files {
		fi, err := os.Stat(f)
		if err != nil {
			fmt.Fprintf(&b, "%s missing\n", f)
			continue
		}
		var dev, ino uint64
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			dev, ino = uint64(st.Dev), st.Ino
		}
		fmt.Fprintf(&b, "%s %d:%d %d %d\n", f, dev, ino, fi.Size(), fi.ModTime().UnixNano())
	}
	return b.String()
}
