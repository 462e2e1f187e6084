package nft

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
)

// kernelTable turns a table into what Read would return for it: each
// rule encoded as Send encodes it and decoded as Read decodes it (the
// wire format between them is kernel's round trip test).
func kernelTable(t *testing.T, want Table) *Table {
	t.Helper()
	tbl := want.Clone()
	for i := range tbl.Chains {
		c := &tbl.Chains[i]
		if c.Hook != nil {
			h := *c.Hook
			c.Hook = &h
		}
		for j, r := range c.Rules {
			c.Rules[j] = decodeMessage(t, c.Name, r)
		}
	}
	return tbl
}

func decodeMessage(t *testing.T, chain string, r Rule) Rule {
	t.Helper()
	return FoundRule(r.expressions(), r.Comment)
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
		for _, label := range []*uint8{nil, ptrTo[uint8](0), ptrTo[uint8](20), ptrTo[uint8](127)} {
			want := Build(cfg, Options{Chain: DefaultChain, EnableIPv6: tc.flags.EnableIPv6, RandomFully: !tc.noRF, ToPorts: ports, CtLabel: label})
			tbl := kernelTable(t, want)
			for i, c := range want.Chains {
				for j, r := range c.Rules {
					kr := tbl.Chains[i].Rules[j]
					if kr.Foreign != "" || !kr.equal(r) || RenderRule(kr) != RenderRule(r) || kr.exprs == nil {
						t.Errorf("%s: %q read back as %+v, %q", tc.name, RenderRule(r), kr, RenderRule(kr))
					}
					n++
				}
			}
			if !want.Equal(*tbl) {
				t.Errorf("%s: the table read back differs from the wanted one:\n%s", tc.name, DiffPlan(tbl, want))
			}
			if got, want := tbl.MarkLabel(), want.MarkLabel(); got != want {
				t.Errorf("%s: read back, MarkLabel %d, want %d", tc.name, got, want)
			}
		}
	}
	t.Logf("%d rules", n)
}

func ptrTo[T any](v T) *T { return &v }

// A ct label statement is the agent's only as the agent encodes it: one
// bit, from register 1, with a set (not a load).
func TestDecodeLabelForeign(t *testing.T) {
	twoBits := LabelBits(20)
	twoBits[0] |= 1
	for name, exprs := range map[string][]expr.Any{
		"two bits":                  {&expr.Immediate{Register: 1, Data: twoBits}, &ctSetLabel},
		"no bit":                    {&expr.Immediate{Register: 1, Data: make([]byte, 16)}, &ctSetLabel},
		"register 2":                {&expr.Immediate{Register: 2, Data: LabelBits(20)}, &expr.Ct{Register: 2, SourceRegister: true, Key: expr.CtKeyLABELS}},
		"set from another register": {&expr.Immediate{Register: 1, Data: LabelBits(20)}, &expr.Ct{Register: 2, SourceRegister: true, Key: expr.CtKeyLABELS}},
		"a load":                    {&expr.Immediate{Register: 1, Data: LabelBits(20)}, &expr.Ct{Register: 1, Key: expr.CtKeyLABELS}},
		"the ct mark":               {&expr.Immediate{Register: 1, Data: LabelBits(20)}, &expr.Ct{Register: 1, SourceRegister: true, Key: expr.CtKeyMARK}},
	} {
		r := Rule{exprs: append(exprs, &expr.Counter{}, &expr.Masq{})}
		if got := decodeMessage(t, MasqChainName, r); got.Foreign == "" {
			t.Errorf("%s: read back as the agent's %q", name, RenderRule(got))
		}
	}
	// The agent's own reads back as its own.
	b := uint8(20)
	if got := decodeMessage(t, MasqChainName, Rule{CtLabel: &b, Verdict: Masquerade}); got.Foreign != "" || got.CtLabel == nil || *got.CtLabel != 20 {
		t.Errorf("the agent's label rule read back as %+v", got)
	}
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
		{[]expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Register: 1, Data: []byte{unix.IPPROTO_TCP}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Register: 1, Data: []byte{0, 80}}, &expr.Counter{}, &expr.Masq{Random: true}},
			"meta l4proto tcp th dport 80 counter masquerade"},
	} {
		kr := FoundRule(tc.exprs, "x")
		if kr.Foreign != tc.text+` comment "x"` || RenderRule(kr) != kr.Foreign {
			t.Errorf("got %+v %q, want a foreign rule %q", kr, RenderRule(kr), tc.text)
		}
		// A foreign rule never equals a rule of the agent's, even one
		// with the same fields otherwise.
		if kr.equal(Rule{Comment: "x"}) || kr.equal(Rule{Verdict: Goto, Target: MasqChainName, Comment: "x"}) {
			t.Errorf("foreign rule %q equals an agent's rule", kr.Foreign)
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
		e := Explain(tc.cfg, tc.o, Packet{Dst: netip.MustParseAddr(tc.addr)})
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
		tbl := kernelTable(t, Build(cfg, o))
		addrs := []netip.Addr{netip.MustParseAddr("0.0.0.0"), netip.MustParseAddr("255.255.255.255"),
			netip.MustParseAddr("8.8.8.8"), netip.MustParseAddr("::"), netip.MustParseAddr("2001:db8::1")}
		for _, s := range tbl.Sets {
			for _, r := range s.Elements {
				if s.Key.Family() == 0 {
					continue // interface names (egressInterfaces): every packet leaves through eth0
				}
				first, last := r.From(), r.To()
				addrs = append(addrs, first, last, first.Prev(), last.Next())
			}
		}
		for _, a := range addrs {
			if !a.IsValid() {
				continue
			}
			for _, src := range []netip.Addr{pod(a), podIn(a)} {
				want, got := Explain(cfg, o, Packet{Src: src, Dst: a, OutIf: "eth0"}), ExplainTable(tbl, Packet{Src: src, Dst: a, OutIf: "eth0"}, nil)
				if got.Undetermined || got.Masquerade != want.Masquerade {
					t.Errorf("%s: %s from %s: config says %s (%s), table says %s (%s)", tc.name, a, src, want.Verdict(), want.Reason, got.Verdict(), got.Reason)
				}
				if want.Rule != "" && got.Rule != want.Rule {
					t.Errorf("%s: %s from %s: deciding rule %q, want %q", tc.name, a, src, got.Rule, want.Rule)
				}
				n++
			}
		}
	}
	t.Logf("%d addresses", n)
}

