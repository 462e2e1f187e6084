package kernel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"syscall"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// change is our own commit, not yet read back: the last read with the
// plan applied, which is what the kernel holds if it took the plan and
// nothing else changed the table since (owned; watched by the monitor;
// or, for a table the plan created, gen).
type change struct {
	table  *nft.Table
	plan   nft.Plan
	readAt time.Time // when the table it was made from was read whole (a create: made)
	// gen, when not 0, is the generation of our commit, which created a
	// table nobody owns: as long as the kernel's generation is still gen,
	// no transaction has committed since ours.
	gen uint32
}

// createsTable reports whether a plan creates the table, exclusively (the
// kernel refuses it if there is one): the table then holds what the plan
// put in it, and nothing else, when the transaction commits.
func createsTable(p nft.Plan) bool {
	return len(p.Ops) > 0 && p.Ops[0].Kind == nft.KindTable && p.Ops[0].Verb == nft.Add && p.Ops[0].Exclusive && !p.Recreate
}

// maxElementGets bounds the elements read back one by one (GETSETELEM of
// each element sent); a set with more changed elements is read whole
// (its own dump; the rest of the table is not read).
const maxElementGets = 1024

// verifyChange reads back what the plan of c changed, and nothing else:
// the table's head (flags, and its count of sets, chains and objects),
// each set or chain the plan added, replaced or deleted, each chain whose
// rules it flushed or added (that chain's rules), and each element it
// added or deleted. It reports whether the kernel holds exactly what c
// says; false (or an error) means: read the table whole.
func verifyChange(conn transport, head *nft.Table, c *change) (bool, error) {
	t := c.table
	if head.Dormant != t.Dormant || head.Persist != t.Persist || head.Owner != t.Owner ||
		head.Use != uint32(len(t.Sets)+len(t.Chains)+len(t.Objects)) {
		return false, nil
	}
	if createsTable(c.plan) {
		return verifyCreated(conn, t)
	}
	var sets, chains []string
	bounds := map[string][]nft.Bound{}
	for _, op := range c.plan.Ops {
		switch op.Kind {
		case nft.KindSet:
			sets = append(sets, op.Name)
		case nft.KindChain, nft.KindRule:
			chains = append(chains, op.Name)
		case nft.KindElements:
			bounds[op.Name] = append(bounds[op.Name], nft.Bounds(op.Elements)...)
		default: // the table itself, objects: read whole (adoption, a found table's leftovers)
			return false, nil
		}
	}
	for _, name := range compact(sets) {
		ok, err := verifySet(conn, name, t.Set(name))
		if !ok || err != nil {
			return false, err
		}
	}
	for _, name := range compact(chains) {
		ok, err := verifyChain(conn, name, t.Chain(name))
		if !ok || err != nil {
			return false, err
		}
	}
	for name, bs := range bounds {
		if slices.Contains(sets, name) {
			continue // read with its set
		}
		want := t.Set(name)
		if want == nil {
			return false, nil
		}
		var ok bool
		var err error
		if len(bs) > maxElementGets {
			ok, err = verifySet(conn, name, want)
		} else {
			ok, err = verifyElements(conn, *want, bs)
		}
		if !ok || err != nil {
			return false, err
		}
	}
	return true, nil
}

// verifyCreated reads back a table our plan created (its head, read by
// the caller, holds as many sets, chains and objects as t): each chain
// with its rules, and each set: with its elements when they are few, else
// its head and the kernel's count of its elements (verifyCreatedSet).
func verifyCreated(conn transport, t *nft.Table) (bool, error) {
	if len(t.Objects) > 0 {
		return false, nil
	}
	for i := range t.Sets {
		ok, err := verifyCreatedSet(conn, &t.Sets[i])
		if !ok || err != nil {
			return false, err
		}
	}
	for i := range t.Chains {
		ok, err := verifyChain(conn, t.Chains[i].Name, &t.Chains[i])
		if !ok || err != nil {
			return false, err
		}
	}
	return true, nil
}

