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
//   - After the agent exits with the default flags (SIGTERM, or the end of
//     --once, which owns the table while it writes it) the table is an
//     ordinary one, its rules kept: the whole save loads, the agent's
//     table with it, and packets are masqueraded after the reload. This
//     part does not depend on ownership: where the kernel cannot own the
//     table (before 6.9) there is no flag to clear, and it passes as well.
//   - With --release-on-exit=false the owned table is left orphaned
//     (persist, no owner): nft 1.0.6 lists it with a bare "flags " line
//     that nft -f refuses; the filtered save loads.
//
// Where the table is not owned (a kernel before 6.9, which the agent says
// in its log, or --own-table=false: the subtest "not owned") the whole
// save loads while the agent runs, and so does the filtered one, whose
// flush ruleset deletes the agent's table: the agent restores it.
func TestSavedRulesetLoads(t *testing.T) {
	testnet.Require(t, "sh", "sed")
	host := "table ip hostfw {\n\tchain input {\n\t\ttype filter hook input priority filter; policy accept;\n\t\ttcp dport 2222 counter accept\n\t}\n}\n"
	want := map[string]bool{internet1: true, private1: false}
	start := func(t *testing.T, flags ...string) (*testnet.Topology, string, *daemon) {
		topo := newTopology(t)
		addDestinations(t, topo, internet1, private1)
		hostFile := filepath.Join(t.TempDir(), "hostfw.nft")
		writeFile(t, hostFile, host)
		if out, err := loadRuleset(topo, hostFile); err != nil {
			t.Fatalf("the host firewall: %v\n%s", err, out)
		}
		cfg := writeConfig(t, "nonMasqueradeCIDRs: [10.0.0.0/8]\n")
		d := startDaemon(t, topo, append([]string{"--config", cfg, "--http-address=127.0.0.1:0"}, flags...)...)
		eventually(t, "the table", func() bool { return strings.Contains(d.output(), "applied config") })
		return topo, cfg, d
	}
	notOwned := func(t *testing.T, topo *testnet.Topology, d *daemon) {
		if code, out, _ := runTool(t, topo, "list"); code != 0 || strings.HasPrefix(out, "# owned:") || strings.Contains(listTable(t, topo), "flags owner") {
			t.Errorf("list of a table that is not owned: %d\n%s", code, out)
		}
		whole, saved := saveRuleset(t, topo, "nft list ruleset")
		if !strings.Contains(saved, "table inet ip-masq-agent {") || !strings.Contains(saved, "table ip hostfw") {
			t.Fatalf("the whole save:\n%s", saved)
		}
		if out, err := loadRuleset(topo, whole); err != nil {
			t.Errorf("nft -f of the whole ruleset while the agent runs, its table not owned: %v\n%s", err, out)
		}
		expectSources(t, topo, want)
		filtered, _ := saveRuleset(t, topo, saveFilter)
		mark := strings.Count(d.output(), repairLine)
		if out, err := loadRuleset(topo, filtered); err != nil {
			t.Fatalf("nft -f of the filtered save: %v\n%s", err, out)
		}
		// flush ruleset deleted the agent's table: the agent creates it again.
		eventually(t, "the agent's table restored", func() bool {
			return strings.Count(d.output(), repairLine) > mark && strings.Contains(listTable(t, topo), "masquerade")
		})
		expectSources(t, topo, want)
		if out, err := topo.NFT("list", "table", "ip", "hostfw"); err != nil || !strings.Contains(out, "tcp dport 2222") {
			t.Errorf("the host firewall's rule is gone: %v\n%s", err, out)
		}
	}
	t.Run("not owned", func(t *testing.T) {
		topo, _, d := start(t, "--own-table=false")
		notOwned(t, topo, d)
	})
	t.Run("default flags", func(t *testing.T) { savedRulesetDefault(t, start, notOwned, want) })
}

