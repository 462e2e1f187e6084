package nft

import (
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// goldenCases are configs from the seeds (Kubernetes docs, Baidu CCE, the
// original's README) and the edge cases of the translation.
var goldenCases = []struct {
	name  string
	yaml  string
	flags config.Flags
	ports string
	noRF  bool
}{
	{name: "defaults"},
	{name: "defaults-all-reserved", flags: config.Flags{NoMasqAllReservedRanges: true}},
	{name: "k8s-docs-example", yaml: "nonMasqueradeCIDRs:\n  - 10.0.0.0/8\nresyncInterval: 60s\nmasqLinkLocal: true\n"},
	{name: "empty-list", yaml: "nonMasqueradeCIDRs: []\n"},
	{name: "cce-own-identity", flags: config.Flags{EnableIPv6: true}, yaml: `
nonMasqueradeCIDRs: [10.0.0.0/8, 172.16.0.0/12, 100.64.230.0/24, 192.168.0.0/16, "fc00::/7"]
masqOutBound: false
masqOutBoundIPv6: true
masqLinkLocal: false
masqLinkLocalIPv6: false
resyncInterval: 60s
`},
	{name: "cce-specific-addresses", flags: config.Flags{EnableIPv6: true}, yaml: `
masqueradeCIDRs: [10.10.10.10/32]
nonMasqueradeCIDRs: [10.0.0.0/8, 172.16.0.0/12, 100.64.230.0/24, 192.168.0.0/16, "fc00::/7"]
masqOutBound: false
masqOutBoundIPv6: true
`},
	{name: "ipv6-link-local-masqueraded", flags: config.Flags{EnableIPv6: true}, yaml: "masqLinkLocalIPv6: true\nnonMasqueradeCIDRs: [\"fd00::/8\"]\n"},
	{name: "overlapping", yaml: "nonMasqueradeCIDRs: [10.0.0.0/8, 10.1.0.0/16, 10.0.0.0/8, 11.0.0.0/8, 169.254.1.0/24, 192.168.1.0/24, 192.168.0.0/16]\n"},
	{name: "top-of-range", flags: config.Flags{EnableIPv6: true}, yaml: "nonMasqueradeCIDRs: [240.0.0.0/4, 255.255.255.255/32, \"ffff::/16\"]\nmasqueradeCIDRs: [0.0.0.0/0, \"::/0\"]\n"},
	{name: "to-ports", ports: "1024-29999,32768-65535"},
	{name: "to-ports-single-no-random-fully", ports: "32768-65535", noRF: true},
	{name: "most-specific", yaml: "cidrMatch: mostSpecific\nnonMasqueradeCIDRs: [10.0.0.0/8, 10.20.30.0/24]\nmasqueradeCIDRs: [10.20.0.0/16, 169.254.169.254/32]\n"},
	{name: "source-exceptions", flags: config.Flags{EnableIPv6: true}, yaml: `
nonMasqueradeSourceCIDRs: [10.244.1.0/24, "fd00:1::/64", 10.244.2.0/24]
masqueradeCIDRs: [203.0.113.0/24]
`},
	{name: "source-guard", flags: config.Flags{EnableIPv6: true}, yaml: `
masqueradeSourceCIDRs: [10.244.0.0/16, "fd00::/16"]
nonMasqueradeSourceCIDRs: [10.244.1.0/24]
`},
	{name: "egress-interfaces", flags: config.Flags{EnableIPv6: true}, yaml: `
egressInterfaces: ["eth0", "ens*", "veth1*"]
masqueradeSourceCIDRs: [10.244.0.0/16, "fd00::/16"]
`},
}

// pod is a pod's address of a's family outside every golden case's
// nonMasqueradeSourceCIDRs: the source of the golden cases' packets.
func pod(a netip.Addr) netip.Addr {
	if a.Unmap().Is4() {
		return netip.MustParseAddr("10.244.9.9")
	}
	return netip.MustParseAddr("fd00:9::9")
}

// podIn is a pod's address of a's family inside the source-exceptions
// case's nonMasqueradeSourceCIDRs.
func podIn(a netip.Addr) netip.Addr {
	if a.Unmap().Is4() {
		return netip.MustParseAddr("10.244.1.5")
	}
	return netip.MustParseAddr("fd00:1::5")
}

func TestGolden(t *testing.T) {
	for _, tc := range goldenCases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _, err := config.Parse([]byte(tc.yaml), tc.flags)
			if err != nil {
				t.Fatal(err)
			}
			ports, err := ParsePorts(tc.ports)
			if err != nil {
				t.Fatal(err)
			}
			got := Render(Build(cfg, Options{Chain: DefaultChain, EnableIPv6: tc.flags.EnableIPv6, RandomFully: !tc.noRF, ToPorts: ports}))
			path := filepath.Join("testdata", tc.name+".nft")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./nft/ -update to create it)", err)
			}
			if got != string(want) {
				t.Errorf("Render differs from %s (rerun with -update if intended):\n%s", path, got)
			}
		})
	}
}

