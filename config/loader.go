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
	// nothing; spare is the buffer of the read before, which the next
	// read fills (2 MB at 100,000 CIDRs not allocated at each read).
	// Nothing a Load returns refers to a read's bytes (TestParseKeepsNoBytes, TestLoaderReusesNoBytes).
	file  file
	spare []byte
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
// (see SourceKind). A file (or a missing path) is read as Load reads it,
// with the original agent's meaning. A directory's files whose names start
// with "ip-masq" (IsConfigName; the kubelet's "..data" and other dot
// entries are not read, symlinks are followed) are each parsed and
// validated alone, then merged, with the meaning Azure's ip-masq-agent-v2
// gives them (azure.go): only nonMasqueradeCIDRs (the union; none at all
// when no file sets any) and masqLinkLocal, masqLinkLocalIPv6 (OR'd) are
// read; a directory without such files gives the defaults, with a warning.
//
// Where Azure's agent exits, this one goes on, with a warning or an error
// naming the entry: a bad file is reported in a *DirError, by name: if
// every bad file has a last good content (from an earlier Load of the same
// directory), that is merged instead and the merged config is returned
// with the error (IsPartial); otherwise no config is returned, as for a
// bad single file. A symlink to a missing file keeps its last good
// content in force, if it had one, and is skipped otherwise, with a
// warning either way; a subdirectory is skipped with a warning. Warnings are prefixed with the
// file's path.
func (l *Loader) Load(path string, f Flags) (Config, []string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.decided || l.path != path {
		l.path, l.kind, l.decided, l.last = path, KindOf(path), true, nil
		l.file, l.spare = file{}, nil // another path's bytes say nothing of this one's
	}
	fi, serr := os.Stat(path)
	switch l.kind {
	case SourceNone:
		return Default(f), nil, nil
	case SourceFile:
		if serr == nil && fi.IsDir() {
			return Config{}, nil, fmt.Errorf("%s: is a directory now, but was a file (or missing) when the agent started: not read; restart the agent to read a directory of config files", path)
		}
		data, err := readFileInto(path, l.spare)
		if err == nil && l.file.data != nil && f == l.file.flags && bytes.Equal(data, l.file.data) {
			l.spare = data
			return l.file.cfg, slices.Clone(l.file.warns), l.file.err
		}
		c, warns, lerr := loadData(path, data, err, f)
		l.spare = l.file.data
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
	c, warns, notes, err := l.loadDir(path, f)
	return c, append(warns, notes...), err
}

// loadDir reads a directory (see Load): the merged config, the files'
// warnings (prefixed with their paths), the directory's own warnings
// (DirNotes), and a *DirError.
func (l *Loader) loadDir(path string, f Flags) (Config, []string, []string, error) {
	entries, err := dirFiles(path)
	if err != nil {
		return Config{}, nil, nil, fmt.Errorf("%s: %w", path, unwrapPath(err))
	}
	if l.last == nil {
		l.last = make(map[string]part)
	}
	f.AzureDir = true
	var (
		parts []part
		names []string // parts' files
		warns []string
		notes []string
		de    DirError
		seen  = make(map[string]bool)
	)
	for _, e := range entries {
		file := e.path
		if e.dir {
			notes = append(notes, file+": a directory, not read (Azure's ip-masq-agent-v2 exits on it; this agent goes on without it)")
			continue
		} else if errors.Is(e.err, fs.ErrNotExist) {
			target, ok := danglingTarget(file)
			if !ok {
				continue // gone since the listing
			}
			// Azure exits on it. A kubelet's update leaves one for a
			// moment (a key removed: its link goes after ..data moved).
			if last, ok := l.last[file]; ok {
				seen[file] = true
				notes = append(notes, fmt.Sprintf("%s: a symlink to %q, which does not exist: its last good content stays in force until the link goes (Azure's ip-masq-agent-v2 exits on it)", file, target))
				parts = append(parts, last)
				names = append(names, file)
				continue
			}
			notes = append(notes, fmt.Sprintf("%s: a symlink to %q, which does not exist: not read (Azure's ip-masq-agent-v2 exits on it; this agent goes on without it)", file, target))
			continue
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
	// Said of the files together: validate shows them too (DirNotes).
	notes = append(notes, cidrMatchNote(parts, names)...)
	notes = append(notes, lastSetNotes(path, parts, names)...)
	for file := range l.last {
		if !seen[file] {
			delete(l.last, file) // the file is gone: so is its part
		}
	}
	c := mergeAzure(f, parts)
	switch {
	case len(seen) == 0:
		notes = append(notes, path+": "+msgNoFiles)
	case len(parts) > 0 && len(c.NonMasqueradeCIDRs) == 0:
		notes = append(notes, path+": "+msgEmptyUnion(f))
	}
	if len(de.Files) > 0 {
		de.Partial = true
		for _, fe := range de.Files {
			de.Partial = de.Partial && fe.LastGood
		}
		if !de.Partial {
			return Config{}, warns, notes, &de
		}
		return c, append(warns, mergedGaps(path, c, f)...), notes, &de
	}
	return c, append(warns, mergedGaps(path, c, f)...), notes, nil
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

// lastSetNotes warns when files set a key of one value (snatAddress,
// snatAddressIPv6) to different values: the last file in name order wins.
func lastSetNotes(dir string, parts []part, names []string) []string {
	var out []string
	for _, name := range []string{KeySNAT, KeySNAT6} {
		k := keyNamed(name)
		var files, vals []string
		var first *Config
		differ := false
		for i := range parts {
			if !parts[i].present[name] {
				continue
			}
			if first == nil {
				first = &parts[i].c
			} else if !k.equal(first, &parts[i].c) {
				differ = true
			}
			var b strings.Builder
			k.write(&b, &parts[i].c)
			files, vals = append(files, names[i]), append(vals, strings.TrimSpace(b.String()))
		}
		if differ {
			out = append(out, fmt.Sprintf("%s: %s is set differently in %s (%s): the last file in name order, %s, applies",
				dir, name, strings.Join(files, ", "), strings.Join(vals, "; "), files[len(files)-1]))
		}
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
