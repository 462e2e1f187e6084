package nft

import (
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// RuleCounter is the kernel's counter of one decision rule.
type RuleCounter struct {
	Family   string // "ipv4" or "ipv6"
	Decision string // "masquerade" or "return"
	Reason   string // "masqueradeCIDRs", "nonMasqueradeCIDRs" or "outbound"
	Packets  uint64
	Bytes    uint64
}

// Counters reads the counters of the decision chain's rules from the
// kernel (one small dump of a few rules; the sets are not read).
func (a *Applier) Counters() ([]RuleCounter, error) {
	a.mu.Lock()
	rs := a.applied
	a.mu.Unlock()
	if rs == nil {
		return nil, errors.New("read counters: no ruleset applied yet")
	}
	c, err := nftables.New(nftables.WithNetNSFd(a.NetNS))
	if err != nil {
		return nil, err
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
	rules, err := c.GetRules(t, &nftables.Chain{Table: t, Name: rs.Chain})
	if err != nil {
		return nil, fmt.Errorf("read counters: list chain %s: %w", rs.Chain, err)
	}
	if len(rules) != len(rs.Rules) {
		return nil, fmt.Errorf("read counters: chain %s has %d rules, want %d", rs.Chain, len(rules), len(rs.Rules))
	}
	var out []RuleCounter
	for i, r := range rules {
		want := rs.Rules[i]
		rc := RuleCounter{Family: "ipv4", Decision: "masquerade", Reason: "outbound"}
		if want.Family == 6 {
			rc.Family = "ipv6"
		}
		switch want.DaddrSet {
		case SetMasqV4, SetMasqV6:
			rc.Reason = "masqueradeCIDRs"
		case SetNonMasqV4, SetNonMasqV6:
			rc.Decision, rc.Reason = "return", "nonMasqueradeCIDRs"
		}
		for _, e := range r.Exprs {
			if ctr, ok := e.(*expr.Counter); ok {
				rc.Packets, rc.Bytes = ctr.Packets, ctr.Bytes
			}
		}
		out = append(out, rc)
	}
	return out, nil
}
