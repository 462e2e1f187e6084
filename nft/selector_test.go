package nft

import (
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables/expr"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
)

// Every selector's lookup is encoded, decoded back to the same rule, and
// written as nft writes it.
func TestSelectorCodec(t *testing.T) {
	for _, tc := range []struct {
		r    Rule
		text string
	}{
		{Rule{Family: 4, Selector: SelDaddr, Set: "s", Verdict: Return}, "ip daddr @s counter return"},
		{Rule{Family: 6, Selector: SelDaddr, Set: "s", Verdict: Return}, "ip6 daddr @s counter return"},
		{Rule{Family: 4, Selector: SelSaddr, Set: "s", Verdict: Return}, "ip saddr @s counter return"},
		{Rule{Family: 6, Selector: SelSaddr, Set: "s", Verdict: Goto, Target: MasqChainName}, "ip6 saddr @s counter goto masq-to-node"},
		{Rule{Selector: SelOif, Set: "s", Verdict: Return}, "oifname @s counter return"},
		{Rule{Family: 4, Selector: SelOif, Set: "s", Verdict: Return}, "meta nfproto ipv4 oifname @s counter return"},
	} {
		if got := RenderRule(tc.r); got != tc.text {
			t.Errorf("RenderRule = %q, want %q", got, tc.text)
		}
		back, ok := decodeRule(tc.r.Encode(), tc.r.Comment)
		if !ok || !back.equal(tc.r) {
			t.Errorf("%s: decoded back as %+v (ok %v)", tc.text, back, ok)
		}
	}
	// A load of the source in a rule of family 6 is no IPv4 lookup.
	r := Rule{Family: 4, Selector: SelSaddr, Set: "s", Verdict: Return}
	exprs := r.Encode()
	exprs[1] = &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{NFProto(6)}}
	if back, ok := decodeRule(exprs, ""); ok {
		t.Errorf("an IPv4 load in an IPv6 rule decoded as %s", RenderRule(back))
	}
}

// srcTable is the default table with a rule before the decisions that
// returns traffic from 10.244.1.0/24, as nonMasqueradeSourceCIDRs would.
func srcTable() Table {
	t := Build(config.Default(config.Flags{}), Options{Chain: DefaultChain})
	t.Sets = append(t.Sets, Set{Name: "src-v4", Key: KeyIPv4,
		Elements: []Range{RangeOfPrefix(netip.MustParsePrefix("10.244.1.0/24"))}})
	c := t.DecisionChain()
	c.Rules = append([]Rule{{Family: 4, Selector: SelSaddr, Set: "src-v4", Verdict: Return}}, c.Rules...)
	return t
}

