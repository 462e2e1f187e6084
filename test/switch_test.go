package test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/original"
)

// The Kubernetes addon runs the original with --nomasq-all-reserved-ranges
// and no ConfigMap: its chain returns the reserved ranges too.
var addonCIDRs = []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "192.0.0.0/24", "192.0.2.0/24",
	"192.88.99.0/24", "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "240.0.0.0/4"}

const reservedChange = "change ipv4 100.64.0.0/10: original: not masqueraded, this agent: masquerade; to keep the original's decision: --nomasq-all-reserved-ranges (the original ran with it)"

// TestSwitchReservedRangesNotCarried: the addon's original (chain IP-MASQ,
// the reserved ranges returned) is on the node. The pre-switch check
// (diff --decisions) with the flag not carried over names 100.64.0.0/10
// and the flag and exits 1; with it, it finds no change and exits 0.
// The agent without the flag (its table not owned, as on 5.10 and 6.1)
// warns naming the range and the flag, counts the ranges in
// ip_masq_agent_original_decision_differences, and packets to
// 203.0.113.10, left alone by the original, leave masqueraded (its table
// runs after the original's RETURN); diff exits 1 and explain --live shows
// both decisions. With the flag carried over none of this appears.
func TestSwitchReservedRangesNotCarried(t *testing.T) {
	testnet.Require(t, "iptables-nft", "iptables-nft-restore")
	topo := newTopology(t)
	addDestinations(t, topo, internet1)
	writeOriginal(t, topo, "iptables-nft", original.AddonChain, addonCIDRs...)
	expectSources(t, topo, map[string]bool{internet1: false}) // the original alone
	cfg := writeConfig(t, "")                                 // as no ConfigMap: defaults

	code, out, stderr := runTool(t, topo, "diff", "--decisions", "--agent-pid", "none", "--config", cfg)
	if code != 1 || !strings.Contains(out, reservedChange) ||
		!strings.Contains(out, "decisions: the switch from the original ip-masq-agent changes 8 ranges (ipv4 8, ipv6 0)") ||
		!strings.Contains(out, "original: table ip nat: chain IP-MASQ (13 rules)") {
		t.Errorf("diff --decisions without the flag: %d\n%s%s", code, out, stderr)
	}
	t.Logf("diff --decisions without the flag (exit %d):\n%s", code, out)
	code, out, stderr = runTool(t, topo, "diff", "--decisions", "--agent-pid", "none", "--config", cfg, "--nomasq-all-reserved-ranges")
	if code != 0 || !strings.Contains(out, "decisions: the switch from the original ip-masq-agent changes none") || strings.Contains(out, "change ") {
		t.Errorf("diff --decisions with the flag: %d\n%s%s", code, out, stderr)
	}
	t.Logf("diff --decisions with the flag (exit %d):\n%s", code, out)

	d := startDaemon(t, topo, "--config", cfg, "--own-table=false")
	eventually(t, "the warning", func() bool {
		return strings.Contains(d.output(), "the switch from the original ip-masq-agent changes the masquerade decision")
	})
	if o := d.output(); !strings.Contains(o, `"ipv4 100.64.0.0/10"="original: not masqueraded, this agent: masquerade; to keep the original's decision: --nomasq-all-reserved-ranges (the original ran with it)"`) {
		t.Errorf("the warning does not name the range and the flag:\n%s", o)
	}
	eventually(t, "the metric", func() bool {
		_, body := httpGet(topo, "/metrics")
		return strings.Contains(body, `ip_masq_agent_original_decision_differences{family="ipv4"} 8`)
	})
	expectSources(t, topo, map[string]bool{internet1: true}) // the change, in force already
	code, out, stderr = runTool(t, topo, "diff", "--agent-pid", "none", "--config", cfg)
	if code != 1 || !strings.Contains(out, reservedChange) {
		t.Errorf("diff: %d\n%s%s", code, out, stderr)
	}
	code, out, stderr = runTool(t, topo, "explain", "--live", "--agent-pid", "none", "--config", cfg, "100.64.0.10")
	if code != 1 || !strings.Contains(out, "  original: not masqueraded: ") || !strings.Contains(out, "  SWITCH: ipv4 100.64.0.0/10: original: not masqueraded, this agent: masquerade") {
		t.Errorf("explain --live: %d\n%s%s", code, out, stderr)
	}
	d.stop(t)
	if n := strings.Count(d.output(), "the switch from the original ip-masq-agent changes"); n != 1 {
		t.Errorf("%d warnings, want 1 (the rules did not change)", n)
	}

	// The flag carried over: the same decisions, nothing said.
	if out, err := topo.RunInNode(context.Background(), "nft", "delete", "table", "inet", nft.TableName); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	d = startDaemon(t, topo, "--config", cfg, "--own-table=false", "--nomasq-all-reserved-ranges")
	eventually(t, "the report of the original's rules", func() bool {
		return strings.Contains(d.output(), "found the original ip-masq-agent's iptables rules")
	})
	eventually(t, "the metric", func() bool {
		_, body := httpGet(topo, "/metrics")
		return strings.Contains(body, `ip_masq_agent_original_decision_differences{family="ipv4"} 0`)
	})
	expectSources(t, topo, map[string]bool{internet1: false})
	if strings.Contains(d.output(), "changes the masquerade decision") {
		t.Errorf("a warning with the flag carried over:\n%s", d.output())
	}
	if code, out, _ := runTool(t, topo, "explain", "--live", "--agent-pid", "none", "--config", cfg, "--nomasq-all-reserved-ranges", "100.64.0.10"); code != 0 || strings.Contains(out, "SWITCH") {
		t.Errorf("explain --live with the flag: %d\n%s", code, out)
	}
}

