package nft

import (
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
)

// Comments of the original agent's rules (and Baidu CCE's for
// masqueradeCIDRs), so that operators recognise them in `nft list`.
const (
	commentGuard    = "ip-masq-agent: ensure nat POSTROUTING directs all non-LOCAL destination traffic to our custom chain"
	commentMasqSet  = "ip-masq-agent: specific outbound traffic is subject to MASQUERADE"
	commentNonMasq  = "ip-masq-agent: local traffic is not subject to MASQUERADE"
	commentOutbound = "ip-masq-agent: outbound traffic is subject to MASQUERADE (must be last in chain)"
	commentMasq     = "ip-masq-agent: masquerade to the node's address"
)

// Build returns the table for a config: the whole policy, top to bottom.
func Build(c config.Config, o Options) Table {
	nonMasq4, nonMasq6 := splitFamilies(c.NonMasqueradeCIDRs)
	masq4, masq6 := splitFamilies(c.MasqueradeCIDRs)
	type family struct {
		masq, nonMasq []netip.Prefix
		linkLocal     netip.Prefix
		masqLinkLocal bool
		outbound      bool
		want          bool
	}
	fams := [len(familySets)]family{ // familySets' order
		{masq4, nonMasq4, config.LinkLocalIPv4, c.MasqLinkLocal, c.MasqOutBound, true},
		{masq6, nonMasq6, config.LinkLocalIPv6, c.MasqLinkLocalIPv6, c.MasqOutBoundIPv6, o.EnableIPv6},
	}

	// The hook: only traffic to non-local destinations is considered, as with
	// the original agent's `-m addrtype ! --dst-type LOCAL -j IP-MASQ-AGENT`.
	base := Chain{Name: BaseChainName, Hook: &Hook{Type: "nat", Hook: "postrouting", Priority: Priority, Policy: "accept"},
		Rules: []Rule{{NotLocal: true, Verdict: Jump, Target: o.Chain, Comment: commentGuard}}}

	// The decision, per family: masqueradeCIDRs first (they win over
	// nonMasqueradeCIDRs, as in Baidu CCE's agent), then nonMasqueradeCIDRs
	// return, then everything else is masqueraded if masqOutBound says so.
	// A connection that falls off the end is not masqueraded by the agent.
	var t Table
	decision := Chain{Name: o.Chain}
	for i, s := range familySets {
		f := fams[i]
		// Link-local is not masqueraded unless asked, and is not counted
		// against cidrLimit (config does the counting).
		if !f.masqLinkLocal {
			f.nonMasq = append(f.nonMasq, f.linkLocal)
		}
		// Without --enable-ipv6 the agent leaves IPv6 alone: no rules, empty sets.
		if !f.want {
			f.masq, f.nonMasq = nil, nil
		}
		t.Sets = append(t.Sets,
			Set{Name: s.masq, Family: s.family, Elements: rangesOf(f.masq), Comment: "ip-masq-agent: masqueradeCIDRs"},
			Set{Name: s.nonMasq, Family: s.family, Elements: rangesOf(f.nonMasq), Comment: "ip-masq-agent: nonMasqueradeCIDRs and link-local"})
		if !f.want {
			continue
		}
		decision.Rules = append(decision.Rules,
			Rule{Family: s.family, DaddrSet: s.masq, Verdict: Goto, Target: MasqChainName, Comment: commentMasqSet},
			Rule{Family: s.family, DaddrSet: s.nonMasq, Verdict: Return, Comment: commentNonMasq},
		)
		if f.outbound {
			decision.Rules = append(decision.Rules, Rule{Family: s.family, Verdict: Goto, Target: MasqChainName, Comment: commentOutbound})
		}
	}

	t.Chains = []Chain{base, decision, {Name: MasqChainName, Rules: masqRules(o)}}
	return t
}

// masqRules spells out the masquerade statement. With --to-ports, TCP, UDP
// and SCTP get a source port from one of the ranges, each range chosen with
// a probability proportional to its size (as the original agent does with
// `-m statistic`); other protocols are masqueraded without a port range.
func masqRules(o Options) []Rule {
	var rules []Rule
	for _, proto := range []uint8{unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_SCTP} {
		remaining := uint32(0)
		for _, p := range o.ToPorts {
			remaining += p.size()
		}
		for i, p := range o.ToPorts {
			r := Rule{L4Proto: proto, CtLabel: o.CtLabel, Verdict: Masquerade, Ports: &p, FullyRandom: o.RandomFully,
				Comment: commentMasq + ", ports " + p.String()}
			if i < len(o.ToPorts)-1 {
				r.Share = &Share{Below: p.size(), Of: remaining}
			}
			remaining -= p.size()
			rules = append(rules, r)
		}
	}
	return append(rules, Rule{CtLabel: o.CtLabel, Verdict: Masquerade, FullyRandom: o.RandomFully, Comment: commentMasq})
}