func prefixes(ss ...string) []netip.Prefix {
	var ps []netip.Prefix
	for _, s := range ss {
		ps = append(ps, netip.MustParsePrefix(s))
	}
	return ps
}

func TestNormalize(t *testing.T) {
	for _, tc := range []struct{ in, want []string }{
		{nil, nil},
		{[]string{"10.0.0.0/8", "10.0.0.0/8"}, []string{"10.0.0.0/8"}},
		{[]string{"10.1.0.0/16", "10.0.0.0/8"}, []string{"10.0.0.0/8"}},
		{[]string{"10.0.0.0/8", "11.0.0.0/8"}, []string{"10.0.0.0/8", "11.0.0.0/8"}}, // adjacent: kept apart
		{[]string{"0.0.0.0/0", "10.0.0.0/8", "240.0.0.0/4"}, []string{"0.0.0.0/0"}},
		{[]string{"10.1.2.3/8"}, []string{"10.0.0.0/8"}}, // masked
		{[]string{"2001:db8::/32", "2001:db8:1::/48", "fd00::/8"}, []string{"2001:db8::/32", "fd00::/8"}},
		{[]string{"192.168.0.0/24", "192.168.0.0/16", "192.168.1.0/24", "192.169.0.0/16"}, []string{"192.168.0.0/16", "192.169.0.0/16"}},
	} {
		got := Normalize(prefixes(tc.in...))
		if !slices.Equal(got, prefixes(tc.want...)) {
			t.Errorf("Normalize(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestSplitFamiliesUnmaps(t *testing.T) {
	v4, v6 := splitFamilies(prefixes("::ffff:10.0.0.0/104", "fd00::/8", "192.168.0.0/16", "::ffff:0:0/80"))
	if !slices.Equal(v4, prefixes("10.0.0.0/8", "192.168.0.0/16")) || !slices.Equal(v6, prefixes("fd00::/8", "::ffff:0:0/80")) {
		t.Errorf("splitFamilies: v4 %v, v6 %v", v4, v6)
	}
}

// --to-ports accepts what the original's parser (pkg/interval) accepts,
// with the same ranges.
func TestParsePorts(t *testing.T) {
	r := func(a, b uint16) PortRange { return PortRange{First: a, Last: b} }
	tests := []struct {
		in      string
		want    []PortRange
		wantErr string
	}{
		{in: "", want: nil},
		{in: "1024-29999,32768-65535", want: []PortRange{r(1024, 29999), r(32768, 65535)}},
		{in: "8080", want: []PortRange{r(8080, 8080)}},
		{in: "1-1", want: []PortRange{r(1, 1)}},
		{in: "+1024-01999", want: []PortRange{r(1024, 1999)}}, // strconv.Atoi
		{in: "2000-3000,1000-1500", want: []PortRange{r(2000, 3000), r(1000, 1500)}},
		{in: "1024-2000,1500-3000", want: []PortRange{r(1024, 2000), r(1500, 3000)}}, // overlap: kept, as the original
		{in: "5,5", want: []PortRange{r(5, 5), r(5, 5)}},
		{in: "65535", want: []PortRange{r(65535, 65535)}},
		{in: "2000-1000", wantErr: `first is greater than last in "2000-1000"`},
		{in: "1-2-3", wantErr: `"1-2-3" is not a port or a range FIRST-LAST`},
		{in: "1024,", wantErr: `"" is not a port or a range FIRST-LAST`},
		{in: " 1024", wantErr: `" 1024" is not a port or a range FIRST-LAST`},
		{in: "1024 - 2048", wantErr: `"1024 - 2048" is not a port or a range FIRST-LAST`},
		{in: "-1024", wantErr: `"-1024" is not a port or a range FIRST-LAST`},
		{in: "http", wantErr: `"http" is not a port or a range FIRST-LAST`},
		// Port 0: iptables-restore installed it for the original (iptables
		// 1.8.9: "masquerade to :0", ":0-65535"); taken as it is.
		{in: "0", want: []PortRange{r(0, 0)}},
		{in: "0-0", want: []PortRange{r(0, 0)}},
		{in: "0-65535", want: []PortRange{r(0, 65535)}},
		{in: "0-1024", want: []PortRange{r(0, 1024)}},
		// The original's parser took this, and iptables then refused the
		// rule at every sync; refused at start here.
		{in: "65536", wantErr: "65536 is not a port (0-65535)"},
	}
	for _, tt := range tests {
		got, err := ParsePorts(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParsePorts(%q) = %v, %v; want an error with %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("ParsePorts(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

// TestChainName: every --masq-chain is taken; the chain is named so that
// nft reads it back (a saved ruleset loads with nft -f) and apart from the
// agent's other chains.
func TestChainName(t *testing.T) {
	for flag, want := range map[string]string{
		"IP-MASQ-AGENT": "IP-MASQ-AGENT", "IP-MASQ": "IP-MASQ", "my_chain.v2": "my_chain.v2", "_MASQ": "_MASQ",
		"MASQ/1": "MASQ/1", "MASQUERADE": "MASQUERADE", "RETURN": "RETURN", strings.Repeat("A", 64): strings.Repeat("A", 64),
		// nft cannot read these back: the upper case, or the default name.
		BaseChainName: "POSTROUTING", MasqChainName: "MASQ-TO-NODE", "mark": "MARK", "custom-masq": "CUSTOM-MASQ",
		"1MASQ": DefaultChain, "MASQ:1": DefaultChain, "a#b": DefaultChain, ".MASQ": DefaultChain, "": DefaultChain,
		"a b": DefaultChain, "-x": DefaultChain, strings.Repeat("A", 256): DefaultChain, "ü-chain": DefaultChain,
	} {
		got, why := ChainName(flag)
		if got != want || (why == "") != (got == flag) {
			t.Errorf("ChainName(%q) = %q, %q; want %q", flag, got, why, want)
		}
		if !nftNameRE.MatchString(got) || !nftKeywordSafe.MatchString(got) || got == BaseChainName || got == MasqChainName {
			t.Errorf("ChainName(%q) = %q: nft could not read it back, or it is one of the agent's chains", flag, got)
		}
	}
}

// TestOriginalCannotWrite: the names iptables refused the original (as
// iptables 1.8.9's -N and iptables-restore answer them).
func TestOriginalCannotWrite(t *testing.T) {
	for name, cannot := range map[string]bool{
		"IP-MASQ-AGENT": false, "1MASQ": false, "_MASQ": false, "MASQ:1": false, "postrouting": false, "masq-to-node": false,
		"mark": false, "ERROR": false, strings.Repeat("a", 28): false,
		strings.Repeat("a", 29): true, "": true, "-x": true, "!x": true, "a b": true, "MASQUERADE": true, "RETURN": true,
		"ACCEPT": true, "SNAT": true, "LOG": true, "POSTROUTING": true, `a"b`: true,
	} {
		if why := OriginalCannotWrite(name); (why != "") != cannot {
			t.Errorf("OriginalCannotWrite(%q) = %q, want a reason: %v", name, why, cannot)
		}
	}
}

// TestPortsNote: --to-ports reaching port 0 is taken, with a note.
func TestPortsNote(t *testing.T) {
	for in, want := range map[string]string{
		"0": "source port 0", "0-0": "source port 0", "0-65535": "a range from 0 (0-65535)",
		"1024-65535": "", "": "", "0,1024-2000": "source port 0",
	} {
		ports, err := ParsePorts(in)
		if err != nil {
			t.Fatalf("ParsePorts(%q): %v", in, err)
		}
		note := PortsNote(in, ports)
		if (want == "") != (note == "") || !strings.Contains(note, want) {
			t.Errorf("PortsNote(%q) = %q, want %q in it", in, note, want)
		}
	}
}

// TestMasqueradeShares checks that --to-ports ranges are chosen in
// proportion to their sizes: P(range i) = Below/Of * P(no earlier range).
func TestMasqueradeShares(t *testing.T) {
	ports, _ := ParsePorts("1024-29999,32768-65535,10-19")
	rules := masqRules(Options{ToPorts: ports})
	total := 0.0
	for _, p := range ports {
		total += float64(p.size())
	}
	left := 1.0
	for i, r := range rules[:3] { // tcp's three rules
		share := 1.0
		if r.Share != nil {
			share = float64(r.Share.Below) / float64(r.Share.Of)
		}
		got := left * share
		if want := float64(ports[i].size()) / total; got < want-1e-9 || got > want+1e-9 {
			t.Errorf("range %v chosen with probability %f, want %f", ports[i], got, want)
		}
		left -= got
	}
	if last := rules[len(rules)-1]; last.L4Proto != 0 || last.Ports != nil {
		t.Errorf("last rule %q should masquerade every other protocol without ports", RenderRule(last))
	}
}

// AgentSet names Build's sets, each looked up by one rule of its
// decision's selector and verdict; no other name is the agent's.
func TestAgentSet(t *testing.T) {
	tbl := Build(config.Default(config.Flags{EnableIPv6: true}), Options{Chain: DefaultChain, EnableIPv6: true})
	n := 0
	for _, r := range tbl.DecisionChain().Rules {
		if r.Set == "" {
			continue
		}
		n++
		if d := decisionOf(r.Set); !AgentSet(r.Set) || d == nil || d.verdict != r.Verdict || d.sel != r.Selector {
			t.Errorf("AgentSet(%s) = %v, for a rule %s", r.Set, AgentSet(r.Set), RenderRule(r))
		}
	}
	if n != len(tbl.Sets) {
		t.Errorf("%d rules look up the %d sets", n, len(tbl.Sets))
	}
	if AgentSet("other") {
		t.Error(`AgentSet("other") is the agent's`)
	}
}

func TestBounds(t *testing.T) {
	var rs []Range
	for _, p := range []string{"10.0.0.0/8", "240.0.0.0/4", "255.255.255.255/32", "::/0", "2001:db8::/32"} {
		rs = append(rs, RangeOfPrefix(netip.MustParsePrefix(p)))
	}
	rs = append(rs, RangeFrom(netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::5")))
	got := Bounds(rs)
	var s []string
	for _, e := range got {
		a := e.Addr
		if e.End {
			s = append(s, "end "+a.String())
		} else {
			s = append(s, a.String())
		}
	}
	// The top of the address space has no end element.
	want := []string{"10.0.0.0", "end 11.0.0.0", "240.0.0.0", "255.255.255.255", "::", "2001:db8::", "end 2001:db9::", "fd00::1", "end fd00::6"}
	if !slices.Equal(s, want) {
		t.Errorf("Bounds = %v, want %v", s, want)
	}
}
