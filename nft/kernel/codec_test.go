package kernel

import (
	"testing"

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
