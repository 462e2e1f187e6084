package config

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func hasWarning(warns []string, parts ...string) bool {
	return slices.ContainsFunc(warns, func(w string) bool {
		for _, p := range parts {
			if !strings.Contains(w, p) {
				return false
			}
		}
		return true
	})
}

// An empty union exempts nothing, as in Azure, and says so; the defaults
// apply only to a directory without ip-masq* files.
func TestAzureEmptyUnion(t *testing.T) {
	for _, content := range []string{"", "masqLinkLocal: true\n", "resyncInterval: 30s\n", "nonMasqueradeCIDRs: []\n", "nonMasqueradeCIDRs: null\n", "# a comment\n"} {
		dir := t.TempDir()
		writeFiles(t, dir, map[string]string{"ip-masq-agent": content})
		for _, f := range []Flags{v4Only, {NoMasqAllReservedRanges: true}} {
			var l Loader
			c, warns, err := l.Load(dir, f)
			if err != nil || len(c.NonMasqueradeCIDRs) != 0 {
				t.Errorf("%q, %+v: %s, %v; want no CIDR", content, f, c, err)
			}
			if !hasWarning(warns, dir+": no file named ip-masq* sets a non-empty nonMasqueradeCIDRs", "10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16") ||
				f.NoMasqAllReservedRanges && !hasWarning(warns, "100.64.0.0/10") {
				t.Errorf("%q, %+v: warnings %q; want the empty union named with the ranges masqueraded", content, f, warns)
			}
		}
	}
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"ip-masq-agent": "nonMasqueradeCIDRs: [10.0.0.0/8]\n"})
	var l Loader
	if _, warns, err := l.Load(dir, v4Only); err != nil || hasWarning(warns, "no file named") {
		t.Errorf("a non-empty union: %q, %v", warns, err)
	}
}

// The keys Azure does not read are ignored in a directory, whatever their
// value, each with a warning naming the file and the key.
func TestAzureIgnoredKeys(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"ip-masq-agent": "nonMasqueradeCIDRs: [10.0.0.0/8]\nresyncInterval: soon\ncidrLimit: 1\n" +
		"masqueradeCIDRs: [10.1.0.0/16]\nmasqOutBound: maybe\nmasqOutBoundIPv6: false\nResyncInterval: 90\n"})
	var l Loader
	c, warns, err := l.Load(dir, v4Only)
	if err != nil || !c.Equal(with(v4Only, func(c *Config) { c.NonMasqueradeCIDRs = prefixes("10.0.0.0/8") })) {
		t.Fatalf("Load = %s, %v", c, err)
	}
	file := filepath.Join(dir, "ip-masq-agent")
	for _, k := range []string{"resyncInterval", "cidrLimit", "masqueradeCIDRs", "masqOutBound", "masqOutBoundIPv6", "ResyncInterval"} {
		if !hasWarning(warns, file+": "+k+": not read in a config directory") {
			t.Errorf("no warning names %q: %q", k, warns)
		}
	}
	// The same file alone keeps the original's meaning: refused.
	if _, _, err := Load(file, v4Only); err == nil {
		t.Errorf("as a single file: accepted")
	}
}

// Azure's validation of a file: 64 CIDRs at most, cidrLimit aside; a null
// item is "", not a default.
func TestAzureFileValidation(t *testing.T) {
	tests := []struct {
		content string
		bad     string // in the error; "" for a good file
	}{
		{cidrFile(0, 64), ""},
		{"cidrLimit: 100\n" + cidrFile(0, 65), "65 CIDRs exceed the limit of 64 per file"},
		{"cidrLimit: 1\nnonMasqueradeCIDRs: [10.0.0.0/8, 192.168.0.0/16]\n", ""},
		{"nonMasqueradeCIDRs: [null, 192.168.0.0/16]\n", "nonMasqueradeCIDRs[0]: expected a CIDR string"},
		{"nonMasqueradeCIDRs: [\"fd00::/8\"]\n", "pass --enable-ipv6"},
		{"masqLinkLocal: \"true\"\n", "masqLinkLocal: expected true or false"},
		{"nonMasqueradeCIDRs: [10.0.0.1/8]\n", "not aligned"},
	}
	for _, tt := range tests {
		dir := t.TempDir()
		writeFiles(t, dir, map[string]string{"ip-masq-agent": tt.content})
		var l Loader
		_, _, err := l.Load(dir, v4Only)
		if tt.bad == "" && err != nil || tt.bad != "" && (err == nil || !strings.Contains(err.Error(), tt.bad)) {
			t.Errorf("%.60q: %v; want %q", tt.content, err, tt.bad)
		}
	}
}

