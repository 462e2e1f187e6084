package kernel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"time"

	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// Read returns the kernel's table, and 0: no generation guards a plan
// made from it (see readLocked). It fails with ErrStale when another
// process's transaction touched the table while it was read: read again.
//
// A table owned by another process is returned without its contents: the
// kernel refuses our changes to it anyway (ReadAll reads them).
//
// What it costs depends on who can change the table. Owned by this
// socket: nothing but this socket can, so after the read that follows our
// own commit, a read asks the kernel only for the table's flags and owner.
// Not owned: the monitor says whether a transaction of another process
// touched the table since the last read; if none did, the last read is
// still the kernel's table, and nothing else is read. Commits to other
// tables, every second on a busy node, cost a fence, not a read. Either
// way a whole read at least every maxReuse. The table returned may be
// returned again by later reads: callers must not modify it (Clone it).
func (n *Netlink) Read() (*nft.Table, uint32, error) { return n.read(false) }

// ReadAll is Read that also reads the contents of a table owned by another
// process (for list, diff and explain --live), and reads again after a
// stale read, for up to Patience.
func (n *Netlink) ReadAll() (*nft.Table, error) {
	deadline := time.Now().Add(nft.Patience)
	for try := 1; ; try++ {
		t, _, err := n.read(true)
		if !errors.Is(err, nft.ErrStale) || time.Now().Add(nft.Backoff(try)).After(deadline) {
			return t, err
		}
		time.Sleep(nft.Backoff(try))
	}
}

func (n *Netlink) read(all bool) (*nft.Table, uint32, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	t, gen, err := n.readLocked(all)
	if err != nil && !errors.Is(err, nft.ErrStale) {
		n.brokenReader()
		return nil, 0, fmt.Errorf("read table inet %s: %w", nft.TableName, err)
	}
	return t, gen, err
}

