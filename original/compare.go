package original

// What the switch from the original agent changes: per family, the exact
// destination ranges that the original's rules (as found in the kernel)
// and this agent (its config and flags, after the original's rules it
// takes over are removed) decide differently.
//
// Both sides decide by the destination alone, piecewise: the original's
// rules compare it with prefixes (nft.DaddrBounds), this agent's table
// looks it up in interval sets (Table.SetBounds). Between two consecutive
// bounds of either side every address is decided alike, so evaluating
// each interval's first address (ExplainOriginal, which walks the chains
// with nft.EvalChain; Table.Decider) decides the whole interval: exact,
// and as cheap as the bounds are few. A node's own addresses are never
// masqueraded by either (`addrtype ! --dst-type LOCAL` in the original's
// jump, `fib daddr type != local` in this agent's), so they are not
// compared.

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
	"go4.org/netipx"
)

// Decision is what a side does with new connections to a destination.
type Decision uint8

const (
	NotMasqueraded Decision = iota
	Masqueraded
	Undetermined // a rule matches on more than the destination
)

func (d Decision) String() string {
	switch d {
	case Masqueraded:
		return "masquerade"
	case Undetermined:
		return "undetermined"
	}
	return "not masqueraded"
}

// MaxExplained is how many differences carry the reasons of both sides.
const MaxExplained = 10

// Difference is a destination range decided differently.
type Difference struct {
	Family   nft.Family
	Range    netipx.IPRange
	Original Decision // under the original agent's rules
	Agent    Decision // once this agent has taken over
	// Fix names the flag or config key that would make them decide alike
	// ("" when none explains it).
	Fix string
	// OriginalWhy and AgentWhy say why, at the range's first address
	// (the first MaxExplained differences only).
	OriginalWhy, AgentWhy string
}

// FamilyName is "ipv4" or "ipv6".
func (d Difference) FamilyName() string { return Family{Family: d.Family}.MetricFamily() }

// RangeString is the range as a prefix when it is one, else FIRST-LAST.
func (d Difference) RangeString() string { return rangeText(d.Range) }

// String is one line: family, range, both decisions, the fix.
func (d Difference) String() string {
	s := fmt.Sprintf("%s %s: original: %s, this agent: %s", d.FamilyName(), d.RangeString(), d.Original, d.Agent)
	if d.Fix != "" {
		s += "; to keep the original's decision: " + d.Fix
	}
	return s
}

func rangeText(r netipx.IPRange) string {
	if p, ok := r.Prefix(); ok {
		return p.String()
	}
	return r.From().String() + "-" + r.To().String()
}

// Comparison is what the switch from the original agent changes.
type Comparison struct {
	// Found: the original agent's rules are in an iptables-nft nat table,
	// so there is a switch to compare.
	Found bool
	// Inexact: a rule of the original's compares the destination in a way
	// whose bounds are not known (a hand edit): ranges may be missing.
	Inexact     bool
	Differences []Difference // by family, then address
	// Kept are the original agent's entries of the families this agent
	// does not program (IPv6 without --enable-ipv6): they stay in place,
	// deciding as before (Rules.TakenOver).
	Kept []Family
	// Notes say what else the switch changes of what is masqueraded: the
	// source ports (the original's --to-ports, --random-fully).
	Notes []string

	inexact map[nft.Family]bool
	notes   map[nft.Family]int
}

// Others is, for a family, the changes besides its differing ranges: one
// for each note (source ports), and one when its comparison is inexact.
// Not 0 means the switch changes something there even when Count is 0.
func (c Comparison) Others(fam nft.Family) int {
	n := c.notes[fam]
	if c.inexact[fam] {
		n++
	}
	return n
}

// Count is the number of differing ranges of a family.
func (c Comparison) Count(fam nft.Family) int {
	n := 0
	for _, d := range c.Differences {
		if d.Family == fam {
			n++
		}
	}
	return n
}

