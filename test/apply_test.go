package test

import (
	"errors"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft/kernel"
)

// TestListedByNFT reads the table back with the real nft CLI: sets as
// prefixes, the fib guard, counters and comments on every rule.
func TestListedByNFT(t *testing.T) {
	topo := newTopology(t)
	mustApply(t, topo, "nonMasqueradeCIDRs: [10.0.0.0/8, 172.16.0.0/12, \"fd00::/8\"]\nmasqueradeCIDRs: [10.10.10.10/32]\n", "--enable-ipv6")
	table := listTable(t, topo)
	for _, want := range []string{
		"table inet ip-masq-agent {",
		"set nonmasq-v4 {", "type ipv4_addr", "flags interval",
		"10.0.0.0/8", "172.16.0.0/12", "169.254.0.0/16", "fd00::/8", "fe80::/10", "10.10.10.10",
		"type nat hook postrouting priority srcnat + 10; policy accept;",
		"fib daddr type != local counter packets 0 bytes 0 jump IP-MASQ-AGENT",
		"ip daddr @masq-v4 counter", "ip daddr @nonmasq-v4 counter", "ip6 daddr @nonmasq-v6 counter",
		"masquerade fully-random",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("nft list table lacks %q", want)
		}
	}
	for _, line := range strings.Split(table, "\n") {
		line = strings.TrimSpace(line)
		isRule := !strings.HasPrefix(line, "comment") && (strings.Contains(line, " return") ||
			strings.Contains(line, " jump ") || strings.Contains(line, " goto ") || strings.Contains(line, " masquerade"))
		if isRule && (!strings.Contains(line, "counter packets") || !strings.Contains(line, `comment "ip-masq-agent: `)) {
			t.Errorf("rule without counter or comment: %q", line)
		}
	}
	if t.Failed() {
		t.Logf("table:\n%s", table)
	}
}

// TestRenderMatchesKernel loads Render's text with `nft -f` in one
// namespace and applies the same ruleset over netlink in another: nft must
// list both identically. This checks our netlink encoding against nft's.
func TestRenderMatchesKernel(t *testing.T) {
	topo := newTopology(t)
	for _, tc := range []struct {
		name, config string
		opts         nft.Options
	}{
		{"defaults", "", nft.Options{Chain: nft.DefaultChain, RandomFully: true}},
		{"ipv6 and masqueradeCIDRs", "nonMasqueradeCIDRs: [10.0.0.0/8, \"fd00::/8\", \"::/0\", 240.0.0.0/4]\nmasqueradeCIDRs: [10.10.10.10/32, \"2001:db8::/32\"]\nmasqOutBound: false\n",
			nft.Options{Chain: "MY-CHAIN", EnableIPv6: true, RandomFully: true}},
		{"to-ports", "", nft.Options{Chain: nft.DefaultChain, ToPorts: []nft.PortRange{{First: 1024, Last: 29999}, {First: 32768, Last: 65535}}, RandomFully: true}},
		{"not fully random", "", nft.Options{Chain: nft.DefaultChain, ToPorts: []nft.PortRange{{First: 32768, Last: 65535}}}},
		{"conntrack label", "", nft.Options{Chain: nft.DefaultChain, RandomFully: true, CtLabel: labelBit(20)}},
		{"source lists and egress interfaces", "nonMasqueradeSourceCIDRs: [10.244.1.0/24]\nmasqueradeSourceCIDRs: [10.244.0.0/16, \"fd00::/16\"]\n" +
			"egressInterfaces: [eth0, \"ens*\", \"veth1*\", abcdefghijklmno]\n",
			nft.Options{Chain: nft.DefaultChain, EnableIPv6: true, RandomFully: true}},
		{"conntrack label, high bit, to-ports", "", nft.Options{Chain: nft.DefaultChain, ToPorts: []nft.PortRange{{First: 1024, Last: 29999}, {First: 32768, Last: 65535}}, CtLabel: labelBit(100)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _, err := config.Parse([]byte(tc.config), config.Flags{EnableIPv6: tc.opts.EnableIPv6})
			if err != nil {
				t.Fatal(err)
			}
			rs := nft.Build(cfg, tc.opts)
			a := &kernel.Netlink{NetNS: int(topo.NodeHandle()), NoOwner: true}
			if _, err := nft.Ensure(a, rs); err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(t.TempDir(), "ruleset.nft")
			text := "table inet ip-masq-agent\ndelete table inet ip-masq-agent\n" + nft.Render(rs)
			if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := testnet.Exec(topo.ExtNS, "nft", "-f", file); err != nil {
				t.Fatalf("nft -f rejects Render's output: %v\n%s\n%s", err, out, text)
			}
			fromNFT, err := testnet.Exec(topo.ExtNS, "nft", "list", "table", "inet", "ip-masq-agent")
			if err != nil {
				t.Fatal(err)
			}
			if got, want := withoutCounters(listTable(t, topo)), withoutCounters(string(fromNFT)); got != want {
				t.Errorf("applied over netlink, nft lists:\n%s\nloaded with nft -f, it lists:\n%s", got, want)
			}
			// The rules nft -f wrote read back as the agent's own.
			ext, err := netns.GetFromName(topo.ExtNS)
			if err != nil {
				t.Fatal(err)
			}
			defer ext.Close()
			found, _, err := (&kernel.Netlink{NetNS: int(ext), NoOwner: true}).Read()
			if err != nil || found == nil {
				t.Fatalf("read what nft -f wrote: %v", err)
			}
			for _, c := range rs.Chains {
				if f := found.Chain(c.Name); f == nil || !slices.EqualFunc(c.Rules, f.Rules, func(a, b nft.Rule) bool { return nft.RenderRule(a) == nft.RenderRule(b) && b.Foreign == "" }) {
					t.Errorf("chain %s that nft -f wrote reads back as another:\n%s", c.Name, nft.Render(*found))
				}
			}
		})
	}
}

