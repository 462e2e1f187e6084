package nft

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
)

// kernelTable turns a ruleset into what Read would return for it: each
// rule encoded by ruleMessage, as Apply sends it, and decoded by
// google/nftables' expression decoders, as Read receives it.
func kernelTable(t *testing.T, rs Ruleset) *Table {
	t.Helper()
	tbl := &Table{}
	for _, s := range rs.Sets {
		tbl.Sets = append(tbl.Sets, Set{Name: s.Name, Family: s.Family, Prefixes: s.Prefixes})
	}
	for i, rules := range rs.chains() {
		c := Chain{Name: []string{BaseChainName, rs.Chain, MasqChainName}[i]}
		if i == 0 {
			c.Hook = fmt.Sprintf("type nat hook postrouting priority srcnat + %d; policy accept;", Priority-100)
			c.natPostrouting, c.priority = true, Priority
		}
		for _, r := range rules {
			c.Rules = append(c.Rules, kernelRule(decodeMessage(t, c.Name, r)))
		}
		tbl.Chains = append(tbl.Chains, c)
	}
	return tbl
}

func decodeMessage(t *testing.T, chain string, r Rule) *nftables.Rule {
	t.Helper()
	msg, err := ruleMessage(chain, r)
	if err != nil {
		t.Fatal(err)
	}
	out, got, err := decodeRuleMessage(msg.Data[4:])
	if err != nil || got != chain {
		t.Fatalf("decode %q: chain %q, %v", RenderRule(r), got, err)
	}
	return out
}

// Every rule Build makes, encoded and decoded, reads back as itself.
func TestDecodeRuleRoundTrip(t *testing.T) {
	n := 0
	for _, tc := range goldenCases {
		cfg, _, err := config.Parse([]byte(tc.yaml), tc.flags)
		if err != nil {
			t.Fatal(err)
		}
		ports, _ := ParsePorts(tc.ports)
		rs := Build(cfg, Options{Chain: DefaultChain, EnableIPv6: tc.flags.EnableIPv6, RandomFully: !tc.noRF, ToPorts: ports})
		tbl := kernelTable(t, rs)
		for i, rules := range rs.chains() {
			for j, r := range rules {
				kr := tbl.Chains[i].Rules[j]
				if kr.Rule == nil || !kr.Rule.equal(r) || kr.Text != RenderRule(r) {
					t.Errorf("%s: %q read back as %+v, %q", tc.name, RenderRule(r), kr.Rule, kr.Text)
				}
				n++
			}
		}
	}
	t.Logf("%d rules", n)
}

func TestDecodeRuleForeign(t *testing.T) {
	for _, tc := range []struct {
		exprs []expr.Any
		text  string
	}{
		{[]expr.Any{
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Cmp{Register: 1, Data: []byte{10, 250, 0, 10}},
			&expr.Verdict{Kind: expr.VerdictGoto, Chain: MasqChainName},
		}, "meta nfproto ipv4 ip daddr 10.250.0.10 goto masq-to-node"},
		{[]expr.Any{ // no counter
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
			&expr.Verdict{Kind: expr.VerdictGoto, Chain: MasqChainName},
		}, "meta nfproto ipv4 goto masq-to-node"},
		{[]expr.Any{ // an inverted lookup
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: SetNonMasqV4, Invert: true}, &expr.Counter{},
			&expr.Verdict{Kind: expr.VerdictReturn},
		}, "meta nfproto ipv4 ip daddr != @nonmasq-v4 counter return"},
		{[]expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Register: 1, Data: []byte{unix.IPPROTO_TCP}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Register: 1, Data: []byte{0, 80}}, &expr.Counter{}, &expr.Masq{Random: true}},
			"meta l4proto tcp th dport 80 counter masquerade"},
	} {
		kr := kernelRule(&nftables.Rule{Exprs: tc.exprs, UserData: userdata.AppendString(nil, userdata.TypeComment, "x")})
		if kr.Rule != nil || kr.Text != tc.text+` comment "x"` {
			t.Errorf("got %+v %q, want a foreign rule %q", kr.Rule, kr.Text, tc.text)
		}
	}
}

