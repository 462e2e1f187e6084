package nft

import "fmt"

// RuleCounter is the kernel's counter of one decision rule.
type RuleCounter struct {
	Family   string // "ipv4" or "ipv6"
	Decision string // "masquerade" or "nonmasquerade" (the rule returns: left alone)
	Reason   string // "cidrs" (a CIDR of the decision's set) or "outbound" (no set matched)
	Packets  uint64
	Bytes    uint64
}

// DecisionCounters reads the counters of the decision chain's rules (one
// small dump of the table's rules; the sets are not read).
func (n *Netlink) DecisionCounters(chain string) ([]RuleCounter, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	conn, err := n.socket()
	if err != nil {
		return nil, err
	}
	rules, err := readRules(conn)
	if err != nil {
		n.broken()
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
		case SetMasqV4, SetMasqV6:
			rc.Reason = "cidrs"
		case SetNonMasqV4, SetNonMasqV6:
			rc.Decision, rc.Reason = "nonmasquerade", "cidrs"
		}
		out = append(out, rc)
	}
	return out, nil
}