// Key identifies the differences, to report them once until they change
// ("" only when the switch is known to change nothing).
func (c Comparison) Key() string {
	var b strings.Builder
	for _, d := range c.Differences {
		b.WriteString(d.String() + "\n")
	}
	for _, n := range c.Notes {
		b.WriteString(n + "\n")
	}
	if c.Inexact {
		// Not "no change": ranges may be missing.
		b.WriteString("inexact\n")
	}
	return b.String()
}

// Programs reports whether this agent programs a family (IPv4 always,
// IPv6 with --enable-ipv6): only then does it take the original's rules
// of that family over and remove them.
func Programs(fam nft.Family, opts nft.Options) bool { return fam == 4 || opts.EnableIPv6 }

// TakenOver is o with the entries of the families this agent programs
// only: the ones it may remove (Fingerprint, RemoveOriginal's families).
func (o Rules) TakenOver(opts nft.Options) Rules {
	return o.only(func(f Family) bool { return Programs(f.Family, opts) })
}

// KeptFamilies are the original agent's removable entries of the
// families this agent does not program.
func (o Rules) KeptFamilies(opts nft.Options) []Family {
	var out []Family
	for _, f := range o.Families {
		if o.Removable(f) && !Programs(f.Family, opts) {
			out = append(out, f)
		}
	}
	return out
}

func (o Rules) only(keep func(Family) bool) Rules {
	r := o
	r.Families = nil
	for _, f := range o.Families {
		if keep(f) {
			r.Families = append(r.Families, f)
		}
	}
	return r
}

// afterSwitch is o once this agent has removed what it takes over: the
// original's entries of the families it programs are gone (their
// exemptions stay: they are rules of nat POSTROUTING).
func (o Rules) afterSwitch(opts nft.Options) Rules {
	r := o
	r.Families = slices.Clone(o.Families)
	for i, f := range r.Families {
		if o.Removable(f) && Programs(f.Family, opts) {
			r.Families[i] = Family{Family: f.Family, Chain: f.Chain, Exemptions: f.Exemptions, first: -1}
		}
	}
	return r
}

// side is one side's decision on an interval.
type side struct {
	d       Decision
	decided bool // the original's rules decided (else this agent's table decides next)
	exempt  bool // a nat POSTROUTING rule accepts or returns it before the original's jump
}

// decide is what the rules do with a new connection to a (not local).
func (o Rules) decide(a netip.Addr) side {
	e, decided := o.ExplainOriginal(a, false)
	s := side{decided: decided}
	switch {
	case e.Undetermined:
		s.d = Undetermined
	case decided && e.Masquerade:
		s.d = Masqueraded
	case !decided && len(o.Jumped(familyOf(a))) > 0:
		for _, f := range o.Families {
			for _, x := range f.Exemptions {
				if f.Family == familyOf(a) && xtMatch(x, a, false) == nft.MatchYes {
					s.exempt = true
				}
			}
		}
	}
	return s
}

func familyOf(a netip.Addr) nft.Family {
	if a.Unmap().Is6() {
		return 6
	}
	return 4
}

// bounds are the destination bounds of every rule of a family's entries.
func (o Rules) bounds(fam nft.Family) (out []netip.Addr, exact bool) {
	exact = true
	for _, f := range o.Families {
		if f.Family != fam {
			continue
		}
		for _, rs := range [][]XTRule{f.Exemptions, f.Jumps, f.Rules} {
			for _, r := range rs {
				b, ok := nft.DaddrBounds(r.exprs, fam)
				out, exact = append(out, b...), exact && ok
			}
		}
	}
	return out, exact
}

// piece is a side's decision from start to the next piece's start.
type piece[T any] struct {
	start netip.Addr
	v     T
}

// piecewise evaluates f at each bound (sorted, unique, with the family's
// first address).
func piecewise[T any](bounds []netip.Addr, f func(netip.Addr) T) []piece[T] {
	out := make([]piece[T], len(bounds))
	for i, b := range bounds {
		out[i] = piece[T]{b, f(b)}
	}
	return out
}

