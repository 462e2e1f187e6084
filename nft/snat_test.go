package nft

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
)

func snatLinks(m map[string][]string) func(netip.Addr) []string {
	return func(a netip.Addr) []string { return m[a.String()] }
}

// snatAddress changes the masquerade chain only: a snat rule of its
// family for each interface that holds the address, before the
// masquerade; the decision chain and its rules stay as they were.
func TestBuildSNAT(t *testing.T) {
	cfg := config.Default(config.Flags{EnableIPv6: true})
	cfg.SNATAddress = netip.MustParseAddr("203.0.113.10")
	cfg.SNATAddressIPv6 = netip.MustParseAddr("2001:db8::10")
	label := uint8(20)
	o := Options{Chain: DefaultChain, EnableIPv6: true, RandomFully: true, CtLabel: &label,
		Links: snatLinks(map[string][]string{"203.0.113.10": {"eth0"}, "2001:db8::10": {"eth1", "eth0", "eth1"}})}
	t0 := Build(config.Default(config.Flags{EnableIPv6: true}), Options{Chain: DefaultChain, EnableIPv6: true, RandomFully: true, CtLabel: &label})
	tb := Build(cfg, o)
	if !tb.DecisionChain().equal(*t0.DecisionChain()) {
		t.Errorf("the decision chain changed:\n%s", Render(tb))
	}
	var got []string
	for _, r := range tb.Chain(MasqChainName).Rules {
		got = append(got, RenderRule(r))
	}
	want := []string{
		`meta nfproto ipv4 oifname "eth0" ct label set 20 counter snat ip to 203.0.113.10 fully-random comment "ip-masq-agent: masquerade to the snat address through its interface (snatAddress)"`,
		`meta nfproto ipv6 oifname "eth0" ct label set 20 counter snat ip6 to 2001:db8::10 fully-random comment "ip-masq-agent: masquerade to the snat address through its interface (snatAddressIPv6)"`,
		`meta nfproto ipv6 oifname "eth1" ct label set 20 counter snat ip6 to 2001:db8::10 fully-random comment "ip-masq-agent: masquerade to the snat address through its interface (snatAddressIPv6)"`,
		`ct label set 20 counter masquerade fully-random comment "ip-masq-agent: masquerade to the node's address"`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("masquerade chain:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if tb.MarkLabel() != 20 {
		t.Errorf("MarkLabel = %d", tb.MarkLabel())
	}
	// Without an interface that holds it, or without --enable-ipv6 for
	// IPv6, the address changes nothing.
	o.Links = nil
	if tn := Build(cfg, o); !tn.Chain(MasqChainName).equal(*t0.Chain(MasqChainName)) {
		t.Errorf("an address on no interface made rules:\n%s", Render(tn))
	}
	cfg.SNATAddress = netip.Addr{}
	o.EnableIPv6 = false
	o.Links = snatLinks(map[string][]string{"2001:db8::10": {"eth0"}})
	if tn := Build(cfg, o); len(tn.Chain(MasqChainName).Rules) != 1 {
		t.Errorf("snatAddressIPv6 without --enable-ipv6:\n%s", Render(tn))
	}
}

// The snat rules are encoded and decoded back exactly, with --to-ports
// (ports in registers 2 and 3) and without, IPv4 and IPv6.
func TestSNATCodec(t *testing.T) {
	cfg := config.Default(config.Flags{EnableIPv6: true})
	cfg.SNATAddress = netip.MustParseAddr("203.0.113.10")
	cfg.SNATAddressIPv6 = netip.MustParseAddr("2001:db8::10")
	for _, ports := range [][]PortRange{nil, {{First: 1024, Last: 2047}, {First: 30000, Last: 32767}}} {
		o := Options{Chain: DefaultChain, EnableIPv6: true, ToPorts: ports,
			Links: snatLinks(map[string][]string{"203.0.113.10": {"eth0"}, "2001:db8::10": {"eth0"}})}
		tb := Build(cfg, o)
		for _, r := range tb.Chain(MasqChainName).Rules {
			back := FoundRule(r.Encode(), r.Comment)
			if back.Foreign != "" || !back.equal(r) {
				t.Errorf("%s: read back as %+v", RenderRule(r), back)
			}
		}
		if ports != nil {
			txt := Render(Build(cfg, o))
			for _, w := range []string{"snat ip to 203.0.113.10:1024-2047", "snat ip6 to [2001:db8::10]:30000-32767"} {
				if !strings.Contains(txt, w) {
					t.Errorf("render lacks %q:\n%s", w, txt)
				}
			}
		}
	}
}

// explain says to which address a masqueraded connection goes.
func TestExplainSNAT(t *testing.T) {
	cfg := config.Default(config.Flags{})
	cfg.SNATAddress = netip.MustParseAddr("203.0.113.10")
	o := Options{Chain: DefaultChain, Links: snatLinks(map[string][]string{"203.0.113.10": {"eth0"}})}
	dst := netip.MustParseAddr("198.51.100.1")
	for _, tc := range []struct {
		oif, want string
	}{
		{"", "masqOutBound: true (no other rule matched); masquerade to 203.0.113.10 (snatAddress) through eth0, to the out interface's address through others"},
		{"eth0", "masqOutBound: true (no other rule matched); masquerade to 203.0.113.10 (snatAddress) through eth0"},
		{"cni0", "masqOutBound: true (no other rule matched); masquerade to cni0's address (snatAddress 203.0.113.10 is on eth0 only)"},
	} {
		e := Explain(cfg, o, Packet{Dst: dst, OutIf: tc.oif})
		if !e.Masquerade || e.Reason != tc.want {
			t.Errorf("oif %q: %s %q, want %q", tc.oif, e.Verdict(), e.Reason, tc.want)
		}
		if d, _ := Build(cfg, o).Decide(Packet{Dst: dst, OutIf: tc.oif}); !d {
			t.Errorf("oif %q: Decide says not masqueraded", tc.oif)
		}
	}
	if e := Explain(cfg, Options{Chain: DefaultChain}, Packet{Dst: dst}); !strings.HasSuffix(e.Reason, "; snatAddress 203.0.113.10 is on no interface of this node: masquerade to the out interface's address") {
		t.Errorf("no interface: %q", e.Reason)
	}
	if e := Explain(cfg, o, Packet{Dst: netip.MustParseAddr("10.1.2.3")}); e.Masquerade || strings.Contains(e.Reason, "snat") {
		t.Errorf("not masqueraded: %q", e.Reason)
	}
}