// verifyCreatedSet verifies a set that our transaction created with its
// elements. A set of few elements is read whole. For more, the set's own
// dump would cost the kernel far more than the commit did (it walks the
// set from its start for every part of the dump: 100,000 CIDRs cost
// about a second of kernel CPU): its head is read, and the kernel's count
// of its elements (NFTA_SET_COUNT, recent kernels, 6.18 among them: half the
// interval set's elements, as nft counts) is compared with what the
// plan sent. That is exact for a set created in our transaction: it
// was empty, the kernel took every element message of the transaction
// (else nothing), each element it took is one it counts, and none of
// ours was a duplicate, so the count says that it parsed every element
// we meant, no fewer (a list cut short) and no more. The elements' bytes
// are our encoding (the wire tests hold it to the kernel's). A kernel
// that does not count, an odd number of bounds (a count of halves
// cannot tell one apart), or a count that disagrees: the set is read
// whole.
func verifyCreatedSet(conn transport, want *nft.Set) (bool, error) {
	bs := 2 * len(want.Elements) // as many as nft.Bounds makes, without making them
	if n := len(want.Elements); n > 0 && !want.Elements[n-1].To().Next().IsValid() {
		bs-- // the range that reaches the top has no end element
	}
	if bs <= maxElementGets || bs%2 != 0 {
		return verifySet(conn, want.Name, want)
	}
	got, count, found, err := getSetHead(conn, want.Name)
	if err != nil || !found {
		return false, err
	}
	if count < 0 || count != bs/2 {
		return verifySet(conn, want.Name, want)
	}
	got.Elements = want.Elements
	return nft.Table{Sets: []nft.Set{*want}}.Equal(nft.Table{Sets: []nft.Set{got}}), nil
}

// getSetHead reads one set without its elements: the set as decodeSetHead
// makes it (Odd: what its head has odd), and the kernel's count of its
// elements (-1: not said); found false: there is none.
func getSetHead(conn transport, name string) (nft.Set, int, bool, error) {
	msgs, err := get(unix.NFT_MSG_GETSET,
		attr(unix.NFTA_SET_TABLE, cstring(nft.TableName)), attr(unix.NFTA_SET_NAME, cstring(name))).ask(conn)
	switch {
	case absent(err):
		return nft.Set{}, 0, false, nil
	case err != nil:
		return nft.Set{}, 0, false, err
	case len(msgs) != 1:
		return nft.Set{}, 0, false, fmt.Errorf("get set %s: %d answers", name, len(msgs))
	}
	s, odd, count, err := decodeSetHead(msgs[0])
	s.Odd = joinUnique(odd)
	return s, count, err == nil, err
}

// small reports whether a plan's elements are few enough to read back one
// by one, and for the monitor to take one notification for each.
func small(p nft.Plan) bool {
	n := 0
	for _, op := range p.Ops {
		n += len(op.Elements)
	}
	return 2*n <= maxElementGets
}

func compact(names []string) []string {
	names = slices.Clone(names)
	slices.Sort(names)
	return slices.Compact(names)
}

// absent reports whether a request failed because what it names is not there.
func absent(err error) bool { return errors.Is(err, unix.ENOENT) || errors.Is(err, os.ErrNotExist) }

// verifySet reads one set, with its elements (want nil: it must be gone).
func verifySet(conn transport, name string, want *nft.Set) (bool, error) {
	got, found, err := getSet(conn, name)
	if err != nil || !found || want == nil {
		return !found && want == nil, err
	}
	return nft.Table{Sets: []nft.Set{*want}}.Equal(nft.Table{Sets: []nft.Set{got}}), nil
}

