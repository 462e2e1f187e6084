package kernel

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// Every rule Build makes, sent as ruleMessage encodes it and read as
// decodeRuleMessage decodes it, attribute by attribute, reads back as
// itself (nft's tests check the codec above the wire).
func TestRuleMessageRoundTrip(t *testing.T) {
	cfg, _, err := config.Parse([]byte("nonMasqueradeCIDRs: [10.0.0.0/8, fd00::/8]\nmasqueradeCIDRs: [10.1.0.0/16]\nmasqLinkLocal: true\n"), config.Flags{EnableIPv6: true})
	if err != nil {
		t.Fatal(err)
	}
	label := uint8(20)
	n := 0
	for _, o := range []nft.Options{
		{Chain: nft.DefaultChain, EnableIPv6: true},
		{Chain: "IP-MASQ", EnableIPv6: true, RandomFully: true, CtLabel: &label},
		{Chain: nft.DefaultChain, RandomFully: true, ToPorts: []nft.PortRange{{First: 1024, Last: 2047}, {First: 3000, Last: 3999}}},
	} {
		want := nft.Build(cfg, o)
		for _, c := range want.Chains {
			for _, r := range c.Rules {
				msg, err := ruleMessage(c.Name, r)
				if err != nil {
					t.Fatal(err)
				}
				got, chain, err := decodeRuleMessage(msg.Data[4:])
				if err != nil || chain != c.Name || got.Foreign != "" || nft.RenderRule(got) != nft.RenderRule(r) {
					t.Errorf("%q read back as %q (foreign %q) in chain %q: %v", nft.RenderRule(r), nft.RenderRule(got), got.Foreign, chain, err)
				}
				n++
			}
		}
	}
	t.Logf("%d rules", n)
}

// Every expression google/nftables decodes reads back as itself, not as
// an unknown expression (so a statement added to the agent's rules later
// needs no change in the read); data it cannot decode reads as unknown,
// without failing the read.
func TestExprKindsReadBack(t *testing.T) {
	for _, e := range []expr.Any{
		&expr.Log{Key: 1 << unix.NFTA_LOG_PREFIX, Data: []byte("masq: ")},
		&expr.Limit{Type: expr.LimitTypePkts, Rate: 10, Unit: expr.LimitTimeSecond, Burst: 5},
		&expr.Quota{Bytes: 1 << 20},
		&expr.Objref{Type: 1, Name: "c"},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
		&expr.Redir{RegisterProtoMin: 1},
	} {
		name := strings.ToLower(strings.TrimPrefix(reflect.TypeOf(e).String(), "*expr."))
		if _, ok := exprDecoders[name]; !ok {
			t.Fatalf("%s: not in exprDecoders", name)
		}
		data, err := expr.MarshalExprData(unix.NFPROTO_INET, e)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeExprFamily(unix.NFPROTO_INET, name, data)
		if err != nil || reflect.TypeOf(got) != reflect.TypeOf(e) {
			t.Errorf("%s read back as %#v: %v", name, got, err)
		}
	}
	got, err := decodeExprFamily(unix.NFPROTO_INET, "log", []byte{0xff})
	if m, ok := got.(*expr.Match); err != nil || !ok || m.Name != nft.UnknownPrefix+"log" {
		t.Errorf("undecodable log read back as %#v, %v; want an unknown expression", got, err)
	}
	got, err = decodeExprFamily(unix.NFPROTO_INET, "target", []byte{0xff})
	if _, ok := got.(*expr.Target); err != nil || !ok || nft.RuleVerdict([]expr.Any{got}) == "" {
		t.Errorf("undecodable target read back as %#v, %v; want a target, which decides", got, err)
	}
}

// A plan that deletes and adds ranges of one set sends only the bounds
// that change: an interval whose start stays keeps its start element
// (the lookup of Linux 5.10 to 6.12 may miss an address whose interval's
// start element a transaction replaces), and one whose end stays keeps
// its end.
func TestSentBoundsKeepWhatStays(t *testing.T) {
	r := func(from, to string) nft.Range {
		return nft.RangeFrom(netip.MustParseAddr(from), netip.MustParseAddr(to))
	}
	b := func(a string, end bool) nft.Bound { return nft.Bound{Addr: netip.MustParseAddr(a), End: end} }
	p := nft.Plan{Ops: []nft.Op{
		{Verb: nft.Delete, Kind: nft.KindElements, Name: nft.SetNonMasqV4, Elements: []nft.Range{r("10.0.0.0", "10.0.0.255"), r("10.9.0.0", "10.9.0.255")}},
		{Verb: nft.Add, Kind: nft.KindElements, Name: nft.SetNonMasqV4, Elements: []nft.Range{r("10.0.0.0", "10.0.1.255"), r("10.8.0.0", "10.9.0.255")}},
		{Verb: nft.Add, Kind: nft.KindElements, Name: nft.SetMasqV4, Elements: []nft.Range{r("10.0.0.0", "10.0.0.255")}},
	}}
	got := sentBounds(p)
	want := map[int][]nft.Bound{
		0: {b("10.0.1.0", true), b("10.9.0.0", false)},
		1: {b("10.0.2.0", true), b("10.8.0.0", false)},
		2: {b("10.0.0.0", false), b("10.0.1.0", true)},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("sent %v, want %v", got, want)
	}
}
