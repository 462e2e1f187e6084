package nft

import (
	"net/netip"
	"slices"
	"sort"

	"go4.org/netipx"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
)

// Prefix and interval math, once: config prefixes to the ranges of an
// interval set, ranges to the kernel's elements and back.

// splitFamilies also unmaps IPv4-mapped IPv6 prefixes (::ffff:10.0.0.0/104
// is 10.0.0.0/8), which the kernel would otherwise never match.
func splitFamilies(ps []netip.Prefix) (v4, v6 []netip.Prefix) {
	v4 = make([]netip.Prefix, 0, len(ps)+1) // room for link-local (decision.extra)
	for _, p := range ps {
		p, _ = config.UnmapPrefix(p)
		if p.Addr().Is4() {
			v4 = append(v4, p)
		} else {
			v6 = append(v6, p)
		}
	}
	return v4, v6
}

// Normalize returns the prefixes the kernel can take as one interval set:
// masked, sorted, without duplicates and without prefixes contained in
// others (the kernel rejects overlapping intervals with EEXIST for the
// whole batch). Adjacent prefixes are kept apart: one element per prefix,
// as the agent wrote them before it merged them (rangesOf); the bench
// measures that shape beside the merged one.
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

// rangesOf returns the ranges of an interval set that holds the prefixes
// (of one family): one per prefix, nested prefixes dropped, adjacent ones
// kept apart (paint says why). Every element costs the node's other nft
// users: nft reads every element of every interval set before a batch
// that adds or deletes one (docs/operation.md).
func rangesOf(ps []netip.Prefix) []Range {
	if !slices.ContainsFunc(ps, func(p netip.Prefix) bool { return !p.Addr().Is4() }) {
		return union4(ps)
	}
	return paint([]painted{ps})[0]
}

// union4 is rangesOf of the IPv4 prefixes of lists (IPv4-mapped ones
// unmapped, IPv6 ones left out), as integer math: each prefix its first
// and last address in one uint64, sorted (a list written in address
// order is sorted already), then nested ones dropped in one pass. A one-CIDR change
// of 100,000 rebuilds the set: paint, with netip.Addr and a stack, took
// 13 ms of the change's CPU, and the lists are not copied first.
func union4(lists ...[]netip.Prefix) []Range {
	n := 0
	for _, l := range lists {
		n += len(l)
	}
	keys := make([]uint64, 0, n)
	for _, l := range lists {
		for _, p := range l {
			p, _ = config.UnmapPrefix(p)
			if !p.Addr().Is4() {
				continue
			}
			a := p.Addr().As4()
			first := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
			first &^= uint32(uint64(1)<<(32-p.Bits()) - 1) // masked
			last := first | uint32(uint64(1)<<(32-p.Bits())-1)
			keys = append(keys, uint64(first)<<32|uint64(last))
		}
	}
	if !slices.IsSorted(keys) {
		slices.Sort(keys)
	}
	out := make([]Range, 0, len(keys))
	for i := 0; i < len(keys); {
		from, to := keys[i]>>32, keys[i]&0xffffffff
		// Take every prefix that starts within the range: nested in it
		// (prefixes nest or are disjoint); one right after it stays apart.
		for i++; i < len(keys) && keys[i]>>32 <= to; i++ {
			to = max(to, keys[i]&0xffffffff)
		}
		out = append(out, range4(uint32(from), uint32(to)))
	}
	return out
}

// joinAdjacent joins, in place, each range of sorted, disjoint ranges rs
// with the next when that starts right after it: one set, one decision,
// fewer elements (Options.MergeAdjacent).
func joinAdjacent(rs []Range) []Range {
	out := rs[:0]
	for _, r := range rs {
		if n := len(out); n > 0 && out[n-1].before(r) {
			out[n-1] = RangeFrom(out[n-1].From(), r.To())
			continue
		}
		out = append(out, r)
	}
	return out
}

// only6 returns the IPv6 prefixes of ps (IPv4-mapped ones are IPv4's).
func only6(ps []netip.Prefix) []netip.Prefix {
	var v6 []netip.Prefix
	for _, p := range ps {
		if p, _ = config.UnmapPrefix(p); !p.Addr().Is4() {
			v6 = append(v6, p)
		}
	}
	return v6
}

