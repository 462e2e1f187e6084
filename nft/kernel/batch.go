package kernel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"syscall"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// batch is the netlink messages of one transaction, each with the plan
// operation it encodes. It is sent by send rather than with
// nftables.Conn.Flush: google/nftables v0.3.0 cannot say which message
// failed, leaves a lasting connection out of step after a failed Flush,
// overflows the default socket buffers on large batches (EMSGSIZE on send,
// ENOBUFS on receive although the transaction committed), and has the
// kernel echo every message back. Sets, elements and chains are still
// encoded by google/nftables: a Conn whose Flush only records messages.
type batch struct {
	cc   *nftables.Conn
	msgs []netlink.Message
	op   []int // index in the plan of each message's operation
	// bounds are the elements each element operation sends (sentBounds).
	bounds map[int][]nft.Bound
}

// elementsPerMessage bounds one NEWSETELEM message well below 64 KiB: a
// netlink attribute's length is 16 bits, and google/nftables v0.3.0 lets a
// larger element list wrap silently, so the kernel keeps a fragment of the
// set while the batch succeeds. 512 IPv6 intervals take about 36 KiB.
const elementsPerMessage = 512

// encode turns a plan into the messages of one transaction.
func encode(p nft.Plan) (*batch, error) {
	b := &batch{}
	b.cc = b.recorder()
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: nft.TableName}
	b.bounds = sentBounds(p)
	for i, op := range p.Ops {
		n := len(b.msgs)
		if err := b.encodeOp(t, i, op); err != nil {
			return nil, fmt.Errorf("encode %q: %w", op, err)
		}
		if err := b.cc.Flush(); err != nil {
			return nil, fmt.Errorf("encode %q: %w", op, err)
		}
		for range b.msgs[n:] {
			b.op = append(b.op, i)
		}
	}
	return b, nil
}

// recorder is a google/nftables connection that dials nothing: each Flush
// appends the messages it would send to b.msgs, without their batch begin
// and end, and is acked.
func (b *batch) recorder() *nftables.Conn {
	ack := []netlink.Message{{Header: netlink.Header{Type: netlink.Error}, Data: make([]byte, 4)}}
	cc, _ := nftables.New(nftables.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
		if req == nil { // Flush waiting for an ack
			return ack, nil
		}
		b.msgs = append(b.msgs, req[1:len(req)-1]...)
		return nil, nil
	}))
	return cc
}

// setKeyTypes are the kernel's data types of the model's set keys.
var setKeyTypes = map[nft.SetKey]nftables.SetDatatype{
	nft.KeyIPv4:   nftables.TypeIPAddr,
	nft.KeyIPv6:   nftables.TypeIP6Addr,
	nft.KeyIfname: nftables.TypeIFName,
}

// sentBounds are the elements each element op of p sends (by op index):
// its ranges' bounds, less those that the delete and the add of the same
// set both carry. An interval whose start stays keeps its start element
// untouched: the rbtree lookup of Linux 5.10 to 6.12 may take a start
// element that a transaction adds or deletes as the start of the interval
// of an address that every state holds, and answer "not in the set" for a
// moment (TestIntervalLookupDuringCommit).
func sentBounds(p nft.Plan) map[int][]nft.Bound {
	out := make(map[int][]nft.Bound)
	for i, op := range p.Ops {
		if op.Kind == nft.KindElements {
			out[i] = nft.Bounds(op.Elements)
		}
	}
	for i, del := range p.Ops {
		if del.Kind != nft.KindElements || del.Verb != nft.Delete {
			continue
		}
		for j, add := range p.Ops {
			if add.Kind != nft.KindElements || add.Verb != nft.Add || add.Name != del.Name {
				continue
			}
			both := make(map[nft.Bound]bool, len(out[i]))
			for _, b := range out[i] {
				both[b] = false
			}
			for _, b := range out[j] {
				if _, ok := both[b]; ok {
					both[b] = true
				}
			}
			keep := func(b nft.Bound) bool { return both[b] }
			out[i] = slices.DeleteFunc(out[i], keep)
			out[j] = slices.DeleteFunc(out[j], keep)
		}
	}
	return out
}