// Where Azure exits, this agent goes on and says so, naming the entry.
func TestAzureExits(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"ip-masq-a": "nonMasqueradeCIDRs: [10.0.0.0/8]\n", "ip-masq-b": "nonMasqueradeCIDRs: [192.168.0.0/16]\n"})
	os.Mkdir(filepath.Join(dir, "ip-masq-sub"), 0o755)
	os.Symlink("..data/ip-masq-gone", filepath.Join(dir, "ip-masq-c"))
	var l Loader
	c, warns, err := l.Load(dir, v4Only)
	if err != nil || !c.Equal(with(v4Only, func(c *Config) { c.NonMasqueradeCIDRs = prefixes("10.0.0.0/8", "192.168.0.0/16") })) {
		t.Fatalf("Load = %s, %v", c, err)
	}
	if !hasWarning(warns, filepath.Join(dir, "ip-masq-c")+`: a symlink to "..data/ip-masq-gone", which does not exist`) ||
		!hasWarning(warns, filepath.Join(dir, "ip-masq-sub")+": a directory, not read") {
		t.Errorf("warnings %q; want the dangling link and the subdirectory named", warns)
	}
	if notes := DirNotes(dir, v4Only); len(notes) != 2 {
		t.Errorf("DirNotes = %q; want the dangling link and the subdirectory", notes)
	}

	// A good file whose link then dangles (a kubelet update removing the
	// key, for a moment): its last good content stays, with a warning
	// naming it; not an error.
	b := filepath.Join(dir, "ip-masq-b")
	os.Remove(b)
	os.Symlink("..data/ip-masq-b", b)
	c, warns, err = l.Load(dir, v4Only)
	if err != nil || !hasWarning(warns, b+`: a symlink to "..data/ip-masq-b", which does not exist: its last good content stays in force`) ||
		!slices.Contains(c.NonMasqueradeCIDRs, prefixes("192.168.0.0/16")[0]) {
		t.Errorf("a link that dangles now: %s, %q, %v; want its last good content kept, named in a warning", c, warns, err)
	}
	// A file turned bad: its last good content stays while another
	// file's change applies.
	os.Remove(b)
	writeFiles(t, dir, map[string]string{"ip-masq-b": "nonMasqueradeCIDRs: [192.168.0.0/16]\n"})
	if _, _, err := l.Load(dir, v4Only); err != nil {
		t.Fatal(err)
	}
	writeFiles(t, dir, map[string]string{"ip-masq-b": "nonMasqueradeCIDRs: [192.168.0.0/33]\n", "ip-masq-a": "nonMasqueradeCIDRs: [172.16.0.0/12]\n"})
	c, _, err = l.Load(dir, v4Only)
	if !IsPartial(err) || !strings.HasPrefix(err.Error(), b+": ") || !c.Equal(with(v4Only, func(c *Config) { c.NonMasqueradeCIDRs = prefixes("172.16.0.0/12", "192.168.0.0/16") })) {
		t.Errorf("a file turned bad: %s, %v", c, err)
	}
	if DirNotes(filepath.Join(dir, "ip-masq-a"), v4Only) != nil {
		t.Errorf("DirNotes of a file: want nil")
	}
}

// nonMasqueradeSourceCIDRs, this agent's own extension, applies in a
// directory too (Azure's agent ignores it): merged as a union, with a
// warning naming the file and the key as an extension.
func TestAzureExtension(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"ip-masq-a": "nonMasqueradeCIDRs: [10.0.0.0/8]\nnonMasqueradeSourceCIDRs: [10.244.1.0/24]\n",
		"ip-masq-b": "nonMasqueradeSourceCIDRs: [10.244.1.0/24, 10.244.2.0/24]\n",
	})
	var l Loader
	c, warns, err := l.Load(dir, v4Only)
	want := with(v4Only, func(c *Config) {
		c.NonMasqueradeCIDRs = prefixes("10.0.0.0/8")
		c.NonMasqueradeSourceCIDRs = prefixes("10.244.1.0/24", "10.244.2.0/24")
	})
	if err != nil || !c.Equal(want) {
		t.Fatalf("Load = %s, %v; want %s", c, err, want)
	}
	for _, f := range []string{"ip-masq-a", "ip-masq-b"} {
		if !hasWarning(warns, filepath.Join(dir, f)+": nonMasqueradeSourceCIDRs: "+msgAzureExtension) {
			t.Errorf("no extension warning for %s: %q", f, warns)
		}
	}
	writeFiles(t, dir, map[string]string{"ip-masq-b": "nonMasqueradeSourceCIDRs:\n" + strings.Repeat("  - 10.244.1.0/24\n", 65)})
	if _, _, err := l.Load(dir, v4Only); err == nil || !strings.Contains(err.Error(), "65 CIDRs exceed the limit of 64") {
		t.Errorf("65 source CIDRs in a file: %v", err)
	}
}