func labelBit(b uint8) *uint8 { return &b }

var tableHandleRE = regexp.MustCompile(`table inet ip-masq-agent \{ # handle (\d+)`)

func tableHandle(t *testing.T, topo *testnet.Topology) string {
	t.Helper()
	m := tableHandleRE.FindStringSubmatch(listTable(t, topo, "-a"))
	if m == nil {
		t.Fatal("no table handle in nft -a list table")
	}
	return m[1]
}

// handles returns the handles of the table and of its sets and chains,
// by name ("table", "chain NAME" and "set NAME").
func handles(t *testing.T, topo *testnet.Topology) map[string]string {
	t.Helper()
	out := listTable(t, topo, "-a")
	h := map[string]string{"table": tableHandle(t, topo)}
	for _, m := range regexp.MustCompile(`(?m)^\t(chain|set) (\S+) \{ # handle (\d+)$`).FindAllStringSubmatch(out, -1) {
		h[m[1]+" "+m[2]] = m[3]
	}
	return h
}

// TestReplacedInPlace: a changed config replaces the table's contents in
// place (the same table, sets and chains, by their handles: nothing is
// deleted and re-created); a chain another process added to the table is
// removed, in place too; other tables are never touched (handles and
// counters).
func TestReplacedInPlace(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1, private1)
	if out, err := topo.NFT("add", "table", "ip", "other"); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	if out, err := topo.NFT("add", "chain", "ip", "other", "post", "{ type nat hook postrouting priority 100; }"); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	if out, err := topo.NFT("add", "rule", "ip", "other", "post", "ip daddr 192.0.2.77 counter"); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	other := func() string {
		out, err := topo.NFT("-a", "list", "table", "ip", "other")
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	otherBefore := other()

	// Each --once here leaves the table orphaned for the next to adopt in
	// place: by default it releases it at exit (re-creates it unowned),
	// and the next run re-creates it owned, new table handles and all
	// (TestSavedRulesetLoads). The in-place change is what is tested.
	keep := "--release-on-exit=false"
	mustApply(t, topo, "", keep)
	first := handles(t, topo)
	if len(first) != 8 { // the table, 4 sets, 3 chains
		t.Fatalf("handles of the table, its sets and chains: %v", first)
	}
	mustApply(t, topo, "nonMasqueradeCIDRs: [203.0.113.0/24]\n", keep)
	if h := handles(t, topo); !maps.Equal(h, first) {
		t.Errorf("handles changed from %v to %v: objects were re-created, not replaced in place", first, h)
	}
	expectSources(t, topo, map[string]bool{internet1: false, private1: true})

	if out, err := topo.NFT("add", "chain", "inet", "ip-masq-agent", "intruder"); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	mustApply(t, topo, "", keep)
	if table := listTable(t, topo); strings.Contains(table, "intruder") {
		t.Errorf("a foreign chain survived the apply:\n%s", table)
	}
	if h := handles(t, topo); !maps.Equal(h, first) {
		t.Errorf("handles changed from %v to %v: the foreign chain's removal re-created objects", first, h)
	}
	expectSources(t, topo, map[string]bool{internet1: true, private1: false})
	if got := other(); got != otherBefore {
		t.Errorf("table ip other changed:\nbefore:\n%s\nafter:\n%s", otherBefore, got)
	}
}

