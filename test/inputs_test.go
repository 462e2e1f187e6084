package test

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
)

// The inputs the original agent ran with that read otherwise than they
// look (issue 31): decided as the original decided, proven with packets.
// None of these tests depends on who owns the table: --once with
// --release-on-exit writes it unowned on every kernel.

// TestInputOctalPrefixLength: "10.0.0.0/010" was validated by the
// original as /10 and installed by its iptables-restore as /8 (octal):
// 10.250.0.10, inside /8 and outside /10, arrives with the pod's address.
// "/08" is no octal number: the original's iptables-restore refused it and
// its rules stayed; here the config is refused, the table stays as it was,
// and at a first start no table is written.
func TestInputOctalPrefixLength(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, private1, internet1)

	// First start with a config the original's iptables-restore refused:
	// no table, an error naming the file, key and value.
	bad := writeConfig(t, "nonMasqueradeCIDRs: [10.0.0.0/08]\n")
	out, err := runAgent(t, topo, "--once", "--release-on-exit", "--config", bad)
	if err == nil || !strings.Contains(out, bad+`: nonMasqueradeCIDRs[0]: \"10.0.0.0/08\" has a leading zero in its prefix length, which iptables reads as an octal number`) {
		t.Errorf("/08 at first start: %v\n%s", err, out)
	}
	if out, err := topo.NFT("list", "table", "inet", "ip-masq-agent"); err == nil {
		t.Errorf("a table after a refused first config:\n%s", out)
	}

	cfg := writeConfig(t, "nonMasqueradeCIDRs: [10.0.0.0/010]\n")
	out, err = runAgent(t, topo, "--once", "--release-on-exit", "--config", cfg)
	if err != nil {
		t.Fatalf("/010: %v\n%s", err, out)
	}
	if !strings.Contains(out, `level=WARN msg="`+cfg+`: nonMasqueradeCIDRs[0]: \"10.0.0.0/010\" has a leading zero in its prefix length, which the original agent's iptables-restore read as octal: \"10.0.0.0/8\"`) {
		t.Errorf("no warning naming the file, key, value and reading:\n%s", out)
	}
	if table := listTable(t, topo); !strings.Contains(table, "elements = { 10.0.0.0/8, 169.254.0.0/16 }") {
		t.Errorf("nonmasq-v4 is not 10.0.0.0/8:\n%s", table)
	}
	expectSources(t, topo, map[string]bool{private1: false, internet1: true})

	// A refused config later: the rules stay as they were.
	before := withoutCounters(listTable(t, topo))
	if out, err := runAgent(t, topo, "--once", "--release-on-exit", "--config", bad); err == nil {
		t.Errorf("/08 applied:\n%s", out)
	}
	if after := withoutCounters(listTable(t, topo)); after != before {
		t.Errorf("a refused config changed the table:\n%s\nwas\n%s", after, before)
	}
	expectSources(t, topo, map[string]bool{private1: false, internet1: true})
}

// TestInputBoolFlagWord: "--nomasq-all-reserved-ranges false" set the
// flag for the original (Go's flag package stops at the word), which then
// ran: 100.64.0.10 (RFC 6598) is not masqueraded. The agent runs, decides
// the same, and says which words it ignored.
func TestInputBoolFlagWord(t *testing.T) {
	const shared = "100.64.0.10"
	topo := newTopology(t)
	addDestinations(t, topo, shared, internet1)
	out, err := runAgent(t, topo, "--once", "--release-on-exit", "--config", writeConfig(t, ""), "--nomasq-all-reserved-ranges", "false")
	if err != nil {
		t.Fatalf("--nomasq-all-reserved-ranges false: %v\n%s", err, out)
	}
	if !strings.Contains(out, `--nomasq-all-reserved-ranges false: the word \"false\" is ignored, as by the original agent`) ||
		!strings.Contains(out, "the flag is ON; write --nomasq-all-reserved-ranges=false to turn it OFF") {
		t.Errorf("no warning naming the ignored word:\n%s", out)
	}
	// 203.0.113.0/24 is reserved too (RFC 5737).
	expectSources(t, topo, map[string]bool{shared: false, internet1: false})
}