// prefixRanges returns one range per prefix, nested ones dropped and
// adjacent ones kept apart (Normalize).
func prefixRanges(ps []netip.Prefix) []Range {
	var out []Range
	for _, p := range Normalize(ps) {
		out = append(out, RangeOfPrefix(p))
	}
	return out
}

// painted is one list of a paint: its prefixes (of one family).
type painted []netip.Prefix

// paint returns, for lists of prefixes of one family, the disjoint ranges
// in which each list decides when the longest prefix holding an address
// decides (cidrMatch: mostSpecific; with one list, its union): the lists
// are painted by prefix length, longest last, and at one prefix an
// earlier list wins (masqueradeCIDRs before nonMasqueradeCIDRs, as under
// listOrder). Prefixes are nested or disjoint, so one sweep in address
// order with a stack of the open prefixes does it: the top, the
// innermost, decides.
//
// A range never spans two outermost prefixes: 10.0.0.0/24 and
// 10.0.1.0/24 stay two elements. Merged, adding or removing a prefix
// beside another would move the start element of the interval that holds
// the other's addresses, and the interval-set lookup of Linux before the
// array-based rbtree (2026, Linux 7.0; 5.10 to 6.12 measured) answers
// "not in the set" for such an address while the transaction commits
// (TestIntervalLookupDuringCommit): a packet to a destination that no
// change touched would be masqueraded. Apart, each listed prefix keeps its
// own start element, and the plan sends only the bounds that change
// (nft/kernel's sentBounds). Where the kernel's lookup is the array's
// (kernel.Netlink.IntervalLookup), Build joins them (Options.MergeAdjacent).
func paint(lists []painted) [][]Range {
	type entry struct {
		p    netip.Prefix
		list int
	}
	n := 0
	for _, l := range lists {
		n += len(l)
	}
	all := make([]entry, 0, n)
	for i, l := range lists {
		for _, p := range l {
			all = append(all, entry{p.Masked(), i})
		}
	}
	// By address, then outer first, then the winner of a tie last.
	slices.SortFunc(all, func(a, b entry) int {
		if c := comparePrefix(a.p, b.p); c != 0 {
			return c
		}
		return b.list - a.list
	})
	out := make([][]Range, len(lists))
	for i, l := range lists {
		// At most a range per prefix and per hole a longer one cuts: the
		// common case allocated once.
		out[i] = make([]Range, 0, len(l))
	}
	// root is the outermost open prefix (its index in all); lastRoot, that
	// of each list's last range: pieces of one root join, pieces of two
	// adjacent roots do not (see the comment of paint).
	root := -1
	lastRoot := make([]int, len(lists))
	// emit paints from-to (valid, from <= to) in list i.
	emit := func(i int, from, to netip.Addr) {
		if !from.IsValid() || from.Compare(to) > 0 {
			return
		}
		rs := out[i]
		if n := len(rs); n > 0 && rs[n-1].To().Next() == from && lastRoot[i] == root {
			rs[n-1] = RangeFrom(rs[n-1].From(), to)
			return
		}
		out[i], lastRoot[i] = append(rs, RangeFrom(from, to)), root
	}
	type open struct {
		last netip.Addr
		list int
	}
	var stack []open
	var at netip.Addr // the first address not painted yet (invalid: past the top)
	for k, e := range all {
		start := e.p.Addr()
		for len(stack) > 0 && stack[len(stack)-1].last.Less(start) {
			top := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			emit(top.list, at, top.last)
			at = top.last.Next()
		}
		if len(stack) > 0 && at.IsValid() && at.Less(start) {
			emit(stack[len(stack)-1].list, at, start.Prev())
		}
		if len(stack) == 0 {
			root = k
		}
		stack = append(stack, open{netipx.PrefixLastIP(e.p), e.list})
		at = start
	}
	for len(stack) > 0 {
		top := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if at.IsValid() && !top.last.Less(at) {
			emit(top.list, at, top.last)
			at = top.last.Next()
		}
	}
	return out
}

