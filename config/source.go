package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// The config sources: what a path given as --config (or to a tool) is,
// how a file is read (a ConfigMap manifest as the file it holds), which
// files of a directory are read. Loader (loader.go) keeps a source's state
// across reads; the tools ask it, or Files and ReadInput, and nothing else.

// SourceKind is what --config names: one file, a directory of files, or
// nothing. A Loader decides it once, at its first Load of a path (the
// agent's start), from the path and what is there; a path that later
// changes kind is not read (the error says why), so that the rules in
// force stay rather than change meaning under the agent.
type SourceKind int

const (
	// SourceFile: one file, read by Load. It may be missing, at start or
	// later: the defaults are in force, with a warning naming the path.
	SourceFile SourceKind = iota
	// SourceDir: a directory whose files named ip-masq* are merged.
	SourceDir
	// SourceNone: --config="": no config; the defaults, without a warning.
	SourceNone
)

func (k SourceKind) String() string {
	switch k {
	case SourceDir:
		return "directory"
	case SourceNone:
		return "none"
	}
	return "file"
}

// KindOf returns the kind of config source path is now: "" is none, a
// directory is a directory, anything else (a missing path too) a file.
func KindOf(path string) SourceKind {
	if path == "" {
		return SourceNone
	}
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return SourceDir
	}
	return SourceFile
}

// IsConfigName reports whether a file in a config directory, or a key of a
// ConfigMap's data, holds agent config: its name starts with "ip-masq"
// (not the kubelet's ..data and other dot entries).
func IsConfigName(name string) bool { return strings.HasPrefix(name, "ip-masq") }

// dirFile is a file of a config directory whose name IsConfigName takes,
// with what os.Stat said of it (symlinks followed).
type dirFile struct {
	path string
	dir  bool  // a directory, not read
	err  error // os.Stat's error
}

// dirFiles lists the files of a config directory whose names start with
// "ip-masq" (not the kubelet's "..data" and other dot entries), in name
// order.
func dirFiles(dir string) ([]dirFile, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []dirFile
	for _, e := range entries { // sorted by name
		if !IsConfigName(e.Name()) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		fi, err := os.Stat(path)
		out = append(out, dirFile{path: path, dir: err == nil && fi.IsDir(), err: err})
	}
	return out, nil
}

// Files returns the files a path given to a tool stands for: a
// directory's files named ip-masq* (those the agent reads with --config
// DIR, and that can be stat'ed), or the path itself (a file, a missing
// path, "-"). warn says why a directory stands for none.
func Files(path string) (files []string, warn string) {
	fi, err := os.Stat(path)
	if err != nil || !fi.IsDir() {
		return []string{path}, ""
	}
	entries, err := dirFiles(path)
	if err != nil {
		return []string{path}, ""
	}
	for _, e := range entries {
		if e.err == nil && !e.dir {
			files = append(files, e.path)
		}
	}
	if len(files) == 0 {
		return nil, `a directory without files named ip-masq*: the agent would use the defaults`
	}
	return files, ""
}

// Load reads path; a missing file (or a path that does not exist) gives
// Default(f) and a warning naming the path, an empty/whitespace-only file
// gives Default(f). A ConfigMap manifest (kind: ConfigMap) is read as the
// tools read it: the value of its data key "config" (or of the one key
// named ip-masq...). Errors and warnings are prefixed with the path. It
// follows symlinks, as Kubernetes mounts ConfigMap keys as symlinks through
// "..data".
func Load(path string, f Flags) (Config, []string, error) {
	data, err := readFile(path)
	return loadData(path, data, err, f)
}

// loadData is Load of what reading path gave.
func loadData(path string, data []byte, err error, f Flags) (Config, []string, error) {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return Default(f), []string{path + ": " + MsgMissing}, nil
	}
	if err != nil {
		return Config{}, nil, fmt.Errorf("%s: %w", path, err)
	}
	content, isManifest, err := FromManifest(data)
	if err != nil {
		return Config{}, nil, fmt.Errorf("%s: %w", path, err)
	}
	if isManifest {
		data = content
	}
	c, warns, err := Parse(data, f)
	for i := range warns {
		warns[i] = path + ": " + warns[i]
	}
	if err != nil {
		return Config{}, warns, fmt.Errorf("%s: %w", path, err)
	}
	return c, warns, nil
}

// MsgMissing is the warning about a config file that does not exist.
const MsgMissing = `does not exist: the defaults are in force (no ConfigMap "ip-masq-agent", or no key "config" in it, or a wrong --config?)`

func readFile(path string) ([]byte, error) { return readFileInto(path, nil) }

// readFileInto is readFile into buf's room, when the file fits in it.
func readFileInto(path string, buf []byte) ([]byte, error) {
	// O_NONBLOCK: opening a FIFO must not block the daemon's loop forever.
	file, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, unwrapPath(err)
	}
	defer file.Close()
	fi, err := file.Stat()
	if err != nil {
		return nil, unwrapPath(err)
	}
	if fi.IsDir() {
		return nil, errors.New("is a directory, expected a file")
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("is not a regular file (%s)", fi.Mode().Type())
	}
	tooBig := fmt.Errorf("file is larger than the limit of %d bytes", MaxFileSize)
	if fi.Size() > MaxFileSize {
		return nil, tooBig
	}
	data, err := readLimited(file, fi.Size(), tooBig, buf)
	if err != nil && err != tooBig {
		return nil, unwrapPath(err)
	}
	return data, err
}

// readLimited reads r up to MaxFileSize; tooBig past it. size is what the
// file's size said (room for it is made at once); a pipe's or a device's
// size means nothing, so the read is bounded whatever it said.
func readLimited(r io.Reader, size int64, tooBig error, room []byte) ([]byte, error) {
	buf := bytes.NewBuffer(room[:0])
	buf.Grow(int(min(size, MaxFileSize)) + bytes.MinRead) // the whole file, and the read that sees its end
	if _, err := buf.ReadFrom(io.LimitReader(r, MaxFileSize+1)); err != nil {
		return nil, err
	}
	if buf.Len() > MaxFileSize {
		return nil, tooBig
	}
	return buf.Bytes(), nil
}

// ReadInput reads a file given to a tool (validate's FILE), or standard
// input for "-". Unlike the agent's read of --config, any file that can be
// read is read (a pipe too: a shell's <(...)), up to MaxFileSize; a
// directory is refused (Files lists what it stands for).
func ReadInput(path string, stdin io.Reader) ([]byte, error) {
	var r io.Reader = stdin
	if path != "-" || stdin == nil {
		f, err := os.Open(path)
		if err != nil {
			return nil, unwrapPath(err)
		}
		defer f.Close()
		if fi, err := f.Stat(); err == nil && fi.IsDir() {
			return nil, errors.New("is a directory")
		}
		r = f
	}
	return readLimited(r, 0, fmt.Errorf("larger than the limit of %d bytes", MaxFileSize), nil)
}

// unwrapPath drops the path from an *fs.PathError, since Load adds it itself.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("cannot %s: %w", pe.Op, pe.Err)
	}
	return err
}