// TestBadConfigKeepsRules: every kind of bad input gets a one-line error
// naming the file, key and value, a non-zero exit from --once, and the
// rules in the kernel stay exactly as they were.
func TestBadConfigKeepsRules(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1, private1)
	mustApply(t, topo, "nonMasqueradeCIDRs: [203.0.113.0/24]\n")
	before := withoutCounters(listTable(t, topo))

	for _, tc := range []struct {
		name, config string
		flags        []string
		wantInError  []string
	}{
		{"unparsable YAML", "nonMasqueradeCIDRs: [10.0.0.0/8\n", nil, []string{"YAML"}},
		{"unparsable JSON", `{"nonMasqueradeCIDRs": ["10.0.0.0/8"]`, nil, nil},
		{"bad CIDR", "nonMasqueradeCIDRs: [10.0.0.0/33]\n", nil, []string{"nonMasqueradeCIDRs[0]", "10.0.0.0/33"}},
		{"misaligned CIDR", "nonMasqueradeCIDRs: [10.0.0.1/8]\n", nil, []string{"nonMasqueradeCIDRs[0]", "10.0.0.1/8"}},
		{"bad masqueradeCIDR", "masqueradeCIDRs: [not-a-cidr]\n", nil, []string{"masqueradeCIDRs[0]", "not-a-cidr"}},
		{"bad duration", "resyncInterval: soon\n", nil, []string{"resyncInterval", "soon"}},
		// A zero or negative resyncInterval is accepted, as by the
		// original, and raised to 1s with a warning (config's tests).
		{"too many CIDRs", "cidrLimit: 2\nnonMasqueradeCIDRs: [10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16]\n", nil, []string{"nonMasqueradeCIDRs", "cidrLimit"}},
		{"IPv6 without --enable-ipv6", "nonMasqueradeCIDRs: [\"fd00::/8\"]\n", nil, []string{"nonMasqueradeCIDRs[0]", "fd00::/8", "--enable-ipv6"}},
		{"wrong type", "masqLinkLocal: \"yes\"\n", nil, []string{"masqLinkLocal"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeConfig(t, tc.config)
			out, err := runAgent(t, topo, append([]string{"--once", "--config", path}, tc.flags...)...)
			var exit interface{ ExitCode() int }
			if !errors.As(err, &exit) || exit.ExitCode() == 0 {
				t.Errorf("--once with a bad config: err %v, want a non-zero exit\n%s", err, out)
			}
			errLine := lineWith(out, "level=ERROR")
			for _, want := range append([]string{path}, tc.wantInError...) {
				if !strings.Contains(errLine, want) {
					t.Errorf("error line %q does not name %q", errLine, want)
				}
			}
			if after := withoutCounters(listTable(t, topo)); after != before {
				t.Errorf("the table changed after a bad config:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
	expectSources(t, topo, map[string]bool{internet1: false, private1: true})
}

// TestUnknownKeyWarns: a typo is named in a warning, and the rest applies.
func TestUnknownKeyWarns(t *testing.T) {
	topo := newTopology(t)
	out, err := runAgent(t, topo, "--once", "--config", writeConfig(t, "nonMasqueradeCIDRs: [10.0.0.0/8]\nmasqLinkLocall: true\n"))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if w := lineWith(out, "level=WARN"); !strings.Contains(w, "masqLinkLocall") {
		t.Errorf("no warning naming the unknown key masqLinkLocall in:\n%s", out)
	}
}

// TestFailedBatchChangesNothing sends a batch the kernel refuses (two
// overlapping intervals, which Build never produces): the error names the
// message that failed, the old rules stay, and the next apply works (no
// socket left out of step).
func TestFailedBatchChangesNothing(t *testing.T) {
	topo := newTopology(t)
	a := &kernel.Netlink{NetNS: int(topo.NodeHandle()), NoOwner: true}
	good := nft.Build(config.Default(config.Flags{}), nft.Options{Chain: nft.DefaultChain, RandomFully: true})
	if _, err := nft.Ensure(a, good); err != nil {
		t.Fatal(err)
	}
	before := listTable(t, topo)

	bad := nft.Build(config.Default(config.Flags{}), nft.Options{Chain: nft.DefaultChain, RandomFully: true})
	bad.Sets[1].Elements = append(bad.Sets[1].Elements, nft.RangeOfPrefix(netip.MustParsePrefix("10.1.0.0/16")))
	_, err := nft.Ensure(a, bad)
	if err == nil {
		t.Fatal("the kernel accepted overlapping intervals")
	}
	if !errors.Is(err, syscall.EEXIST) || !strings.Contains(err.Error(), "nonmasq-v4") {
		t.Errorf("error %q should be EEXIST and name the set", err)
	}
	t.Logf("refused as expected: %v", err)
	if after := listTable(t, topo); after != before {
		t.Errorf("a refused batch changed the table:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if _, err := nft.Ensure(a, good); err != nil {
		t.Errorf("apply after a refused batch: %v", err)
	}
}

// TestCleanup: --cleanup deletes the table, and succeeds when there is none.
func TestCleanup(t *testing.T) {
	topo := newTopology(t)
	mustApply(t, topo, "")
	for i, want := range []string{`msg="deleted table inet ip-masq-agent"`, `msg="there is no table inet ip-masq-agent: nothing to delete"`} {
		out, err := runAgent(t, topo, "--cleanup")
		if err != nil {
			t.Fatalf("--cleanup (run %d): %v\n%s", i+1, err, out)
		}
		if !strings.Contains(out, want) {
			t.Errorf("--cleanup (run %d) does not say %s:\n%s", i+1, want, out)
		}
		if out, err := topo.NFT("list", "tables"); err != nil || strings.Contains(out, "ip-masq-agent") {
			t.Fatalf("after --cleanup: %v\n%s", err, out)
		}
	}
}
