package test

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The kernel tests of a config directory with the meaning of Azure's
// ip-masq-agent-v2 (config/azure.go; docs/configuration.md, "Config from
// several files"). None depends on owning the table: --once
// --release-on-exit, or a daemon with --own-table=false.

// TestAzureDirOnce: directories applied by --once, decided as Azure's
// agent decides (or as the listed difference), by packets. Files exist but
// none sets a non-empty nonMasqueradeCIDRs: nothing is exempt (10.x and,
// with --nomasq-all-reserved-ranges, the documentation ranges are
// masqueraded), with a warning saying so; a directory without ip-masq*
// files has the defaults. The keys Azure does not read (resyncInterval:
// soon, cidrLimit, masqueradeCIDRs, masqOutBound) are ignored with a
// warning, and the rest applied. Where Azure exits (an IPv4-mapped CIDR, a
// missing directory), the difference: the IPv4 CIDR; the defaults.
func TestAzureDirOnce(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1, internet2, private1)
	once := func(t *testing.T, files map[string]string, flags ...string) string {
		t.Helper()
		dir := filepath.Join(t.TempDir(), "missing")
		if files != nil {
			dir = newProjectedDir(t, files).Dir
		}
		out, err := runAgent(t, topo, append([]string{"--once", "--release-on-exit", "--config", dir}, flags...)...)
		if err != nil {
			t.Fatalf("--once --config DIR: %v\n%s", err, out)
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		files map[string]string
		flags []string
		want  map[string]bool
		warn  string
	}{
		{"an empty file", map[string]string{"ip-masq-agent": ""}, nil,
			map[string]bool{private1: true, internet1: true}, "no file named ip-masq* sets a non-empty nonMasqueradeCIDRs"},
		{"only masqLinkLocal and resyncInterval", map[string]string{"ip-masq-agent": "masqLinkLocal: false\n", "ip-masq-agent-reconciled": "resyncInterval: 30s\n"}, nil,
			map[string]bool{private1: true, internet1: true}, "10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16 are masqueraded"},
		{"an empty file, reserved ranges", map[string]string{"ip-masq-agent": ""}, []string{"--nomasq-all-reserved-ranges"},
			map[string]bool{private1: true, internet1: true}, "203.0.113.0/24"},
		{"no ip-masq* file: the defaults", map[string]string{"other": "nonMasqueradeCIDRs: []\n"}, []string{"--nomasq-all-reserved-ranges"},
			map[string]bool{private1: false, internet1: false}, `no file whose name starts with \"ip-masq\"; using the defaults`},
		{"resyncInterval: soon is ignored", map[string]string{"ip-masq-agent": "nonMasqueradeCIDRs: [10.0.0.0/8]\nresyncInterval: soon\n"}, nil,
			map[string]bool{private1: false, internet1: true}, "resyncInterval: not read in a config directory"},
		{"cidrLimit: 1 is ignored", map[string]string{"ip-masq-agent": "cidrLimit: 1\nnonMasqueradeCIDRs: [10.0.0.0/8, 203.0.113.0/24]\n"}, nil,
			map[string]bool{private1: false, internet1: false, internet2: true}, "cidrLimit: not read in a config directory"},
		{"masqueradeCIDRs and masqOutBound are ignored", map[string]string{"ip-masq-agent": "nonMasqueradeCIDRs: [10.0.0.0/8]\nmasqueradeCIDRs: [10.250.0.0/16]\nmasqOutBound: false\n"}, nil,
			map[string]bool{private1: false, internet1: true}, "masqueradeCIDRs: not read in a config directory"},
		{"an IPv4-mapped CIDR", map[string]string{"ip-masq-agent": "nonMasqueradeCIDRs: [\"::ffff:10.0.0.0/104\"]\n"}, nil,
			map[string]bool{private1: false, internet1: true}, "IPv4-mapped"},
		{"a missing directory", nil, nil,
			map[string]bool{private1: false, internet1: true}, "does not exist: the defaults are in force"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := once(t, tc.files, tc.flags...)
			expectSources(t, topo, tc.want)
			if !strings.Contains(out, tc.warn) || !strings.Contains(out, "level=WARN") {
				t.Errorf("no warning %q:\n%s", tc.warn, out)
			}
			if t.Failed() {
				t.Logf("table:\n%s", listTable(t, topo))
			}
		})
	}
}

