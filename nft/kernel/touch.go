package kernel

import (
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// touch is what transactions of other processes did to the table, as
// their notifications name it: the read that follows reads those parts
// again rather than the whole table (reread).
type touch struct {
	whole  bool                   // something no notification names closely (the table, an object): read it all
	sets   map[string]bool        // sets added or deleted: read whole, with their elements
	chains map[string]bool        // chains added or deleted, or their rules changed: read with their rules
	bounds map[string][]nft.Bound // elements added or deleted, by set: the set is read whole
}

// any reports whether anything was touched.
func (t touch) any() bool { return t.whole || len(t.sets)+len(t.chains)+len(t.bounds) > 0 }

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
		if set == "" || !ok {
			t.whole = true
			return
		}
		if t.bounds == nil {
			t.bounds = map[string][]nft.Bound{}
		}
		t.bounds[set] = append(t.bounds[set], bs...)
	default: // the table itself, objects, flowtables
		t.whole = true
	}
}

// notifiedBounds reads the elements of an element notification as
// bounds; false when one is not a plain key (a catch-all element, a
// range as one element).
func notifiedBounds(data []byte) ([]nft.Bound, bool) {
	var out []nft.Bound
	plain := true
	ok := walkAttrs(data[4:], func(typ uint16, list []byte) bool {
		if typ != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			return true
		}
		return walkAttrs(list, func(_ uint16, elem []byte) bool {
			var b nft.Bound
			walkAttrs(elem, func(typ uint16, v []byte) bool {
				switch typ {
				case unix.NFTA_SET_ELEM_KEY:
					b.Addr = dataValue(v)
				case elemAttrKeyEnd:
					plain = false
				case unix.NFTA_SET_ELEM_FLAGS:
					b.End = len(v) == 4 && binary.BigEndian.Uint32(v)&unix.NFT_SET_ELEM_INTERVAL_END != 0
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
	return out, ok && plain
}

// reread reads again the parts of table last that foreign transactions
// touched, and returns last with them as the kernel holds them now; false
// when what was touched cannot be read in parts (read the table whole).
func reread(conn transport, ours uint32, last *nft.Table, t touch) (*nft.Table, bool, error) {
	if t.whole || last.Owner != nft.NotOwned {
		return nil, false, nil
	}
	out := last.Clone()
	// A set whose elements were touched is read whole, as the whole read
	// reads it: a get of one element of an interval set answers with what
	// the kernel's walk finds near the key, which with a foreign lone
	// start or end is not the element asked for, so the bounds a
	// notification names cannot be read one by one.
	sets := maps.Clone(t.sets)
	if sets == nil {
		sets = map[string]bool{}
	}
	for name := range t.bounds {
		sets[name] = true
	}
	for _, name := range slices.Sorted(maps.Keys(sets)) {
		s, found, err := getSet(conn, name)
		if err != nil {
			return nil, false, err
		}
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
			return nil, false, err
		}
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
		return nil, false, err
	}
	out.Dormant, out.Persist, out.Use = head.Dormant, head.Persist, head.Use
	return out, true, nil
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
