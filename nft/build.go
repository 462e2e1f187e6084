package nft

import (
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
)

// Comments of the original agent's rules (and Baidu CCE's for
// masqueradeCIDRs), so that operators recognise them in `nft list`.
const (
	commentGuard      = "ip-masq-agent: ensure nat POSTROUTING directs all non-LOCAL destination traffic to our custom chain"
	commentMasqSet    = "ip-masq-agent: specific outbound traffic is subject to MASQUERADE"
	commentNonMasq    = "ip-masq-agent: local traffic is not subject to MASQUERADE"
	commentOutbound   = "ip-masq-agent: outbound traffic is subject to MASQUERADE (must be last in chain)"
	commentMasq       = "ip-masq-agent: masquerade to the node's address"
	commentNonMasqSrc = "ip-masq-agent: traffic from these sources is not subject to MASQUERADE"
)

// The sets of nonMasqueradeSourceCIDRs, made only when it is set.
const (
	SetNonMasqSrcV4 = "nonmasq-src-v4"
	SetNonMasqSrcV6 = "nonmasq-src-v6"
)

// decision is one rule of each family in the decision chain: a lookup of
// a selector in a set of the agent's, and what a match does. Build places
// them in the order of decisions, then masqOutBound's rule: a new key is a
// row here (and its selector's row in selector.go, its key in config).
type decision struct {
	sel        Selector
	sets       [2]string // the set of IPv4 and of IPv6
	setComment string
	verdict    Verdict // Goto the masquerade chain, or Return
	comment    string
	key        string                             // the config key the sets hold (explain names it)
	reason     string                             // the /metrics reason of a match
	list       func(config.Config) []netip.Prefix // that key's list, as written
	// always: the sets and rules exist whatever the list (the original's
	// keys); otherwise only when the list is not empty, so that a
	// config without the key has the table it had before the key.
	always bool
	// defaults: the list has a default (explain says when it is that).
	defaults bool
	// extra are prefixes of family f the set holds besides the list's.
	extra func(c config.Config, f Family) []netip.Prefix
}

// decisions, in the decision chain's order: nonMasqueradeSourceCIDRs
// first (traffic from those sources is never masqueraded), then
// masqueradeCIDRs (they win over nonMasqueradeCIDRs, as in Baidu CCE's
// agent), then nonMasqueradeCIDRs return.
var decisions = []decision{
	{sel: SelSaddr, sets: [2]string{SetNonMasqSrcV4, SetNonMasqSrcV6}, setComment: "ip-masq-agent: nonMasqueradeSourceCIDRs",
		verdict: Return, comment: commentNonMasqSrc, key: config.KeyNonMasqSrc, reason: "sources",
		list: func(c config.Config) []netip.Prefix { return c.NonMasqueradeSourceCIDRs }},
	{sel: SelDaddr, sets: [2]string{SetMasqV4, SetMasqV6}, setComment: "ip-masq-agent: masqueradeCIDRs",
		verdict: Goto, comment: commentMasqSet, key: config.KeyMasq, reason: "cidrs", always: true,
		list: func(c config.Config) []netip.Prefix { return c.MasqueradeCIDRs }},
	{sel: SelDaddr, sets: [2]string{SetNonMasqV4, SetNonMasqV6}, setComment: "ip-masq-agent: nonMasqueradeCIDRs and link-local",
		verdict: Return, comment: commentNonMasq, key: config.KeyNonMasq, reason: "cidrs", always: true, defaults: true,
		list: func(c config.Config) []netip.Prefix { return c.NonMasqueradeCIDRs },
		// Link-local is not masqueraded unless asked, and is not counted
		// against cidrLimit (config does the counting).
		extra: func(c config.Config, f Family) []netip.Prefix {
			if f == 4 && !c.MasqLinkLocal {
				return []netip.Prefix{config.LinkLocalIPv4}
			}
			if f == 6 && !c.MasqLinkLocalIPv6 {
				return []netip.Prefix{config.LinkLocalIPv6}
			}
			return nil
		}},
}

// decisionOf returns the decision whose set is name, or nil.
func decisionOf(name string) *decision {
	for i, d := range decisions {
		if name != "" && (name == d.sets[0] || name == d.sets[1]) {
			return &decisions[i]
		}
	}
	return nil
}

// outcome is what a match of the decision does, as /metrics labels it.
func (d *decision) outcome() string {
	if d.verdict == Return {
		return "nonmasquerade"
	}
	return "masquerade"
}

// SetOf says what one of the agent's sets holds, for /metrics: the
// decision a match makes ("masquerade" or "nonmasquerade") and the config
// list behind it, as written.
func SetOf(cfg config.Config, name string) (decision string, list []netip.Prefix, ok bool) {
	d := decisionOf(name)
	if d == nil {
		return "", nil, false
	}
	return d.outcome(), d.list(cfg), true
}

// DaddrSet says whether name is one of the agent's destination sets, and
// whether a match there masquerades.
func DaddrSet(name string) (masquerade, ok bool) {
	d := decisionOf(name)
	if d == nil || d.sel != SelDaddr {
		return false, false
	}
	return d.verdict != Return, true
}

// Build returns the table for a config: the whole policy, top to bottom.
func Build(c config.Config, o Options) Table {
	// The hook: only traffic to non-local destinations is considered, as with
	// the original agent's `-m addrtype ! --dst-type LOCAL -j IP-MASQ-AGENT`.
	base := Chain{Name: BaseChainName, Hook: &Hook{Type: "nat", Hook: "postrouting", Priority: Priority, Policy: "accept"},
		Rules: []Rule{{NotLocal: true, Verdict: Jump, Target: o.Chain, Comment: commentGuard}}}

	// The decision, per family: the decisions in order, then everything
	// else is masqueraded if masqOutBound says so. A connection that falls
	// off the end is not masqueraded by the agent.
	var t Table
	decision := Chain{Name: o.Chain}
	for i, f := range []Family{4, 6} {
		// Without --enable-ipv6 the agent leaves IPv6 alone: no rules, empty sets.
		want := f == 4 || o.EnableIPv6
		for _, d := range decisions {
			if !d.always && len(d.list(c)) == 0 {
				continue
			}
			var ps []netip.Prefix
			if want {
				ps = ofFamily(d.list(c), f)
				if d.extra != nil {
					ps = append(ps, d.extra(c, f)...)
				}
			}
			t.Sets = append(t.Sets, Set{Name: d.sets[i], Key: d.sel.Key(f), Elements: rangesOf(ps), Comment: d.setComment})
			if want {
				decision.Rules = append(decision.Rules, Rule{Family: f, Selector: d.sel, Set: d.sets[i], Verdict: d.verdict,
					Target: cond(d.verdict == Goto, MasqChainName), Comment: d.comment})
			}
		}
		if want && (f == 4 && c.MasqOutBound || f == 6 && c.MasqOutBoundIPv6) {
			decision.Rules = append(decision.Rules, Rule{Family: f, Verdict: Goto, Target: MasqChainName, Comment: commentOutbound})
		}
	}

	t.Chains = []Chain{base, decision, {Name: MasqChainName, Rules: masqRules(o)}}
	return t
}

// ofFamily returns the prefixes of family f (IPv4-mapped IPv6 ones are IPv4).
func ofFamily(ps []netip.Prefix, f Family) []netip.Prefix {
	v4, v6 := splitFamilies(ps)
	if f == 6 {
		return v6
	}
	return v4
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