// diffRanges returns the ranges of old not in new and of new not in old;
// both inputs sorted.
func diffRanges(old, new []Range) (removed, added []Range) {
	// A change of a few CIDRs leaves long equal runs at both ends: skip
	// them by equality, cheaper than ordering (what the merge does to
	// equal elements).
	for len(old) > 0 && len(new) > 0 && old[0] == new[0] {
		old, new = old[1:], new[1:]
	}
	for len(old) > 0 && len(new) > 0 && old[len(old)-1] == new[len(new)-1] {
		old, new = old[:len(old)-1], new[:len(new)-1]
	}
	i, j := 0, 0
	for i < len(old) || j < len(new) {
		switch {
		case j == len(new) || (i < len(old) && compareRange(old[i], new[j]) < 0):
			removed = append(removed, old[i])
			i++
		case i == len(old) || compareRange(old[i], new[j]) > 0:
			added = append(added, new[j])
			j++
		default:
			i++
			j++
		}
	}
	return removed, added
}

// rangeString writes a range as nft lists it: an address, a prefix, or
// first-last.
func rangeString(r Range) string {
	if r.From() == r.To() {
		return r.From().String()
	}
	if p, ok := r.Prefix(); ok {
		return p.String()
	}
	return r.String()
}

// lookup returns the range of a sorted, disjoint list that holds addr.
func lookup(rs []Range, addr netip.Addr) (Range, bool) {
	i := sort.Search(len(rs), func(i int) bool { return rs[i].From().Compare(addr) > 0 })
	if i > 0 && rs[i-1].Contains(addr) {
		return rs[i-1], true
	}
	return Range{}, false
}

// Bounds are ranges as interval-set elements: the first address, and the
// address after the last flagged as interval end. A range that reaches
// the top of the address space (0.0.0.0/0, 240.0.0.0/4, ::/0) has no
// address after it and gets no end element, as nft does.
func Bounds(rs []Range) []Bound {
	out := make([]Bound, 0, 2*len(rs))
	for _, r := range rs {
		out = append(out, Bound{Addr: r.From()})
		if end := r.To().Next(); end.IsValid() {
			out = append(out, Bound{Addr: end, End: true})
		}
	}
	return out
}

// Bound is one element of an interval set as the kernel lists it.
type Bound struct {
	Addr netip.Addr
	End  bool // NFT_SET_ELEM_INTERVAL_END
}

// RangesFromBounds turns an interval set's elements into the ranges the
// kernel's lookup matches, and says what about them the agent would never
// write. The lookup finds the greatest element at or below an address
// (a start before an end at the same address): the address matches if
// that element is a start. So a range runs from a start to the next
// element: to the address before an end, as the agent writes them; to the
// address before the next start, when a start has no end (a foreign
// DELSETELEM of one end leaves that); to the top of the address space
// after the last start. An end with no start matches nothing; nft writes
// one at the lowest address, and any other is odd.
func RangesFromBounds(bs []Bound) (ranges []Range, odd []string) {
	slices.SortFunc(bs, func(x, y Bound) int {
		if c := x.Addr.Compare(y.Addr); c != 0 {
			return c
		}
		switch {
		case x.End == y.End:
			return 0
		case x.End:
			return -1
		}
		return 1
	})
	out := make([]Range, 0, len(bs)/2+1)
	var start netip.Addr
	open := false
	for i, b := range bs {
		switch {
		case !b.End && open:
			out = append(out, RangeFrom(start, b.Addr.Prev()))
			odd = append(odd, "an interval start without an end")
			start = b.Addr
		case !b.End:
			start, open = b.Addr, true
		case open:
			out = append(out, RangeFrom(start, b.Addr.Prev()))
			open = false
		case i > 0 || !b.Addr.IsUnspecified():
			odd = append(odd, "an interval end without a start")
		}
	}
	if open {
		last := netipx.PrefixLastIP(netip.PrefixFrom(netip.IPv4Unspecified(), 0))
		if start.Is6() {
			last = netipx.PrefixLastIP(netip.PrefixFrom(netip.IPv6Unspecified(), 0))
		}
		out = append(out, RangeFrom(start, last))
	}
	return out, odd
}