func (n *Netlink) readLocked(all bool) (*nft.Table, uint32, error) {
	conn, err := n.reader()
	if err != nil {
		return nil, 0, err
	}
	ours := n.ownerPort()
	head, err := readHead(conn, ours)
	if err != nil {
		return nil, 0, err
	}
	fresh := n.last != nil && time.Since(n.lastAt) < maxReuse
	c := n.change // verified now, or never
	n.change = nil
	switch {
	case head == nil:
		// The plan creates it exclusively: refused (ErrStale) if the
		// table appears before it.
		n.last = nil
		return nil, 0, nil
	case head.Owner == nft.OwnedByUs:
		// Nobody else can change it, and no commit is under way: ours
		// are synchronous. No fence, no generation.
		if fresh && n.last.Owner == nft.OwnedByUs && n.last.Dormant == head.Dormant {
			return n.last, 0, nil
		}
		if c != nil && time.Since(c.readAt) < maxReuse {
			// Our own commit: read back what it changed. The table was
			// read whole when c was made from it; that read's age
			// schedules the next whole one.
			ok, err := verifyChange(conn, head, c)
			if err != nil {
				return nil, 0, err
			}
			if ok {
				n.last, n.lastAt = c.table, c.readAt
				return c.table, 0, nil
			}
		}
		t, err := readContents(conn, head)
		if err != nil {
			return nil, 0, err
		}
		n.last, n.lastAt = t, time.Now()
		return t, 0, nil
	case head.Owner == nft.OwnedByOther && !all:
		// Its owner can change it without telling anyone (its exit
		// orphans or deletes it): nothing is kept.
		n.last = nil
		return head, 0, nil
	}
	// Anyone can change it. After the fence every transaction that began
	// before it has finished and its notifications are queued on the
	// monitor. No generation guards the plan made from this read: on a
	// busy node another table's commit lands between any read and any
	// write (a CPU quota stretches that window to 100 ms), and would
	// refuse it. A foreign change since the read is found instead by the
	// read that follows every write; the plan's own checks (an exclusive
	// create, elements that must exist) refuse a plan that no longer fits.
	const gen = 0
	mon, err := n.monitor()
	if err != nil {
		return nil, 0, err
	}
	if err := fence(conn); err != nil {
		return nil, 0, err
	}
	what, lost, err := mon.takeTouch()
	if err != nil {
		return nil, 0, err
	}
	if c != nil && c.gen != 0 {
		// Our commit created the table, and was the only one then: if
		// none has committed since (the generation is still ours), what
		// the monitor holds (or missed before it joined) is older than
		// the table, and from here on it sees every transaction.
		g, err := generation(conn)
		if err != nil {
			return nil, 0, err
		}
		if g == c.gen {
			what, lost = touch{}, false
		}
	}
	touched := what.any()
	if !touched && !lost && fresh {
		return n.last, gen, nil
	}
	last := n.last
	n.last = nil
	if touched && !lost && fresh {
		// Another process touched the table, and its notifications
		// name what: read that again, then make sure that no one
		// touched the table meanwhile, as for a whole read.
		t, did, ok, err := reread(conn, ours, last, what)
		if err != nil {
			return nil, 0, err
		}
		n.reads.sets += len(did.sets)
		n.reads.elements += did.elements
		// whole: the parts did not make the whole (the table's count of
		// its sets and chains disagrees): the table is read whole next.
		n.debug("read again what other processes' transactions touched", "sets", did.sets, "chains", did.chains, "elements", did.elements, "whole", !ok)
		if ok {
			if err := fence(conn); err != nil {
				return nil, 0, err
			}
			if what, lost, err = mon.takeTouch(); err != nil {
				return nil, 0, err
			}
			if what.any() {
				return nil, 0, fmt.Errorf("%w: another process changed table inet %s while it was read", nft.ErrStale, nft.TableName)
			}
			if !lost {
				n.last = t // the whole read it was made from schedules the next
				return t, gen, nil
			}
		}
	}
	if !touched && !lost && c != nil && time.Since(c.readAt) < maxReuse {
		// Our own commit, and nobody else's since the last read: read
		// back what it changed, then make sure that no one touched the
		// table meanwhile (the fence and the monitor, as for a whole read).
		ok, err := verifyChange(conn, head, c)
		if err != nil {
			return nil, 0, err
		}
		if ok {
			if err := fence(conn); err != nil {
				return nil, 0, err
			}
			if touched, lost, err = mon.take(); err != nil {
				return nil, 0, err
			}
			if !touched && !lost {
				n.last, n.lastAt = c.table, c.readAt
				return c.table, gen, nil
			}
		}
	}
	t, err := readTable(conn, ours)
	if err != nil {
		return nil, 0, err
	}
	n.reads.tables++
	n.debug("read the table whole", "touched", touched, "lost", lost, "fresh", fresh)
	// Did a transaction that touched the table run during the read? The
	// fence waits for any under way; the monitor says what they touched.
	if err := fence(conn); err != nil {
		return nil, 0, err
	}
	if touched, lost, err = mon.take(); err != nil {
		return nil, 0, err
	}
	switch {
	case touched:
		n.lostRead = nil
		return nil, 0, fmt.Errorf("%w: another process changed table inet %s while it was read", nft.ErrStale, nft.TableName)
	case lost && (n.lostRead == nil || !sameRead(t, n.lostRead)):
		// Notifications were lost during the read (a neighbour's rule
		// too large for a notification makes the kernel report a loss to
		// every listener at each of its commits): the read stands once
		// the next one, fenced alike, finds the same.
		n.lostRead = t
		if t == nil {
			n.lostRead = noTable
		}
		return nil, 0, fmt.Errorf("%w: nftables notifications were lost while table inet %s was read", nft.ErrStale, nft.TableName)
	}
	n.lostRead = nil
	if t != nil && t.Owner == nft.NotOwned {
		n.last, n.lastAt = t, time.Now()
	}
	return t, gen, nil
}

// noTable stands for a read that found no table, in lostRead.
var noTable = &nft.Table{}