// The evaluator loads the bytes each selector's expression asks for: the
// source for a source lookup (unknown without one), the out interface for
// oifname; and Decider remembers an answer by destination only when the
// evaluation read nothing else.
func TestEvaluatorReadsSelectors(t *testing.T) {
	tbl := srcTable()
	ext := netip.MustParseAddr("203.0.113.10")
	in, out := netip.MustParseAddr("10.244.1.5"), netip.MustParseAddr("10.244.2.5")
	d := newDecider(tbl)
	for _, tc := range []struct {
		p              Packet
		masq, handled  bool
		undeterminable bool
	}{
		{Packet{Src: in, Dst: ext}, false, true, false},
		{Packet{Src: out, Dst: ext}, true, true, false},
		{Packet{Src: in, Dst: ext}, false, true, false}, // remembered by packet, not by destination
		{Packet{Dst: ext}, false, false, true},          // the source is unknown: undetermined
		{Packet{Src: netip.MustParseAddr("2001:db8::1"), Dst: ext}, false, false, true},
	} {
		masq, handled := tbl.Decide(tc.p)
		if masq != tc.masq || handled != tc.handled {
			t.Errorf("Decide(%+v) = %v %v, want %v %v", tc.p, masq, handled, tc.masq, tc.handled)
		}
		if m, h := d.decide(tc.p); m != masq || h != handled {
			t.Errorf("Decider(%+v) = %v %v, Decide %v %v", tc.p, m, h, masq, handled)
		}
		e := ExplainTable(&tbl, tc.p, nil)
		if e.Undetermined != tc.undeterminable || (!e.Undetermined && e.Masquerade != tc.masq) {
			t.Errorf("ExplainTable(%+v) = %s (%s)", tc.p, e.Verdict(), e.Reason)
		}
	}
	if len(d.byDst) != 0 {
		t.Errorf("answers that read the source were remembered by destination: %v", d.byDst)
	}

	// A table that reads only destinations is remembered by destination,
	// and its memory is bounded.
	d = newDecider(Build(config.Default(config.Flags{}), Options{Chain: DefaultChain}))
	for i := range deciderMemo + 10 {
		src := netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)})
		dst := netip.AddrFrom4([4]byte{203, byte(i >> 16), byte(i >> 8), byte(i)})
		d.decide(Packet{Src: src, Dst: ext})
		d.decide(Packet{Src: src, Dst: dst})
	}
	if len(d.byPacket) != 0 || len(d.byDst) > deciderMemo || len(d.byDst) == 0 {
		t.Errorf("destination-only table: %d answers by packet, %d by destination (at most %d)", len(d.byPacket), len(d.byDst), deciderMemo)
	}

	oif := []expr.Any{&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte("eth0\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00")}}
	for outIf, want := range map[string]Match{"eth0": MatchYes, "eth1": MatchNo, "": MatchUnknown} {
		if got := MatchExprs(oif, Packet{Dst: ext, OutIf: outIf}, false); got != want {
			t.Errorf("oifname eth0 on a packet out of %q: %d, want %d", outIf, got, want)
		}
	}
	saddr := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{10, 244}}}
	for src, want := range map[string]Match{"10.244.9.9": MatchYes, "10.245.0.1": MatchNo} {
		if got := MatchExprs(saddr, Packet{Src: netip.MustParseAddr(src), Dst: ext}, false); got != want {
			t.Errorf("ip saddr 10.244.0.0/16 (iptables-nft's load) on %s: %d, want %d", src, got, want)
		}
	}
}

// Each decision looks up its selector's sets with the key type of their
// family, and its rule's selector is the decision's.
func TestDecisionsKeys(t *testing.T) {
	tbl := Build(config.Default(config.Flags{EnableIPv6: true}), Options{Chain: DefaultChain, EnableIPv6: true})
	for _, d := range decisions {
		for i, f := range []Family{4, 6} {
			s := tbl.Set(d.sets[i])
			if s == nil {
				continue
			}
			if s.Key != d.sel.Key(f) || s.Key.Family() != f {
				t.Errorf("set %s: key %s, want %s", s.Name, s.Key, d.sel.Key(f))
			}
		}
	}
	got := map[string]Selector{}
	for _, r := range tbl.DecisionChain().Rules {
		if r.Set != "" {
			got[r.Set] = r.Selector
		}
	}
	want := map[string]Selector{SetMasqV4: SelDaddr, SetNonMasqV4: SelDaddr, SetMasqV6: SelDaddr, SetNonMasqV6: SelDaddr}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("rules' selectors %v, want %v", got, want)
	}
}