// TestSwitchIPv6Kept: the original ran with --enable-ipv6, this agent runs
// without. Once the original is gone the agent removes its IPv4 rules
// only: the IPv6 chain stays (said once, with both ways out), and a pod's
// IPv6 connection to 2001:db8:aa::10 still leaves masqueraded. diff does
// not promise to remove it; cleanup-iptables --family ipv6 does, on
// purpose.
func TestSwitchIPv6Kept(t *testing.T) {
	testnet.Require(t, "iptables-nft", "iptables-nft-restore", "ip6tables-nft", "ip6tables-nft-restore")
	topo := newTopology(t)
	addDestinations(t, topo, internet1, internet6a)
	writeOriginal(t, topo, "iptables-nft", nft.DefaultChain, "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")
	writeOriginal(t, topo, "ip6tables-nft", nft.DefaultChain)
	expectSources(t, topo, map[string]bool{internet1: true, internet6a: true})
	cfg := writeConfig(t, "resyncInterval: 1s\n")

	code, out, stderr := runTool(t, topo, "diff", "--decisions", "--agent-pid", "none", "--config", cfg)
	if code != 0 || !strings.Contains(out, "kept ipv6: the original ip-masq-agent's rules in table ip6 nat stay") ||
		!strings.Contains(out, "decisions: the switch from the original ip-masq-agent changes none") {
		t.Errorf("diff --decisions: %d\n%s%s", code, out, stderr)
	}
	d := startDaemon(t, topo, "--config", cfg)
	eventually(t, "the removal of the IPv4 rules", func() bool {
		return strings.Contains(d.output(), "removed the original ip-masq-agent's iptables rules")
	})
	if s := natTable(t, topo, "ip"); strings.Contains(s, nft.DefaultChain) {
		t.Errorf("table ip nat after the removal:\n%s", s)
	}
	if s := natTable(t, topo, "ip6"); !strings.Contains(s, "jump "+nft.DefaultChain) || !strings.Contains(s, "chain "+nft.DefaultChain+" {") {
		t.Fatalf("the original's IPv6 rules were removed:\n%s", s)
	}
	expectSources(t, topo, map[string]bool{internet1: true, internet6a: true})
	o := d.output()
	if n := strings.Count(o, "the original ip-masq-agent's ipv6 rules stay in table ip6 nat"); n != 1 ||
		!strings.Contains(o, "run this agent with --enable-ipv6, or remove them deliberately with ip-masq-agent cleanup-iptables --family ipv6") ||
		strings.Contains(o, "changes the masquerade decision") {
		t.Errorf("%d kept messages, want 1:\n%s", n, o)
	}
	_, body := httpGet(topo, "/metrics")
	for _, want := range []string{`ip_masq_agent_legacy_rules{family="ipv6"} 1`, `ip_masq_agent_legacy_rules{family="ipv4"} 0`,
		`ip_masq_agent_original_decision_differences{family="ipv6"} 0`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	code, out, _ = runTool(t, topo, "diff", "--agent-pid", "none", "--config", cfg)
	if code != 0 || !strings.Contains(out, "kept ipv6:") || strings.Contains(out, "removes it once") || !strings.Contains(out, "in sync") {
		t.Errorf("diff: %d\n%s", code, out)
	}
	code, out, _ = runTool(t, topo, "explain", "--live", "--agent-pid", "none", "--config", cfg, internet6a)
	if code != 0 || !strings.Contains(out, "masqueraded by the original ip-masq-agent's rules in table ip6 nat") ||
		!strings.Contains(out, "the original ip-masq-agent's rules of this family stay") || strings.Contains(out, "DISAGREE") {
		t.Errorf("explain --live %s: %d\n%s", internet6a, code, out)
	}
	code, out, stderr = runTool(t, topo, "cleanup-iptables", "--watch", "0", "--agent-pid", "none", "--family", "ipv6")
	if code != 0 || !strings.Contains(out, "removed from table ip6 nat") {
		t.Errorf("cleanup-iptables --family ipv6: %d\n%s%s", code, out, stderr)
	}
	expectSources(t, topo, map[string]bool{internet1: true, internet6a: false})
}

// TestSwitchImpostorChain: a chain called IP-MASQ (the addon's name) that
// is not the original's, jumped to from nat POSTROUTING, gets one answer:
// the daemon (run with --masq-chain IP-MASQ) leaves it alone and counts
// it nowhere, diff names it "left alone" and exits 0, explain --live says
// whose it is, cleanup-iptables (even with the daemon's --masq-chain taken
// from its command line) leaves it, and removes it only when named.
func TestSwitchImpostorChain(t *testing.T) {
	testnet.Require(t, "iptables-nft")
	topo := newTopology(t)
	addDestinations(t, topo, internet1)
	for _, args := range [][]string{{"-N", "IP-MASQ"}, {"-A", "IP-MASQ", "-d", "203.0.113.0/24", "-j", "MASQUERADE"}, {"-A", "POSTROUTING", "-j", "IP-MASQ"}} {
		if out, err := topo.RunInNode(context.Background(), "iptables-nft", append([]string{"-t", "nat"}, args...)...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	cfg := writeConfig(t, "resyncInterval: 1s\n")
	d := startDaemon(t, topo, "--config", cfg, "--masq-chain", "IP-MASQ", "--own-table=false")
	eventually(t, "the report", func() bool { return strings.Contains(d.output(), "is not the original ip-masq-agent's") })
	code, out, stderr := runTool(t, topo, "diff", "--agent-pid", strconv.Itoa(d.Pid()), "--config", cfg)
	if code != 0 || !strings.Contains(out, "left alone: table ip nat: chain IP-MASQ (1 rules)") || strings.Contains(out, "removes it once") || !strings.Contains(out, "in sync") {
		t.Errorf("diff: %d\n%s%s", code, out, stderr)
	}
	code, out, stderr = runTool(t, topo, "explain", "--live", "--agent-pid", strconv.Itoa(d.Pid()), "--config", cfg, internet1)
	if code != 0 || !strings.Contains(out, "chain IP-MASQ in table ip nat (a name of the original ip-masq-agent's, not its rules: left alone") {
		t.Errorf("explain --live: %d\n%s%s", code, out, stderr)
	}
	code, out, stderr = runTool(t, topo, "cleanup-iptables", "--watch", "0", "--agent-pid", strconv.Itoa(d.Pid()))
	if code != 0 || !strings.Contains(out, "nothing to remove") || !strings.Contains(stderr, "not removed: table ip nat: chain IP-MASQ (1 rules)") ||
		!strings.Contains(natTable(t, topo, "ip"), "chain IP-MASQ {") {
		t.Errorf("cleanup-iptables with the agent's --masq-chain: %d\n%s%s", code, out, stderr)
	}
	_, body := httpGet(topo, "/metrics")
	for _, want := range []string{`ip_masq_agent_legacy_rules{family="ipv4"} 0`, `ip_masq_agent_original_decision_differences{family="ipv4"} 0`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(d.output(), "found the original ip-masq-agent's iptables rules") || strings.Contains(d.output(), "removed the original") {
		t.Errorf("the daemon took it for the original's:\n%s", d.output())
	}
	code, out, stderr = runTool(t, topo, "cleanup-iptables", "--watch", "0", "--agent-pid", "none", "--masq-chain", "IP-MASQ")
	if code != 0 || !strings.Contains(out, "found chain IP-MASQ in table ip nat: not the original ip-masq-agent's rules, removed as --masq-chain IP-MASQ asks") ||
		strings.Contains(natTable(t, topo, "ip"), "IP-MASQ") {
		t.Errorf("cleanup-iptables --masq-chain IP-MASQ: %d\n%s%s", code, out, stderr)
	}
}

// TestSwitchStandInCarriedOver: the whole switch with the addon's flags
// carried over. The stand-in original (e2e/original, --masq-chain IP-MASQ
// --nomasq-all-reserved-ranges) runs; the pre-switch check finds no
// change with the flag (and the reserved ranges without it); the agent
// with the flag runs beside it, then the original stops and its rules are
// removed: 203.0.113.10 is left alone by packets before, during and after,
// and nothing warns of a changed decision.
func TestSwitchStandInCarriedOver(t *testing.T) {
	testnet.Require(t, "iptables-nft", "iptables-nft-restore")
	topo := newTopology(t)
	addDestinations(t, topo, internet1)
	cm := newConfigMapDir(t, "resyncInterval: 1s\n")
	orig := startOriginal(t, topo, "--config", cm.path(), "--masq-chain", original.AddonChain, "--nomasq-all-reserved-ranges")
	eventually(t, "the original's first rewrite", func() bool { return rewrites(orig) >= 1 })
	expectSources(t, topo, map[string]bool{internet1: false})

	if code, out, stderr := runTool(t, topo, "diff", "--decisions", "--agent-pid", "none", "--config", cm.path(), "--nomasq-all-reserved-ranges"); code != 0 ||
		!strings.HasSuffix(out, "decisions: the switch from the original ip-masq-agent changes none\n") {
		t.Errorf("diff --decisions with the flag: %d\n%s%s", code, out, stderr)
	}
	if code, out, stderr := runTool(t, topo, "diff", "--decisions", "--agent-pid", "none", "--config", cm.path()); code != 1 || !strings.Contains(out, reservedChange) {
		t.Errorf("diff --decisions without the flag: %d\n%s%s", code, out, stderr)
	}
	d := startDaemon(t, topo, "--config", cm.path(), "--nomasq-all-reserved-ranges", "--masq-chain", original.AddonChain)
	eventually(t, "the report of the original's rules", func() bool {
		return strings.Contains(d.output(), "found the original ip-masq-agent's iptables rules")
	})
	expectSources(t, topo, map[string]bool{internet1: false})
	orig.Stop()
	eventually(t, "the removal", func() bool { return strings.Contains(d.output(), "removed the original ip-masq-agent's iptables rules") })
	if s := natTable(t, topo, "ip"); strings.Contains(s, original.AddonChain) {
		t.Errorf("table ip nat after the removal:\n%s", s)
	}
	expectSources(t, topo, map[string]bool{internet1: false})
	if strings.Contains(d.output(), "changes the masquerade decision") {
		t.Errorf("a warning with the flags carried over:\n%s", d.output())
	}
	_, body := httpGet(topo, "/metrics")
	if !strings.Contains(body, `ip_masq_agent_original_decision_differences{family="ipv4"} 0`) {
		t.Errorf("/metrics: no zero for the differences")
	}
}
