package bench

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// TestSelectorsTableSize checks the every-selector table of RunSelectors:
// one rule per decision, as many at one entry per list as at 100,000, and
// a set for every selector.
func TestSelectorsTableSize(t *testing.T) {
	var first RuleCount
	for i, n := range []int{1, 1_000, 100_000} {
		tbl := nft.Build(selectorsConfig(n))
		got := rulesOf(n, tbl)
		if i == 0 {
			first = got
			for _, set := range []string{nft.SetNonMasqSrcV4, nft.SetMasqSrcV4, nft.SetEgressIfV4, nft.SetMasqV4, nft.SetNonMasqV4} {
				if tbl.Set(set) == nil {
					t.Errorf("no set %s: a selector is not in use", set)
				}
			}
			continue
		}
		if got.Decision != first.Decision || got.Masq != first.Masq {
			t.Errorf("%d entries per list: %d + %d rules, at 1 entry %d + %d", n, got.Decision, got.Masq, first.Decision, first.Masq)
		}
	}
	// Five decisions and masqOutBound; the snat rule and the masquerade.
	if first.Decision != 6 || first.Masq != 2 {
		t.Errorf("rules: decision chain %d, masquerade chain %d; want 6 and 2", first.Decision, first.Masq)
	}
	s := &SelectorResults{Rules: []RuleCount{first, {N: 2, Decision: first.Decision + 1, Masq: first.Masq}}}
	if s.Constant() {
		t.Error("Constant: true for counts that differ")
	}
}

// TestSelectorsTraffic checks, with the evaluator, that the data plane's
// connections pass every rule of the every-selector table and are
// masqueraded by masqOutBound, and that the nesting decides as meant.
func TestSelectorsTraffic(t *testing.T) {
	c, o := selectorsConfig(1000)
	pod := netip.MustParseAddr("10.244.1.2")
	e := nft.Explain(c, o, nft.Packet{Src: pod, Dst: dataDst, OutIf: testnet.NodeUplinkIf})
	if !e.Masquerade || !strings.Contains(e.Reason, "masqOutBound") {
		t.Errorf("pod to %s: %s (%s), want masqueraded by masqOutBound", dataDst, e.Verdict(), e.Reason)
	}
	for dst, masq := range map[string]bool{
		"100.64.0.1":    true,  // the /30 inside the first /29
		"100.64.0.5":    false, // the first /29, outside its /30
		"100.64.0.33":   false, // the second /29 (no /30 inside)
		"100.127.0.1":   true,  // 100.64.0.0/10, outside every /29
		"203.0.113.200": true,  // no list
	} {
		e := nft.Explain(c, o, nft.Packet{Src: pod, Dst: netip.MustParseAddr(dst), OutIf: testnet.NodeUplinkIf})
		if e.Masquerade != masq {
			t.Errorf("pod to %s: %s (%s), want masquerade %v", dst, e.Verdict(), e.Reason, masq)
		}
	}
}