// nonMasqueradeSourceCIDRs: traffic from those sources is never
// masqueraded, whatever its destination, and explain names the entry; a
// packet without a source is undetermined, and says why.
func TestExplainSource(t *testing.T) {
	cfg, _, err := config.Parse([]byte("nonMasqueradeSourceCIDRs: [10.244.1.0/24, \"fd00:1::/64\"]\nmasqueradeCIDRs: [203.0.113.0/24]\n"),
		config.Flags{EnableIPv6: true})
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Chain: DefaultChain, EnableIPv6: true}
	tbl := Build(cfg, o)
	p := func(src, dst string) Packet {
		var s netip.Addr
		if src != "" {
			s = netip.MustParseAddr(src)
		}
		return Packet{Src: s, Dst: netip.MustParseAddr(dst)}
	}
	for _, tc := range []struct {
		p               Packet
		verdict, reason string
	}{
		{p("10.244.1.7", "203.0.113.10"), "not masqueraded", "nonMasqueradeSourceCIDRs[0] 10.244.1.0/24"},
		{p("10.244.1.7", "8.8.8.8"), "not masqueraded", "nonMasqueradeSourceCIDRs[0] 10.244.1.0/24"},
		{p("fd00:1::7", "2001:db8::1"), "not masqueraded", "nonMasqueradeSourceCIDRs[1] fd00:1::/64"},
		{p("10.244.2.7", "203.0.113.10"), "masquerade", "masqueradeCIDRs[0] 203.0.113.0/24"},
		{p("10.244.2.7", "10.1.2.3"), "not masqueraded", "nonMasqueradeCIDRs[0] 10.0.0.0/8 (the default list)"},
		{p("fd00:2::7", "2001:db8::1"), "masquerade", "masqOutBoundIPv6: true (no other rule matched)"},
		{p("", "8.8.8.8"), "undetermined", "depends on the source (nonMasqueradeSourceCIDRs), which is not given"},
	} {
		e := Explain(cfg, o, tc.p)
		if e.Verdict() != tc.verdict || e.Reason != tc.reason {
			t.Errorf("Explain(%+v) = %s (%s), want %s (%s)", tc.p, e.Verdict(), e.Reason, tc.verdict, tc.reason)
		}
		got := ExplainTable(&tbl, tc.p, nil)
		if got.Verdict() != tc.verdict {
			t.Errorf("ExplainTable(%+v) = %s (%s), want %s", tc.p, got.Verdict(), got.Reason, tc.verdict)
		}
		if masq, handled := tbl.Decide(tc.p); masq != (tc.verdict == "masquerade") || handled != (tc.verdict != "undetermined") {
			t.Errorf("Decide(%+v) = %v %v", tc.p, masq, handled)
		}
	}
	// The source rule's counter is labelled by its own reason.
	for _, rc := range DecisionCounters(tbl.DecisionChain().Rules[:1]) {
		if rc.Decision != "nonmasquerade" || rc.Reason != "sources" {
			t.Errorf("the source rule's counter: %+v", rc)
		}
	}
}

// masqueradeSourceCIDRs: only traffic from those sources may be
// masqueraded; a source outside it, of either family, is never (an empty
// set of a family returns all of it), and explain names the key; one
// inverted lookup per family, no rule per source.
func TestExplainSourceGuard(t *testing.T) {
	cfg, _, err := config.Parse([]byte("masqueradeSourceCIDRs: [10.244.0.0/16, 10.245.0.0/16]\nnonMasqueradeSourceCIDRs: [10.244.1.0/24]\n"),
		config.Flags{EnableIPv6: true})
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Chain: DefaultChain, EnableIPv6: true}
	tbl := Build(cfg, o)
	var guards []string
	for _, r := range tbl.DecisionChain().Rules {
		if r.Invert {
			guards = append(guards, RenderRule(r))
		}
	}
	if want := []string{
		`ip saddr != @masq-src-v4 counter return comment "` + commentMasqSrc + `"`,
		`ip6 saddr != @masq-src-v6 counter return comment "` + commentMasqSrc + `"`,
	}; !slices.Equal(guards, want) {
		t.Errorf("guard rules %q, want %q", guards, want)
	}
	p := func(src, dst string) Packet {
		var s netip.Addr
		if src != "" {
			s = netip.MustParseAddr(src)
		}
		return Packet{Src: s, Dst: netip.MustParseAddr(dst)}
	}
	for _, tc := range []struct {
		p               Packet
		verdict, reason string
	}{
		{p("10.244.2.7", "203.0.113.10"), "masquerade", "masqOutBound: true (no other rule matched)"},
		{p("10.245.2.7", "203.0.113.10"), "masquerade", "masqOutBound: true (no other rule matched)"},
		{p("198.51.100.7", "203.0.113.10"), "not masqueraded", "masqueradeSourceCIDRs: 198.51.100.7 is in none of its 2 entries"},
		{p("10.244.1.7", "203.0.113.10"), "not masqueraded", "nonMasqueradeSourceCIDRs[0] 10.244.1.0/24"},
		{p("10.244.2.7", "10.1.2.3"), "not masqueraded", "nonMasqueradeCIDRs[0] 10.0.0.0/8 (the default list)"},
		{p("fd00:2::7", "2001:db8::1"), "not masqueraded", "masqueradeSourceCIDRs: fd00:2::7 is in none of its 2 entries"},
		{p("", "203.0.113.10"), "undetermined", "depends on the source (nonMasqueradeSourceCIDRs), which is not given"},
	} {
		e := Explain(cfg, o, tc.p)
		if e.Verdict() != tc.verdict || e.Reason != tc.reason {
			t.Errorf("Explain(%+v) = %s (%s), want %s (%s)", tc.p, e.Verdict(), e.Reason, tc.verdict, tc.reason)
		}
		got := ExplainTable(&tbl, tc.p, nil)
		if got.Verdict() != tc.verdict {
			t.Errorf("ExplainTable(%+v) = %s (%s), want %s", tc.p, got.Verdict(), got.Reason, tc.verdict)
		}
		if masq, handled := tbl.Decide(tc.p); masq != (tc.verdict == "masquerade") || handled != (tc.verdict != "undetermined") {
			t.Errorf("Decide(%+v) = %v %v", tc.p, masq, handled)
		}
	}
	// The guard's rule reads back as itself and counts as a source reason.
	for _, r := range tbl.DecisionChain().Rules {
		if !r.Invert {
			continue
		}
		back, ok := decodeRule(r.Encode(), r.Comment)
		if !ok || !back.equal(r) {
			t.Errorf("%s decodes as %+v (%v)", RenderRule(r), back, ok)
		}
		for _, rc := range DecisionCounters([]Rule{r}) {
			if rc.Decision != "nonmasquerade" || rc.Reason != "sources" {
				t.Errorf("the guard's counter: %+v", rc)
			}
		}
	}
}