// verifyChain reads one chain and its rules (want nil: it must be gone).
func verifyChain(conn transport, name string, want *nft.Chain) (bool, error) {
	got, found, err := getChain(conn, name)
	if err != nil || !found || want == nil {
		return !found && want == nil, err
	}
	return nft.Table{Chains: []nft.Chain{*want}}.Equal(nft.Table{Chains: []nft.Chain{got}}), nil
}

// elementGetsPerDatagram bounds the requests written at once: the kernel
// queues all their answers before we read one, on a receive buffer of
// its default size.
const elementGetsPerDatagram = 64

// verifyElements asks the kernel for each bound of the elements a plan
// added to or deleted from set want (GETSETELEM of one element each) and
// checks that it holds exactly the wanted ones among them. On an interval
// set the kernel answers a get with the element it finds for the key: the
// element itself, or a neighbour (the start or end of an interval around
// the key, depending on the kernel), or ENOENT. A bound is held only if
// the answer is that key with that end flag.
func verifyElements(conn transport, want nft.Set, bs []nft.Bound) (bool, error) {
	for len(bs) > 0 {
		n := min(len(bs), elementGetsPerDatagram)
		held, plain, err := getElements(conn, want.Name, bs[:n])
		if err != nil || !plain {
			return false, err
		}
		for i, b := range bs[:n] {
			if held[i] != holds(want.Elements, b) {
				return false, nil
			}
		}
		bs = bs[n:]
	}
	return true, nil
}

// holds reports whether sorted, disjoint ranges make the interval set
// hold bound b (see nft.Bounds).
func holds(rs []nft.Range, b nft.Bound) bool {
	if !b.End {
		i, ok := slices.BinarySearchFunc(rs, b.Addr, func(r nft.Range, a netip.Addr) int { return r.From().Compare(a) })
		return ok && i >= 0
	}
	last := b.Addr.Prev()
	if !last.IsValid() {
		return false
	}
	_, ok := slices.BinarySearchFunc(rs, last, func(r nft.Range, a netip.Addr) int { return r.To().Compare(a) })
	return ok
}

// getElements sends one GETSETELEM request per bound, in one datagram,
// each acknowledged, and reports which of them the kernel holds exactly;
// plain false: an answer was more than a bound (data, a timeout, a
// comment, a range as one element), or the kernel refused a get, or an
// interval-end get would be unsafe (below): the caller reads the set
// whole.
//
// The array-based interval lookup (Linux 7.0; 6.18.14 and 6.19.4 took it
// back) answers an interval-end get of a key in the open interval at the
// top of the address space (a start with no end: 240.0.0.0/4, ::/0) with
// the end element that interval does not have, a NULL pointer the kernel
// then reads (proposed fix: "nft_set_rbtree: reject interval-end get for
// open intervals", 2026-06-30). So before any interval-end get, a plain get
// of the top address asks for that interval's start, and no interval-end
// get at or above it is sent. A foreign transaction between the two gets
// can still open one (a process with CAP_NET_ADMIN can crash such a kernel
// by itself anyway); our own commits never do while we verify them.
func getElements(conn transport, set string, bs []nft.Bound) (held []bool, plain bool, err error) {
	if ok, err := endGetsSafe(conn, set, bs); !ok || err != nil {
		return nil, false, err
	}
	got, found, plain, err := getBounds(conn, set, bs)
	if err != nil || !plain {
		return nil, plain, err
	}
	held = make([]bool, len(bs))
	for i := range bs {
		held[i] = found[i] && got[i] == bs[i]
	}
	return held, true, nil
}