func (b *batch) encodeOp(t *nftables.Table, i int, op nft.Op) error {
	cc := b.cc
	set := func(s *nft.Set) *nftables.Set {
		key := nftables.TypeIPAddr
		if s != nil {
			if k, ok := setKeyTypes[s.Key]; ok {
				key = k
			}
		}
		out := &nftables.Set{Table: t, Name: op.Name, KeyType: key, Interval: true, KeyByteOrder: binaryutil.BigEndian}
		if s != nil {
			out.Comment = s.Comment
		}
		return out
	}
	switch op.Kind {
	case nft.KindTable:
		b.msgs = append(b.msgs, tableMessage(op))
	case nft.KindSet:
		if op.Verb == nft.Add {
			return cc.AddSet(set(op.Set), nil)
		}
		cc.DelSet(set(nil))
	case nft.KindElements:
		bs := b.bounds[i]
		for start := 0; start < len(bs); start += 2 * elementsPerMessage {
			b.msgs = append(b.msgs, elementsMessage(op.Verb, op.Name, bs[start:min(start+2*elementsPerMessage, len(bs))]))
		}
	case nft.KindChain:
		c := &nftables.Chain{Table: t, Name: op.Name}
		switch op.Verb {
		case nft.Flush:
			cc.FlushChain(c)
		case nft.Delete:
			cc.DelChain(c)
		default:
			if h := op.Chain.Hook; h != nil {
				policy := nftables.ChainPolicyAccept
				if h.Policy == "drop" {
					policy = nftables.ChainPolicyDrop
				}
				hooknum := slices.Index([]string{"prerouting", "input", "forward", "output", "postrouting"}, h.Hook)
				if hooknum < 0 {
					return fmt.Errorf("unknown hook %q", h.Hook)
				}
				c.Type, c.Hooknum, c.Priority, c.Policy = nftables.ChainType(h.Type), nftables.ChainHookRef(nftables.ChainHook(hooknum)),
					nftables.ChainPriorityRef(nftables.ChainPriority(h.Priority)), &policy
			}
			cc.AddChain(c)
		}
	case nft.KindRule:
		m, err := ruleMessage(op.Name, *op.Rule)
		if err != nil {
			return err
		}
		b.msgs = append(b.msgs, m)
	case nft.KindObject:
		b.msgs = append(b.msgs, objectMessage(*op.Object))
	}
	return nil
}

// tableMessage encodes add, create, update or delete table, with the
// flags: google/nftables v0.3.0 always sends flags 0 (which would turn an
// owned table's update into EOPNOTSUPP) and cannot create exclusively.
func tableMessage(op nft.Op) netlink.Message {
	typ, flags := unix.NFT_MSG_NEWTABLE, netlink.Request|netlink.Create
	attrs := []netlink.Attribute{attr(unix.NFTA_TABLE_NAME, cstring(nft.TableName))}
	if op.Verb == nft.Delete {
		typ, flags = unix.NFT_MSG_DELTABLE, netlink.Request
	} else {
		var f uint32
		if op.Owned {
			f |= tableFlagOwner
		}
		if op.Persist {
			f |= tableFlagPersist
		}
		attrs = append(attrs, attr(unix.NFTA_TABLE_FLAGS, binaryutil.BigEndian.PutUint32(f)))
		if op.Exclusive {
			flags |= netlink.Excl
		}
	}
	return message(unix.NFPROTO_INET, typ, flags, attrs...)
}

// elementsMessage encodes NEWSETELEM or DELSETELEM for elements of an
// interval set (see intervals), by hand: google/nftables builds several
// attribute values per element, which costs more than the kernel's work at
// 100,000 CIDRs.
func elementsMessage(verb nft.Verb, set string, bs []nft.Bound) netlink.Message {
	typ := unix.NFT_MSG_NEWSETELEM
	flags := netlink.Request | netlink.Create
	if verb == nft.Delete {
		typ, flags = unix.NFT_MSG_DELSETELEM, netlink.Request
	}
	return rawMessage(typ, flags, elementsPayload(set, bs))
}