func TestExplain(t *testing.T) {
	cfgOf := func(yaml string, f config.Flags) config.Config {
		c, _, err := config.Parse([]byte(yaml), f)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	v4 := Options{Chain: DefaultChain, RandomFully: true}
	v6 := Options{Chain: DefaultChain, RandomFully: true, EnableIPv6: true}
	ipv6 := config.Flags{EnableIPv6: true}
	for _, tc := range []struct {
		cfg    config.Config
		o      Options
		addr   string
		masq   bool
		reason string
	}{
		{config.Default(config.Flags{}), v4, "10.1.2.3", false, "nonMasqueradeCIDRs[0] 10.0.0.0/8 (the default list)"},
		{config.Default(config.Flags{}), v4, "203.0.113.1", true, "masqOutBound: true (no other rule matched)"},
		{config.Default(config.Flags{}), v4, "169.254.169.254", false, "link-local 169.254.0.0/16 (masqLinkLocal: false)"},
		{config.Default(config.Flags{}), v4, "2001:db8::1", false, "IPv6 is not handled without --enable-ipv6"},
		{config.Default(config.Flags{}), v4, "::ffff:10.0.0.1", false, "nonMasqueradeCIDRs[0] 10.0.0.0/8 (the default list)"},
		{cfgOf("nonMasqueradeCIDRs: [10.1.0.0/16, 192.168.0.0/16, 10.0.0.0/8]\n", config.Flags{}), v4, "10.1.2.3", false, "nonMasqueradeCIDRs[2] 10.0.0.0/8"},
		{cfgOf("nonMasqueradeCIDRs: [\"::ffff:10.0.0.0/104\"]\n", config.Flags{}), v4, "10.1.2.3", false, "nonMasqueradeCIDRs[0] 10.0.0.0/8"},
		{cfgOf("nonMasqueradeCIDRs: [169.254.169.0/24]\n", config.Flags{}), v4, "169.254.169.254", false, "link-local 169.254.0.0/16 (masqLinkLocal: false)"},
		{cfgOf("nonMasqueradeCIDRs: [169.254.169.0/24]\nmasqLinkLocal: true\n", config.Flags{}), v4, "169.254.169.254", false, "nonMasqueradeCIDRs[0] 169.254.169.0/24"},
		{cfgOf("masqLinkLocal: true\n", config.Flags{}), v4, "169.254.1.1", true, "masqOutBound: true (no other rule matched)"},
		{cfgOf("masqueradeCIDRs: [10.10.10.10/32, 10.0.0.0/8]\n", config.Flags{}), v4, "10.10.10.10", true, "masqueradeCIDRs[1] 10.0.0.0/8"},
		{cfgOf("masqueradeCIDRs: [10.10.10.10/32]\nmasqOutBound: false\n", config.Flags{}), v4, "10.10.10.10", true, "masqueradeCIDRs[0] 10.10.10.10/32"},
		{cfgOf("masqueradeCIDRs: [10.10.10.10/32]\nmasqOutBound: false\n", config.Flags{}), v4, "8.8.8.8", false, "masqOutBound: false (no other rule matched)"},
		{cfgOf("nonMasqueradeCIDRs: [\"fd00::/8\"]\n", ipv6), v6, "fd00::1", false, "nonMasqueradeCIDRs[0] fd00::/8"},
		{cfgOf("nonMasqueradeCIDRs: [\"fd00::/8\"]\n", ipv6), v6, "fe80::1", false, "link-local fe80::/10 (masqLinkLocalIPv6: false)"},
		{cfgOf("nonMasqueradeCIDRs: [\"fd00::/8\"]\n", ipv6), v6, "2001:db8::1", true, "masqOutBoundIPv6: true (no other rule matched)"},
		{cfgOf("masqOutBoundIPv6: false\n", ipv6), v6, "2001:db8::1", false, "masqOutBoundIPv6: false (no other rule matched)"},
		{cfgOf("masqueradeCIDRs: [\"::/0\"]\n", ipv6), v6, "fe80::1", true, "masqueradeCIDRs[0] ::/0"},
		{config.Default(config.Flags{NoMasqAllReservedRanges: true}), v4, "203.0.113.1", false, "nonMasqueradeCIDRs[9] 203.0.113.0/24 (the default list)"},
	} {
		e := Explain(tc.cfg, tc.o, netip.MustParseAddr(tc.addr))
		if e.Masquerade != tc.masq || e.Reason != tc.reason || e.Undetermined {
			t.Errorf("Explain(%s) = %v %q, want %v %q", tc.addr, e.Masquerade, e.Reason, tc.masq, tc.reason)
		}
	}
}

// Explain (on the ruleset, from the config) and ExplainTable (on the
// kernel's expressions) agree for every golden config on addresses at and
// around every CIDR's edges.
func TestExplainAgreesWithTable(t *testing.T) {
	n := 0
	for _, tc := range goldenCases {
		cfg, _, err := config.Parse([]byte(tc.yaml), tc.flags)
		if err != nil {
			t.Fatal(err)
		}
		ports, _ := ParsePorts(tc.ports)
		o := Options{Chain: DefaultChain, EnableIPv6: tc.flags.EnableIPv6, RandomFully: !tc.noRF, ToPorts: ports}
		rs := Build(cfg, o)
		tbl := kernelTable(t, rs)
		addrs := []netip.Addr{netip.MustParseAddr("0.0.0.0"), netip.MustParseAddr("255.255.255.255"),
			netip.MustParseAddr("8.8.8.8"), netip.MustParseAddr("::"), netip.MustParseAddr("2001:db8::1")}
		for _, s := range rs.Sets {
			for _, p := range s.Prefixes {
				first, last := p.Addr(), lastAddr(p)
				addrs = append(addrs, first, last, first.Prev(), last.Next())
			}
		}
		for _, a := range addrs {
			if !a.IsValid() {
				continue
			}
			want, got := Explain(cfg, o, a), ExplainTable(tbl, a, nil)
			if got.Undetermined || got.Masquerade != want.Masquerade {
				t.Errorf("%s: %s: config says %s (%s), table says %s (%s)", tc.name, a, want.Verdict(), want.Reason, got.Verdict(), got.Reason)
			}
			if want.Rule != "" && got.Rule != want.Rule {
				t.Errorf("%s: %s: deciding rule %q, want %q", tc.name, a, got.Rule, want.Rule)
			}
			n++
		}
	}
	t.Logf("%d addresses", n)
}

func TestExplainTable(t *testing.T) {
	cfg, _, _ := config.Parse([]byte("nonMasqueradeCIDRs: [10.0.0.0/8]\nmasqueradeCIDRs: [10.10.10.10/32]\n"), config.Flags{})
	rs := Build(cfg, Options{Chain: DefaultChain, RandomFully: true, ToPorts: []PortRange{{1024, 2047}, {4096, 8191}}})
	explain := func(tbl *Table, addr string, local bool) Explanation {
		return ExplainTable(tbl, netip.MustParseAddr(addr), func(netip.Addr) bool { return local })
	}
	tbl := kernelTable(t, rs)
	for _, tc := range []struct {
		addr    string
		local   bool
		verdict string
		reason  string
	}{
		{"10.1.1.1", false, "not masqueraded", "set nonmasq-v4 holds 10.0.0.0/8 (chain IP-MASQ-AGENT rule 2)"},
		{"10.10.10.10", false, "masquerade", "set masq-v4 holds 10.10.10.10/32 (chain IP-MASQ-AGENT rule 1)"},
		{"8.8.8.8", false, "masquerade", "chain IP-MASQ-AGENT rule 3"},
		{"8.8.8.8", true, "not masqueraded", "a local address of the node is never masqueraded (fib daddr type local)"},
		{"2001:db8::1", false, "not masqueraded", "no rule of chain IP-MASQ-AGENT matched (after chain postrouting rule 1)"},
	} {
		if e := explain(tbl, tc.addr, tc.local); e.Verdict() != tc.verdict || e.Reason != tc.reason {
			t.Errorf("%s (local %v): %s %q, want %s %q", tc.addr, tc.local, e.Verdict(), e.Reason, tc.verdict, tc.reason)
		}
	}

	// Tampered: an element added, a rule inserted first, a rule that
	// depends on more than the destination.
	tbl = kernelTable(t, rs)
	nonmasq := tbl.Set(SetNonMasqV4)
	nonmasq.Prefixes = append(nonmasq.Prefixes, netip.MustParsePrefix("203.0.113.0/24"))
	slices.SortFunc(nonmasq.Prefixes, comparePrefix)
	if e := explain(tbl, "203.0.113.7", false); e.Masquerade || e.Reason != "set nonmasq-v4 holds 203.0.113.0/24 (chain IP-MASQ-AGENT rule 2)" {
		t.Errorf("added element: %s %q", e.Verdict(), e.Reason)
	}
	c := tbl.Chain(DefaultChain)
	c.Rules = append([]KernelRule{kernelRule(&nftables.Rule{Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{255, 255, 0, 0}, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Register: 1, Data: []byte{10, 250, 0, 0}},
		&expr.Verdict{Kind: expr.VerdictGoto, Chain: MasqChainName},
	}})}, c.Rules...)
	if e := explain(tbl, "10.250.0.10", false); !e.Masquerade || e.Reason != "chain IP-MASQ-AGENT rule 1" ||
		e.Rule != "meta nfproto ipv4 ip daddr & 255.255.0.0 10.250.0.0 goto masq-to-node" {
		t.Errorf("inserted rule: %s %q %q", e.Verdict(), e.Reason, e.Rule)
	}
	if e := explain(tbl, "10.251.0.10", false); e.Masquerade {
		t.Errorf("inserted rule matched outside its prefix: %s %q", e.Verdict(), e.Reason)
	}
	c.Rules = append([]KernelRule{kernelRule(&nftables.Rule{Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Register: 1, Data: []byte{unix.IPPROTO_UDP}},
		&expr.Verdict{Kind: expr.VerdictReturn},
	}})}, c.Rules...)
	if e := explain(tbl, "8.8.8.8", false); !e.Undetermined || !strings.Contains(e.Reason, "rule 1 of chain IP-MASQ-AGENT matches on more than the destination") {
		t.Errorf("protocol-dependent rule: %s %q", e.Verdict(), e.Reason)
	}

	// No base chain.
	tbl.Chains = tbl.Chains[1:]
	if e := explain(tbl, "8.8.8.8", false); e.Masquerade || !strings.Contains(e.Reason, "no chain hooked") {
		t.Errorf("no base chain: %s %q", e.Verdict(), e.Reason)
	}
}