// savedRulesetDefault is TestSavedRulesetLoads with the default flags: the
// owned table's cases while the agent runs, or on a kernel that cannot own
// it (the agent logged so) the not-owned ones; then, on every kernel, the
// whole save loads after SIGTERM and after --once.
func savedRulesetDefault(t *testing.T, start func(*testing.T, ...string) (*testnet.Topology, string, *daemon),
	notOwned func(*testing.T, *testnet.Topology, *daemon), want map[string]bool) {
	topo, cfg, d := start(t)
	owns := !strings.Contains(d.output(), cannotOwnLog)
	if owns {
		savedRulesetWhileOwned(t, topo, want)
	} else {
		t.Logf("this kernel cannot own the table: the not-owned cases are asserted while the agent runs")
		notOwned(t, topo, d)
	}

	// SIGTERM: the table stays, an ordinary one.
	d.stop(t)
	if owns && !strings.Contains(d.output(), "released table inet ip-masq-agent") {
		t.Errorf("no release logged:\n%s", d.output())
	}
	savedLoadsAfterExit(t, topo, "SIGTERM", want)

	// --once with the default flags: it would release the table at its
	// end, so it writes it unowned in the first place (flush ruleset
	// deleted the table, nft -f made it anew, unowned): nothing to release.
	if out, err := runAgent(t, topo, "--once", "--config", cfg); err != nil {
		t.Fatalf("--once: %v\n%s", err, out)
	} else if strings.Contains(out, "released table inet ip-masq-agent") || strings.Contains(listTable(t, topo), "flags owner") {
		t.Errorf("--once owned the table:\n%s", out)
	}
	savedLoadsAfterExit(t, topo, "--once", want)

	if !owns {
		return
	}
	// --release-on-exit=false: the agent exits leaving the table orphaned.
	d = startDaemon(t, topo, "--config", cfg, "--http-address=127.0.0.1:0", "--release-on-exit=false")
	eventually(t, "the table owned", func() bool { return strings.Contains(listTable(t, topo), "flags owner") })
	d.stop(t)
	if code, out, _ := runTool(t, topo, "list"); code != 0 || !strings.HasPrefix(out, "# orphaned:") {
		t.Errorf("list of an orphaned table: %d\n%s", code, out)
	}
	whole, saved := saveRuleset(t, topo, "nft list ruleset")
	if strings.Contains(saved, "\n\tflags \n") {
		// nft 1.0.6 (Debian 12) prints the persist flag as nothing.
		if out, err := loadRuleset(topo, whole); err == nil {
			t.Errorf("nft -f accepted a bare \"flags \" line:\n%s", out)
		}
	}
	// --once, which does not own the table, releases the orphan it finds.
	if out, err := runAgent(t, topo, "--once", "--config", cfg); err != nil {
		t.Fatalf("--once on an orphaned table: %v\n%s", err, out)
	} else if !strings.Contains(out, "released table inet ip-masq-agent") {
		t.Errorf("--once on an orphaned table logged no release:\n%s", out)
	}
	if code, out, _ := runTool(t, topo, "list"); code != 0 || strings.HasPrefix(out, "# orphaned:") {
		t.Errorf("list after --once on an orphaned table: %d\n%s", code, out)
	}
	filtered, _ := saveRuleset(t, topo, saveFilter)
	if out, err := loadRuleset(topo, filtered); err != nil {
		t.Fatalf("nft -f of the filtered save after the agent exited: %v\n%s", err, out)
	}
	// The next agent owns it again (flush ruleset above deleted the
	// orphan: the agent creates it again).
	d = startDaemon(t, topo, "--config", cfg, "--http-address=127.0.0.1:0")
	eventually(t, "the table owned again", func() bool {
		out, err := topo.NFT("list", "table", "inet", "ip-masq-agent")
		return err == nil && strings.Contains(out, "flags owner")
	})
	expectSources(t, topo, want)
}

// savedRulesetWhileOwned: the whole save is refused while the agent owns
// its table; the filtered one loads and the owned table stays.
func savedRulesetWhileOwned(t *testing.T, topo *testnet.Topology, want map[string]bool) {
	t.Helper()
	if code, out, _ := runTool(t, topo, "list"); code != 0 || !strings.HasPrefix(out, "# owned:") {
		t.Fatalf("the agent did not log %q, yet list does not say owned: %d\n%s", cannotOwnLog, code, out)
	}
	whole, _ := saveRuleset(t, topo, "nft list ruleset")
	if out, err := loadRuleset(topo, whole); err == nil || !strings.Contains(out, "Operation not permitted") {
		t.Errorf("nft -f of the whole ruleset while the agent owns its table: %v\n%s", err, out)
	}
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
}

// savedLoadsAfterExit: after the agent exited (how: SIGTERM or --once)
// its table is in force and carries no flags, and the whole save, the
// agent's table in it, loads; packets are masqueraded after the reload
// and the host firewall's rule is back.
func savedLoadsAfterExit(t *testing.T, topo *testnet.Topology, how string, want map[string]bool) {
	t.Helper()
	if code, out, _ := runTool(t, topo, "list"); code != 0 || !strings.HasPrefix(out, "# free:") {
		t.Errorf("list after %s: %d\n%s", how, code, out)
	}
	expectSources(t, topo, want)
	whole, saved := saveRuleset(t, topo, "nft list ruleset")
	if !strings.Contains(saved, "table inet ip-masq-agent {") || strings.Contains(saved, "\n\tflags ") {
		t.Errorf("the save after %s holds no table inet ip-masq-agent, or a flags line:\n%s", how, saved)
	}
	if out, err := loadRuleset(topo, whole); err != nil {
		t.Fatalf("nft -f of the whole ruleset after %s: %v\n%s", how, err, out)
	}
	expectSources(t, topo, want)
	if out, err := topo.NFT("list", "table", "ip", "hostfw"); err != nil || !strings.Contains(out, "tcp dport 2222") {
		t.Errorf("the host firewall's rule is gone after %s: %v\n%s", how, err, out)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
