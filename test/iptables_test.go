package test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/harness"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/original"
)

// writeOriginal programs, with the real iptables binary (tool: iptables-nft,
// ip6tables-nft, iptables-legacy), exactly what the original ip-masq-agent
// writes at each resync: its chain (EnsureChain), the POSTROUTING jump
// (EnsureRule: -C, then -A), and the chain rewritten whole with
// iptables-restore --noflush.
func writeOriginal(t *testing.T, topo *testnet.Topology, tool, chain string, cidrs ...string) {
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
	jump := []string{"-t", "nat", "POSTROUTING", "-m", "comment", "--comment", original.JumpComment(chain),
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
	writeOriginal(t, topo, "iptables-nft", nft.DefaultChain, "203.0.113.0/24")
	d := startDaemon(t, topo, "--config", writeConfig(t, "nonMasqueradeCIDRs: [10.0.0.0/8]\nresyncInterval: 1s\n"), "--http-address=127.0.0.1:0")
	// The original rewrites once a second while the agent starts, too: a
	// slow start (6 s in a loaded kernel guest) is no quiet original.
	for i := 0; !strings.Contains(d.output(), "found the original ip-masq-agent's iptables rules"); i++ {
		if i == 60 {
			t.Fatalf("no report of the original's rules after 60 rewrites:\n%s", d.output())
		}
		time.Sleep(time.Second)
		writeOriginal(t, topo, "iptables-nft", nft.DefaultChain, "203.0.113.0/24")
	}
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
		writeOriginal(t, topo, "iptables-nft", nft.DefaultChain, "203.0.113.0/24")
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
	writeOriginal(t, topo, "iptables-nft", "IP-MASQ")
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
	writeOriginal(t, topo, "iptables-nft", nft.DefaultChain, "203.0.113.0/24")
	writeOriginal(t, topo, "ip6tables-nft", nft.DefaultChain)

	code, out, stderr := runTool(t, topo, "diff", "--config", cfg)
	if code != 1 || !strings.Contains(out, "table ip nat chain POSTROUTING: the original ip-masq-agent's jump to chain IP-MASQ-AGENT (its --masq-chain) decides first") ||
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

// TestIptablesAnyChainName: the original's rules are found by what they
// are, whatever --masq-chain it ran with, by an agent and tools given no
// --masq-chain: IP-MASQ (the Kubernetes addon manifest's and GKE's name)
// masquerades 10.250.0.10 before the agent's table, which exempts 10/8;
// diff and explain --live say so (and that the IPv6 chain stays: no
// --enable-ipv6), cleanup-iptables removes it and, in table ip6 nat, a
// custom chain jumped to with Azure ip-masq-agent-v2's quoted comment; a
// chain called IP-MASQ-AGENT without the original's comments is reported
// and left alone.
func TestIptablesAnyChainName(t *testing.T) {
	testnet.Require(t, "iptables-nft", "iptables-nft-restore", "ip6tables-nft", "ip6tables-nft-restore")
	topo := newTopology(t)
	addDestinations(t, topo, private1)
	cfg := writeConfig(t, "nonMasqueradeCIDRs: [10.0.0.0/8]\n")
	mustApply(t, topo, "nonMasqueradeCIDRs: [10.0.0.0/8]\n")
	writeOriginal(t, topo, "iptables-nft", original.AddonChain)
	originalAzure(t, topo, "ip6tables-nft", "azure-masq")
	for _, args := range [][]string{{"-N", nft.DefaultChain}, {"-A", nft.DefaultChain, "-j", "RETURN"}} {
		if out, err := topo.RunInNode(context.Background(), "iptables-nft", append([]string{"-t", "nat"}, args...)...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	expectSources(t, topo, map[string]bool{private1: true}) // the original's IP-MASQ decides first

	code, out, stderr := runTool(t, topo, "diff", "--config", cfg)
	if code != 1 || !strings.Contains(out, "the original ip-masq-agent's jump to chain IP-MASQ (its --masq-chain) decides first") ||
		!strings.Contains(out, "kept ipv6: the original ip-masq-agent's rules in table ip6 nat stay") ||
		!strings.Contains(out, "change ipv4 10.0.0.0/8: original: masquerade, this agent: not masqueraded") {
		t.Errorf("diff: %d\n%s%s", code, out, stderr)
	}
	code, out, stderr = runTool(t, topo, "explain", "--live", "--config", cfg, private1)
	if code != 1 || !strings.Contains(out, "masqueraded by the original ip-masq-agent's rules in table ip nat") || !strings.Contains(out, "chain IP-MASQ rule") {
		t.Errorf("explain --live: %d\n%s%s", code, out, stderr)
	}
	code, out, stderr = runTool(t, topo, "cleanup-iptables", "--watch", "0")
	if code != 0 || !strings.Contains(out, "found the original ip-masq-agent's chain IP-MASQ in table ip nat") || !strings.Contains(out, "found the original ip-masq-agent's chain azure-masq in table ip6 nat") ||
		!strings.Contains(out, "removed from table ip nat: chain IP-MASQ") || !strings.Contains(out, "removed from table ip6 nat: chain azure-masq") ||
		!strings.Contains(stderr, "not removed: table ip nat: chain IP-MASQ-AGENT (1 rules)") {
		t.Errorf("cleanup-iptables: %d\n%s%s", code, out, stderr)
	}
	nat4, nat6 := natTable(t, topo, "ip"), natTable(t, topo, "ip6")
	if strings.Contains(nat4, "IP-MASQ ") || strings.Contains(nat4, "jump IP-MASQ\n") || strings.Contains(nat6, "azure-masq") {
		t.Errorf("left behind:\n%s\n%s", nat4, nat6)
	}
	if !strings.Contains(nat4, "chain IP-MASQ-AGENT {") {
		t.Errorf("the foreign chain IP-MASQ-AGENT was removed:\n%s", nat4)
	}
	expectSources(t, topo, map[string]bool{private1: false}) // now the agent's table decides
	if code, out, _ := runTool(t, topo, "diff", "--config", cfg); code != 0 || !strings.Contains(out, "in sync") {
		t.Errorf("diff after: %d %q", code, out)
	}
	// Named, the foreign chain goes too.
	if code, out, stderr := runTool(t, topo, "cleanup-iptables", "--watch", "0", "--masq-chain", nft.DefaultChain); code != 0 || !strings.Contains(out, "removed from table ip nat: chain IP-MASQ-AGENT") {
		t.Errorf("cleanup-iptables --masq-chain IP-MASQ-AGENT: %d\n%s%s", code, out, stderr)
	}
}

// originalAzure programs what Azure's ip-masq-agent-v2 writes: its jump's
// comment keeps the double quotes of its format, and its MASQUERADE rule
// has no --random-fully.
func originalAzure(t *testing.T, topo *testnet.Topology, tool, chain string) {
	t.Helper()
	for _, args := range [][]string{
		{"-N", chain},
		{"-A", "POSTROUTING", "-m", "comment", "--comment", `"` + original.JumpComment(chain) + `"`, "-m", "addrtype", "!", "--dst-type", "LOCAL", "-j", chain},
		{"-A", chain, "-m", "comment", "--comment", "ip-masq-agent: outbound traffic is subject to MASQUERADE (must be last in chain)", "-j", "MASQUERADE"},
	} {
		if out, err := topo.RunInNode(context.Background(), tool, append([]string{"-t", "nat"}, args...)...); err != nil {
			t.Fatalf("%s %s: %v\n%s", tool, strings.Join(args, " "), err, out)
		}
	}
}

var (
	originalOnce sync.Once
	originalBin  string
	originalErr  error
)

// standIn builds e2e/original, the e2e harness's stand-in for the original
// agent (its own module), once.
func standIn(t *testing.T) string {
	t.Helper()
	originalOnce.Do(func() {
		// Prebuilt where there is no Go toolchain (make test-kernels'
		// guests), as IP_MASQ_AGENT_BIN is for the agent.
		if prebuilt := os.Getenv("IP_MASQ_AGENT_ORIGINAL_BIN"); prebuilt != "" {
			originalBin = prebuilt
			return
		}
		originalBin = filepath.Join(filepath.Dir(agentBin), "original")
		cmd := exec.Command("go", "build", "-o", originalBin, "./original")
		cmd.Dir = "../e2e"
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			originalErr = fmt.Errorf("build e2e/original: %v\n%s", err, out)
		}
	})
	if originalErr != nil {
		t.Fatal(originalErr)
	}
	return originalBin
}

// startOriginal starts the stand-in original agent in the node namespace
// until the test ends.
func startOriginal(t *testing.T, topo *testnet.Topology, args ...string) *harness.Daemon {
	t.Helper()
	o := harness.New(exec.Command("ip", append([]string{"netns", "exec", topo.NodeNS, standIn(t)}, args...)...))
	if err := o.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		o.Stop()
		if t.Failed() {
			t.Logf("original's log:\n%s", o.Output())
		}
	})
	return o
}

// rewrites counts the original's resyncs that wrote its rules.
func rewrites(o *harness.Daemon) int { return strings.Count(o.Output(), "IPv4 masquerading rules") }

var jumpHandleRE = regexp.MustCompile(`jump CUSTOM-MASQ # handle (\d+)`)

// TestIptablesIntervalShortened: the stand-in original (e2e/original,
// IPv4 and IPv6, --masq-chain CUSTOM-MASQ) and the agent (no --masq-chain)
// share a config; right after one of the original's rewrites the config
// shortens resyncInterval from 12s to 1s. The original sleeps its old 12s
// before it reads the new config: its rules must not be removed meanwhile
// (2 × 1s + 5s would), and they are not while it then rewrites them every
// second. Then the original really stops (SIGTERM, the process exits):
// its rules go, in both families, once quiet for the longest interval in
// force since its last rewrite.
func TestIptablesIntervalShortened(t *testing.T) {
	testnet.Require(t, "iptables-nft", "iptables-nft-restore", "ip6tables-nft", "ip6tables-nft-restore")
	topo := newTopology(t)
	addDestinations(t, topo, internet1, private1)
	cm := newConfigMapDir(t, "nonMasqueradeCIDRs: [10.0.0.0/8]\nresyncInterval: 12s\n")
	orig := startOriginal(t, topo, "--config", cm.path(), "--masq-chain", "CUSTOM-MASQ", "--enable-ipv6")
	harness.Eventually(t, 20*time.Second, "the original's first rewrite", func() bool { return rewrites(orig) >= 1 })
	d := startDaemon(t, topo, "--config", cm.path(), "--enable-ipv6", "--http-address=127.0.0.1:0")
	eventually(t, "the report of the original's rules", func() bool {
		o := d.output()
		return strings.Contains(o, "found the original ip-masq-agent's iptables rules") && strings.Contains(o, `"original --masq-chain"=CUSTOM-MASQ`)
	})
	handle := func() string {
		m := jumpHandleRE.FindStringSubmatch(natTable(t, topo, "ip"))
		if m == nil {
			return ""
		}
		return m[1]
	}
	first := handle()
	if first == "" {
		t.Fatalf("no jump to CUSTOM-MASQ:\n%s", natTable(t, topo, "ip"))
	}
	harness.Eventually(t, 20*time.Second, "the original's second rewrite", func() bool { return rewrites(orig) >= 2 })
	cm.update("nonMasqueradeCIDRs: [10.0.0.0/8]\nresyncInterval: 1s\n")
	eventually(t, "the agent's new config", func() bool { return strings.Contains(d.output(), "applied new config") })
	// The original wakes about 12s later, then rewrites every second.
	harness.Eventually(t, 40*time.Second, "the original's rewrites under the new interval", func() bool { return rewrites(orig) >= 8 })
	if got := handle(); got != first || strings.Contains(d.output(), "removed the original ip-masq-agent's iptables rules") {
		t.Fatalf("the original's rules were removed while it ran (jump handle %s, was %s):\n%s", got, first, d.output())
	}
	expectSources(t, topo, map[string]bool{internet1: true, private1: false})
	orig.Stop()
	stopped := time.Now()
	harness.Eventually(t, 60*time.Second, "the removal after the original stopped", func() bool {
		return strings.Contains(d.output(), "removed the original ip-masq-agent's iptables rules")
	})
	t.Logf("removed %s after the original stopped", time.Since(stopped).Round(100*time.Millisecond))
	for _, fam := range []string{"ip", "ip6"} {
		if s := natTable(t, topo, fam); strings.Contains(s, "CUSTOM-MASQ") {
			t.Errorf("table %s nat after the removal:\n%s", fam, s)
		}
	}
	if n := strings.Count(d.output(), "removed the original ip-masq-agent's iptables rules"); n != 1 {
		t.Errorf("%d removal lines, want 1", n)
	}
	expectSources(t, topo, map[string]bool{internet1: true, private1: false})
}

// TestDecisionsLegacyOriginal: the original run with iptables-legacy (the
// iptables-wrapper of its image picks legacy on a node whose rules are
// there) with the addon's --nomasq-all-reserved-ranges: its rules cannot
// be seen over nftables, so the check before the switch cannot compare.
// It must not pass (exit 0, "no switch to compare"): the switch does
// change 100.64.0.10, proved with packets (the legacy chain RETURNs, then
// this agent's table masquerades it).
func TestDecisionsLegacyOriginal(t *testing.T) {
	testnet.Require(t, "iptables-legacy", "iptables-legacy-restore")
	const shared = "100.64.0.10"
	topo := newTopology(t)
	addDestinations(t, topo, shared)
	writeOriginal(t, topo, "iptables-legacy", original.AddonChain, "10.0.0.0/8", "100.64.0.0/10")
	expectSources(t, topo, map[string]bool{shared: false})
	cfg := writeConfig(t, "")
	code, out, stderr := runTool(t, topo, "diff", "--decisions", "--agent-pid", "none", "--config", cfg)
	if code != 1 || !strings.Contains(out, "legacy iptables nat table") || strings.Contains(out, "no switch to compare") {
		t.Errorf("diff --decisions with the original's rules in a legacy nat table: exit %d\n%s%s", code, out, stderr)
	}
	mustApply(t, topo, "")
	expectSources(t, topo, map[string]bool{shared: true}) // what the check must not hide
}

// TestCleanupIptablesKeepsIPv6: cleanup-iptables run as docs/upgrade.md
// says (in the agent's pod: it takes the running agent's flags), beside an
// agent without --enable-ipv6, removes the original's IPv4 rules only: the
// IPv6 ones are the masquerade this agent does not take over (the daemon
// keeps them). --family ipv6 removes them deliberately. Without a running
// agent (the uninstall) both go, as before.
func TestCleanupIptablesKeepsIPv6(t *testing.T) {
	testnet.Require(t, "iptables-nft", "iptables-nft-restore", "ip6tables-nft", "ip6tables-nft-restore")
	topo := newTopology(t)
	writeOriginal(t, topo, "iptables-nft", original.AddonChain, "10.0.0.0/8")
	writeOriginal(t, topo, "ip6tables-nft", original.AddonChain, "fd00::/8")
	d := startDaemon(t, topo, "--config", writeConfig(t, "nonMasqueradeCIDRs: [10.0.0.0/8]\n"), "--http-address=127.0.0.1:0")
	eventually(t, "the table", func() bool { return strings.Contains(d.output(), "applied config") })
	pid := strconv.Itoa(d.Pid())
	code, out, stderr := runTool(t, topo, "cleanup-iptables", "--watch", "0", "--agent-pid", pid)
	if code != 0 || !strings.Contains(out, "removed from table ip nat") || strings.Contains(out, "removed from table ip6 nat") ||
		!strings.Contains(stderr, "--family ipv6") {
		t.Errorf("cleanup-iptables beside an agent without --enable-ipv6: %d\n%s%s", code, out, stderr)
	}
	if nat6 := natTable(t, topo, "ip6"); !strings.Contains(nat6, "jump "+original.AddonChain) {
		t.Errorf("the original's IPv6 rules were removed:\n%s", nat6)
	}
	code, out, stderr = runTool(t, topo, "cleanup-iptables", "--watch", "0", "--agent-pid", pid, "--family", "ipv6")
	if code != 0 || !strings.Contains(out, "removed from table ip6 nat") {
		t.Errorf("cleanup-iptables --family ipv6: %d\n%s%s", code, out, stderr)
	}
}

// TestDecisionsToPorts: the original run with --to-ports (one MASQUERADE
// per protocol and range, as the stand-in writes them) and this agent
// without it: no range changes, but the source ports do; the check before
// the switch says so and exits 1, and names the flag. Carried over (the
// ranges in any order), it says none.
func TestDecisionsToPorts(t *testing.T) {
	testnet.Require(t, "iptables-nft", "iptables-nft-restore", "ip6tables-nft", "ip6tables-nft-restore")
	topo := newTopology(t)
	runOnce := exec.Command("ip", "netns", "exec", topo.NodeNS, standIn(t), "--once", "--config", "/nonexistent", "--enable-ipv6", "--to-ports", "1024-29999,32768-65535")
	if out, err := runOnce.CombinedOutput(); err != nil {
		t.Fatalf("the stand-in original: %v\n%s", err, out)
	}
	cfg := writeConfig(t, "")
	code, out, stderr := runTool(t, topo, "diff", "--decisions", "--agent-pid", "none", "--config", cfg, "--enable-ipv6")
	if code != 1 || !strings.Contains(out, "change ipv4 masquerade source ports: the original's MASQUERADE used ports 1024-29999,32768-65535, this agent any port; to keep them: --to-ports=1024-29999,32768-65535") ||
		!strings.Contains(out, "change ipv6 masquerade source ports") {
		t.Errorf("--to-ports not carried over: exit %d\n%s%s", code, out, stderr)
	}
	code, out, stderr = runTool(t, topo, "diff", "--decisions", "--agent-pid", "none", "--config", cfg, "--enable-ipv6", "--to-ports", "32768-65535,1024-29999")
	if code != 0 || !strings.Contains(out, "changes none") {
		t.Errorf("--to-ports carried over: exit %d\n%s%s", code, out, stderr)
	}
}
