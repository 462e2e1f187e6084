package nft

import (
	"net/netip"
	"slices"
	"strings"

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
	commentSNAT       = "ip-masq-agent: masquerade to the snat address through its interface"
	commentMasqSrc    = "ip-masq-agent: only traffic from these sources may be subject to MASQUERADE"
	commentEgressIf   = "ip-masq-agent: only traffic leaving through these interfaces may be subject to MASQUERADE"
)

// The sets of nonMasqueradeSourceCIDRs, made only when it is set.
const (
	SetNonMasqSrcV4 = "nonmasq-src-v4"
	SetNonMasqSrcV6 = "nonmasq-src-v6"
)

// The sets of egressInterfaces, made only when it is set.
const (
	SetEgressIfV4 = "egress-if-v4"
	SetEgressIfV6 = "egress-if-v6"
)

// The sets of masqueradeSourceCIDRs, made only when it is set.
const (
	SetMasqSrcV4 = "masq-src-v4"
	SetMasqSrcV6 = "masq-src-v6"
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
	// invert: the rule matches what the set does not hold (ip saddr != @set).
	invert  bool
	comment string
	key     string                             // the config key the sets hold (explain names it)
	reason  string                             // the /metrics reason of a match
	list    func(config.Config) []netip.Prefix // that key's list, as written
	// always: the sets and rules exist whatever the list (the original's
	// keys); otherwise only when the list is not empty, so that a
	// config without the key has the table it had before the key.
	always bool
	// defaults: the list has a default (explain says when it is that).
	defaults bool
	// extra are prefixes of family f the set holds besides the list's.
	extra func(c config.Config, f Family) []netip.Prefix
	// mostSpecific: under cidrMatch: mostSpecific the sets of these rows
	// are painted together (paint, prefix.go): each address is in the set
	// of the row whose longest prefix holding it is longest, so the sets
	// are disjoint and their order in the chain does not matter.
	mostSpecific bool
}

// decisions, in the decision chain's order: nonMasqueradeSourceCIDRs
// first (traffic from those sources is never masqueraded), then
// masqueradeSourceCIDRs (traffic from other sources is not either), then
// egressInterfaces (nor is traffic leaving through other interfaces), then
// masqueradeCIDRs (they win over nonMasqueradeCIDRs, as in Baidu CCE's
// agent), then nonMasqueradeCIDRs return.
var decisions = []decision{
	{sel: SelSaddr, sets: [2]string{SetNonMasqSrcV4, SetNonMasqSrcV6}, setComment: "ip-masq-agent: nonMasqueradeSourceCIDRs",
		verdict: Return, comment: commentNonMasqSrc, key: config.KeyNonMasqSrc, reason: "sources",
		list: func(c config.Config) []netip.Prefix { return c.NonMasqueradeSourceCIDRs }},
	// The guard is literal: with a list, a source outside it (of either
	// family: an empty set of a family returns all of that family) is
	// never masqueraded.
	{sel: SelSaddr, sets: [2]string{SetMasqSrcV4, SetMasqSrcV6}, setComment: "ip-masq-agent: masqueradeSourceCIDRs",
		verdict: Return, invert: true, comment: commentMasqSrc, key: config.KeyMasqSrc, reason: "sources",
		list: func(c config.Config) []netip.Prefix { return c.MasqueradeSourceCIDRs }},
	// egressInterfaces: oifname != @egress-if-v4 return. Its list is the
	// names as their set holds them (IfnamePrefix), the same in both
	// families' sets.
	{sel: SelOif, sets: [2]string{SetEgressIfV4, SetEgressIfV6}, setComment: "ip-masq-agent: egressInterfaces",
		verdict: Return, invert: true, comment: commentEgressIf, key: config.KeyEgressIf, reason: "interfaces",
		list: func(c config.Config) []netip.Prefix { return ifnamePrefixes(c.EgressInterfaces) }},
	{sel: SelDaddr, sets: [2]string{SetMasqV4, SetMasqV6}, setComment: "ip-masq-agent: masqueradeCIDRs",
		verdict: Goto, comment: commentMasqSet, key: config.KeyMasq, reason: "cidrs", always: true, mostSpecific: true,
		list: func(c config.Config) []netip.Prefix { return c.MasqueradeCIDRs }},
	{sel: SelDaddr, sets: [2]string{SetNonMasqV4, SetNonMasqV6}, setComment: "ip-masq-agent: nonMasqueradeCIDRs and link-local",
		verdict: Return, comment: commentNonMasq, key: config.KeyNonMasq, reason: "cidrs", always: true, defaults: true, mostSpecific: true,
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
// decision a match makes ("masquerade" or "nonmasquerade"), the config
// list behind it, as written, and the family of the rule that looks it up
// (a set of interface names has one per family too).
func SetOf(cfg config.Config, name string) (decision string, list []netip.Prefix, family Family, ok bool) {
	d := decisionOf(name)
	if d == nil {
		return "", nil, 0, false
	}
	family = 4
	if name == d.sets[1] {
		family = 6
	}
	return d.outcome(), d.list(cfg), family, true
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
	elems := elementsOf(c, o.EnableIPv6)
	if o.MergeAdjacent {
		for i := range elems {
			for j, d := range decisions {
				if d.sel.isAddr() {
					elems[i][j] = joinAdjacent(elems[i][j])
				}
			}
		}
	}
	for i, f := range []Family{4, 6} {
		// Without --enable-ipv6 the agent leaves IPv6 alone: no rules, empty sets.
		want := f == 4 || o.EnableIPv6
		elems := elems[i]
		for j, d := range decisions {
			if !d.always && len(d.list(c)) == 0 {
				continue
			}
			t.Sets = append(t.Sets, Set{Name: d.sets[i], Key: d.sel.Key(f), Elements: elems[j], Comment: d.setComment})
			if want {
				decision.Rules = append(decision.Rules, Rule{Family: f, Selector: d.sel, Set: d.sets[i], Invert: d.invert, Verdict: d.verdict,
					Target: cond(d.verdict == Goto, MasqChainName), Comment: d.comment})
			}
		}
		if want && (f == 4 && c.MasqOutBound || f == 6 && c.MasqOutBoundIPv6) {
			decision.Rules = append(decision.Rules, Rule{Family: f, Verdict: Goto, Target: MasqChainName, Comment: commentOutbound})
		}
	}

	var masq []Rule
	for _, l := range SNATLinks(c, o) {
		masq = append(masq, snatRules(l, o)...)
	}
	t.Chains = []Chain{base, decision, {Name: MasqChainName, Rules: append(masq, masqRules(o)...)}}
	return t
}

// elementsOf returns the elements of each decision's set, IPv4's and
// IPv6's (none without enableIPv6): the fewest ranges that cover its
// prefixes, or under cidrMatch: mostSpecific the mostSpecific rows'
// paint.
func elementsOf(c config.Config, enableIPv6 bool) (out [2][][]Range) {
	var lists [2][]painted
	var rows []int
	for f := range out {
		out[f] = make([][]Range, len(decisions))

	}
	for j, d := range decisions {
		var ps [2][]netip.Prefix
		if !d.sel.isAddr() {
			// Interface names: the same in both families' sets, each
			// name an element (merging adjacent names could make a
			// range that is no name or wildcard).
			out[0][j] = prefixRanges(d.list(c))
			if enableIPv6 {
				out[1][j] = out[0][j]
			}
			continue
		}
		var extra [2][]netip.Prefix
		for f, fam := range []Family{4, 6} {
			if d.extra != nil && (fam == 4 || enableIPv6) {
				extra[f] = d.extra(c, fam)
			}
		}
		if c.CIDRMatch != config.MostSpecific || !d.mostSpecific {
			// Each family's union; the list is not split first (100,000
			// CIDRs at every change).
			out[0][j] = union4(d.list(c), extra[0])
			var v6 []netip.Prefix
			if enableIPv6 {
				v6 = append(only6(d.list(c)), extra[1]...)
			}
			out[1][j] = rangesOf(v6)
			continue
		}
		ps[0], ps[1] = splitFamilies(d.list(c))
		if !enableIPv6 {
			ps[1] = nil
		}
		for f := range ps {
			ps[f] = append(ps[f], extra[f]...)
		}
		rows = append(rows, j)
		for f := range ps {
			lists[f] = append(lists[f], ps[f])
		}
	}
	for f := range lists {
		if len(lists[f]) > 0 {
			for k, rs := range paint(lists[f]) {
				out[f][rows[k]] = rs
			}
		}
	}
	return out
}

// ifnamePrefixes are interface names as their sets hold them (config
// refuses a name that does not fit).
func ifnamePrefixes(names []string) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(names))
	for _, n := range names {
		if p, ok := IfnamePrefix(n); ok {
			out = append(out, p)
		}
	}
	return out
}

