package nft

import (
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

	// Link-local is not masqueraded unless asked, and is not counted
	// against cidrLimit (config does the counting).
	if !c.MasqLinkLocal {
		nonMasq4 = append(nonMasq4, config.LinkLocalIPv4)
	}
	if !c.MasqLinkLocalIPv6 {
		nonMasq6 = append(nonMasq6, config.LinkLocalIPv6)
	}
	// Without --enable-ipv6 the agent leaves IPv6 alone: no rules, empty sets.
	if !o.EnableIPv6 {
		nonMasq6, masq6 = nil, nil
	}

	t := Table{
		Sets: []Set{
			{Name: SetMasqV4, Family: 4, Elements: rangesOf(masq4), Comment: "ip-masq-agent: masqueradeCIDRs"},
			{Name: SetNonMasqV4, Family: 4, Elements: rangesOf(nonMasq4), Comment: "ip-masq-agent: nonMasqueradeCIDRs and link-local"},
			{Name: SetMasqV6, Family: 6, Elements: rangesOf(masq6), Comment: "ip-masq-agent: masqueradeCIDRs"},
			{Name: SetNonMasqV6, Family: 6, Elements: rangesOf(nonMasq6), Comment: "ip-masq-agent: nonMasqueradeCIDRs and link-local"},
		},
	}

	// The hook: only traffic to non-local destinations is considered, as with
	// the original agent's `-m addrtype ! --dst-type LOCAL -j IP-MASQ-AGENT`.
	base := Chain{Name: BaseChainName, Hook: &Hook{Type: "nat", Hook: "postrouting", Priority: Priority, Policy: "accept"},
		Rules: []Rule{{NotLocal: true, Verdict: Jump, Target: o.Chain, Comment: commentGuard}}}

	// The decision, per family: masqueradeCIDRs first (they win over
	// nonMasqueradeCIDRs, as in Baidu CCE's agent), then nonMasqueradeCIDRs
	// return, then everything else is masqueraded if masqOutBound says so.
	// A connection that falls off the end is not masqueraded by the agent.
	decision := Chain{Name: o.Chain}
	type family struct {
		f              Family
		masq, nonMasq  string
		outbound, want bool
	}
	for _, fam := range []family{
		{4, SetMasqV4, SetNonMasqV4, c.MasqOutBound, true},
		{6, SetMasqV6, SetNonMasqV6, c.MasqOutBoundIPv6, o.EnableIPv6},
	} {
		if !fam.want {
			continue
		}
		decision.Rules = append(decision.Rules,
			Rule{Family: fam.f, DaddrSet: fam.masq, Verdict: Goto, Target: MasqChainName, Comment: commentMasqSet},
			Rule{Family: fam.f, DaddrSet: fam.nonMasq, Verdict: Return, Comment: commentNonMasq},
		)
		if fam.outbound {
			decision.Rules = append(decision.Rules, Rule{Family: fam.f, Verdict: Goto, Target: MasqChainName, Comment: commentOutbound})
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