// TestAzureDirDanglingLink: an ip-masq* symlink to a missing file and a
// subdirectory named ip-masq* (Azure's agent exits on each) are skipped,
// each with a warning naming it, the other files applied, and the daemon
// keeps running; validate reports them. A good file's link that starts to
// dangle keeps its last good CIDRs in force, with a warning.
func TestAzureDirDanglingLink(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1, internet2, private1)
	cm := newProjectedDir(t, map[string]string{"ip-masq-agent": "nonMasqueradeCIDRs: [203.0.113.0/24]\n"})
	link := filepath.Join(cm.Dir, "ip-masq-agent-reconciled")
	if err := os.Symlink("..data/ip-masq-agent-reconciled", link); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(cm.Dir, "ip-masq-sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, topo, "--config", cm.Dir, "--http-address=127.0.0.1:0", "--own-table=false")
	eventually(t, "the other file's rules", sourcesAre(topo, map[string]bool{internet1: false, private1: true}))
	eventually(t, "the warning naming the link", func() bool {
		return strings.Contains(d.output(), "level=WARN") && strings.Contains(d.output(), link+`: a symlink to \"..data/ip-masq-agent-reconciled\", which does not exist`) &&
			strings.Contains(d.output(), sub+": a directory, not read")
	})
	// Still running, and a change of the other file applies.
	cm.updateFiles(map[string]string{"ip-masq-agent": "nonMasqueradeCIDRs: [10.0.0.0/8]\n"})
	eventually(t, "the change", sourcesAre(topo, map[string]bool{internet1: true, private1: false}))
	select {
	case <-d.Exited():
		t.Fatalf("the agent exited:\n%s", d.output())
	default:
	}
	if code, out, _ := runTool(t, topo, "validate", cm.Dir); code != 0 || !strings.Contains(out, link+`: a symlink to "..data/ip-masq-agent-reconciled", which does not exist`) ||
		!strings.Contains(out, sub+": a directory, not read") {
		t.Errorf("validate DIR: exit %d %q; want the dangling link reported", code, out)
	}

	// A good file's link starts to dangle (as a kubelet update removing
	// the key leaves it for a moment): its last good CIDRs stay, with a
	// warning naming it, and the daemon runs on.
	cm.updateFiles(map[string]string{"ip-masq-agent": "nonMasqueradeCIDRs: [10.0.0.0/8, 203.0.113.0/24]\n"})
	eventually(t, "the good file's CIDRs", sourcesAre(topo, map[string]bool{internet1: false, private1: false}))
	good := filepath.Join(cm.Dir, "ip-masq-agent")
	if err := os.Remove(good); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..data/ip-masq-gone", good); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the warning naming the good file's link", func() bool {
		return strings.Contains(d.output(), good+`: a symlink to \"..data/ip-masq-gone\", which does not exist: its last good content stays in force`)
	})
	// A file added next: once it is in force, the sync that saw the link
	// is done; the link's CIDRs are still there (not the defaults).
	if err := os.WriteFile(filepath.Join(cm.Dir, "ip-masq-zz"), []byte("nonMasqueradeCIDRs: [198.51.100.0/24]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the added file", sourcesAre(topo, map[string]bool{internet2: false}))
	expectSources(t, topo, map[string]bool{internet1: false, private1: false, internet2: false})
	select {
	case <-d.Exited():
		t.Fatalf("the agent exited:\n%s", d.output())
	default:
	}
}

// TestAzureDirFileTurnsBad: a file turns bad (Azure's agent exits and
// crash-loops, so no other change applies): here its last good CIDRs stay
// in force, the error names it, and another file's change applies.
func TestAzureDirFileTurnsBad(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1, internet2, private1)
	cm := newProjectedDir(t, map[string]string{
		"ip-masq-agent":            "nonMasqueradeCIDRs: [10.0.0.0/8]\n",
		"ip-masq-agent-reconciled": "nonMasqueradeCIDRs: [203.0.113.0/24]\n",
	})
	d := startDaemon(t, topo, "--config", cm.Dir, "--http-address=127.0.0.1:0", "--own-table=false")
	eventually(t, "the merged config", sourcesAre(topo, map[string]bool{private1: false, internet1: false, internet2: true}))

	bad := filepath.Join(cm.Dir, "ip-masq-agent-reconciled")
	cm.updateFiles(map[string]string{"ip-masq-agent-reconciled": "nonMasqueradeCIDRs: [203.0.113.0/33]\n"})
	eventually(t, "the bad file named", func() bool { return strings.Contains(d.output(), bad+": nonMasqueradeCIDRs[0]") })
	cm.updateFiles(map[string]string{"ip-masq-agent": "nonMasqueradeCIDRs: [10.0.0.0/8, 198.51.100.0/24]\n"})
	eventually(t, "the other file's change", sourcesAre(topo, map[string]bool{internet2: false}))
	expectSources(t, topo, map[string]bool{private1: false, internet1: false, internet2: false})
	if !strings.Contains(d.output(), "its last good content stays in force") {
		t.Errorf("the log does not say the last good content stays:\n%s", d.output())
	}
}

// TestAzureDirSourceExtension: nonMasqueradeSourceCIDRs, this agent's own
// extension, applies in a directory too (Azure's agent ignores it), with a
// warning naming it: a second pod address listed in one file is not
// masqueraded, while the first pod's traffic is decided by the other
// file's nonMasqueradeCIDRs.
func TestAzureDirSourceExtension(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1, private1)
	pod2 := netip.MustParseAddr("10.244.1.3")
	if err := topo.AddPodAddress(netip.MustParsePrefix("10.244.1.3/24")); err != nil {
		t.Fatalf("add pod address: %v", err)
	}
	cm := newProjectedDir(t, map[string]string{
		"ip-masq-agent":            "nonMasqueradeCIDRs: [10.0.0.0/8]\n",
		"ip-masq-agent-reconciled": "nonMasqueradeSourceCIDRs: [10.244.1.3/32]\n",
	})
	out, err := runAgent(t, topo, "--once", "--release-on-exit", "--config", cm.Dir)
	if err != nil {
		t.Fatalf("--once --config DIR: %v\n%s", err, out)
	}
	if !strings.Contains(out, filepath.Join(cm.Dir, "ip-masq-agent-reconciled")+": nonMasqueradeSourceCIDRs: an extension of this agent, applied in a config directory too") {
		t.Errorf("no warning names the extension:\n%s", out)
	}
	expectSources(t, topo, map[string]bool{internet1: true, private1: false})
	if got, err := topo.SourceSeenFrom(pod2, netip.MustParseAddr(internet1)); err != nil || got != pod2 {
		t.Errorf("internet1 from %s saw %s (%v), want the pod's own address", pod2, got, err)
	}
}