// SNATLink is snatAddress or snatAddressIPv6 and an interface of the node
// that holds it.
type SNATLink struct {
	Key  string // config.KeySNAT or config.KeySNAT6
	Addr netip.Addr
	Link string
}

// SNATLinks are the config's snat addresses of the families the agent
// handles, each with every interface of the node that holds it (o.Links),
// sorted: the snat rules' order. An address no interface holds has none:
// its family is masqueraded as without it.
func SNATLinks(c config.Config, o Options) []SNATLink {
	var out []SNATLink
	for _, k := range []struct {
		key  string
		addr netip.Addr
		ok   bool
	}{{config.KeySNAT, c.SNATAddress, true}, {config.KeySNAT6, c.SNATAddressIPv6, o.EnableIPv6}} {
		if !k.addr.IsValid() || !k.ok || o.Links == nil {
			continue
		}
		links := slices.Clone(o.Links(k.addr))
		slices.Sort(links)
		for _, l := range slices.Compact(links) {
			out = append(out, SNATLink{Key: k.key, Addr: k.addr, Link: l})
		}
	}
	return out
}

// snatRules are masqRules for packets of l's family leaving through l's
// interface, with the masquerade made a source NAT to l's address. Only
// there: a packet that leaves through another interface (to a pod of this
// node, into an overlay, out of a second NIC) is masqueraded to that
// interface's address as before, so that its replies come back the way
// they did (snatAddress in docs/configuration.md).
func snatRules(l SNATLink, o Options) []Rule {
	rules := masqRules(o)
	for i := range rules {
		r := &rules[i]
		r.Family, r.OutIf, r.To = familyOf(l.Addr), l.Link, l.Addr
		r.Comment = strings.Replace(r.Comment, commentMasq, commentSNAT+" ("+l.Key+")", 1)
	}
	return rules
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

// SNATs are the snat rules' addresses and interfaces in t's masquerade
// chain (Key empty), in order, each once: for the conntrack cleanup after
// a change of snatAddress.
func (t *Table) SNATs() []SNATLink {
	var out []SNATLink
	c := t.Chain(MasqChainName)
	if c == nil {
		return nil
	}
	for _, r := range c.Rules {
		l := SNATLink{Addr: r.To, Link: r.OutIf}
		if r.Foreign == "" && r.To.IsValid() && !slices.Contains(out, l) {
			out = append(out, l)
		}
	}
	return out
}