func TestElementPrefixes(t *testing.T) {
	el := func(s string, end bool) nftables.SetElement {
		return nftables.SetElement{Key: netip.MustParseAddr(s).AsSlice(), IntervalEnd: end}
	}
	for _, tc := range []struct {
		name  string
		elems []nftables.SetElement
		want  string
	}{
		{"empty", nil, ""},
		{"the kernel's reverse order", []nftables.SetElement{el("192.169.0.0", true), el("192.168.0.0", false), el("11.0.0.0", true), el("10.0.0.0", false)},
			"10.0.0.0/8 192.168.0.0/16"},
		{"adjacent intervals stay apart", []nftables.SetElement{el("10.0.0.0", false), el("11.0.0.0", true), el("11.0.0.0", false), el("12.0.0.0", true)},
			"10.0.0.0/8 11.0.0.0/8"},
		{"nft's leading end marker", []nftables.SetElement{el("0.0.0.0", true), el("10.0.0.1", false), el("10.0.0.2", true)}, "10.0.0.1/32"},
		{"top of the range has no end", []nftables.SetElement{el("240.0.0.0", false)}, "240.0.0.0/4"},
		{"everything", []nftables.SetElement{el("::", false)}, "::/0"},
		{"a range that is not a prefix", []nftables.SetElement{el("10.0.0.1", false), el("10.0.0.6", true)}, "10.0.0.1/32 10.0.0.2/31 10.0.0.4/31"},
		{"IPv6", []nftables.SetElement{el("fd00::", false), el("fe00::", true), el("fe80::", false), el("fec0::", true)}, "fd00::/8 fe80::/10"},
	} {
		ps, err := elementPrefixes(tc.elems, true)
		var got []string
		for _, p := range ps {
			got = append(got, p.String())
		}
		if err != nil || strings.Join(got, " ") != tc.want {
			t.Errorf("%s: %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	// Every golden set survives the round trip through intervals().
	for _, tc := range goldenCases {
		cfg, _, _ := config.Parse([]byte(tc.yaml), tc.flags)
		for _, s := range Build(cfg, Options{Chain: DefaultChain, EnableIPv6: tc.flags.EnableIPv6}).Sets {
			elems := intervals(s.Prefixes)
			slices.Reverse(elems)
			got, err := elementPrefixes(elems, true)
			if err != nil || !slices.Equal(got, s.Prefixes) {
				t.Errorf("%s %s: %v, %v; want %v", tc.name, s.Name, got, err, s.Prefixes)
			}
		}
	}
}

func TestRangePrefixes(t *testing.T) {
	for _, tc := range []struct{ first, last, want string }{
		{"10.0.0.0", "10.255.255.255", "10.0.0.0/8"},
		{"0.0.0.0", "255.255.255.255", "0.0.0.0/0"},
		{"10.0.0.255", "10.0.1.0", "10.0.0.255/32 10.0.1.0/32"},
		{"255.255.255.254", "255.255.255.255", "255.255.255.254/31"},
		{"::1", "::3", "::1/128 ::2/127"},
	} {
		var got []string
		for _, p := range rangePrefixes(netip.MustParseAddr(tc.first), netip.MustParseAddr(tc.last)) {
			got = append(got, p.String())
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("%s-%s: %q, want %q", tc.first, tc.last, got, tc.want)
		}
	}
}

func TestDiffTable(t *testing.T) {
	cfg := config.Default(config.Flags{})
	o := Options{Chain: DefaultChain, RandomFully: true}
	rs := Build(cfg, o)
	if d := DiffTable(rs, kernelTable(t, rs)); d != nil {
		t.Errorf("in sync: %q", d)
	}
	tbl := kernelTable(t, rs)
	s := tbl.Set(SetNonMasqV4)
	s.Prefixes = append(s.Prefixes[1:], netip.MustParsePrefix("203.0.113.0/24")) // 10/8 gone
	c := tbl.Chain(DefaultChain)
	c.Rules = c.Rules[:2]
	tbl.Sets = append(tbl.Sets, Set{Name: "extra", Family: 4})
	tbl.Chains = append(tbl.Chains, Chain{Name: "intruder"})
	tbl.Chains[0].Hook = "type filter hook postrouting priority 0; policy accept;"
	want := []string{
		"- nonmasq-v4 203.0.113.0/24",
		"+ nonmasq-v4 10.0.0.0/8",
		"- set extra",
		"~ chain postrouting: type filter hook postrouting priority 0; policy accept;, want type nat hook postrouting priority srcnat + 10; policy accept;",
		"~ chain IP-MASQ-AGENT rules differ",
		`    + meta nfproto ipv4 counter goto masq-to-node comment "ip-masq-agent: outbound traffic is subject to MASQUERADE (must be last in chain)"`,
		"- chain intruder",
	}
	if got := DiffTable(rs, tbl); !slices.Equal(got, want) {
		t.Errorf("DiffTable:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// Another chain name: the old chain goes, the new one comes.
	o.Chain = "MY-CHAIN"
	got := DiffTable(Build(cfg, o), kernelTable(t, rs))
	if !slices.Contains(got, "+ chain MY-CHAIN") || !slices.Contains(got, "- chain IP-MASQ-AGENT") ||
		!slices.Contains(got, "~ chain postrouting rules differ") {
		t.Errorf("renamed chain:\n%s", strings.Join(got, "\n"))
	}
}
