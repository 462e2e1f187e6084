package config

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"sync"
)

// Loader loads the config from a file, as Load does, or from a directory
// of files, such as a projected volume of two ConfigMaps (one managed by
// the platform, one by the user, as with Azure's ip-masq-agent-v2). For a
// directory it remembers each file's last good content, so that one bad
// file does not take the others' CIDRs, or its own last good ones, out of
// force. A Loader is safe for concurrent use.
type Loader struct {
	mu      sync.Mutex
	path    string     // the path whose kind was decided
	kind    SourceKind // decided at the first Load of path
	decided bool
	last    map[string]part // a directory's file path: its last good content

	// One file: the bytes last read and what they gave, so that a resync
	// of an unchanged file (100,000 CIDRs: tens of ms of CPU) parses
	// nothing.
	file file
}

type file struct {
	data  []byte
	flags Flags
	cfg   Config
	warns []string
	err   error
}

// part is one file's config and the keys it sets.
type part struct {
	c       Config
	present map[string]bool
}

// DirError says which files of a config directory are bad. When each of
// them has a last good content, Loader.Load merged that instead and
// returned the merged config with the error: Partial is true, and the
// config is to be applied. Otherwise nothing is to be applied.
type DirError struct {
	Files   []FileError
	Partial bool
}

// FileError is a bad file of a config directory.
type FileError struct {
	Path     string
	Err      error // its problems, one line (without the path)
	LastGood bool  // its last good content was merged instead
}