// A family the guard has no entry of is never masqueraded, and the config
// says so (validate, and the agent's WARN at start and change).
func TestSourceGuardFamilyWarning(t *testing.T) {
	for _, tc := range []struct {
		yaml  string
		flags config.Flags
		warn  string // "" for none about a family
	}{
		{"masqueradeSourceCIDRs: [10.244.0.0/16]\n", config.Flags{}, ""},
		{"masqueradeSourceCIDRs: [10.244.0.0/16]\n", config.Flags{EnableIPv6: true}, "has no IPv6 CIDR: no IPv6 traffic will be masqueraded"},
		{"masqueradeSourceCIDRs: [\"fd00::/8\"]\n", config.Flags{EnableIPv6: true}, "has no IPv4 CIDR: no IPv4 traffic will be masqueraded"},
		{"masqueradeSourceCIDRs: [10.244.0.0/16, \"fd00::/8\"]\n", config.Flags{EnableIPv6: true}, ""},
	} {
		_, warns, err := config.Parse([]byte(tc.yaml), tc.flags)
		if err != nil {
			t.Fatal(err)
		}
		found := ""
		for _, w := range warns {
			if strings.Contains(w, "has no IPv") {
				found = w
			}
		}
		if (tc.warn == "") != (found == "") || !strings.Contains(found, tc.warn) || (found != "" && !strings.Contains(found, "masqueradeSourceCIDRs")) {
			t.Errorf("%q %+v: warning %q, want %q", tc.yaml, tc.flags, found, tc.warn)
		}
	}
}

