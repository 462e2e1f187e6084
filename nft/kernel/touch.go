package kernel

import (
	"encoding/binary"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// touch is what transactions of other processes did to the table, as
// their notifications name it: the read that follows reads those parts
// again rather than the whole table (reread).
type touch struct {
	whole  bool              // something no notification names closely (the table, an object): read it all
	sets   map[string]bool   // sets added or deleted, or elements no notification says: read whole, with their elements
	chains map[string]bool   // chains added or deleted, or their rules changed: read with their rules
	elems  map[string][]elem // elements added or deleted, by set, in the notifications' order: those asked of the kernel
}

// elem is one element a notification names: added, or deleted.
type elem struct {
	nft.Bound
	add bool
}

// any reports whether anything was touched.
func (t touch) any() bool { return t.whole || len(t.sets)+len(t.chains)+len(t.elems) > 0 }

// note adds one notification of the table's (typ, payload after the
// netlink header).
func (t *touch) note(typ int, data []byte) {
	name := func(attr uint16) string {
		var s string
		walkAttrs(data[4:], func(typ uint16, v []byte) bool {
			if typ == attr {
				s = strings.TrimRight(string(v), "\x00")
				return false
			}
			return true
		})
		return s
	}
	add := func(m *map[string]bool, s string) {
		if s == "" {
			t.whole = true
			return
		}
		if *m == nil {
			*m = map[string]bool{}
		}
		(*m)[s] = true
	}
	switch typ {
	case unix.NFT_MSG_NEWSET, unix.NFT_MSG_DELSET:
		add(&t.sets, name(unix.NFTA_SET_NAME))
	case unix.NFT_MSG_NEWCHAIN, unix.NFT_MSG_DELCHAIN:
		add(&t.chains, name(unix.NFTA_CHAIN_NAME))
	case unix.NFT_MSG_NEWRULE, unix.NFT_MSG_DELRULE:
		add(&t.chains, name(unix.NFTA_RULE_CHAIN))
	case unix.NFT_MSG_NEWSETELEM, unix.NFT_MSG_DELSETELEM:
		set := name(unix.NFTA_SET_ELEM_LIST_SET)
		bs, ok := notifiedBounds(data)
		if !ok {
			add(&t.sets, set) // read that set whole (no set named: the table)
			return
		}
		if t.elems == nil {
			t.elems = map[string][]elem{}
		}
		for _, b := range bs {
			t.elems[set] = append(t.elems[set], elem{b, typ == unix.NFT_MSG_NEWSETELEM})
		}
	default: // the table itself, objects, flowtables
		t.whole = true
	}
}

// notifiedBounds reads the elements of an element notification as
// bounds; false when there are none or one is not a plain bound (a
// catch-all element, a range as one element, data, a timeout, a comment,
// expressions): the agent writes none of those, and only a whole read of
// the set says what they are.
func notifiedBounds(data []byte) ([]nft.Bound, bool) {
	var out []nft.Bound
	plain := true
	ok := walkAttrs(data[4:], func(typ uint16, list []byte) bool {
		if typ != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			return true
		}
		return walkAttrs(list, func(_ uint16, e []byte) bool {
			var b nft.Bound
			walkAttrs(e, func(typ uint16, v []byte) bool {
				switch typ {
				case unix.NFTA_SET_ELEM_KEY:
					b.Addr = dataValue(v)
				case unix.NFTA_SET_ELEM_FLAGS:
					b.End = len(v) == 4 && binary.BigEndian.Uint32(v)&unix.NFT_SET_ELEM_INTERVAL_END != 0
					plain = plain && len(v) == 4 && binary.BigEndian.Uint32(v)&^unix.NFT_SET_ELEM_INTERVAL_END == 0
				default:
					plain = false
				}
				return true
			})
			if !b.Addr.IsValid() {
				plain = false
			}
			out = append(out, b)
			return true
		})
	})
	return out, ok && plain && len(out) > 0
}

// rereadOf is what a read of the touched parts read (for the log and the
// tests): sets read whole, chains read with their rules, elements asked
// of the kernel one by one.
type rereadOf struct {
	sets, chains []string
	elements     int
}