func TestExplainTable(t *testing.T) {
	cfg, _, _ := config.Parse([]byte("nonMasqueradeCIDRs: [10.0.0.0/8]\nmasqueradeCIDRs: [10.10.10.10/32]\n"), config.Flags{})
	want := Build(cfg, Options{Chain: DefaultChain, RandomFully: true, ToPorts: []PortRange{{1024, 2047}, {4096, 8191}}})
	explain := func(tbl *Table, addr string, local bool) Explanation {
		return ExplainTable(tbl, Packet{Dst: netip.MustParseAddr(addr)}, func(netip.Addr) bool { return local })
	}
	tbl := kernelTable(t, want)
	for _, tc := range []struct {
		addr    string
		local   bool
		verdict string
		reason  string
	}{
		{"10.1.1.1", false, "not masqueraded", "set nonmasq-v4 holds 10.0.0.0/8 (chain IP-MASQ-AGENT rule 2)"},
		{"10.10.10.10", false, "masquerade", "set masq-v4 holds 10.10.10.10 (chain IP-MASQ-AGENT rule 1)"},
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
	tbl = kernelTable(t, want)
	nonmasq := tbl.Set(SetNonMasqV4)
	nonmasq.Elements = append(nonmasq.Elements, RangeOfPrefix(netip.MustParsePrefix("203.0.113.0/24")),
		RangeFrom(netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("198.51.100.9")))
	slices.SortFunc(nonmasq.Elements, compareRange)
	if e := explain(tbl, "203.0.113.7", false); e.Masquerade || e.Reason != "set nonmasq-v4 holds 203.0.113.0/24 (chain IP-MASQ-AGENT rule 2)" {
		t.Errorf("added element: %s %q", e.Verdict(), e.Reason)
	}
	if e := explain(tbl, "198.51.100.8", false); e.Masquerade || e.Reason != "set nonmasq-v4 holds 198.51.100.7-198.51.100.9 (chain IP-MASQ-AGENT rule 2)" {
		t.Errorf("added range: %s %q", e.Verdict(), e.Reason)
	}
	c := tbl.Chain(DefaultChain)
	c.Rules = append([]Rule{FoundRule([]expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{255, 255, 0, 0}, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Register: 1, Data: []byte{10, 250, 0, 0}},
		&expr.Verdict{Kind: expr.VerdictGoto, Chain: MasqChainName},
	}, "")}, c.Rules...)
	if e := explain(tbl, "10.250.0.10", false); !e.Masquerade || e.Reason != "chain IP-MASQ-AGENT rule 1" ||
		e.Rule != "meta nfproto ipv4 ip daddr 10.250.0.0/16 goto masq-to-node" {
		t.Errorf("inserted rule: %s %q %q", e.Verdict(), e.Reason, e.Rule)
	}
	if e := explain(tbl, "10.251.0.10", false); e.Masquerade {
		t.Errorf("inserted rule matched outside its prefix: %s %q", e.Verdict(), e.Reason)
	}
	c.Rules = append([]Rule{FoundRule([]expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Register: 1, Data: []byte{unix.IPPROTO_UDP}},
		&expr.Verdict{Kind: expr.VerdictReturn},
	}, "")}, c.Rules...)
	if e := explain(tbl, "8.8.8.8", false); !e.Undetermined || !strings.Contains(e.Reason, "rule 1 of chain IP-MASQ-AGENT matches on more than the destination") {
		t.Errorf("protocol-dependent rule: %s %q", e.Verdict(), e.Reason)
	}

	// No base chain.
	tbl.Chains = tbl.Chains[1:]
	if e := explain(tbl, "8.8.8.8", false); e.Masquerade || !strings.Contains(e.Reason, "no chain hooked") {
		t.Errorf("no base chain: %s %q", e.Verdict(), e.Reason)
	}
}

