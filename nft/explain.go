package nft

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
)

// Explanation says what the agent's rules do with new connections from a
// pod to one destination address (from one source, when known), and why.
type Explanation struct {
	Addr       netip.Addr // the destination
	From       netip.Addr // the source; invalid: any
	Masquerade bool
	// Undetermined is set when the rules' outcome does not follow from the
	// destination alone (a rule added by someone else matches on
	// something else); Masquerade is then meaningless.
	Undetermined bool
	// Reason names what decided, e.g. "nonMasqueradeCIDRs[2] 10.0.0.0/8",
	// "link-local 169.254.0.0/16 (masqLinkLocal: false)",
	// "masqOutBound: true (no other rule matched)".
	Reason string
	// Rule is the rule that decided, in nft syntax; "" when none did.
	Rule string
}

// Verdict is "masquerade", "not masqueraded" or "undetermined".
func (e Explanation) Verdict() string {
	switch {
	case e.Undetermined:
		return "undetermined"
	case e.Masquerade:
		return "masquerade"
	}
	return "not masqueraded"
}

// Explain says what the ruleset Build makes of cfg and o does with a new
// connection p (a destination, and a source or out interface when known),
// from the config alone: the rules are evaluated as the kernel
// evaluates them (the evaluator of Decider and ExplainTable), and the
// reason names the config entry behind the set element that matched. It
// cannot know the node's own addresses, which the kernel never
// masquerades (the base chain's `fib daddr type != local`).
func Explain(cfg config.Config, o Options, p Packet) Explanation {
	return Explainer(cfg, o)(p)
}

// Explainer is Explain for many packets: the table is built once.
func Explainer(cfg config.Config, o Options) func(Packet) Explanation {
	return Build(cfg, o).Explainer(cfg, o)
}

// Explainer is Explain for many packets with t, which is Build(cfg, o)
// already.
func (t Table) Explainer(cfg config.Config, o Options) func(Packet) Explanation {
	return func(p Packet) Explanation { return explainIn(&t, cfg, o, p) }
}

func explainIn(t *Table, cfg config.Config, o Options, p Packet) Explanation {
	p = p.unmapped()
	e := Explanation{Addr: p.Dst, From: p.Src}
	ev := t.evaluate(p, false, true)
	if !ev.handled {
		e.Reason = "IPv6 is not handled without --enable-ipv6"
		return e
	}
	if ev.outcome == outUndetermined {
		// A decision on what the packet does not say (its source).
		e.Undetermined, e.Reason = true, ev.why
		if n := len(ev.steps); n > 0 {
			s := ev.steps[n-1]
			e.Rule = s.text
			if c := t.Chain(s.chain); c != nil && s.index <= len(c.Rules) {
				if dec := decisionOf(c.Rules[s.index-1].Set); dec != nil {
					e.Reason = fmt.Sprintf("depends on the %s (%s), which is not given", dec.sel.row().what, dec.key)
				}
			}
		}
		return e
	}
	outbound := config.KeyOutBound
	if p.Dst.Is6() {
		outbound = config.KeyOutBound6
	}
	var d *step // the decision chain's rule that decided
	for i := range ev.steps {
		if ev.steps[i].chain == t.DecisionChain().Name {
			d = &ev.steps[i]
		}
	}
	if d == nil {
		e.Reason = outbound + ": false (no other rule matched)"
		return e
	}
	e.Rule, e.Masquerade = d.text, ev.outcome == outMasquerade
	if dec := decisionOf(d.set); dec != nil && d.notIn {
		e.Reason = fmt.Sprintf("%s: %s is in none of its %d entries", dec.key, dec.sel.row().text(p), len(dec.list(cfg)))
	} else if dec != nil {
		a, _ := netip.AddrFromSlice(dec.sel.row().value(p)) // what the set was looked up with
		e.Reason = decidedBy(cfg, dec, a, d.element)
	} else {
		e.Reason = outbound + ": true (no other rule matched)"
	}
	if e.Masquerade {
		e.Reason += snatNote(cfg, o, p)
	}
	return e
}

// snatNote says to which address a masqueraded connection p goes when the
// config has a snat address of its family: that address through the
// interfaces that hold it, the out interface's elsewhere.
func snatNote(cfg config.Config, o Options, p Packet) string {
	key, addr := config.KeySNAT, cfg.SNATAddress
	if p.Dst.Is6() {
		key, addr = config.KeySNAT6, cfg.SNATAddressIPv6
	}
	if !addr.IsValid() {
		return ""
	}
	var links []string
	for _, l := range SNATLinks(cfg, o) {
		if l.Addr == addr {
			links = append(links, l.Link)
		}
	}
	switch {
	case len(links) == 0:
		return fmt.Sprintf("; %s %s is on no interface of this node: masquerade to the out interface's address", key, addr)
	case p.OutIf != "" && slices.Contains(links, p.OutIf):
		return fmt.Sprintf("; masquerade to %s (%s) through %s", addr, key, p.OutIf)
	case p.OutIf != "":
		return fmt.Sprintf("; masquerade to %s's address (%s %s is on %s only)", p.OutIf, key, addr, strings.Join(links, ", "))
	}
	return fmt.Sprintf("; masquerade to %s (%s) through %s, to the out interface's address through others", addr, key, strings.Join(links, ", "))
}

