package config

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestMerge: a directory's files merge as Azure's ip-masq-agent-v2
// merges them (azure.go).
func TestMerge(t *testing.T) {
	az := func(f Flags) Flags { f.AzureDir = true; return f }
	tests := []struct {
		name  string
		files []string
		f     Flags
		want  Config
	}{
		{"no files: defaults", nil, v4Only, Default(v4Only)},
		{"no files, reserved ranges: defaults", nil, Flags{NoMasqAllReservedRanges: true}, Default(Flags{NoMasqAllReservedRanges: true})},
		{"one file is that file", []string{"nonMasqueradeCIDRs: [10.0.0.0/8, 10.0.0.0/8]\n"}, v4Only,
			with(v4Only, func(c *Config) { c.NonMasqueradeCIDRs = prefixes("10.0.0.0/8") })},
		{"an empty file: nothing exempt, not the defaults", []string{""}, v4Only,
			with(v4Only, func(c *Config) { c.NonMasqueradeCIDRs = nil })},
		{"an empty file with --nomasq-all-reserved-ranges: nothing exempt", []string{""}, Flags{NoMasqAllReservedRanges: true},
			with(Flags{NoMasqAllReservedRanges: true}, func(c *Config) { c.NonMasqueradeCIDRs = nil })},
		{"lists are unioned, in file order, repeats across files dropped", []string{
			"nonMasqueradeCIDRs: [10.0.0.0/8, 100.64.0.0/10]\n",
			"nonMasqueradeCIDRs: [100.64.0.0/10, 192.168.0.0/16]\n",
			"nonMasqueradeCIDRs: null\nmasqLinkLocal: false\n",
		}, v4Only, with(v4Only, func(c *Config) {
			c.NonMasqueradeCIDRs = prefixes("10.0.0.0/8", "100.64.0.0/10", "192.168.0.0/16")
		})},
		{"booleans are OR'd", []string{
			"masqLinkLocal: true\n", "masqLinkLocal: false\nmasqLinkLocalIPv6: true\n",
		}, v6, with(v6, func(c *Config) {
			c.NonMasqueradeCIDRs = nil
			c.MasqLinkLocal = true
			c.MasqLinkLocalIPv6 = true
		})},
		{"keys Azure does not read are ignored", []string{
			"resyncInterval: 10s\ncidrLimit: 1\nnonMasqueradeCIDRs: [1.0.0.0/8, 2.0.0.0/8]\nmasqueradeCIDRs: [1.1.1.1/32]\nmasqOutBound: false\nmasqOutBoundIPv6: false\n",
			"resyncInterval: soon\ncidrLimit: many\nmasqOutBound: maybe\n",
		}, v6, with(v6, func(c *Config) {
			c.NonMasqueradeCIDRs = prefixes("1.0.0.0/8", "2.0.0.0/8")
		})},
		{"the limit is Azure's 64 per file; the union is not limited", []string{
			cidrFile(0, 64), cidrFile(100, 64),
		}, v4Only, with(v4Only, func(c *Config) {
			c.NonMasqueradeCIDRs = append(prefixes16(0, 64), prefixes16(100, 64)...)
			c.CIDRLimit = 128
		})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var parts []part
			for _, f := range tt.files {
				c, present, _, err := parseKeys([]byte(f), az(tt.f))
				if err != nil {
					t.Fatal(err)
				}
				parts = append(parts, part{c, present})
			}
			got := mergeAzure(tt.f, parts)
			if !got.Equal(tt.want) {
				t.Errorf("merge =\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}

func cidrFile(from, n int) string {
	var b strings.Builder
	b.WriteString("nonMasqueradeCIDRs:\n")
	for _, p := range prefixes16(from, n) {
		b.WriteString("  - " + p.String() + "\n")
	}
	return b.String()
}

func prefixes16(from, n int) []netip.Prefix {
	var out []netip.Prefix
	for i := from; i < from+n; i++ {
		out = append(out, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i), 0, 0}), 16))
	}
	return out
}

func TestLoaderDirectory(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"ip-masq-agent":            "nonMasqueradeCIDRs: [10.0.0.0/8]\n",
		"ip-masq-agent-reconciled": "nonMasqueradeCIDRs: [192.168.0.0/16]\nmasqLinkLocal: true\n",
		"README":                   "not read",
		".hidden-ip-masq":          "not read",
	})
	var l Loader
	load := func() (Config, []string, error) { t.Helper(); return l.Load(dir, v4Only) }
	c, warns, err := load()
	want := with(v4Only, func(c *Config) {
		c.NonMasqueradeCIDRs = prefixes("10.0.0.0/8", "192.168.0.0/16")
		c.MasqLinkLocal = true
	})
	if err != nil || len(warns) != 0 || !c.Equal(want) {
		t.Fatalf("Load = %s, %q, %v; want %s", c, warns, err, want)
	}

	// One file goes bad: it is named, and its last good content stays.
	writeFiles(t, dir, map[string]string{"ip-masq-agent-reconciled": "nonMasqueradeCIDRs: [192.168.0.1/16]\n"})
	c, _, err = load()
	if !IsPartial(err) || !c.Equal(want) {
		t.Fatalf("with a bad file: %s, %v; want the last good merge and a partial error", c, err)
	}
	bad := filepath.Join(dir, "ip-masq-agent-reconciled")
	if msg := err.Error(); !strings.HasPrefix(msg, bad+": nonMasqueradeCIDRs[0]: ") || !strings.Contains(msg, "last good content stays") ||
		strings.Contains(msg, filepath.Join(dir, "ip-masq-agent:")) {
		t.Errorf("error %q should name the bad file only", msg)
	}

	// The good file changes meanwhile: its new content is merged with
	// the bad one's last good content.
	writeFiles(t, dir, map[string]string{"ip-masq-agent": "nonMasqueradeCIDRs: [172.16.0.0/12]\n"})
	c, _, err = load()
	want.NonMasqueradeCIDRs = prefixes("172.16.0.0/12", "192.168.0.0/16")
	if !IsPartial(err) || !c.Equal(want) {
		t.Fatalf("good file changed: %s, %v; want %s", c, err, want)
	}

	// Fixed: no error.
	writeFiles(t, dir, map[string]string{"ip-masq-agent-reconciled": "masqLinkLocal: true\n"})
	if c, _, err = load(); err != nil || !c.Equal(with(v4Only, func(c *Config) {
		c.NonMasqueradeCIDRs = prefixes("172.16.0.0/12")
		c.MasqLinkLocal = true
	})) {
		t.Fatalf("fixed: %s, %v", c, err)
	}

	// A new file that has never been good: nothing to apply.
	writeFiles(t, dir, map[string]string{"ip-masq-extra": "masqLinkLocal: maybe\n"})
	if _, _, err = load(); err == nil || IsPartial(err) || !strings.Contains(err.Error(), "no good content yet") {
		t.Fatalf("a file bad from the start: %v, want a plain error", err)
	}
	// It goes away: so does the error.
	os.Remove(filepath.Join(dir, "ip-masq-extra"))
	if _, _, err = load(); err != nil {
		t.Fatalf("after removing the bad file: %v", err)
	}

	// A removed file's content leaves the merge, and its last good
	// content is forgotten.
	os.Remove(filepath.Join(dir, "ip-masq-agent-reconciled"))
	if c, _, err = load(); err != nil || c.MasqLinkLocal {
		t.Fatalf("after removing a file: %s, %v", c, err)
	}
	writeFiles(t, dir, map[string]string{"ip-masq-agent-reconciled": "masqLinkLocal: 1\n"})
	if _, _, err = load(); err == nil || IsPartial(err) {
		t.Fatalf("a re-created bad file has no last good content: %v", err)
	}
}

