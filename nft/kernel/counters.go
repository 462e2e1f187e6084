package kernel

import (
	"fmt"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// RuleCounter is the kernel's counter of one decision rule.
type RuleCounter struct {
	Family   string // "ipv4" or "ipv6"
	Decision string // "masquerade" or "nonmasquerade" (the rule returns: left alone)
	Reason   string // "cidrs" (a CIDR of the decision's set) or "outbound" (no set matched)
	Packets  uint64
	Bytes    uint64
}

// DecisionCounters reads the counters of the decision chain's rules (one
// small dump of the table's rules; the sets are not read). It reads on a
// socket of its own: a scrape that fails must never close the socket that
// owns the table, which would orphan it.
func (n *Netlink) DecisionCounters(chain string) ([]RuleCounter, error) {
	n.cmu.Lock() // not n.mu: a scrape does not wait for a sync
	defer n.cmu.Unlock()
	if n.counters == nil {
		c, err := dial(n.NetNS)
		if err != nil {
			return nil, fmt.Errorf("read counters of chain %s: %w", chain, err)
		}
		n.counters = c
	}
	rules, err := readRules(n.counters)
	if err != nil {
		n.counters.Close()
		n.counters = nil
		return nil, fmt.Errorf("read counters of chain %s: %w", chain, err)
	}
	var out []RuleCounter
	for _, r := range rules[chain] {
		if r.Foreign != "" {
			continue
		}
		rc := RuleCounter{Family: "ipv4", Decision: "masquerade", Reason: "outbound", Packets: r.Packets, Bytes: r.Bytes}
		if r.Family == 6 {
			rc.Family = "ipv6"
		}
		switch r.DaddrSet {
		case nft.SetMasqV4, nft.SetMasqV6:
			rc.Reason = "cidrs"
		case nft.SetNonMasqV4, nft.SetNonMasqV6:
			rc.Decision, rc.Reason = "nonmasquerade", "cidrs"
		}
		out = append(out, rc)
	}
	return out, nil
}