// elementsPayload is the payload of an element message: the set's
// elements bs.
func elementsPayload(set string, bs []nft.Bound) []byte {
	return elementsPayloadIn(nft.TableName, set, bs)
}

// elementsPayloadIn is elementsPayload for a set of table inet tbl.
func elementsPayloadIn(tbl, set string, bs []nft.Bound) []byte {
	// An element takes at most 36 bytes (an IPv6 key with its flag).
	b := append(make([]byte, 0, 64+len(tbl)+len(set)+36*len(bs)), nfgenmsg(unix.NFPROTO_INET, 0)...)
	b = appendAttr(b, unix.NFTA_SET_ELEM_LIST_TABLE, cstring(tbl))
	b = appendAttr(b, unix.NFTA_SET_ELEM_LIST_SET, cstring(set))
	list := len(b)
	b = appendAttr(b, unix.NLA_F_NESTED|unix.NFTA_SET_ELEM_LIST_ELEMENTS, nil)
	for _, e := range bs {
		elem := len(b)
		b = appendAttr(b, unix.NLA_F_NESTED|unix.NFTA_LIST_ELEM, nil)
		if e.End {
			b = appendAttr(b, unix.NFTA_SET_ELEM_FLAGS, binary.BigEndian.AppendUint32(nil, unix.NFT_SET_ELEM_INTERVAL_END))
		}
		key := len(b)
		b = appendAttr(b, unix.NLA_F_NESTED|unix.NFTA_SET_ELEM_KEY, nil)
		b = appendAttr(b, unix.NFTA_DATA_VALUE, e.Addr.AsSlice())
		b = endNested(b, key)
		b = endNested(b, elem)
	}
	return endNested(b, list)
}

// objectMessage deletes a stateful object or a flowtable.
func objectMessage(o nft.Object) netlink.Message {
	typ := unix.NFT_MSG_DELOBJ
	attrs := []netlink.Attribute{attr(unix.NFTA_OBJ_TABLE, cstring(nft.TableName)), attr(unix.NFTA_OBJ_NAME, cstring(o.Name)),
		attr(unix.NFTA_OBJ_TYPE, binaryutil.BigEndian.PutUint32(o.Type))}
	if o.Kind == "flowtable" {
		typ = unix.NFT_MSG_DELFLOWTABLE
		attrs = []netlink.Attribute{attr(flowtableAttrTable, cstring(nft.TableName)), attr(flowtableAttrName, cstring(o.Name))}
	}
	return message(unix.NFPROTO_INET, typ, netlink.Request, attrs...)
}

// ruleMessage encodes a NEWRULE message (appended to its chain; without
// the echo that nftables.Conn.AddRule asks for).
func ruleMessage(chain string, r nft.Rule) (netlink.Message, error) {
	// Written from the model (Encode), also when Release re-creates a
	// found table.
	exprs, err := marshalExprs(r.Encode())
	if err != nil {
		return netlink.Message{}, err
	}
	data, err := netlink.MarshalAttributes([]netlink.Attribute{
		attr(unix.NFTA_RULE_TABLE, cstring(nft.TableName)),
		attr(unix.NFTA_RULE_CHAIN, cstring(chain)),
		attr(unix.NLA_F_NESTED|unix.NFTA_RULE_EXPRESSIONS, exprs),
		attr(unix.NFTA_RULE_USERDATA, userdata.AppendString(nil, userdata.TypeComment, r.Comment)),
	})
	if err != nil {
		return netlink.Message{}, err
	}
	return rawMessage(unix.NFT_MSG_NEWRULE, netlink.Request|netlink.Create|unix.NLM_F_APPEND,
		append(nfgenmsg(unix.NFPROTO_INET, 0), data...)), nil
}