// sameRead reports whether a read found what the last one did.
func sameRead(t, last *nft.Table) bool {
	if t == nil || last == noTable {
		return t == nil && last == noTable
	}
	return t.Persist == last.Persist && t.Use == last.Use && t.Equal(*last) && last.Equal(*t)
}

// readTable reads table inet ip-masq-agent, all of it: nil if there is none.
// ours is the port id whose ownership makes it OwnedByUs.
func readTable(conn transport, ours uint32) (*nft.Table, error) {
	head, err := readHead(conn, ours)
	if err != nil || head == nil {
		return head, err
	}
	return readContents(conn, head)
}

// readContents reads the sets, chains and objects of the table head.
func readContents(conn transport, head *nft.Table) (*nft.Table, error) {
	t := &nft.Table{Owner: head.Owner, Dormant: head.Dormant, Persist: head.Persist, Use: head.Use}
	if err := readSets(conn, t); err != nil {
		return nil, err
	}
	if err := readChains(conn, t); err != nil {
		return nil, err
	}
	if err := readObjects(conn, t); err != nil {
		return nil, err
	}
	// The chain and object dumps walk every inet table and resume by an
	// index over all of them: a neighbour's commit between two parts can
	// skip one of ours or list it twice, and the kernel does not always
	// flag it (NLM_F_DUMP_INTR; not within the last part). The table's own
	// count of what it holds says whether the read is whole.
	if n := len(t.Sets) + len(t.Chains) + len(t.Objects); uint32(n) != t.Use {
		return nil, fmt.Errorf("%w: read %d sets, chains and objects of table inet %s, which holds %d", nft.ErrStale, n, nft.TableName, t.Use)
	}
	return t, nil
}

// readHead reads the table's flags and owner: nil if there is no table.
func readHead(conn transport, ours uint32) (*nft.Table, error) {
	msgs, err := get(unix.NFT_MSG_GETTABLE, attr(unix.NFTA_TABLE_NAME, cstring(nft.TableName))).ask(conn)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	t := &nft.Table{}
	for _, m := range msgs {
		var flags uint32
		owner := uint32(0)
		err := decode(m.Data, func(ad *netlink.AttributeDecoder) {
			switch ad.Type() {
			case unix.NFTA_TABLE_FLAGS:
				flags = ad.Uint32()
			case tableAttrOwner:
				owner = ad.Uint32()
			case unix.NFTA_TABLE_USE:
				t.Use = ad.Uint32()
			}
		})
		if err != nil {
			return nil, err
		}
		t.Dormant = flags&unix.NFT_TABLE_F_DORMANT != 0
		t.Persist = flags&tableFlagPersist != 0
		switch {
		case flags&tableFlagOwner == 0:
			t.Owner = nft.NotOwned
		case ours != 0 && owner == ours:
			// Port ids are unique among a namespace's open sockets, and
			// our commit socket is open: the kernel says the table is ours.
			t.Owner = nft.OwnedByUs
		default:
			t.Owner = nft.OwnedByOther
		}
	}
	return t, nil
}

func readSets(conn transport, t *nft.Table) error {
	msgs, err := dump(unix.NFT_MSG_GETSET, attr(unix.NFTA_SET_TABLE, cstring(nft.TableName))).ask(conn)
	if err != nil {
		return fmt.Errorf("list sets: %w", err)
	}
	for _, m := range msgs {
		s, err := decodeSet(conn, m)
		if err != nil {
			return err
		}
		t.Sets = append(t.Sets, s)
	}
	return nil
}

// decodeSet decodes a set message, and reads the set's elements when it
// is one of the agent's.
func decodeSet(conn transport, m netlink.Message) (nft.Set, error) {
	s, odd, _, err := decodeSetHead(m)
	if err != nil {
		return nft.Set{}, err
	}
	var oddElems []string
	if nft.AgentSet(s.Name) {
		if oddElems, err = readElements(conn, &s); err != nil {
			return nft.Set{}, fmt.Errorf("list set %s: %w", s.Name, err)
		}
	} else {
		// The plan deletes a set the agent does not make, whatever
		// it holds: its elements (possibly millions) are not read.
		oddElems = []string{"not the agent's (its elements were not read)"}
	}
	s.Odd = joinUnique(append(odd, oddElems...))
	return s, nil
}

