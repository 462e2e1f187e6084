package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
)

// saveFilter is the command docs/upgrade.md gives to save the node's
// ruleset without table inet ip-masq-agent: nft prints each table from
// "table FAMILY NAME {" (with " # progname ..." while owned) to a "}" at
// the start of a line.
const saveFilter = `nft list ruleset | sed '/^table inet ip-masq-agent /,/^}$/d'`

// saveRuleset runs cmd (a shell pipeline) in the node namespace and
// writes its output, with "flush ruleset" in front as nftables.service
// loads /etc/nftables.conf, to a file.
func saveRuleset(t *testing.T, topo *testnet.Topology, cmd string) (path, saved string) {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", topo.NodeNS, "sh", "-c", cmd).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, out)
	}
	path = filepath.Join(t.TempDir(), "nftables.conf")
	writeFile(t, path, "flush ruleset\n"+string(out))
	return path, string(out)
}

// loadRuleset is nft -f of a saved file in the node namespace.
func loadRuleset(topo *testnet.Topology, path string) (string, error) {
	out, err := topo.NFT("-f", path)
	return out, err
}

// TestSavedRulesetLoads: the node's usual practice, nft list ruleset to a
// file and later nft -f of it with "flush ruleset" in front, with a host
// firewall table next to the agent's.
//
//   - While the agent owns its table, the whole file is refused (EPERM on
//     the agent's table), the host firewall's part too; the documented
//     filter saves the ruleset without the agent's table and loads: flush
//     ruleset passes over the owned table, which stays, and packets are
//     still masqueraded.
//   - After the agent exits the table is orphaned (persist, no owner): nft
//     1.0.6 lists it with a bare "flags " line that nft -f refuses; the
//     filtered save loads.
//   - With --release-on-exit the table is, after exit, an ordinary one:
//     the unfiltered save loads, the agent's table with it, and packets
//     are masqueraded after the reload; list says owned, orphaned, free.
func TestSavedRulesetLoads(t *testing.T) {
	testnet.Require(t, "sh", "sed")
	topo := newTopology(t)
	addDestinations(t, topo, internet1, private1)
	host := "table ip hostfw {\n\tchain input {\n\t\ttype filter hook input priority filter; policy accept;\n\t\ttcp dport 2222 counter accept\n\t}\n}\n"
	hostFile := filepath.Join(t.TempDir(), "hostfw.nft")
	writeFile(t, hostFile, host)
	if out, err := loadRuleset(topo, hostFile); err != nil {
		t.Fatalf("the host firewall: %v\n%s", err, out)
	}
	cfg := writeConfig(t, "nonMasqueradeCIDRs: [10.0.0.0/8]\n")
	want := map[string]bool{internet1: true, private1: false}

	d := startDaemon(t, topo, "--config", cfg, "--http-address=127.0.0.1:0")
	eventually(t, "the table", func() bool { return strings.Contains(d.output(), "applied config") })
	if code, out, _ := runTool(t, topo, "list"); code != 0 || !strings.HasPrefix(out, "# owned:") {
		if strings.Contains(listTable(t, topo), "flags owner") || code != 0 {
			t.Errorf("list of an owned table: %d\n%s", code, out)
		} else {
			t.Skip("the kernel does not let the agent own its table (before Linux 6.9): nothing to test")
		}
	}
	// The unfiltered save is refused as a whole.
	whole, _ := saveRuleset(t, topo, "nft list ruleset")
	if out, err := loadRuleset(topo, whole); err == nil || !strings.Contains(out, "Operation not permitted") {
		t.Errorf("nft -f of the whole ruleset while the agent owns its table: %v\n%s", err, out)
	}
	// The filtered one loads; the owned table stays.
	filtered, saved := saveRuleset(t, topo, saveFilter)
	if strings.Contains(saved, "ip-masq-agent") || !strings.Contains(saved, "table ip hostfw") {
		t.Fatalf("the filtered save:\n%s", saved)
	}
	if out, err := loadRuleset(topo, filtered); err != nil {
		t.Fatalf("nft -f of the filtered save while the agent runs: %v\n%s", err, out)
	}
	if !strings.Contains(listTable(t, topo), "masquerade") {
		t.Error("the agent's table is gone after the reload")
	}
	expectSources(t, topo, want)

	// The agent exits: orphaned.
	d.stop(t)
	if code, out, _ := runTool(t, topo, "list"); code != 0 || !strings.HasPrefix(out, "# orphaned:") {
		t.Errorf("list of an orphaned table: %d\n%s", code, out)
	}
	whole, saved = saveRuleset(t, topo, "nft list ruleset")
	if strings.Contains(saved, "\n\tflags \n") {
		// nft 1.0.6 (Debian 12) prints the persist flag as nothing.
		if out, err := loadRuleset(topo, whole); err == nil {
			t.Errorf("nft -f accepted a bare \"flags \" line:\n%s", out)
		}
	}
	filtered, _ = saveRuleset(t, topo, saveFilter)
	if out, err := loadRuleset(topo, filtered); err != nil {
		t.Fatalf("nft -f of the filtered save after the agent exited: %v\n%s", err, out)
	}

	// --release-on-exit: the agent adopts the orphan, owns it, and at exit
	// leaves an ordinary table (flush ruleset above deleted the orphan:
	// the agent creates it again).
	d = startDaemon(t, topo, "--config", cfg, "--http-address=127.0.0.1:0", "--release-on-exit")
	eventually(t, "the table", func() bool { return strings.Contains(d.output(), "applied config") })
	expectSources(t, topo, want)
	d.stop(t)
	if !strings.Contains(d.output(), "released table inet ip-masq-agent") {
		t.Errorf("no release logged:\n%s", d.output())
	}
	if code, out, _ := runTool(t, topo, "list"); code != 0 || !strings.HasPrefix(out, "# free:") {
		t.Errorf("list after --release-on-exit: %d\n%s", code, out)
	}
	expectSources(t, topo, want)
	whole, saved = saveRuleset(t, topo, "nft list ruleset")
	if !strings.Contains(saved, "table inet ip-masq-agent {") || strings.Contains(saved, "\n\tflags ") {
		t.Errorf("the save after --release-on-exit:\n%s", saved)
	}
	if out, err := loadRuleset(topo, whole); err != nil {
		t.Fatalf("nft -f of the whole ruleset after --release-on-exit: %v\n%s", err, out)
	}
	expectSources(t, topo, want)
	if out, err := topo.NFT("list", "table", "ip", "hostfw"); err != nil || !strings.Contains(out, "tcp dport 2222") {
		t.Errorf("the host firewall's rule is gone: %v\n%s", err, out)
	}
	// The next agent owns it again.
	d = startDaemon(t, topo, "--config", cfg, "--http-address=127.0.0.1:0")
	eventually(t, "the table owned again", func() bool { return strings.Contains(listTable(t, topo), "flags owner") })
	expectSources(t, topo, want)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
