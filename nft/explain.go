package nft

import (
	"fmt"
	"net/netip"
	"slices"

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
	p = p.unmapped()
	e := Explanation{Addr: p.Dst, From: p.Src}
	t := Build(cfg, o)
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
	matched, _ := d.element.Prefix() // Build makes one range per prefix
	if dec := decisionOf(d.set); dec != nil {
		list := dec.list(cfg)
		e.Reason = source(dec.key, list, matched, dec.defaults && isDefaultList(list))
	} else {
		e.Reason = outbound + ": true (no other rule matched)"
	}
	return e
}

// source names the config entry behind a set element: the first entry of
// the list equal to it (normalization keeps, of nested entries, the
// widest, which is one of them), or the link-local default.
func source(key string, list []netip.Prefix, p netip.Prefix, defaults bool) string {
	for i, q := range list {
		q, _ = config.UnmapPrefix(q)
		if q.Masked() == p {
			if defaults {
				return fmt.Sprintf("%s[%d] %s (the default list)", key, i, p)
			}
			return fmt.Sprintf("%s[%d] %s", key, i, p)
		}
	}
	switch p {
	case config.LinkLocalIPv4:
		return fmt.Sprintf("link-local %s (%s: false)", p, config.KeyLinkLocal)
	case config.LinkLocalIPv6:
		return fmt.Sprintf("link-local %s (%s: false)", p, config.KeyLinkLocal6)
	}
	return fmt.Sprintf("%s %s", key, p)
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
	if d.set != "" {
		return fmt.Sprintf("set %s holds %s (%s)", d.set, rangeString(d.element), where), d.text
	}
	return where, d.text
}