func TestLoaderKubeletLayout(t *testing.T) {
	// A projected volume: each key a symlink through ..data to a
	// timestamped directory.
	dir := t.TempDir()
	ts := filepath.Join(dir, "..2026_11_22_10_00_00.000000001")
	if err := os.Mkdir(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFiles(t, ts, map[string]string{"ip-masq-agent": "masqLinkLocal: true\n", "ip-masq-agent-reconciled": "nonMasqueradeCIDRs: [1.2.3.0/24]\n"})
	for _, l := range []struct{ name, to string }{
		{"..data", filepath.Base(ts)}, {"ip-masq-agent", "..data/ip-masq-agent"}, {"ip-masq-agent-reconciled", "..data/ip-masq-agent-reconciled"},
	} {
		if err := os.Symlink(l.to, filepath.Join(dir, l.name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "ip-masq-subdir"), 0o755); err != nil {
		t.Fatal(err)
	}
	var l Loader
	c, warns, err := l.Load(dir, v4Only)
	want := with(v4Only, func(c *Config) { c.MasqLinkLocal = true; c.NonMasqueradeCIDRs = prefixes("1.2.3.0/24") })
	if err != nil || !c.Equal(want) {
		t.Fatalf("Load = %s, %v; want %s", c, err, want)
	}
	if len(warns) != 1 || !strings.Contains(warns[0], "ip-masq-subdir: a directory") {
		t.Errorf("warnings %q, want one about the subdirectory", warns)
	}
}

func TestLoaderFileAndEmptyDir(t *testing.T) {
	var l Loader
	dir := t.TempDir()
	c, warns, err := l.Load(dir, v4Only)
	if err != nil || !c.Equal(Default(v4Only)) || len(warns) != 1 || !strings.Contains(warns[0], "no file") {
		t.Errorf("empty directory: %s, %q, %v", c, warns, err)
	}
	// A file, or a missing path, is read as Load reads it.
	file := filepath.Join(dir, "config")
	writeFiles(t, dir, map[string]string{"config": "masqLinkLocal: x\n"})
	_, _, err = l.Load(file, v4Only)
	_, _, want := Load(file, v4Only)
	if err == nil || err.Error() != want.Error() || IsPartial(err) {
		t.Errorf("file: %v, want %v", err, want)
	}
	if c, _, err := l.Load(filepath.Join(dir, "missing"), v4Only); err != nil || !c.Equal(Default(v4Only)) {
		t.Errorf("missing: %s, %v", c, err)
	}
}

// TestLoaderKindDecidedOnce: the kind of source is decided at the first
// Load of a path; a path that changes kind afterwards is not read, and the
// error says why (the agent keeps the last good rules).
func TestLoaderKindDecidedOnce(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ip-masq-agent")

	var file Loader // missing at start: a file, defaults with a warning
	c, warns, err := file.Load(path, v4Only)
	if err != nil || !c.Equal(Default(v4Only)) || !slices.Equal(warns, []string{path + ": " + MsgMissing}) {
		t.Fatalf("missing: %s, %q, %v", c, warns, err)
	}
	writeFiles(t, dir, map[string]string{"ip-masq-agent": "masqLinkLocal: true\n"})
	if c, _, err := file.Load(path, v4Only); err != nil || !c.MasqLinkLocal {
		t.Fatalf("the file appeared: %s, %v", c, err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, _, err := file.Load(path, v4Only); err == nil || !strings.Contains(err.Error(), "is a directory now, but was a file") {
		t.Errorf("a file that became a directory: %v", err)
	}

	var d Loader // a directory at start
	if _, _, err := d.Load(path, v4Only); err != nil {
		t.Fatalf("directory: %v", err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.Load(path, v4Only); err == nil || !strings.Contains(err.Error(), "the config directory is gone") {
		t.Errorf("a directory that went: %v", err)
	}
	writeFiles(t, dir, map[string]string{"ip-masq-agent": "masqLinkLocal: true\n"})
	if _, _, err := d.Load(path, v4Only); err == nil || !strings.Contains(err.Error(), "is a file now, but was a directory") {
		t.Errorf("a directory that became a file: %v", err)
	}

	var none Loader // --config=""
	if c, warns, err := none.Load("", v4Only); err != nil || len(warns) > 0 || !c.Equal(Default(v4Only)) {
		t.Errorf("no config: %s, %q, %v", c, warns, err)
	}
}

// Files lists what the agent reads of a directory: its files named
// ip-masq*, not the directories among them nor dangling symlinks.
func TestFiles(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"ip-masq-b", "ip-masq-a", "other"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.Mkdir(filepath.Join(dir, "ip-masq-dir"), 0o755)
	os.Symlink(filepath.Join(dir, "gone"), filepath.Join(dir, "ip-masq-dangling"))
	files, warn := Files(dir)
	if want := []string{filepath.Join(dir, "ip-masq-a"), filepath.Join(dir, "ip-masq-b")}; !slices.Equal(files, want) || warn != "" {
		t.Errorf("Files(dir) = %q, %q; want %q", files, warn, want)
	}
	if files, warn := Files(t.TempDir()); files != nil || !strings.Contains(warn, "the agent would use the defaults") {
		t.Errorf("Files(empty dir) = %q, %q", files, warn)
	}
	if files, warn := Files("-"); !slices.Equal(files, []string{"-"}) || warn != "" {
		t.Errorf("Files(-) = %q, %q", files, warn)
	}
	if data, err := ReadInput("-", strings.NewReader("x: 1\n")); string(data) != "x: 1\n" || err != nil {
		t.Errorf("ReadInput(-) = %q, %v", data, err)
	}
	if _, err := ReadInput(dir, nil); errString(err) != "is a directory" {
		t.Errorf("ReadInput(dir) = %v", err)
	}
	big := strings.NewReader(strings.Repeat("#", MaxFileSize+1))
	if _, err := ReadInput("-", big); errString(err) != "larger than the limit of 4194304 bytes" {
		t.Errorf("ReadInput of a large stdin = %v", err)
	}
}

// cidrMatch: mostSpecific in one file of a directory applies to the
// merged lists, with a warning naming the file with lists that does not
// set it.
func TestLoaderDirectoryCIDRMatch(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"ip-masq-agent":      "nonMasqueradeCIDRs: [10.0.0.0/8]\n",
		"ip-masq-agent-user": "cidrMatch: mostSpecific\nmasqueradeCIDRs: [10.20.0.0/16]\n",
	})
	var l Loader
	c, warns, err := l.Load(dir, v4Only)
	if err != nil || c.CIDRMatch != MostSpecific {
		t.Fatalf("Load = %s, %v; want cidrMatch: mostSpecific", c, err)
	}
	var note string
	for _, w := range warns {
		if strings.Contains(w, "applies to the merged lists") {
			note = w
		}
	}
	if !strings.Contains(note, filepath.Join(dir, "ip-masq-agent-user")+": cidrMatch: mostSpecific") ||
		!strings.Contains(note, "also to those of "+filepath.Join(dir, "ip-masq-agent")+",") {
		t.Errorf("warnings %q: want one naming both files", warns)
	}
	writeFiles(t, dir, map[string]string{"ip-masq-agent": "cidrMatch: mostSpecific\nnonMasqueradeCIDRs: [10.0.0.0/8]\n"})
	if c, warns, err = l.Load(dir, v4Only); err != nil || c.CIDRMatch != MostSpecific || strings.Contains(strings.Join(warns, "\n"), "applies to the merged lists") {
		t.Errorf("both mostSpecific: %s, %q, %v; want no note", c, warns, err)
	}
}

// Files that set snatAddress to different values: the last in name order
// applies, and the loader says so naming both files and values; the same
// value in both says nothing.
func TestLoaderDirectorySNATConflict(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"ip-masq-a": "snatAddress: 192.0.2.1\n",
		"ip-masq-b": "snatAddress: 192.0.2.2\n",
	})
	var l Loader
	c, warns, err := l.Load(dir, v4Only)
	if err != nil || c.SNATAddress != netip.MustParseAddr("192.0.2.2") {
		t.Fatalf("Load = %s, %v; want snatAddress 192.0.2.2", c, err)
	}
	all := strings.Join(warns, "\n")
	if !strings.Contains(all, "snatAddress is set differently in "+filepath.Join(dir, "ip-masq-a")+", "+filepath.Join(dir, "ip-masq-b")) ||
		!strings.Contains(all, "192.0.2.1") || !strings.Contains(all, "the last file in name order, "+filepath.Join(dir, "ip-masq-b")+", applies") {
		t.Errorf("warnings %q: want one naming both files, both values and the winner", warns)
	}
	writeFiles(t, dir, map[string]string{"ip-masq-a": "snatAddress: 192.0.2.2\n"})
	if _, warns, _ = l.Load(dir, v4Only); strings.Contains(strings.Join(warns, "\n"), "set differently") {
		t.Errorf("the same value in both files: %q; want no note", warns)
	}
}

// masqueradeSourceCIDRs' family warning is said of a directory's merged
// config, not of each file: two files, one family each, warn of nothing;
// one family in all files warns once, naming the directory.
func TestLoaderSourceGuardFamilies(t *testing.T) {
	f := Flags{EnableIPv6: true}
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"ip-masq-a": "masqueradeSourceCIDRs: [10.244.0.0/16]\n",
		"ip-masq-b": "masqueradeSourceCIDRs: [\"fd00::/8\"]\n",
	})
	var l Loader
	c, warns, err := l.Load(dir, f)
	if err != nil || len(c.MasqueradeSourceCIDRs) != 2 {
		t.Fatalf("load: %v %v", c.MasqueradeSourceCIDRs, err)
	}
	for _, w := range warns {
		if strings.Contains(w, "traffic will be masqueraded") {
			t.Errorf("both families are listed, but: %s", w)
		}
	}
	writeFiles(t, dir, map[string]string{"ip-masq-b": "masqLinkLocal: true\n"})
	_, warns, err = l.Load(dir, f)
	if err != nil {
		t.Fatal(err)
	}
	var gaps []string
	for _, w := range warns {
		if strings.Contains(w, "traffic will be masqueraded") {
			gaps = append(gaps, w)
		}
	}
	if want := []string{dir + ": masqueradeSourceCIDRs (all files): has no IPv6 CIDR: no IPv6 traffic will be masqueraded"}; !slices.Equal(gaps, want) {
		t.Errorf("warnings %q, want %q", gaps, want)
	}
}