// decodeSetHead decodes a set message without its elements: the set,
// what is odd about it, and the kernel's count of its elements
// (NFTA_SET_COUNT; -1: the kernel does not say).
func decodeSetHead(m netlink.Message) (nft.Set, []string, int, error) {
	var s nft.Set
	var flags, keyType, keyLen uint32
	var odd []string
	count := -1
	err := decode(m.Data, func(ad *netlink.AttributeDecoder) {
		switch ad.Type() &^ unix.NLA_F_NESTED {
		case unix.NFTA_SET_TABLE:
			if ad.String() != nft.TableName {
				odd = append(odd, "other table")
			}
		case unix.NFTA_SET_NAME:
			s.Name = ad.String()
		case unix.NFTA_SET_FLAGS:
			flags = ad.Uint32()
		case unix.NFTA_SET_KEY_TYPE:
			keyType = ad.Uint32()
		case unix.NFTA_SET_KEY_LEN:
			keyLen = ad.Uint32()
		case unix.NFTA_SET_USERDATA:
			s.Comment, _ = userdata.GetString(ad.Bytes(), userdata.NFTNL_UDATA_SET_COMMENT)
		case unix.NFTA_SET_DATA_TYPE:
			odd = append(odd, "a map")
		case unix.NFTA_SET_OBJ_TYPE:
			odd = append(odd, "an object map")
		case unix.NFTA_SET_TIMEOUT, unix.NFTA_SET_GC_INTERVAL:
			odd = append(odd, "a timeout")
		case setAttrExpr, setAttrExpressions:
			odd = append(odd, "set expressions")
		case setAttrCount:
			count = int(ad.Uint32())
		case unix.NFTA_SET_DESC:
			ad.Nested(func(d *netlink.AttributeDecoder) error {
				for d.Next() {
					if d.Type() == unix.NFTA_SET_DESC_SIZE && d.Uint32() != 0 {
						odd = append(odd, fmt.Sprintf("size %d", d.Uint32()))
					}
				}
				return nil
			})
		}
	})
	if err != nil {
		return nft.Set{}, nil, 0, err
	}
	for k, t := range setKeyTypes {
		if keyType == t.GetNFTMagic() && keyLen == t.Bytes {
			s.Key = k
		}
	}
	if s.Key == 0 {
		odd = append(odd, fmt.Sprintf("key type %d of %d bytes", keyType, keyLen))
	}
	if flags != unix.NFT_SET_INTERVAL {
		odd = append(odd, fmt.Sprintf("flags %#x", flags))
	}
	return s, odd, count, nil
}

// readElements reads a set's elements as ranges, and what is odd about
// them (timeouts, expressions, comments: never the agent's).
func readElements(conn transport, s *nft.Set) ([]string, error) {
	msgs, err := dump(unix.NFT_MSG_GETSETELEM,
		attr(unix.NFTA_SET_ELEM_LIST_TABLE, cstring(nft.TableName)), attr(unix.NFTA_SET_ELEM_LIST_SET, cstring(s.Name))).ask(conn)
	if err != nil {
		return nil, err
	}
	return decodeElements(msgs, s)
}