// TestInputMasqChainNames: chain names the original wrote (1MASQ, MASQ:1,
// postrouting, masq-to-node) and one it never wrote (MASQUERADE): the
// agent applies each, nft reads the table back, a saved ruleset loads
// with nft -f, and packets are decided alike.
func TestInputMasqChainNames(t *testing.T) {
	testnet.Require(t, "sh")
	topo := newTopology(t)
	addDestinations(t, topo, private1, internet1)
	for _, tc := range []struct{ flag, chain, warning string }{
		{"1MASQ", "IP-MASQ-AGENT", `nft cannot read back a chain named \"1MASQ\"`},
		{"MASQ:1", "IP-MASQ-AGENT", `nft cannot read back a chain named \"MASQ:1\"`},
		{"postrouting", "POSTROUTING", `the name is taken by the agent's own chain \"postrouting\"`},
		{"masq-to-node", "MASQ-TO-NODE", `the name is taken by the agent's own chain \"masq-to-node\"`},
		{"_MASQ", "_MASQ", ""},
		{"MASQUERADE", "MASQUERADE", "the original agent never wrote this chain"},
	} {
		t.Run(tc.flag, func(t *testing.T) {
			out, err := runAgent(t, topo, "--once", "--release-on-exit", "--config", writeConfig(t, ""), "--masq-chain", tc.flag)
			if err != nil {
				t.Fatalf("--masq-chain %s: %v\n%s", tc.flag, err, out)
			}
			if tc.warning != "" && !strings.Contains(out, tc.warning) {
				t.Errorf("no warning with %q:\n%s", tc.warning, out)
			}
			table := listTable(t, topo)
			if !strings.Contains(table, "\tchain "+tc.chain+" {") || !strings.Contains(table, "jump "+tc.chain+" comment") ||
				strings.Count(table, "\tchain ") != 3 {
				t.Errorf("want chain %s beside postrouting and masq-to-node:\n%s", tc.chain, table)
			}
			expectSources(t, topo, map[string]bool{private1: false, internet1: true})
			path, saved := saveRuleset(t, topo, "nft list ruleset")
			if out, err := loadRuleset(topo, path); err != nil {
				t.Fatalf("nft -f of the saved ruleset: %v\n%s\n%s", err, out, saved)
			}
			expectSources(t, topo, map[string]bool{private1: false, internet1: true})
		})
	}
}

// TestInputToPortsZero: --to-ports=0 and 0-65535, which the original's
// iptables-restore installed (as "masquerade to :0" and ":0-65535"): the
// same statement here, with the kernel's reading of the range. 0-65535
// masquerades as usual; port 0 alone maps every udp (and tcp, sctp)
// connection to source port 0, which the destination does not answer:
// conntrack shows it masqueraded to the node's address and port 0.
func TestInputToPortsZero(t *testing.T) {
	testnet.Require(t, "conntrack")
	topo := newTopology(t)
	addDestinations(t, topo, internet1, internet2, internet3, private1)
	for _, tc := range []struct {
		ports, rule, dst string
		zero             bool
	}{
		{"0-65535", "masquerade to :0-65535 fully-random", internet2, false},
		{"0", "masquerade to :0-0 fully-random", internet1, true},
		{"0-0", "masquerade to :0-0 fully-random", internet3, true},
	} {
		t.Run(tc.ports, func(t *testing.T) {
			out, err := runAgent(t, topo, "--once", "--release-on-exit", "--config", writeConfig(t, ""), "--to-ports", tc.ports)
			if err != nil {
				t.Fatalf("--to-ports %s: %v\n%s", tc.ports, err, out)
			}
			if !strings.Contains(out, "--to-ports="+tc.ports+": ") {
				t.Errorf("no warning about --to-ports=%s:\n%s", tc.ports, out)
			}
			if table := listTable(t, topo); !strings.Contains(table, tc.rule) {
				t.Errorf("nft list lacks %q:\n%s", tc.rule, table)
			}
			expectSources(t, topo, map[string]bool{private1: false})
			src, err := topo.SourcePortSeen("udp", netip.MustParseAddr(tc.dst))
			if !tc.zero {
				if err != nil || src.Addr() != topo.NodeUplink4 {
					t.Errorf("udp to %s arrived from %s (%v), want the node's address", tc.dst, src, err)
				}
				expectSources(t, topo, map[string]bool{tc.dst: true})
				return
			}
			// The reply tuple: what the connection was masqueraded to.
			ct, cerr := testnet.Exec(topo.NodeNS, "conntrack", "-L", "-p", "udp", "--orig-dst", tc.dst)
			want := fmt.Sprintf("src=%s dst=%s sport=%d dport=0 ", tc.dst, topo.NodeUplink4, testnet.ServerPort)
			if cerr != nil || !strings.Contains(string(ct), want) {
				t.Errorf("udp to %s (%v): want a conntrack entry with reply %q:\n%s", tc.dst, err, want, ct)
			}
		})
	}
}