func (b *batch) size() int {
	n := 0
	for _, m := range b.msgs {
		n += 16 + len(m.Data) // nlmsghdr + payload
	}
	return n
}

// replyTimeout bounds the wait for the kernel's answer to one batch.
const replyTimeout = 30 * time.Second

// send sends the batch as one transaction on conn and waits for the
// kernel's verdict; with gen not 0 the kernel refuses the batch with
// ERESTART if the generation moved on. Only the last message asks for an
// ack; errors are reported whatever the flags, so one ack means the whole
// batch committed. failed is the index of the first refused message (-1:
// none, or the batch as a whole).
func (b *batch) send(conn transport, gen uint32) (failed int, err error) {
	size := b.size() + 4096
	if err := datagramsOf(conn).growSendBuffer(size); err != nil {
		return -1, fmt.Errorf("set socket send buffer to %d bytes: %w", size, err)
	}
	seq := rand.Uint32()>>1 + 1
	beginData := nfgenmsg(unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES)
	if gen != 0 {
		a, _ := netlink.MarshalAttributes([]netlink.Attribute{attr(unix.NFNL_BATCH_GENID, binaryutil.BigEndian.PutUint32(gen))})
		beginData = append(beginData, a...)
	}
	begin := netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_MSG_BATCH_BEGIN), Flags: netlink.Request, Sequence: seq},
		Data:   beginData,
	}
	out := make([]netlink.Message, 0, len(b.msgs)+2)
	out = append(out, begin)
	for i, m := range b.msgs {
		m.Header.Sequence = seq + 1 + uint32(i)
		m.Header.Flags &^= netlink.Acknowledge | unix.NLM_F_ECHO
		if i == len(b.msgs)-1 {
			m.Header.Flags |= netlink.Acknowledge
		}
		out = append(out, m)
	}
	last := seq + uint32(len(b.msgs))
	out = append(out, netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_MSG_BATCH_END), Flags: netlink.Request, Sequence: last + 1},
		Data:   nfgenmsg(unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES),
	})
	if err := sendAll(conn, out, size); err != nil {
		return -1, fmt.Errorf("send %d messages (%d bytes): %w", len(out), size, err)
	}
	return b.wait(conn, seq, last)
}

// wait reads the kernel's replies until the ack or error of the last
// message, or an error on the batch itself, and names the failed messages.
func (b *batch) wait(conn transport, begin, last uint32) (int, error) {
	if err := conn.SetReadDeadline(time.Now().Add(replyTimeout)); err != nil {
		return -1, err
	}
	defer conn.SetReadDeadline(time.Time{})
	buf, from := make([]byte, 1<<16), datagramsOf(conn)
	var errs []error
	failed := -1
	for {
		msgs, err := receive(from, buf)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				err = fmt.Errorf("%w within %s", nft.ErrNoAnswer, replyTimeout)
			}
			return failed, errors.Join(append(errs, fmt.Errorf("receive the kernel's answer: %w", err))...)
		}
		for _, m := range msgs {
			if m.Header.Type != unix.NLMSG_ERROR || len(m.Data) < 4 {
				continue
			}
			code := int32(binary.NativeEndian.Uint32(m.Data[:4]))
			s := m.Header.Seq
			switch {
			case code != 0 && s == begin:
				errs = append(errs, fmt.Errorf("transaction refused: %w", syscall.Errno(-code)))
			case code != 0 && s > begin && s <= last:
				if failed < 0 {
					failed = int(s - begin - 1)
				}
				errs = append(errs, fmt.Errorf("%d messages in, %w", s-begin, syscall.Errno(-code)))
			}
			if s == last || (s == begin && code != 0) {
				return failed, firstOf(errs)
			}
		}
	}
}

// firstOf returns the first error and how many more messages failed: when
// one message is refused the kernel reports the rest of the batch too.
func firstOf(errs []error) error {
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	return fmt.Errorf("%w (and %d more messages of the transaction refused)", errs[0], len(errs)-1)
}