// reread reads again the parts of table last that foreign transactions
// touched, and returns last with them as the kernel holds them now; false
// when what was touched cannot be read in parts (read the table whole).
func reread(conn transport, ours uint32, last *nft.Table, t touch) (*nft.Table, rereadOf, bool, error) {
	var did rereadOf
	if t.whole || last.Owner != nft.NotOwned {
		return nil, did, false, nil
	}
	out := last.Clone()
	sets := maps.Clone(t.sets)
	if sets == nil {
		sets = map[string]bool{}
	}
	// The elements the notifications name are asked of the kernel one by
	// one (rereadElements); a set whose elements cannot be is read whole.
	for _, name := range slices.Sorted(maps.Keys(t.elems)) {
		if sets[name] {
			continue
		}
		i := slices.IndexFunc(out.Sets, func(s nft.Set) bool { return s.Name == name })
		if i < 0 {
			sets[name] = true
			continue
		}
		n, ok, err := rereadElements(conn, &out.Sets[i], t.elems[name])
		if err != nil {
			return nil, did, false, err
		}
		did.elements += n
		if !ok {
			sets[name] = true
		}
	}
	for _, name := range slices.Sorted(maps.Keys(sets)) {
		s, found, err := getSet(conn, name)
		if err != nil {
			return nil, did, false, err
		}
		did.sets = append(did.sets, name)
		i := slices.IndexFunc(out.Sets, func(s nft.Set) bool { return s.Name == name })
		switch {
		case found && i >= 0:
			out.Sets[i] = s
		case found:
			out.Sets = append(out.Sets, s)
		case i >= 0:
			out.Sets = slices.Delete(out.Sets, i, i+1)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(t.chains)) {
		c, found, err := getChain(conn, name)
		if err != nil {
			return nil, did, false, err
		}
		did.chains = append(did.chains, name)
		i := slices.IndexFunc(out.Chains, func(c nft.Chain) bool { return c.Name == name })
		switch {
		case found && i >= 0:
			out.Chains[i] = c
		case found:
			out.Chains = append(out.Chains, c)
		case i >= 0:
			out.Chains = slices.Delete(out.Chains, i, i+1)
		}
	}
	// The table's own count of what it holds says whether the parts make
	// the whole.
	head, err := readHead(conn, ours)
	if err != nil || head == nil || head.Owner != nft.NotOwned ||
		head.Use != uint32(len(out.Sets)+len(out.Chains)+len(out.Objects)) {
		return nil, did, false, err
	}
	out.Dormant, out.Persist, out.Use = head.Dormant, head.Persist, head.Use
	return out, did, true, nil
}

// rereadElements puts into set s (as last read, whole or in parts) what
// the notified element operations did, in their order, and verifies it:
// each element they name is asked of the kernel (getElements), which must
// hold exactly those of them that s now holds. It returns how many it
// asked; false: s is left as it was, and the set is to be read whole.
//
// The elements no notification names are as the last read found them:
// the monitor saw every transaction since (no loss, no generation gap;
// else the caller reads whole). A get is no reader of an interval set:
// it answers with what the kernel's walk finds near the key, which beside
// a foreign lone start or end (two elements at one address) need not be
// the element asked for, although the kernel holds it. So the answers
// only check what the notifications say: an element s holds must be
// answered exactly; any answer but that one for an element s does not
// hold. A mismatch, in either direction, reads the set whole.
func rereadElements(conn transport, s *nft.Set, ops []elem) (int, bool, error) {
	if s.Odd != "" {
		// Its elements as the model holds them are not the kernel's
		// bounds (nft.Bounds would invent some): read it whole.
		return 0, false, nil
	}
	var asked []nft.Bound
	seen := map[nft.Bound]bool{}
	for _, op := range ops {
		if !seen[op.Bound] {
			seen[op.Bound] = true
			asked = append(asked, op.Bound)
		}
	}
	if len(asked) > maxElementGets {
		return 0, false, nil
	}
	elements, odd, held := applyElems(s.Elements, ops)
	for start := 0; start < len(asked); start += elementGetsPerDatagram {
		part := asked[start:min(start+elementGetsPerDatagram, len(asked))]
		got, plain, err := getElements(conn, s.Name, part)
		if err != nil || !plain {
			return start + len(part), false, err
		}
		for i, b := range part {
			if got[i] != held[b] {
				return start + len(part), false, nil
			}
		}
	}
	s.Elements, s.Odd = elements, joinUnique(odd)
	return len(asked), true, nil
}

// applyElems returns the ranges that sorted, disjoint ranges rs (a set's
// elements with no odd shape: nft.Bounds gives the kernel's bounds) make
// after the element operations ops, in their order, as nft.RangesFromBounds
// reads the bounds, with what is odd about them, and whether each bound
// ops name is held after them. Only the ranges around each bound named are
// computed again (the first range whose end is at it or above, and the
// next, which closes a start left open; one more on each side, for
// margin): RangesFromBounds reads bounds in order, and enters such a
// window with no interval open. The rest of a set of 100,000 is copied,
// not taken apart (that costs a few hundred ms of CPU).
func applyElems(rs []nft.Range, ops []elem) ([]nft.Range, []string, map[nft.Bound]bool) {
	type window struct {
		lo, hi int
		addrs  map[netip.Addr]bool
	}
	var addrs []netip.Addr
	for _, op := range ops {
		addrs = append(addrs, op.Addr)
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	addrs = slices.Compact(addrs)
	var ws []window
	for _, a := range addrs {
		// The first range whose end bound (the address after its last) is
		// a or above: those before it end below a.
		j, _ := slices.BinarySearchFunc(rs, a, func(r nft.Range, a netip.Addr) int {
			if end := r.To().Next(); end.IsValid() && end.Less(a) {
				return -1
			}
			return 1
		})
		lo, hi := max(j-1, 0), min(j+3, len(rs))
		if n := len(ws); n > 0 && lo <= ws[n-1].hi {
			ws[n-1].hi = max(ws[n-1].hi, hi)
			ws[n-1].addrs[a] = true
			continue
		}
		ws = append(ws, window{lo: lo, hi: hi, addrs: map[netip.Addr]bool{a: true}})
	}
	out := make([]nft.Range, 0, len(rs)+len(addrs))
	var odd []string
	held := map[nft.Bound]bool{}
	next := 0
	for _, w := range ws {
		out = append(out, rs[next:w.lo]...)
		bs := map[nft.Bound]bool{}
		for _, b := range nft.Bounds(rs[w.lo:w.hi]) {
			bs[b] = true
		}
		for _, op := range ops {
			if !w.addrs[op.Addr] {
				continue
			}
			if op.add {
				bs[op.Bound] = true
			} else {
				delete(bs, op.Bound)
			}
		}
		for _, op := range ops {
			if w.addrs[op.Addr] {
				held[op.Bound] = bs[op.Bound]
			}
		}
		got, shape := nft.RangesFromBounds(slices.Collect(maps.Keys(bs)))
		out = append(out, got...)
		odd = append(odd, shape...)
		next = w.hi
	}
	return append(out, rs[next:]...), odd, held
}

// getSet reads one set with its elements; found false: there is none.
func getSet(conn transport, name string) (nft.Set, bool, error) {
	msgs, err := get(unix.NFT_MSG_GETSET,
		attr(unix.NFTA_SET_TABLE, cstring(nft.TableName)), attr(unix.NFTA_SET_NAME, cstring(name))).ask(conn)
	switch {
	case absent(err):
		return nft.Set{}, false, nil
	case err != nil:
		return nft.Set{}, false, err
	case len(msgs) != 1:
		return nft.Set{}, false, fmt.Errorf("get set %s: %d answers", name, len(msgs))
	}
	s, err := decodeSet(conn, msgs[0])
	return s, err == nil, err
}

// getChain reads one chain with its rules; found false: there is none.
func getChain(conn transport, name string) (nft.Chain, bool, error) {
	msgs, err := get(unix.NFT_MSG_GETCHAIN,
		attr(unix.NFTA_CHAIN_TABLE, cstring(nft.TableName)), attr(unix.NFTA_CHAIN_NAME, cstring(name))).ask(conn)
	switch {
	case absent(err):
		return nft.Chain{}, false, nil
	case err != nil:
		return nft.Chain{}, false, err
	case len(msgs) != 1:
		return nft.Chain{}, false, fmt.Errorf("get chain %s: %d answers", name, len(msgs))
	}
	c, table, err := decodeChain(msgs[0])
	if err != nil {
		return nft.Chain{}, false, err
	}
	if table != nft.TableName {
		return nft.Chain{}, false, fmt.Errorf("get chain %s: the answer is of table %s", name, table)
	}
	msgs, err = dump(unix.NFT_MSG_GETRULE,
		attr(unix.NFTA_RULE_TABLE, cstring(nft.TableName)), attr(unix.NFTA_RULE_CHAIN, cstring(name))).ask(conn)
	if err != nil {
		return nft.Chain{}, false, err
	}
	rules, err := decodeRules(msgs)
	if err != nil {
		return nft.Chain{}, false, err
	}
	c.Rules = rules[name]
	return c, true, nil
}
