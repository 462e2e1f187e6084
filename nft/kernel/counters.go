package kernel

import (
	"fmt"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// DecisionCounters reads the counters of the decision chain's rules (one
// small dump of the table's rules; the sets are not read). It reads on a
// socket of its own: a scrape that fails must never close the socket that
// owns the table, which would orphan it.
func (n *Netlink) DecisionCounters(chain string) ([]nft.RuleCounter, error) {
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
	return nft.DecisionCounters(rules[chain]), nil
}