// sortedBounds sorts and dedups bounds, with the family's first address.
func sortedBounds(fam nft.Family, bs ...[]netip.Addr) []netip.Addr {
	first := netip.IPv4Unspecified()
	if fam == 6 {
		first = netip.IPv6Unspecified()
	}
	out := []netip.Addr{first}
	for _, b := range bs {
		for _, a := range b {
			if familyOf(a) == fam {
				out = append(out, a.Unmap())
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// at returns the value of the piece holding a; ps sorted, *i advanced
// (addresses asked in order).
func at[T any](ps []piece[T], i *int, a netip.Addr) T {
	for *i+1 < len(ps) && ps[*i+1].start.Compare(a) <= 0 {
		*i++
	}
	return ps[*i].v
}

// Compare computes what the switch from the original agent's rules o to
// this agent's config cfg (read with flags) and options changes: per
// family, the ranges the original's rules and this agent, once it has
// removed what it takes over, decide differently, each with the flag or
// key that would make them decide alike. Nothing is compared when o holds
// none of the original agent's rules.
func Compare(o Rules, cfg config.Config, flags config.Flags, opts nft.Options) Comparison {
	var c Comparison
	for _, f := range o.Families {
		c.Found = c.Found || o.Removable(f)
	}
	if !c.Found {
		return c
	}
	c.Kept = o.KeptFamilies(opts)
	after := o.afterSwitch(opts)
	// The original decides by destination alone; so does this agent for
	// traffic that no source key singles out (the keys the original does
	// not have): that is what is compared.
	cfg = cfg.DestinationOnly()
	want := nft.Build(cfg, opts)
	decide := want.Decider()
	h := newHints(o, cfg, flags, opts, want)
	for _, fam := range []nft.Family{4, 6} {
		// A family without the original's rules was left alone by it
		// only when it ran (IPv4 has them: the original always writes
		// IPv4's); else they are gone already, and so is the switch.
		if !o.Removes(fam) && !(fam == 6 && o.Removes(4)) {
			continue
		}
		ob, exact := o.bounds(fam)
		c.Inexact = c.Inexact || !exact
		if !exact {
			if c.inexact == nil {
				c.inexact = map[nft.Family]bool{}
			}
			c.inexact[fam] = true
		}
		ob = sortedBounds(fam, ob, h.bounds(fam))
		before := piecewise(ob, o.decide)
		afterOrig := piecewise(ob, after.decide)
		ours := piecewise(sortedBounds(fam, want.SetBounds(fam)), func(a netip.Addr) Decision {
			if m, _ := decide(nft.Packet{Dst: a}); m {
				return Masqueraded
			}
			return NotMasqueraded
		})
		all := sortedBounds(fam, ob, want.SetBounds(fam))
		var ib, ia, io int
		var cur *Difference
		for i, p := range all {
			var iv netipx.IPRange // from p to the next bound
			if i+1 < len(all) {
				iv = netipx.IPRangeFrom(p, all[i+1].Prev())
			} else {
				iv = netipx.IPRangeFrom(p, netipx.RangeOfPrefix(netip.PrefixFrom(p, 0)).To())
			}
			b, a, w := at(before, &ib, p), at(afterOrig, &ia, p), at(ours, &io, p)
			now := w
			if a.decided {
				now = a.d
			}
			if b.d == now {
				cur = nil
				continue
			}
			fix := h.fix(fam, iv, b, now, a.decided)
			if cur != nil && cur.Original == b.d && cur.Agent == now && cur.Fix == fix {
				cur.Range = netipx.IPRangeFrom(cur.Range.From(), iv.To())
				continue
			}
			c.Differences = append(c.Differences, Difference{Family: fam, Range: iv, Original: b.d, Agent: now, Fix: fix})
			cur = &c.Differences[len(c.Differences)-1]
		}
	}
	for _, fam := range []nft.Family{4, 6} {
		if Programs(fam, opts) {
			notes := o.masqNotes(fam, opts)
			c.Notes = append(c.Notes, notes...)
			if len(notes) > 0 {
				if c.notes == nil {
					c.notes = map[nft.Family]int{}
				}
				c.notes[fam] += len(notes)
			}
		}
	}
	explain := want.Explainer(cfg, opts)
	for i := range c.Differences {
		d := &c.Differences[i]
		d.Fix = h.fixText(d.Fix, *d)
		if i >= MaxExplained {
			continue
		}
		a := d.Range.From()
		e, _ := o.ExplainOriginal(a, false)
		d.OriginalWhy = e.Reason
		if d.OriginalWhy == "" {
			d.OriginalWhy = "no rule of the original agent's in table " + Family{Family: d.Family}.Table() + ": it left " + d.FamilyName() + " alone"
		}
		if ea, decided := after.ExplainOriginal(a, false); decided {
			d.AgentWhy = ea.Reason
		} else {
			d.AgentWhy = explain(nft.Packet{Dst: a}).Reason
		}
	}
	return c
}

// At is what the switch changes at one address a (not local), decided
// at a alone: exact where Compare is not (Comparison.Inexact), for
// explain --live. The difference's range is a alone; it has no fix.
func At(o Rules, cfg config.Config, flags config.Flags, opts nft.Options, a netip.Addr) (Difference, bool) {
	a = a.Unmap()
	fam := familyOf(a)
	found := false
	for _, f := range o.Families {
		found = found || o.Removable(f)
	}
	if !found || !o.Removes(fam) && !(fam == 6 && o.Removes(4)) {
		return Difference{}, false
	}
	before := o.decide(a).d
	now := o.afterSwitch(opts).decide(a)
	if !now.decided {
		now.d = NotMasqueraded
		if m, _ := nft.Build(cfg.DestinationOnly(), opts).Decider()(nft.Packet{Dst: a}); m {
			now.d = Masqueraded
		}
	}
	if before == now.d {
		return Difference{}, false
	}
	return Difference{Family: fam, Range: netipx.IPRangeFrom(a, a), Original: before, Agent: now.d}, true
}

// masqNotes compare the source ports of the original's MASQUERADE in
// family fam (its --to-ports and --random-fully) with this agent's.
func (o Rules) masqNotes(fam nft.Family, opts nft.Options) []string {
	ports, random, ok := o.masqOptions(fam)
	if !ok {
		return nil
	}
	name := Family{Family: fam}.MetricFamily()
	var out []string
	theirs := slices.Clone(opts.ToPorts)
	slices.SortFunc(theirs, func(a, b nft.PortRange) int { return int(a.First) - int(b.First) })
	if !slices.Equal(theirs, ports) {
		want := "no --to-ports"
		if len(ports) > 0 {
			want = "--to-ports=" + strings.TrimPrefix(portsWord(ports), "ports ")
		}
		out = append(out, fmt.Sprintf("%s masquerade source ports: the original's MASQUERADE used %s, this agent %s; to keep them: %s",
			name, portsWord(ports), portsWord(opts.ToPorts), want))
	}
	if random != opts.RandomFully {
		out = append(out, fmt.Sprintf("%s masquerade source ports: the original's MASQUERADE ran with --random-fully=%v, this agent with --random-fully=%v; to keep it: --random-fully=%v",
			name, random, opts.RandomFully, random))
	}
	return out
}

func portsWord(ps []nft.PortRange) string {
	if len(ps) == 0 {
		return "any port"
	}
	var w []string
	for _, p := range ps {
		w = append(w, p.String())
	}
	return "ports " + strings.Join(w, ",")
}

// masqOptions are the source ports of the MASQUERADE targets of the
// first of the original's chains of family fam (its --to-ports: one rule
// per protocol and range, each range once, sorted) and the fully-random
// flag of its last MASQUERADE (the catch-all); ok is false when there is
// none, or an encoding is not known here.
func (o Rules) masqOptions(fam nft.Family) (ports []nft.PortRange, random, ok bool) {
	for _, f := range o.Jumped(fam) {
		if !o.Removable(*f) {
			continue
		}
		for _, r := range f.Rules {
			for _, e := range r.exprs {
				t, isT := e.(*expr.Target)
				if !isT || t.Name != "MASQUERADE" {
					continue
				}
				var flags uint
				var lo, hi uint16
				switch i := t.Info.(type) {
				case *xt.NatIPv4MultiRangeCompat: // IPv4: struct nf_nat_ipv4_multi_range_compat
					if len(*i) != 1 {
						return nil, false, false
					}
					flags, lo, hi = (*i)[0].Flags, (*i)[0].MinPort, (*i)[0].MaxPort
				case *xt.Unknown: // IPv6: struct nf_nat_range (flags, 2 addresses, 2 ports)
					if len(*i) != 40 {
						return nil, false, false
					}
					b := []byte(*i)
					flags = uint(binary.NativeEndian.Uint32(b[:4]))
					lo, hi = binary.BigEndian.Uint16(b[36:38]), binary.BigEndian.Uint16(b[38:40])
				default:
					return nil, false, false
				}
				ok, random = true, flags&uint(xt.NatRangeProtoRandomFully) != 0
				if p := (nft.PortRange{First: lo, Last: hi}); flags&uint(xt.NatRangeProtoSpecified) != 0 && !slices.Contains(ports, p) {
					ports = append(ports, p)
				}
			}
		}
		break
	}
	slices.SortFunc(ports, func(a, b nft.PortRange) int { return int(a.First) - int(b.First) })
	return ports, random, ok
}

// Fix kinds: what explains a difference (fixText words them).
const (
	fixIPv6      = "--enable-ipv6"
	fixLinkLocal = "link-local"
	fixReserved  = "--nomasq-all-reserved-ranges"
	fixExemption = "exemption"
	fixMasqCIDRs = config.KeyMasq
	fixMissing   = "missing"
	fixExtra     = "extra"
	fixOutBound  = "outbound"
	fixNone      = ""
)

// hints are what the fixes are told by.
type hints struct {
	cfg        config.Config
	flags      config.Flags
	opts       nft.Options
	orig6      bool // the original has rules in table ip6 nat
	defaultNon bool // nonMasqueradeCIDRs is the default list (the file sets none)
	// origReserved: the original's rules exempt (1) or masquerade (2)
	// every reserved range that --nomasq-all-reserved-ranges adds; 0: neither.
	origReserved int
	reserved     netipx.IPSet
	masq         ranges // this agent's sets, merged
	nonMasq      ranges
}

// ranges are sorted, disjoint and apart.
type ranges []netipx.IPRange

// contains reports whether r lies within one of them.
func (rs ranges) contains(r netipx.IPRange) bool {
	i, _ := slices.BinarySearchFunc(rs, r.From(), func(x netipx.IPRange, a netip.Addr) int { return x.From().Compare(a) })
	if i == len(rs) || rs[i].From() != r.From() {
		i--
	}
	return i >= 0 && r.To().Compare(rs[i].To()) <= 0
}

func newHints(o Rules, cfg config.Config, flags config.Flags, opts nft.Options, want nft.Table) *hints {
	h := &hints{cfg: cfg, flags: flags, opts: opts, orig6: len(o.Jumped(6)) > 0}
	h.defaultNon = slices.Equal(cfg.NonMasqueradeCIDRs, config.Default(flags).NonMasqueradeCIDRs)
	for _, s := range want.Sets {
		into := &h.nonMasq
		masq, ok := nft.DaddrSet(s.Name)
		if !ok {
			continue
		} else if masq {
			into = &h.masq
		}
		for _, r := range s.Merged() {
			*into = append(*into, r.IPRange())
		}
	}
	for _, rs := range []ranges{h.masq, h.nonMasq} {
		slices.SortFunc(rs, func(a, b netipx.IPRange) int { return a.From().Compare(b.From()) })
	}
	var r netipx.IPSetBuilder
	with := config.Default(config.Flags{NoMasqAllReservedRanges: true}).NonMasqueradeCIDRs
	without := config.Default(config.Flags{}).NonMasqueradeCIDRs
	for _, p := range with {
		if !slices.Contains(without, p) {
			r.AddPrefix(p)
		}
	}
	h.reserved = must(r.IPSet())
	exempt, masq := true, true
	for _, r := range h.reserved.Ranges() {
		s := o.decide(r.From())
		exempt = exempt && s.d == NotMasqueraded && !s.exempt
		masq = masq && s.d == Masqueraded
	}
	switch {
	case exempt:
		h.origReserved = 1
	case masq:
		h.origReserved = 2
	}
	return h
}

func must(s *netipx.IPSet, _ error) netipx.IPSet { return *s }

// bounds split the ranges the fixes speak of from their neighbours.
func (h *hints) bounds(fam nft.Family) []netip.Addr {
	var out []netip.Addr
	ll := config.LinkLocalIPv4
	if fam == 6 {
		ll = config.LinkLocalIPv6
	}
	for _, r := range append(h.reserved.Ranges(), netipx.RangeOfPrefix(ll)) {
		out = append(out, r.From())
		if n := r.To().Next(); n.IsValid() {
			out = append(out, n)
		}
	}
	return out
}

// fix says what explains a differing interval r (within which every
// address is decided alike, and the hints' ranges are whole).
func (h *hints) fix(fam nft.Family, r netipx.IPRange, before side, now Decision, remaining bool) string {
	ll := config.LinkLocalIPv4
	if fam == 6 {
		ll = config.LinkLocalIPv6
	}
	switch {
	case before.d == Undetermined || now == Undetermined || remaining:
		return fixNone
	case fam == 6 && !h.orig6 && h.opts.EnableIPv6:
		return fixIPv6
	case ll.Contains(r.From()):
		return fixLinkLocal
	case before.exempt && now == Masqueraded:
		return fixExemption
	case fam == 4 && h.defaultNon && h.reserved.ContainsRange(r) &&
		(h.origReserved == 1 && !h.flags.NoMasqAllReservedRanges || h.origReserved == 2 && h.flags.NoMasqAllReservedRanges):
		return fixReserved
	case now == Masqueraded && h.masq.contains(r):
		return fixMasqCIDRs
	case now == Masqueraded:
		return fixMissing
	case h.nonMasq.contains(r):
		return fixExtra
	}
	return fixOutBound
}

// fixText words a fix for a merged difference.
func (h *hints) fixText(kind string, d Difference) string {
	cidrs := prefixesText(d.Range)
	switch kind {
	case fixIPv6:
		return "no --enable-ipv6 (the original ran without it and left IPv6 alone)"
	case fixLinkLocal:
		key := config.KeyLinkLocal
		if d.Family == 6 {
			key = config.KeyLinkLocal6
		}
		return fmt.Sprintf("%s: %v", key, d.Original == Masqueraded)
	case fixReserved:
		if h.flags.NoMasqAllReservedRanges {
			return "no " + fixReserved + " (the original ran without it)"
		}
		return fixReserved + " (the original ran with it)"
	case fixExemption:
		return config.KeyNonMasq + ": add " + cidrs + " (a rule in nat POSTROUTING exempts it before the original's jump; this agent's table runs after it all the same)"
	case fixMasqCIDRs:
		return config.KeyMasq + ": remove " + cidrs + " (the original has no such key)"
	case fixMissing:
		return config.KeyNonMasq + ": add " + cidrs
	case fixExtra:
		return config.KeyNonMasq + ": remove " + cidrs
	case fixOutBound:
		key := config.KeyOutBound
		if d.Family == 6 {
			key = config.KeyOutBound6
		}
		return key + ": true"
	}
	return ""
}

// prefixesText is a range as its prefixes, at most four, then a count.
func prefixesText(r netipx.IPRange) string {
	ps := r.Prefixes()
	var w []string
	for i, p := range ps {
		if i == 4 {
			w = append(w, fmt.Sprintf("and %d more", len(ps)-4))
			break
		}
		w = append(w, p.String())
	}
	return strings.Join(w, ", ")
}

// Summary lists the differences for a log line: at most max, then a count.
func (c Comparison) Summary(max int) []string {
	var out []string
	for i, d := range c.Differences {
		if i == max {
			out = append(out, fmt.Sprintf("and %d more ranges (ip-masq-agent diff --decisions lists them all)", len(c.Differences)-max))
			break
		}
		out = append(out, d.String())
	}
	return out
}