// decidedBy names the config entry behind the set element (of dec's set)
// that holds addr: under listOrder the widest entry of dec's list that
// holds it, the first of equal ones (its set element; every entry of one
// set decides alike); under cidrMatch: mostSpecific the longest entry of
// the painted lists (masqueradeCIDRs, nonMasqueradeCIDRs, link-local)
// that holds it. When the set element is not that entry (a part of it
// that a longer entry of the other list leaves), it names the element:
// "nonMasqueradeCIDRs[0] 10.0.0.0/8 (...) (set element
// 10.0.0.0-10.19.255.255)".
func decidedBy(cfg config.Config, dec *decision, addr netip.Addr, element Range) string {
	type entry struct {
		key      string
		index    int // -1: an extra prefix (link-local)
		p        netip.Prefix
		defaults bool
	}
	var best *entry
	consider := func(d *decision) {
		list := d.list(cfg)
		defaults := d.defaults && isDefaultList(list)
		var ps []entry
		for i, q := range list {
			q, _ = config.UnmapPrefix(q)
			ps = append(ps, entry{d.key, i, q.Masked(), defaults})
		}
		if d.extra != nil {
			f := Family(4)
			if addr.Is6() {
				f = 6
			}
			for _, q := range d.extra(cfg, f) {
				ps = append(ps, entry{d.key, -1, q, false})
			}
		}
		for _, en := range ps {
			if !en.p.Contains(addr) {
				continue
			}
			switch {
			case best == nil:
				best = &en
			case cfg.CIDRMatch == config.MostSpecific && d.mostSpecific && en.p.Bits() > best.p.Bits():
				best = &en
			case (cfg.CIDRMatch != config.MostSpecific || !d.mostSpecific) && en.p.Bits() < best.p.Bits():
				best = &en
			}
		}
	}
	if cfg.CIDRMatch == config.MostSpecific && dec.mostSpecific {
		for i := range decisions {
			if decisions[i].mostSpecific {
				consider(&decisions[i])
			}
		}
	} else {
		consider(dec)
	}
	if best == nil {
		return fmt.Sprintf("%s (set element %s)", dec.key, rangeString(element))
	}
	var s string
	switch {
	case best.index >= 0 && best.defaults:
		s = fmt.Sprintf("%s[%d] %s (the default list)", best.key, best.index, best.p)
	case best.index >= 0:
		s = fmt.Sprintf("%s[%d] %s", best.key, best.index, best.p)
	case best.p == config.LinkLocalIPv4:
		s = fmt.Sprintf("link-local %s (%s: false)", best.p, config.KeyLinkLocal)
	case best.p == config.LinkLocalIPv6:
		s = fmt.Sprintf("link-local %s (%s: false)", best.p, config.KeyLinkLocal6)
	default:
		s = fmt.Sprintf("%s %s", best.key, best.p)
	}
	if cfg.CIDRMatch == config.MostSpecific && dec.mostSpecific {
		s += " (the most specific CIDR; cidrMatch: mostSpecific)"
	}
	if RangeOfPrefix(best.p) != element {
		s += fmt.Sprintf(" (set element %s)", rangeString(element))
	}
	return s
}

// isDefaultList reports whether a nonMasqueradeCIDRs list is one of the
// defaults (with or without --nomasq-all-reserved-ranges).
func isDefaultList(ps []netip.Prefix) bool {
	for _, r := range []bool{false, true} {
		if slices.Equal(ps, config.Default(config.Flags{NoMasqAllReservedRanges: r}).NonMasqueradeCIDRs) {
			return true
		}
	}
	return false
}

// ExplainTable says what the kernel's table, as Read returned it, does
// with a new connection p: its base chains hooked at nat postrouting are
// evaluated in priority order as the kernel would, expression by
// expression (the first chain that masquerades wins). isLocal says
// whether an address is one of the node's own (fib daddr type local); nil
// means none is.
func ExplainTable(t *Table, p Packet, isLocal func(netip.Addr) bool) Explanation {
	p = p.unmapped()
	local := isLocal != nil && isLocal(p.Dst)
	ev := t.evaluate(p, local, true)
	e := Explanation{Addr: p.Dst, From: p.Src}
	switch {
	case ev.dormant:
		e.Reason = "the table is dormant (flags dormant): it masquerades nothing"
		return e
	case ev.noBase:
		e.Reason = "the table has no chain hooked at nat postrouting: it masquerades nothing"
		return e
	}
	e.Reason, e.Rule = reason(ev.result, ev.base, local)
	switch ev.outcome {
	case outMasquerade:
		e.Masquerade = true
	case outUndetermined:
		e.Undetermined = true
	case outDrop:
		e.Reason = "dropped: " + e.Reason
	}
	return e
}

// reason describes a result: the deciding rule and why it matched.
func reason(r result, base string, local bool) (reason, rule string) {
	n := len(r.steps)
	if r.why != "" {
		if n == 0 {
			return r.why, ""
		}
		return r.why, r.steps[n-1].text
	}
	if n == 0 {
		if local {
			return "a local address of the node is never masqueraded (fib daddr type local)", ""
		}
		return "no rule of chain " + base + " matched", ""
	}
	d := r.steps[n-1]
	switch {
	case d.verdict == verdictMasquerade && n > 1 && r.steps[n-2].target == d.chain:
		d = r.steps[n-2] // the rule that sent it to the masquerade chain
	case r.outcome == outReturn && d.target != "":
		// fell off the end of the chain the last step jumped to
		return fmt.Sprintf("no rule of chain %s matched (after chain %s rule %d)", d.target, d.chain, d.index), d.text
	}
	where := fmt.Sprintf("chain %s rule %d", d.chain, d.index)
	if d.set != "" && d.notIn {
		return fmt.Sprintf("set %s does not hold it (%s)", d.set, where), d.text
	}
	if d.set != "" {
		return fmt.Sprintf("set %s holds %s (%s)", d.set, elementString(d.key, d.element), where), d.text
	}
	return where, d.text
}