func TestRangesFromBounds(t *testing.T) {
	b := func(s string, end bool) Bound { return Bound{Addr: netip.MustParseAddr(s), End: end} }
	for _, tc := range []struct {
		name   string
		bounds []Bound
		want   string
	}{
		{"empty", nil, ""},
		{"the kernel's reverse order", []Bound{b("192.169.0.0", true), b("192.168.0.0", false), b("11.0.0.0", true), b("10.0.0.0", false)},
			"10.0.0.0/8 192.168.0.0/16"},
		{"adjacent intervals stay apart", []Bound{b("10.0.0.0", false), b("11.0.0.0", true), b("11.0.0.0", false), b("12.0.0.0", true)},
			"10.0.0.0/8 11.0.0.0/8"},
		{"adjacent, the start listed first", []Bound{b("11.0.0.0", false), b("11.0.0.0", true), b("12.0.0.0", true), b("10.0.0.0", false)},
			"10.0.0.0/8 11.0.0.0/8"},
		{"nft's leading end marker", []Bound{b("0.0.0.0", true), b("10.0.0.1", false), b("10.0.0.2", true)}, "10.0.0.1"},
		{"top of the range has no end", []Bound{b("240.0.0.0", false)}, "240.0.0.0/4"},
		{"everything", []Bound{b("::", false)}, "::/0"},
		// The kernel's lookup matches from a start to the next element.
		{"a start without an end before the next start", []Bound{b("10.0.0.1", false), b("10.0.0.5", false), b("10.0.0.6", true)},
			"10.0.0.1-10.0.0.4 10.0.0.5"},
		{"the issue's repro: a lone start covers up to the next start", []Bound{b("10.0.0.0", false), b("11.0.0.0", true),
			b("20.0.0.1", false), b("192.168.0.0", false), b("192.169.0.0", true)}, "10.0.0.0/8 20.0.0.1-192.167.255.255 192.168.0.0/16"},
		{"a lone start before an adjacent end and start", []Bound{b("10.0.0.1", false), b("10.0.0.5", true), b("10.0.0.5", false),
			b("10.0.0.3", false)}, "10.0.0.1-10.0.0.2 10.0.0.3-10.0.0.4 10.0.0.5-255.255.255.255"},
		{"an end without a start matches nothing", []Bound{b("10.0.0.1", false), b("10.0.0.2", true), b("10.0.0.9", true)}, "10.0.0.1"},
		{"a range that is not a prefix stays a range", []Bound{b("10.0.0.1", false), b("10.0.0.6", true)}, "10.0.0.1-10.0.0.5"},
		{"IPv6", []Bound{b("fd00::", false), b("fe00::", true), b("fe80::", false), b("fec0::", true)}, "fd00::/8 fe80::/10"},
	} {
		rs, odd := RangesFromBounds(tc.bounds)
		var got []string
		for _, r := range rs {
			got = append(got, rangeString(r))
		}
		// Odd: any shape the agent never writes, so that the set is replaced.
		wantOdd := strings.Contains(tc.name, "lone start") || strings.Contains(tc.name, "without a")
		if strings.Join(got, " ") != tc.want || (len(odd) > 0) != wantOdd {
			t.Errorf("%s: %q, odd %q; want %q", tc.name, got, odd, tc.want)
		}
	}
	// Every golden set, and ranges that are not prefixes, survive the
	// round trip through Bounds.
	toBounds := func(rs []Range) []Bound {
		bs := Bounds(rs)
		slices.Reverse(bs) // the kernel lists them backwards
		return bs
	}
	check := func(name string, want []Range) {
		got, odd := RangesFromBounds(toBounds(want))
		if len(odd) > 0 || !slices.Equal(got, want) {
			t.Errorf("%s: %v, %v; want %v", name, got, odd, want)
		}
	}
	for _, tc := range goldenCases {
		cfg, _, _ := config.Parse([]byte(tc.yaml), tc.flags)
		for _, s := range Build(cfg, Options{Chain: DefaultChain, EnableIPv6: tc.flags.EnableIPv6}).Sets {
			check(tc.name+" "+s.Name, s.Elements)
		}
	}
	r := func(from, to string) Range {
		return RangeFrom(netip.MustParseAddr(from), netip.MustParseAddr(to))
	}
	check("ranges", []Range{r("10.0.0.1", "10.0.0.5"), r("10.0.0.6", "10.0.0.6"), r("10.0.0.7", "10.0.1.0"),
		r("255.255.255.0", "255.255.255.255")})
	check("IPv6 ranges", []Range{r("::1", "::3"), r("fe80::1", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")})
}

func TestRangeString(t *testing.T) {
	for _, tc := range []struct{ first, last, want string }{
		{"10.0.0.0", "10.255.255.255", "10.0.0.0/8"},
		{"0.0.0.0", "255.255.255.255", "0.0.0.0/0"},
		{"10.0.0.7", "10.0.0.7", "10.0.0.7"},
		{"10.0.0.255", "10.0.1.0", "10.0.0.255-10.0.1.0"},
		{"255.255.255.254", "255.255.255.255", "255.255.255.254/31"},
		{"::1", "::3", "::1-::3"},
	} {
		if got := rangeString(RangeFrom(netip.MustParseAddr(tc.first), netip.MustParseAddr(tc.last))); got != tc.want {
			t.Errorf("%s-%s: %q, want %q", tc.first, tc.last, got, tc.want)
		}
	}
}

func TestDiffPlan(t *testing.T) {
	cfg := config.Default(config.Flags{})
	o := Options{Chain: DefaultChain, RandomFully: true}
	want := Build(cfg, o)
	if p := DiffPlan(kernelTable(t, want), want); !p.Empty() {
		t.Errorf("in sync:\n%s", p)
	}
	// Ownership aside: an owned, persistent table is in sync too.
	owned := kernelTable(t, want)
	owned.Owner, owned.Persist = OwnedByUs, true
	if p := DiffPlan(owned, want); !p.Empty() {
		t.Errorf("owned, in sync:\n%s", p)
	}
	tbl := kernelTable(t, want)
	s := tbl.Set(SetNonMasqV4)
	s.Elements = append(s.Elements[1:], RangeOfPrefix(netip.MustParsePrefix("203.0.113.0/24"))) // 10/8 gone
	c := tbl.Chain(DefaultChain)
	c.Rules = c.Rules[:2]
	tbl.Sets = append(tbl.Sets, Set{Name: "extra", Key: KeyIPv4})
	tbl.Chains = append(tbl.Chains, Chain{Name: "intruder"})
	tbl.Chains[0].Hook = &Hook{Type: "filter", Hook: "postrouting", Priority: 0, Policy: "accept"}
	wantOps := []string{
		"flush chain inet ip-masq-agent postrouting",
		"flush chain inet ip-masq-agent IP-MASQ-AGENT",
		"flush chain inet ip-masq-agent intruder",
		"delete chain inet ip-masq-agent postrouting",
		"delete chain inet ip-masq-agent intruder",
		"delete set inet ip-masq-agent extra",
		"delete element inet ip-masq-agent nonmasq-v4 { 203.0.113.0/24 }",
		"add element inet ip-masq-agent nonmasq-v4 { 10.0.0.0/8 }",
		"add chain inet ip-masq-agent postrouting { type nat hook postrouting priority srcnat + 10; policy accept; }",
		`add rule inet ip-masq-agent postrouting fib daddr type != local counter jump IP-MASQ-AGENT comment "` + commentGuard + `"`,
		`add rule inet ip-masq-agent IP-MASQ-AGENT ip daddr @masq-v4 counter goto masq-to-node comment "` + commentMasqSet + `"`,
		`add rule inet ip-masq-agent IP-MASQ-AGENT ip daddr @nonmasq-v4 counter return comment "` + commentNonMasq + `"`,
		`add rule inet ip-masq-agent IP-MASQ-AGENT meta nfproto ipv4 counter goto masq-to-node comment "` + commentOutbound + `"`,
	}
	p := DiffPlan(tbl, want)
	if got := strings.Split(strings.TrimSuffix(p.String(), "\n"), "\n"); !slices.Equal(got, wantOps) {
		t.Errorf("DiffPlan:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(wantOps, "\n"))
	}
	if res, err := ExecPlan(tbl, p); err != nil || !want.Equal(*res) {
		t.Errorf("the plan does not make the wanted table: %v", err)
	}
	// Another chain name: the old chain goes, the new one comes, and the
	// base chain's jump is rewritten.
	o.Chain = "MY-CHAIN"
	renamed := Build(cfg, o)
	p = DiffPlan(kernelTable(t, want), renamed)
	for _, op := range []string{
		"flush chain inet ip-masq-agent postrouting",
		"flush chain inet ip-masq-agent IP-MASQ-AGENT",
		"delete chain inet ip-masq-agent IP-MASQ-AGENT",
		"add chain inet ip-masq-agent MY-CHAIN",
	} {
		if !strings.Contains(p.String(), op+"\n") {
			t.Errorf("renamed chain: no %q in\n%s", op, p)
		}
	}
	if res, err := ExecPlan(kernelTable(t, want), p); err != nil || !renamed.Equal(*res) {
		t.Errorf("renamed chain: the plan does not make the wanted table: %v", err)
	}
}

// Decide agrees with Explain on every golden config at and around every
// range's edges.
func TestDecideAgreesWithExplain(t *testing.T) {
	for _, tc := range goldenCases {
		cfg, _, err := config.Parse([]byte(tc.yaml), tc.flags)
		if err != nil {
			t.Fatal(err)
		}
		o := Options{Chain: DefaultChain, EnableIPv6: tc.flags.EnableIPv6, RandomFully: true}
		tab := Build(cfg, o)
		decider := tab.Decider()
		addrs := []netip.Addr{netip.MustParseAddr("8.8.8.8"), netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("::ffff:10.1.2.3")}
		for _, s := range tab.Sets {
			for _, r := range s.Elements {
				if s.Key.Family() == 0 {
					continue // interface names (egressInterfaces): every packet leaves through eth0
				}
				addrs = append(addrs, r.From(), r.To(), r.From().Prev(), r.To().Next())
			}
		}
		for _, a := range addrs {
			if !a.IsValid() {
				continue
			}
			masq, handled := tab.Decide(Packet{Src: pod(a), Dst: a, OutIf: "eth0"})
			if m, h := decider(Packet{Src: pod(a), Dst: a, OutIf: "eth0"}); m != masq || h != handled {
				t.Errorf("%s: %s: Decider %v (handled %v), Decide %v (handled %v)", tc.name, a, m, h, masq, handled)
			}
			e := Explain(cfg, o, Packet{Src: pod(a), Dst: a, OutIf: "eth0"})
			if masq != e.Masquerade || handled != (a.Unmap().Is4() || o.EnableIPv6) {
				t.Errorf("%s: %s: Decide %v (handled %v), Explain %s (%s)", tc.name, a, masq, handled, e.Verdict(), e.Reason)
			}
		}
	}
}

// Decide evaluates a table found in the kernel as the kernel does: the
// base chain's hook and policy, the jump, a dormant table, foreign rules
// in the agent's chains (the conntrack cleanup compares against it).
func TestDecideFoundTable(t *testing.T) {
	want := Build(config.Default(config.Flags{}), Options{Chain: DefaultChain, RandomFully: true})
	ext, other := netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("198.51.100.10")
	foreign := func(text string, exprs ...expr.Any) Rule { return Rule{Foreign: text, exprs: exprs} }
	// ip daddr 203.0.113.0/24 return, as nft encodes it: 3 bytes loaded
	ipDaddr24Return := foreign("ip daddr 203.0.113.0/24 return",
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 3},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{203, 0, 113}}, &expr.Verdict{Kind: expr.VerdictReturn})
	hook := func(t *Table) *Hook { // a copy of the base chain's hook, to change
		c := t.Chain(BaseChainName)
		h := *c.Hook
		c.Hook = &h
		return &h
	}
	markReturn := foreign("meta mark 0x1 return", &expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{1, 0, 0, 0}}, &expr.Verdict{Kind: expr.VerdictReturn})
	for _, tc := range []struct {
		name          string
		change        func(*Table)
		addr          netip.Addr
		masq, handled bool
	}{
		{"as built", func(*Table) {}, ext, true, true},
		{"no table", func(t *Table) { *t = Table{} }, ext, false, false},
		{"dormant", func(t *Table) { t.Dormant = true }, ext, false, true},
		{"jump deleted", func(t *Table) { t.Chain(BaseChainName).Rules = nil }, ext, false, true},
		{"hooked at filter", func(t *Table) { hook(t).Type = "filter" }, ext, false, true},
		{"hooked at prerouting", func(t *Table) { hook(t).Hook = "prerouting" }, ext, false, true},
		{"jump deleted, policy drop", func(t *Table) { hook(t).Policy, t.Chain(BaseChainName).Rules = "drop", nil }, ext, false, true},
		{"masquerade chain emptied", func(t *Table) { t.Chain(MasqChainName).Rules = nil }, ext, false, true},
		{"foreign return at the top", func(t *Table) {
			c := t.Chain(DefaultChain)
			c.Rules = append([]Rule{ipDaddr24Return}, c.Rules...)
		}, ext, false, true},
		{"foreign return at the top, other destination", func(t *Table) {
			c := t.Chain(DefaultChain)
			c.Rules = append([]Rule{ipDaddr24Return}, c.Rules...)
		}, other, true, true},
		{"foreign rule on the packet mark: undetermined", func(t *Table) {
			c := t.Chain(DefaultChain)
			c.Rules = append([]Rule{markReturn}, c.Rules...)
		}, ext, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			found := want.Clone()
			tc.change(found)
			if masq, handled := found.Decider()(Packet{Dst: tc.addr}); masq != tc.masq || handled != tc.handled {
				t.Errorf("Decider(%s) = %v (handled %v), want %v (handled %v)", tc.addr, masq, handled, tc.masq, tc.handled)
			}
			if masq, handled := found.Decide(Packet{Dst: tc.addr}); masq != tc.masq || handled != tc.handled {
				t.Errorf("Decide(%s) = %v (handled %v), want %v (handled %v)", tc.addr, masq, handled, tc.masq, tc.handled)
			}
		})
	}
}

// MarkLabel names the bit only when every masquerade rule sets it.
func TestMarkLabel(t *testing.T) {
	bit := uint8(20)
	cfg := config.Default(config.Flags{})
	if got := Build(cfg, Options{Chain: DefaultChain, CtLabel: &bit, ToPorts: []PortRange{{1024, 65535}}}); got.MarkLabel() != 20 {
		t.Errorf("marked table: MarkLabel %d", got.MarkLabel())
	}
	if got := Build(cfg, Options{Chain: DefaultChain}); got.MarkLabel() != -1 {
		t.Errorf("unmarked table: MarkLabel %d", got.MarkLabel())
	}
	partly := Build(cfg, Options{Chain: DefaultChain, CtLabel: &bit, ToPorts: []PortRange{{1024, 65535}}})
	partly.Chain(MasqChainName).Rules[0].CtLabel = nil
	if partly.MarkLabel() != -1 {
		t.Errorf("a masquerade rule without the mark: MarkLabel %d", partly.MarkLabel())
	}
	if (&Table{}).MarkLabel() != -1 {
		t.Error("no table: marked")
	}
}