// decodeElements decodes a set's element dump into s.Elements and says
// what about them the agent would never write. Walked by hand: 100,000
// CIDRs are 200,000 elements, and an AttributeDecoder per element costs
// more than the kernel's dump.
func decodeElements(msgs []netlink.Message, s *nft.Set) ([]string, error) {
	size := 0
	for _, m := range msgs {
		size += len(m.Data)
	}
	bs := make([]nft.Bound, 0, size/24) // an IPv4 element takes 24 to 32 bytes
	var odd []string
	for _, m := range msgs {
		ok := walkAttrs(m.Data[4:], func(typ uint16, list []byte) bool {
			if typ != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
				return true
			}
			return walkAttrs(list, func(_ uint16, elem []byte) bool {
				var b nft.Bound
				var keyEnd netip.Addr
				ok := walkAttrs(elem, func(typ uint16, v []byte) bool {
					switch typ {
					case unix.NFTA_SET_ELEM_KEY:
						b.Addr = dataValue(v)
					case elemAttrKeyEnd:
						keyEnd = dataValue(v)
					case unix.NFTA_SET_ELEM_FLAGS:
						b.End = len(v) == 4 && binary.BigEndian.Uint32(v)&unix.NFT_SET_ELEM_INTERVAL_END != 0
					case unix.NFTA_SET_ELEM_TIMEOUT, unix.NFTA_SET_ELEM_EXPIRATION:
						odd = append(odd, "elements with a timeout")
					case unix.NFTA_SET_ELEM_EXPR, elemAttrExprs:
						odd = append(odd, "elements with expressions")
					case unix.NFTA_SET_ELEM_USERDATA:
						odd = append(odd, "elements with comments")
					case unix.NFTA_SET_ELEM_DATA, unix.NFTA_SET_ELEM_OBJREF:
						odd = append(odd, "elements with data")
					}
					return true
				})
				switch {
				case !ok:
					return false
				case !b.Addr.IsValid():
					odd = append(odd, "elements that are not addresses")
					return true
				}
				bs = append(bs, b)
				if keyEnd.IsValid() && keyEnd.Next().IsValid() { // a range as one element (pipapo)
					bs = append(bs, nft.Bound{Addr: keyEnd.Next(), End: true})
				}
				return true
			})
		})
		if !ok {
			return nil, fmt.Errorf("malformed element message of set %s", s.Name)
		}
	}
	var shape []string
	s.Elements, shape = nft.RangesFromBounds(bs)
	return append(odd, shape...), nil
}

func readChains(conn transport, t *nft.Table) error {
	// The chain dump cannot be filtered by table: every inet chain comes,
	// and only the agent's are kept.
	msgs, err := dump(unix.NFT_MSG_GETCHAIN).across(func(b []byte) bool {
		ours := false
		walkAttrs(b, func(typ uint16, v []byte) bool {
			if typ == unix.NFTA_CHAIN_TABLE {
				ours = string(v) == nft.TableName+"\x00"
				return false
			}
			return true
		})
		return ours
	}).ask(conn)
	if err != nil {
		return fmt.Errorf("list chains: %w", err)
	}
	for _, m := range msgs {
		c, table, err := decodeChain(m)
		if err != nil {
			return err
		}
		if table == nft.TableName {
			t.Chains = append(t.Chains, c)
		}
	}
	rules, err := readRules(conn)
	if err != nil {
		return fmt.Errorf("list rules: %w", err)
	}
	for i := range t.Chains {
		t.Chains[i].Rules = rules[t.Chains[i].Name]
	}
	return nil
}

// decodeChain decodes a chain message (without its rules) and the name
// of its table.
func decodeChain(m netlink.Message) (nft.Chain, string, error) {
	var c nft.Chain
	var table string
	var hook *nft.Hook
	var odd []string
	hooknum := uint32(0)
	err := decode(m.Data, func(ad *netlink.AttributeDecoder) {
		switch ad.Type() &^ unix.NLA_F_NESTED {
		case unix.NFTA_CHAIN_TABLE:
			table = ad.String()
		case unix.NFTA_CHAIN_NAME:
			c.Name = ad.String()
		case unix.NFTA_CHAIN_HOOK:
			if hook == nil {
				hook = &nft.Hook{Policy: "accept"}
			}
			ad.Nested(func(h *netlink.AttributeDecoder) error {
				for h.Next() {
					switch h.Type() &^ unix.NLA_F_NESTED {
					case unix.NFTA_HOOK_HOOKNUM:
						hooknum = h.Uint32()
					case unix.NFTA_HOOK_PRIORITY:
						hook.Priority = int(int32(h.Uint32()))
					case unix.NFTA_HOOK_DEV, hookAttrDevs:
						odd = append(odd, "devices")
					}
				}
				return nil
			})
		case unix.NFTA_CHAIN_TYPE:
			if hook == nil {
				hook = &nft.Hook{Policy: "accept"}
			}
			hook.Type = ad.String()
		case unix.NFTA_CHAIN_POLICY:
			if hook == nil {
				hook = &nft.Hook{Policy: "accept"}
			}
			if ad.Uint32() == 0 { // NF_DROP
				hook.Policy = "drop"
			}
		case chainAttrFlags:
			if f := ad.Uint32() &^ chainFlagBase; f != 0 {
				odd = append(odd, fmt.Sprintf("flags %#x", f))
			}
		}
	})
	if err != nil {
		return nft.Chain{}, "", err
	}
	if hook != nil {
		hook.Hook = hookName(hooknum)
		c.Hook = hook
	}
	c.Odd = joinUnique(odd)
	return c, table, nil
}

