package kernel

import (
	"go4.org/netipx"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// The interval-set lookups of Linux (nft_set_rbtree), as IntervalLookup
// learns them.
const (
	lookupUnknown = iota
	// lookupTree walks the tree of elements, locklessly, and may answer
	// "not in the set" while a transaction adds or deletes the start
	// element of an address's interval (TestIntervalLookupDuringCommit).
	lookupTree
	// lookupArray searches a sorted array of the intervals built at each
	// commit ("nft_set_rbtree: translate rbtree to array for binary
	// search", nf-next 2026-01-22: Linux 7.0, 6.18.14, 6.19.4): a packet
	// sees the set as it was before a transaction or after it.
	lookupArray
)

// IntervalLookup says whether the kernel's interval sets look up in an
// array built at each commit (array), from its answer to one get on
// table t, as this Netlink last read or wrote it: the start of an
// isolated interval of one of t's address sets, asked with the
// interval-end flag. The tree's get answers with the start element itself
// (an exact key match, whatever the flag), the array's with the end
// element of the interval that holds the key. known is false when t has
// no such interval, or the answer is neither (the set is not t's); once
// known, the answer is kept (a kernel does not change under a process).
func (n *Netlink) IntervalLookup(t *nft.Table) (array, known bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lookup != lookupUnknown || t == nil {
		return n.lookup == lookupArray, n.lookup != lookupUnknown
	}
	set, r, ok := isolatedInterval(t)
	if !ok {
		return false, false
	}
	conn, err := n.reader()
	if err != nil {
		return false, false
	}
	ask := []nft.Bound{{Addr: r.From(), End: true}}
	if ok, err := endGetsSafe(conn, set, ask); !ok || err != nil {
		return false, false
	}
	got, found, plain, err := getBounds(conn, set, ask)
	if err != nil || !plain || !found[0] {
		return false, false
	}
	switch got[0] {
	case nft.Bound{Addr: r.From()}:
		n.lookup = lookupTree
	case nft.Bound{Addr: r.To().Next(), End: true}:
		n.lookup = lookupArray
	default:
		return false, false
	}
	n.debug("learnt the kernel's interval-set lookup from its answer to a get", "set", set, "asked", r.From(), "answer", got[0].Addr, "array", n.lookup == lookupArray)
	return n.lookup == lookupArray, true
}

// isolatedInterval returns an element of one of t's address sets that ends
// below the top of the address space and touches no other: the one
// interval that holds its start, whichever lookup asks.
func isolatedInterval(t *nft.Table) (string, netipx.IPRange, bool) {
	for _, s := range t.Sets {
		if s.Key == nft.KeyIfname || s.Odd != "" {
			continue
		}
		for i, r := range s.Elements {
			end := r.To().Next()
			if !end.IsValid() ||
				i > 0 && s.Elements[i-1].To().Next() == r.From() ||
				i+1 < len(s.Elements) && s.Elements[i+1].From() == end {
				continue
			}
			return s.Name, r, true
		}
	}
	return "", netipx.IPRange{}, false
}