// endGetsSafe reports whether the interval-end gets among bs are safe to
// send: none is at or above the start of an open interval at the top of
// the address space, which a plain get of the top address asks for (see
// getElements).
func endGetsSafe(conn transport, set string, bs []nft.Bound) (bool, error) {
	i := slices.IndexFunc(bs, func(b nft.Bound) bool { return b.End })
	if i < 0 {
		return true, nil
	}
	var top netip.Addr
	if bs[i].Addr.Is4() {
		top = netip.AddrFrom4([4]byte{255, 255, 255, 255})
	} else {
		top = netip.AddrFrom16([16]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	}
	got, found, plain, err := getBounds(conn, set, []nft.Bound{{Addr: top}})
	if err != nil || !plain {
		return false, err
	}
	open := got[0].Addr
	return !found[0] || !slices.ContainsFunc(bs, func(b nft.Bound) bool { return b.End && !b.Addr.Less(open) }), nil
}

// getBounds sends getElements' requests and returns each answer (found:
// the kernel answered with an element).
func getBounds(conn transport, set string, bs []nft.Bound) (got []nft.Bound, found []bool, plain bool, err error) {
	return getBoundsIn(conn, nft.TableName, set, bs)
}

// getBoundsIn is getBounds for a set of table inet tbl.
func getBoundsIn(conn transport, tbl, set string, bs []nft.Bound) (got []nft.Bound, found []bool, plain bool, err error) {
	seq := rand.Uint32()>>1 + 1
	msgs := make([]netlink.Message, len(bs))
	size := 0
	for i, b := range bs {
		msgs[i] = rawMessage(unix.NFT_MSG_GETSETELEM, netlink.Request|netlink.Acknowledge, elementsPayloadIn(tbl, set, []nft.Bound{b}))
		msgs[i].Header.Sequence = seq + uint32(i)
		size += unix.NLMSG_HDRLEN + len(msgs[i].Data) + 4
	}
	if err := sendAll(conn, msgs, size); err != nil {
		return nil, nil, false, err
	}
	if err := conn.SetReadDeadline(time.Now().Add(replyTimeout)); err != nil {
		return nil, nil, false, err
	}
	defer conn.SetReadDeadline(time.Time{})
	got, found, plain = make([]nft.Bound, len(bs)), make([]bool, len(bs)), true
	done := 0
	buf, from := make([]byte, 64<<10), datagramsOf(conn)
	for done < len(bs) {
		answers, err := receive(from, buf)
		if err != nil {
			return nil, nil, false, err
		}
		for _, m := range answers {
			i := int(m.Header.Seq - seq)
			if m.Header.Seq < seq || i >= len(bs) {
				continue // an answer to an earlier request that timed out
			}
			switch m.Header.Type {
			case unix.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return nil, nil, false, errors.New("short netlink error message")
				}
				if code := int32(binary.NativeEndian.Uint32(m.Data[:4])); code != 0 && !absent(syscall.Errno(-code)) {
					// A kernel that cannot get one element of such a set
					// (EOPNOTSUPP): the caller reads the set whole.
					plain = false
				}
				done++
			case unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWSETELEM:
				b, ok := answerBound(m.Data)
				plain = plain && ok
				got[i], found[i] = b, ok
			}
		}
	}
	return got, found, plain, nil
}

// answerBound reads the one element of a GETSETELEM answer as a bound;
// false if it is anything else (a range as one element, data, a timeout).
func answerBound(data []byte) (nft.Bound, bool) {
	var b nft.Bound
	n, plain := 0, true
	if len(data) < 4 {
		return b, false
	}
	ok := walkAttrs(data[4:], func(typ uint16, list []byte) bool {
		if typ != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			return true
		}
		return walkAttrs(list, func(_ uint16, elem []byte) bool {
			n++
			return walkAttrs(elem, func(typ uint16, v []byte) bool {
				switch typ {
				case unix.NFTA_SET_ELEM_KEY:
					b.Addr = dataValue(v)
				case unix.NFTA_SET_ELEM_FLAGS:
					b.End = len(v) == 4 && binary.BigEndian.Uint32(v)&unix.NFT_SET_ELEM_INTERVAL_END != 0
				default:
					plain = false
				}
				return true
			})
		})
	})
	return b, ok && plain && n == 1 && b.Addr.IsValid()
}