// TestInputsDecideAsTheOriginal: the stand-in original (e2e/original: the
// original's commands and rules text, through iptables-nft) and this agent
// run with the same surprising input, one after the other on a node; every
// destination sees the same source address from both.
func TestInputsDecideAsTheOriginal(t *testing.T) {
	const shared = "100.64.0.10"
	dsts := []string{private1, internet1, internet2, shared, internet6a, private6}
	for _, tc := range []struct {
		name, config string
		flags        []string
	}{
		{"octal prefix lengths", "nonMasqueradeCIDRs: [10.0.0.0/010, 203.0.113.0/030]\n", nil},
		{"a word after --nomasq-all-reserved-ranges", "", []string{"--nomasq-all-reserved-ranges", "false"}},
		{"a word after --enable-ipv6", "nonMasqueradeCIDRs: [10.0.0.0/8]\n", []string{"--enable-ipv6", "true", "--nomasq-all-reserved-ranges"}},
		{"--masq-chain 1MASQ", "", []string{"--masq-chain", "1MASQ"}},
		{"--masq-chain MASQ:1", "", []string{"--masq-chain", "MASQ:1"}},
		{"--masq-chain postrouting", "", []string{"--masq-chain", "postrouting"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testnet.Require(t, "iptables-nft", "ip6tables-nft")
			topo := newTopology(t)
			addDestinations(t, topo, dsts...)
			cfg := writeConfig(t, tc.config)
			seen := func() map[string]bool {
				m := map[string]bool{}
				for _, d := range dsts {
					addr := netip.MustParseAddr(d)
					src, err := topo.SourceSeen(addr)
					if err != nil {
						t.Fatalf("connect to %s: %v", d, err)
					}
					m[d] = src == topo.NodeUplink4 || src == topo.NodeUplink6
				}
				return m
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			out, err := topo.RunInNode(ctx, standIn(t), append([]string{"-once", "--config", cfg}, tc.flags...)...)
			if err != nil {
				t.Fatalf("the original: %v\n%s", err, out)
			}
			original := seen()
			for _, bin := range []string{"iptables-nft", "ip6tables-nft"} {
				for _, op := range []string{"-F", "-X"} {
					if out, err := testnet.Exec(topo.NodeNS, bin, "-t", "nat", op); err != nil {
						t.Fatalf("%s -t nat %s: %v\n%s", bin, op, err, out)
					}
				}
			}
			if out, err := runAgent(t, topo, append([]string{"--once", "--release-on-exit", "--config", cfg}, tc.flags...)...); err != nil {
				t.Fatalf("the agent: %v\n%s", err, out)
			}
			ours := seen()
			t.Logf("masqueraded: %v", ours)
			if !maps.Equal(ours, original) {
				t.Errorf("masqueraded: the original %v, this agent %v", original, ours)
			}
		})
	}
}

// TestInputToPortsZeroAsTheOriginal: --to-ports=0 in the stand-in original
// (its iptables-restore installs "masquerade to :0") and here: a udp
// connection leaves masqueraded to the node's address and port 0 from
// both, and neither gets an answer.
func TestInputToPortsZeroAsTheOriginal(t *testing.T) {
	testnet.Require(t, "conntrack", "iptables-nft")
	topo := newTopology(t)
	addDestinations(t, topo, internet1, internet2)
	cfg := writeConfig(t, "")
	reply := func(dst string) string {
		t.Helper()
		_, err := topo.SourcePortSeen("udp", netip.MustParseAddr(dst))
		ct, cerr := testnet.Exec(topo.NodeNS, "conntrack", "-L", "-p", "udp", "--orig-dst", dst)
		if cerr != nil {
			t.Fatalf("conntrack -L: %v\n%s", cerr, ct)
		}
		want := fmt.Sprintf("src=%s dst=%s sport=%d dport=0 ", dst, topo.NodeUplink4, testnet.ServerPort)
		if !strings.Contains(string(ct), want) {
			t.Errorf("udp to %s (%v): no conntrack entry with reply %q:\n%s", dst, err, want, ct)
		}
		return fmt.Sprint(err != nil)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := topo.RunInNode(ctx, standIn(t), "-once", "--config", cfg, "--to-ports", "0"); err != nil {
		t.Fatalf("the original: %v\n%s", err, out)
	}
	if out, err := testnet.Exec(topo.NodeNS, "iptables-nft-save", "-t", "nat"); err != nil || !strings.Contains(string(out), "-j MASQUERADE --to-ports 0") {
		t.Errorf("the original's rules (%v):\n%s", err, out)
	}
	originalUnanswered := reply(internet1)
	for _, op := range []string{"-F", "-X"} {
		if out, err := testnet.Exec(topo.NodeNS, "iptables-nft", "-t", "nat", op); err != nil {
			t.Fatalf("iptables-nft -t nat %s: %v\n%s", op, err, out)
		}
	}
	if out, err := runAgent(t, topo, "--once", "--release-on-exit", "--config", cfg, "--to-ports", "0"); err != nil {
		t.Fatalf("the agent: %v\n%s", err, out)
	}
	if ours := reply(internet2); ours != originalUnanswered {
		t.Errorf("unanswered: the original %s, this agent %s", originalUnanswered, ours)
	}
}