// egressInterfaces: only traffic leaving through the listed interfaces
// (nft's trailing "*" included) may be masqueraded; explain names the key
// for another interface, and without one says it depends on it.
func TestExplainEgressInterfaces(t *testing.T) {
	cfg, _, err := config.Parse([]byte("egressInterfaces: [eth0, \"ens*\"]\nmasqueradeSourceCIDRs: [10.244.0.0/16, \"fd00::/16\"]\n"),
		config.Flags{EnableIPv6: true})
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Chain: DefaultChain, EnableIPv6: true}
	tbl := Build(cfg, o)
	p := func(src, dst, oif string) Packet {
		return Packet{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), OutIf: oif}
	}
	for _, tc := range []struct {
		p               Packet
		verdict, reason string
	}{
		{p("10.244.2.7", "203.0.113.10", "eth0"), "masquerade", "masqOutBound: true (no other rule matched)"},
		{p("10.244.2.7", "203.0.113.10", "ens3"), "masquerade", "masqOutBound: true (no other rule matched)"},
		{p("10.244.2.7", "203.0.113.10", "ens"), "masquerade", "masqOutBound: true (no other rule matched)"},
		{p("fd00:2::7", "2001:db8::1", "ens192"), "masquerade", "masqOutBoundIPv6: true (no other rule matched)"},
		{p("10.244.2.7", "203.0.113.10", "eth1"), "not masqueraded", "egressInterfaces: eth1 is in none of its 2 entries"},
		{p("10.244.2.7", "203.0.113.10", "eth00"), "not masqueraded", "egressInterfaces: eth00 is in none of its 2 entries"},
		{p("fd00:2::7", "2001:db8::1", "wg0"), "not masqueraded", "egressInterfaces: wg0 is in none of its 2 entries"},
		{p("198.51.100.7", "203.0.113.10", "eth0"), "not masqueraded", "masqueradeSourceCIDRs: 198.51.100.7 is in none of its 2 entries"},
		{p("10.244.2.7", "10.1.2.3", "eth0"), "not masqueraded", "nonMasqueradeCIDRs[0] 10.0.0.0/8 (the default list)"},
		{p("10.244.2.7", "203.0.113.10", ""), "undetermined", "depends on the out interface (egressInterfaces), which is not given"},
	} {
		e := Explain(cfg, o, tc.p)
		if e.Verdict() != tc.verdict || e.Reason != tc.reason {
			t.Errorf("Explain(%+v) = %s (%s), want %s (%s)", tc.p, e.Verdict(), e.Reason, tc.verdict, tc.reason)
		}
		got := ExplainTable(&tbl, tc.p, nil)
		if got.Verdict() != tc.verdict {
			t.Errorf("ExplainTable(%+v) = %s (%s), want %s", tc.p, got.Verdict(), got.Reason, tc.verdict)
		}
		if masq, handled := tbl.Decide(tc.p); masq != (tc.verdict == "masquerade") || handled != (tc.verdict != "undetermined") {
			t.Errorf("Decide(%+v) = %v %v", tc.p, masq, handled)
		}
	}
	for _, r := range tbl.DecisionChain().Rules {
		if r.Selector != SelOif {
			continue
		}
		if back, ok := decodeRule(r.Encode(), r.Comment); !ok || !back.equal(r) {
			t.Errorf("%s decodes as %+v (%v)", RenderRule(r), back, ok)
		}
		for _, rc := range DecisionCounters([]Rule{r}) {
			if rc.Decision != "nonmasquerade" || rc.Reason != "interfaces" {
				t.Errorf("the interface rule's counter: %+v", rc)
			}
		}
	}
}

// An interface name's elements are nft 1.0.6's, byte for byte (as
// `nft --debug=netlink` shows for `elements = { "ens3", "eth*" }`): a name
// from its zero-padded bytes to one past them, a wildcard from its
// prefix's bytes to the prefix with its last byte incremented.
func TestIfnameElements(t *testing.T) {
	pad := func(s string) netip.Addr {
		var b [16]byte
		copy(b[:], s)
		return netip.AddrFrom16(b)
	}
	var rs []Range
	for _, n := range []string{"ens3", "eth*"} {
		p, ok := IfnamePrefix(n)
		if !ok {
			t.Fatalf("%q does not fit", n)
		}
		rs = append(rs, RangeOfPrefix(p))
		if got := ifnameString(RangeOfPrefix(p)); got != `"`+n+`"` {
			t.Errorf("%q is written %s", n, got)
		}
	}
	want := []Bound{{Addr: pad("ens3")}, {Addr: pad("ens3").Next(), End: true}, {Addr: pad("eth")}, {Addr: pad("eti"), End: true}}
	if got := Bounds(rs); !reflect.DeepEqual(got, want) {
		t.Errorf("bounds %v, want %v", got, want)
	}
	for _, bad := range []string{"", "abcdefghijklmnop", "abcdefghijklmnop*"} {
		if _, ok := IfnamePrefix(bad); ok {
			t.Errorf("%q fits", bad)
		}
	}
}
