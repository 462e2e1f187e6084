package nft

import (
	"net/netip"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
)

var (
	linkLocal4 = netip.MustParsePrefix("169.254.0.0/16")
	linkLocal6 = netip.MustParsePrefix("fe80::/10") // RFC 4291
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

// Build returns the ruleset for a config: the whole policy, top to bottom.
func Build(c config.Config, o Options) Ruleset {
	nonMasq4, nonMasq6 := splitFamilies(c.NonMasqueradeCIDRs)
	masq4, masq6 := splitFamilies(c.MasqueradeCIDRs)

	// Link-local is not masqueraded unless asked, and is not counted
	// against cidrLimit (config does the counting).
	if !c.MasqLinkLocal {
		nonMasq4 = append(nonMasq4, linkLocal4)
	}
	if !c.MasqLinkLocalIPv6 {
		nonMasq6 = append(nonMasq6, linkLocal6)
	}
	// Without --enable-ipv6 the agent leaves IPv6 alone: no rules, empty sets.
	if !o.EnableIPv6 {
		nonMasq6, masq6 = nil, nil
	}

	rs := Ruleset{
		Chain: o.Chain,
		Sets: []Set{
			{Name: SetMasqV4, Family: 4, Prefixes: Normalize(masq4), Comment: "ip-masq-agent: masqueradeCIDRs"},
			{Name: SetNonMasqV4, Family: 4, Prefixes: Normalize(nonMasq4), Comment: "ip-masq-agent: nonMasqueradeCIDRs and link-local"},
			{Name: SetMasqV6, Family: 6, Prefixes: Normalize(masq6), Comment: "ip-masq-agent: masqueradeCIDRs"},
			{Name: SetNonMasqV6, Family: 6, Prefixes: Normalize(nonMasq6), Comment: "ip-masq-agent: nonMasqueradeCIDRs and link-local"},
		},
	}

	// The hook: only traffic to non-local destinations is considered, as with
	// the original agent's `-m addrtype ! --dst-type LOCAL -j IP-MASQ-AGENT`.
	rs.Base = []Rule{{NotLocal: true, Verdict: Jump, Target: o.Chain, Comment: commentGuard}}

	// The decision, per family: masqueradeCIDRs first (they win over
	// nonMasqueradeCIDRs, as in Baidu CCE's agent), then nonMasqueradeCIDRs
	// return, then everything else is masqueraded if masqOutBound says so.
	// A connection that falls off the end is not masqueraded by the agent.
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
		rs.Rules = append(rs.Rules,
			Rule{Family: fam.f, DaddrSet: fam.masq, Verdict: Goto, Target: MasqChainName, Comment: commentMasqSet},
			Rule{Family: fam.f, DaddrSet: fam.nonMasq, Verdict: Return, Comment: commentNonMasq},
		)
		if fam.outbound {
			rs.Rules = append(rs.Rules, Rule{Family: fam.f, Verdict: Goto, Target: MasqChainName, Comment: commentOutbound})
		}
	}

	rs.Masq = masqRules(o)
	return rs
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
			r := Rule{L4Proto: proto, Verdict: Masquerade, Ports: &p, FullyRandom: o.RandomFully,
				Comment: commentMasq + ", ports " + p.String()}
			if i < len(o.ToPorts)-1 {
				r.Share = &Share{Below: p.size(), Of: remaining}
			}
			remaining -= p.size()
			rules = append(rules, r)
		}
	}
	return append(rules, Rule{Verdict: Masquerade, FullyRandom: o.RandomFully, Comment: commentMasq})
}

// splitFamilies also unmaps IPv4-mapped IPv6 prefixes (::ffff:10.0.0.0/104
// is 10.0.0.0/8), which the kernel would otherwise never match.
func splitFamilies(ps []netip.Prefix) (v4, v6 []netip.Prefix) {
	for _, p := range ps {
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		if p.Addr().Is4() {
			v4 = append(v4, p)
		} else {
			v6 = append(v6, p)
		}
	}
	return v4, v6
}

// Normalize returns the prefixes the kernel can take as one interval set:
// masked, sorted, without duplicates and without
// prefixes contained in others (the kernel rejects overlapping intervals
// with EEXIST for the whole batch). Adjacent prefixes are kept apart, so
// that `nft list` shows what the operator wrote.
func Normalize(in []netip.Prefix) []netip.Prefix {
	ps := make([]netip.Prefix, 0, len(in))
	for _, p := range in {
		ps = append(ps, p.Masked())
	}
	// Sorted by address, then shorter first: a prefix that contains others
	// comes right before them, so one sweep drops every contained prefix.
	slices.SortFunc(ps, comparePrefix)
	out := ps[:0]
	for _, p := range ps {
		if n := len(out); n > 0 && out[n-1].Addr().BitLen() == p.Addr().BitLen() && out[n-1].Contains(p.Addr()) {
			continue
		}
		out = append(out, p)
	}
	return slices.Clip(out)
}

// comparePrefix orders by address, then shorter prefix first.
func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}