func (e *DirError) Error() string {
	var parts []string
	for _, f := range e.Files {
		s := f.Path + ": " + f.Err.Error()
		if f.LastGood {
			s += " (its last good content stays in force)"
		} else {
			s += " (it has no good content yet, so no config is applied)"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

// IsPartial reports whether err, from Loader.Load, came with a config to
// apply (some files of a directory are bad, and their last good content
// was merged instead).
func IsPartial(err error) bool {
	var de *DirError
	return errors.As(err, &de) && de.Partial
}

// Load reads path, as the kind of source it was at the first Load of path
// (see SourceKind). A file (or a missing path) is read as Load reads it. A
// directory's files whose names start with "ip-masq" (IsConfigName; the
// kubelet's "..data" and other dot entries are not read, symlinks are
// followed) are each parsed and validated alone, then merged:
//
//   - nonMasqueradeCIDRs: the union of the lists of the files that set it,
//     in file name order; the defaults if no file sets it;
//   - masqueradeCIDRs: the union;
//   - masqLinkLocal, masqLinkLocalIPv6, masqOutBound, masqOutBoundIPv6:
//     true if any file that sets the key sets it to true; the default if
//     no file sets it;
//   - resyncInterval: the smallest that a file sets;
//   - cidrMatch: mostSpecific if any file sets it (with a warning when
//     another file has lists and does not), listOrder otherwise;
//   - cidrLimit: applies to each file's lists; the merge is not limited
//     (its CIDRLimit is the largest of the files', at least the merged
//     lists' lengths).
//
// A directory without such files gives the defaults, with a warning. A
// bad file is reported in a *DirError, by name: if every bad file has a
// last good content (from an earlier Load of the same directory), that is
// merged instead and the merged config is returned with the error
// (IsPartial); otherwise no config is returned, as for a bad single file.
// Warnings are prefixed with the file's path.
func (l *Loader) Load(path string, f Flags) (Config, []string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.decided || l.path != path {
		l.path, l.kind, l.decided, l.last = path, KindOf(path), true, nil
	}
	fi, serr := os.Stat(path)
	switch l.kind {
	case SourceNone:
		return Default(f), nil, nil
	case SourceFile:
		if serr == nil && fi.IsDir() {
			return Config{}, nil, fmt.Errorf("%s: is a directory now, but was a file (or missing) when the agent started: not read; restart the agent to read a directory of config files", path)
		}
		data, err := readFile(path)
		if err == nil && l.file.data != nil && f == l.file.flags && bytes.Equal(data, l.file.data) {
			return l.file.cfg, slices.Clone(l.file.warns), l.file.err
		}
		c, warns, lerr := loadData(path, data, err, f)
		l.file = file{}
		if err == nil {
			l.file = file{data: data, flags: f, cfg: c, warns: slices.Clone(warns), err: lerr}
		}
		return c, warns, lerr
	}
	switch {
	case errors.Is(serr, fs.ErrNotExist):
		return Config{}, nil, fmt.Errorf("%s: the config directory is gone (it was a directory when the agent started): not read", path)
	case serr == nil && !fi.IsDir():
		return Config{}, nil, fmt.Errorf("%s: is a file now, but was a directory when the agent started: not read; restart the agent to read it as a file", path)
	}
	entries, err := dirFiles(path)
	if err != nil {
		return Config{}, nil, fmt.Errorf("%s: %w", path, unwrapPath(err))
	}
	if l.last == nil {
		l.last = make(map[string]part)
	}
	var (
		parts []part
		names []string // parts' files
		warns []string
		de    DirError
		seen  = make(map[string]bool)
	)
	for _, e := range entries {
		file := e.path
		if e.dir {
			warns = append(warns, file+": a directory, not read")
			continue
		} else if errors.Is(e.err, fs.ErrNotExist) {
			continue // a dangling symlink, or gone since the listing
		}
		seen[file] = true
		data, err := readFile(file)
		var p part
		var w []string
		if err == nil {
			p.c, p.present, w, err = parseKeys(data, f)
		}
		for _, s := range w {
			if isFamilyGap(s) {
				continue // said of the merged config below, not of each file
			}
			warns = append(warns, file+": "+s)
		}
		if err != nil {
			last, ok := l.last[file]
			de.Files = append(de.Files, FileError{Path: file, Err: err, LastGood: ok})
			if !ok {
				continue
			}
			p = last
		}
		l.last[file] = p
		parts = append(parts, p)
		names = append(names, file)
	}
	warns = append(warns, cidrMatchNote(parts, names)...)
	for file := range l.last {
		if !seen[file] {
			delete(l.last, file) // the file is gone: so is its part
		}
	}
	if len(seen) == 0 {
		warns = append(warns, path+": no file whose name starts with \"ip-masq\"; using the defaults")
	}
	if len(de.Files) > 0 {
		de.Partial = true
		for _, fe := range de.Files {
			de.Partial = de.Partial && fe.LastGood
		}
		if !de.Partial {
			return Config{}, warns, &de
		}
		c := merge(f, parts)
		return c, append(warns, mergedGaps(path, c, f)...), &de
	}
	c := merge(f, parts)
	return c, append(warns, mergedGaps(path, c, f)...), nil
}

// isFamilyGap reports whether a file's warning is a familyGaps one.
func isFamilyGap(w string) bool {
	for _, fam := range []string{"IPv4", "IPv6"} {
		if strings.Contains(w, fmt.Sprintf(msgFamilyGap, fam, fam)) {
			return true
		}
	}
	return false
}

// mergedGaps are familyGaps of a directory's merged config.
func mergedGaps(path string, c Config, f Flags) []string {
	var out []string
	for _, gap := range familyGaps(c, f) {
		out = append(out, path+": "+KeyMasqSrc+" (all files): "+gap)
	}
	return out
}

// cidrMatchNote warns when some files set cidrMatch: mostSpecific and
// others do not: mostSpecific applies to the merged lists, every file's.
func cidrMatchNote(parts []part, names []string) []string {
	var most, other []string
	for i, p := range parts {
		if p.present[KeyCIDRMatch] && p.c.CIDRMatch == MostSpecific {
			most = append(most, names[i])
		} else if len(p.c.MasqueradeCIDRs) > 0 || p.present[KeyNonMasq] {
			other = append(other, names[i])
		}
	}
	if len(most) == 0 || len(other) == 0 {
		return nil
	}
	return []string{fmt.Sprintf("%s: cidrMatch: mostSpecific applies to the merged lists, so also to those of %s, which does not set it: "+
		"there, a CIDR of either list inside a wider one of the other decides", strings.Join(most, ", "), strings.Join(other, ", "))}
}

// merge combines the configs of a directory's files (see Loader.Load):
// each key by its merge rule (keys) over the files that set it.
func merge(f Flags, parts []part) Config {
	c := Default(f)
	for _, k := range keys {
		var set []*Config
		for i := range parts {
			if parts[i].present[k.Name()] {
				set = append(set, &parts[i].c)
			}
		}
		if len(set) > 0 {
			k.mergeInto(&c, set)
		}
	}
	// The limit applied to each file; the merge is not limited.
	for _, k := range keys {
		if ps := k.cidrs(&c); ps != nil {
			c.CIDRLimit = max(c.CIDRLimit, len(*ps))
		}
	}
	return c
}
