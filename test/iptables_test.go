package test

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// original programs, with the real iptables binary (tool: iptables-nft,
// ip6tables-nft, iptables-legacy), exactly what the original ip-masq-agent
// writes at each resync: its chain (EnsureChain), the POSTROUTING jump
// (EnsureRule: -C, then -A), and the chain rewritten whole with
// iptables-restore --noflush.
func original(t *testing.T, topo *testnet.Topology, tool, chain string, cidrs ...string) {
	t.Helper()
	run := func(stdin string, name string, args ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", topo.NodeNS, name}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}
	jump := []string{"-t", "nat", "POSTROUTING", "-m", "comment", "--comment", nft.OriginalJumpComment(chain),
		"-m", "addrtype", "!", "--dst-type", "LOCAL", "-j", chain}
	if exec.Command("ip", append([]string{"netns", "exec", topo.NodeNS, tool, "-t", "nat", "-C"}, jump[2:]...)...).Run() != nil {
		run("", tool, "-t", "nat", "-N", chain)
		run("", tool, append([]string{"-t", "nat", "-A"}, jump[2:]...)...)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*nat\n:%s - [0:0]\n", chain)
	linkLocal := "169.254.0.0/16"
	if strings.HasPrefix(tool, "ip6") {
		linkLocal = "fe80::/10"
	}
	for _, c := range append([]string{linkLocal}, cidrs...) {
		fmt.Fprintf(&b, "-A %s -m comment --comment \"ip-masq-agent: local traffic is not subject to MASQUERADE\" -d %s -j RETURN\n", chain, c)
	}
	fmt.Fprintf(&b, "-A %s -m comment --comment \"ip-masq-agent: outbound traffic is subject to MASQUERADE (must be last in chain)\" -j MASQUERADE --random-fully\nCOMMIT\n", chain)
	run(b.String(), tool+"-restore", "--noflush")
}

func natTable(t *testing.T, topo *testnet.Topology, family string) string {
	t.Helper()
	out, err := topo.NFT("-a", "list", "table", family, "nat")
	if err != nil && !strings.Contains(out, "No such file") {
		t.Fatalf("nft list table %s nat: %v\n%s", family, err, out)
	}
	return out
}

// TestIptablesOriginalRemovedWhenGone: the original agent's rules,
// rewritten every second by a loop as the original does at every resync,
// are reported and left alone while it runs (they decide first: packets
// show the original's decisions); once the loop stops they are removed
// within twice the resync interval plus 5s, and packets then follow the
// agent's config alone.
func TestIptablesOriginalRemovedWhenGone(t *testing.T) {
	testnet.Require(t, "iptables-nft", "iptables-nft-restore")
	topo := newTopology(t)
	addDestinations(t, topo, internet1, private1)
	// The original's list exempts 203.0.113.0/24 and masquerades 10.250/16;
	// the agent's config masquerades 203.0.113.0/24 and exempts 10/8.
	original(t, topo, "iptables-nft", nft.DefaultChain, "203.0.113.0/24")
	d := startDaemon(t, topo, "--config", writeConfig(t, "nonMasqueradeCIDRs: [10.0.0.0/8]\nresyncInterval: 1s\n"), "--http-address=127.0.0.1:0")
	eventually(t, "the report of the original's rules", func() bool {
		return strings.Contains(d.output(), "found the original ip-masq-agent's iptables rules")
	})
	jumpHandle := func() string {
		for _, l := range strings.Split(natTable(t, topo, "ip"), "\n") {
			if strings.Contains(l, "jump "+nft.DefaultChain) {
				return l[strings.LastIndex(l, "# handle"):]
			}
		}
		return ""
	}
	first := jumpHandle()
	if first == "" {
		t.Fatal("no jump")
	}
	// The original still runs: 10 rewrites, one a second. The jump it
	// made once stays (never removed), and its decision is in force.
	var lastRewrite time.Time
	for i := 0; i < 10; i++ {
		lastRewrite = time.Now()
		original(t, topo, "iptables-nft", nft.DefaultChain, "203.0.113.0/24")
		if got := jumpHandle(); got != first {
			t.Fatalf("rewrite %d: the original's jump changed (%q, was %q): the agent removed it while the original ran\n%s", i, got, first, d.output())
		}
		if i == 5 {
			// The original masquerades 10.250.0.10 first; 203.0.113.10 is
			// left alone by it and masqueraded by the agent.
			expectSources(t, topo, map[string]bool{private1: true, internet1: true})
		}
		time.Sleep(time.Second)
	}
	if !strings.Contains(d.output(), "the original ip-masq-agent still runs") {
		t.Errorf("no report that the original still runs:\n%s", d.output())
	}
	eventually(t, "the removal of the original's rules", func() bool {
		return !strings.Contains(natTable(t, topo, "ip"), nft.DefaultChain)
	})
	// Never before the rules have been left unchanged for twice the
	// resync interval plus 5 s (how soon after is for make bench and the
	// e2e test to measure, not for an assertion on a loaded machine).
	took := time.Since(lastRewrite)
	if quiet := 2*time.Second + 5*time.Second; took < quiet {
		t.Errorf("removed %s after the original's last rewrite began, want at least %s", took, quiet)
	}
	t.Logf("removed %s after the original's last rewrite", took.Round(100*time.Millisecond))
	expectSources(t, topo, map[string]bool{private1: false, internet1: true})
	if n := strings.Count(d.output(), "removed the original ip-masq-agent's iptables rules"); n != 1 {
		t.Errorf("%d removal lines, want 1:\n%s", n, d.output())
	}
	// POSTROUTING itself (iptables-nft's base chain) is left.
	if !strings.Contains(natTable(t, topo, "ip"), "chain POSTROUTING") {
		t.Error("the removal took POSTROUTING with it")
	}
}

// TestIptablesCustomChainAndExemption: --masq-chain IP-MASQ (the upstream
// manifest's name at one time) is found and removed; an ACCEPT placed
// before the jump is reported with its match and left in place.
func TestIptablesCustomChainAndExemption(t *testing.T) {
	testnet.Require(t, "iptables-nft", "iptables-nft-restore")
	topo := newTopology(t)
	addDestinations(t, topo, internet1)
	original(t, topo, "iptables-nft", "IP-MASQ")
	if out, err := topo.RunInNode(context.Background(), "iptables-nft", "-t", "nat", "-I", "POSTROUTING", "-d", "203.0.113.0/24", "-j", "ACCEPT"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	d := startDaemon(t, topo, "--masq-chain", "IP-MASQ", "--config", writeConfig(t, "resyncInterval: 1s\n"), "--http-address=127.0.0.1:0")
	eventually(t, "the report", func() bool {
		o := d.output()
		return strings.Contains(o, "chain IP-MASQ (2 rules)") && strings.Contains(o, "ip daddr 203.0.113.0/24 counter accept")
	})
	// The exemption only held under the original: the agent masquerades.
	expectSources(t, topo, map[string]bool{internet1: true})
	eventually(t, "the removal", func() bool { return !strings.Contains(natTable(t, topo, "ip"), "IP-MASQ") })
	if !strings.Contains(natTable(t, topo, "ip"), "ip daddr 203.0.113.0/24 counter") {
		t.Errorf("the exemption was removed:\n%s", natTable(t, topo, "ip"))
	}
}

// TestIptablesCleanupAndTools: diff and explain --live report the
// original's jump (it decides first), cleanup-iptables removes it (IPv4 and
// IPv6) on demand and nothing else, and a legacy nat table is reported
// with the commands that clean it.
func TestIptablesCleanupAndTools(t *testing.T) {
	testnet.Require(t, "iptables-nft", "iptables-nft-restore", "ip6tables-nft", "ip6tables-nft-restore", "iptables-legacy")
	topo := newTopology(t)
	addDestinations(t, topo, private1)
	cfg := writeConfig(t, "nonMasqueradeCIDRs: [10.0.0.0/8]\n")
	mustApply(t, topo, "nonMasqueradeCIDRs: [10.0.0.0/8]\n")
	if code, out, _ := runTool(t, topo, "diff", "--config", cfg); code != 0 || strings.TrimSpace(out) != "in sync" {
		t.Fatalf("diff before: %d %q", code, out)
	}
	original(t, topo, "iptables-nft", nft.DefaultChain, "203.0.113.0/24")
	original(t, topo, "ip6tables-nft", nft.DefaultChain)

	code, out, stderr := runTool(t, topo, "diff", "--config", cfg)
	if code != 1 || !strings.Contains(out, "table ip nat chain POSTROUTING: the original ip-masq-agent's jump decides first") ||
		!strings.Contains(out, "in sync, but the original agent's rules decide first") {
		t.Errorf("diff with the original's jump: %d\n%s%s", code, out, stderr)
	}
	code, out, stderr = runTool(t, topo, "explain", "--live", "--config", cfg, private1)
	if code != 1 || !strings.Contains(out, "kernel: masquerade: masqueraded by the original ip-masq-agent's rules in table ip nat") ||
		!strings.Contains(out, "DISAGREE") {
		t.Errorf("explain --live with the original's jump: %d\n%s%s", code, out, stderr)
	}
	expectSources(t, topo, map[string]bool{private1: true}) // what explain said

	// A legacy nat table (as iptables-legacy leaves it).
	if out, err := topo.RunInNode(context.Background(), "iptables-legacy", "-t", "nat", "-L", "-n"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	before6 := natTable(t, topo, "ip6")
	code, out, stderr = runTool(t, topo, "cleanup-iptables", "--watch", "1s")
	if code != 0 || !strings.Contains(out, "removed from table ip nat") || !strings.Contains(out, "removed from table ip6 nat") {
		t.Errorf("cleanup-iptables: %d\n%s%s", code, out, stderr)
	}
	if !strings.Contains(stderr, "iptables-legacy -t nat -D POSTROUTING -m comment --comment \"ip-masq-agent: ensure nat POSTROUTING") ||
		!strings.Contains(stderr, "iptables-legacy -t nat -X IP-MASQ-AGENT") {
		t.Errorf("no legacy commands:\n%s", stderr)
	}
	for _, fam := range []string{"ip", "ip6"} {
		if s := natTable(t, topo, fam); strings.Contains(s, nft.DefaultChain) || !strings.Contains(s, "chain POSTROUTING") {
			t.Errorf("table %s nat after cleanup-iptables:\n%s", fam, s)
		}
	}
	if !strings.Contains(before6, "jump IP-MASQ-AGENT") {
		t.Errorf("no IPv6 jump before:\n%s", before6)
	}
	expectSources(t, topo, map[string]bool{private1: false})
	if code, out, _ := runTool(t, topo, "diff", "--config", cfg); code != 0 || strings.TrimSpace(out) == "" || !strings.Contains(out, "in sync") {
		t.Errorf("diff after: %d %q", code, out)
	}
	code, out, _ = runTool(t, topo, "cleanup-iptables", "--watch", "0")
	if code != 0 || !strings.Contains(out, "nothing to remove") {
		t.Errorf("cleanup-iptables again: %d %q", code, out)
	}
}