func hookName(n uint32) string {
	names := []string{"prerouting", "input", "forward", "output", "postrouting", "ingress"}
	if int(n) < len(names) {
		return names[n]
	}
	return fmt.Sprintf("hook %d", n)
}

// readRules reads the table's rules by chain, in order (rules.go).
func readRules(conn transport) (map[string][]nft.Rule, error) {
	msgs, err := dump(unix.NFT_MSG_GETRULE, attr(unix.NFTA_RULE_TABLE, cstring(nft.TableName))).ask(conn)
	if err != nil {
		return nil, err
	}
	return decodeRules(msgs)
}

func readObjects(conn transport, t *nft.Table) error {
	msgs, err := dump(unix.NFT_MSG_GETOBJ, attr(unix.NFTA_OBJ_TABLE, cstring(nft.TableName))).across(nil).ask(conn)
	if err != nil {
		return fmt.Errorf("list objects: %w", err)
	}
	kinds := map[uint32]string{1: "counter", 2: "quota", 3: "ct helper", 4: "limit", 5: "connlimit",
		6: "tunnel", 7: "ct timeout", 8: "secmark", 9: "ct expectation", 10: "synproxy"}
	for _, m := range msgs {
		var o nft.Object
		table := ""
		err := decode(m.Data, func(ad *netlink.AttributeDecoder) {
			switch ad.Type() {
			case unix.NFTA_OBJ_TABLE:
				table = ad.String()
			case unix.NFTA_OBJ_NAME:
				o.Name = ad.String()
			case unix.NFTA_OBJ_TYPE:
				o.Type = ad.Uint32()
			}
		})
		if err != nil {
			return err
		}
		if table == nft.TableName {
			o.Kind = kinds[o.Type]
			if o.Kind == "" {
				o.Kind = fmt.Sprintf("object type %d", o.Type)
			}
			t.Objects = append(t.Objects, o)
		}
	}
	msgs, err = dump(unix.NFT_MSG_GETFLOWTABLE, attr(flowtableAttrTable, cstring(nft.TableName))).across(nil).ask(conn)
	if err != nil {
		return fmt.Errorf("list flowtables: %w", err)
	}
	for _, m := range msgs {
		o := nft.Object{Kind: "flowtable"}
		table := ""
		err := decode(m.Data, func(ad *netlink.AttributeDecoder) {
			switch ad.Type() {
			case flowtableAttrTable:
				table = ad.String()
			case flowtableAttrName:
				o.Name = ad.String()
			}
		})
		if err != nil {
			return err
		}
		if table == nft.TableName {
			t.Objects = append(t.Objects, o)
		}
	}
	return nil
}

// joinUnique lists the distinct strings of ss, sorted.
func joinUnique(ss []string) string {
	ss = slices.Clone(ss)
	slices.Sort(ss)
	ss = slices.Compact(ss)
	out := ""
	for i, s := range ss {
		if i > 0 {
			out += ", "
		}
		out += s
	}
	return out
}
