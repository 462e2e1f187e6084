package nft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Applier makes the kernel's table inet ip-masq-agent hold a Ruleset. It is
// the only code that talks to the kernel. Its methods are safe for
// concurrent use, but Apply calls are serialized.
type Applier struct {
	// NetNS is a file descriptor of the network namespace to program;
	// 0 means the caller's own.
	NetNS int

	applyMu sync.Mutex // one Apply at a time

	mu       sync.Mutex
	applied  *Ruleset // what the kernel holds since the last commit, if known
	gen      uint32   // the nftables generation that commit made (0: unknown)
	dirty    bool     // another process touched the table since, or events were lost
	changes  uint64   // counts markDirty calls, so that Apply does not clear a newer one
	watching bool     // a Watch has received every event since before the last commit
	ownPorts []uint32 // netlink port ids of the agent's recent transactions
}

// Result says what an Apply did.
type Result struct {
	Unchanged bool // the kernel already held the ruleset: nothing was sent
	Created   bool // the table was (re-)created whole, not replaced in place
	Partial   bool // only the differences were sent
	Messages  int  // netlink messages in the transaction
	Bytes     int  // their size
}

// Apply makes the table hold rs, in one netlink transaction: either all of
// rs is in force afterwards or, on error, all of the old state.
//
// When the kernel provably still holds the last ruleset applied (no other
// process touched the table since: see Watch, or the nftables generation is
// the one the agent's commit made), an equal rs sends nothing, so counters
// keep counting, and a different rs sends only the differences: elements
// added and removed, and the chains whose rules changed. Otherwise the
// table's sets and chains are flushed and refilled in place.
//
// The table is deleted and re-created (in the same single transaction) only
// when it is missing or its shape is wrong: measured on kernel 6.18, while
// delete-and-recreate swaps ran, 2-6% of new connections to non-masquerade
// destinations were masqueraded; in-place swaps made no wrong decision.
func (a *Applier) Apply(rs Ruleset) (Result, error) {
	a.applyMu.Lock()
	defer a.applyMu.Unlock()
	conn, err := a.dial()
	if err != nil {
		return Result{}, fmt.Errorf("apply table inet %s: open netlink socket: %w", TableName, err)
	}
	defer closeLater(conn)
	last, epoch, err := a.known(conn)
	if err != nil {
		return Result{}, fmt.Errorf("apply table inet %s: read the nftables generation: %w", TableName, err)
	}
	if last != nil && last.Equal(rs) {
		return Result{Unchanged: true}, nil
	}
	b := newBatch()
	o := objectsFor(rs)
	res := Result{}
	switch {
	case last != nil && last.Chain == rs.Chain:
		res.Partial = true
		a.addChanges(b, o, *last, rs)
	default:
		exists, sameShape, err := a.inspect(rs)
		if err != nil {
			return Result{}, fmt.Errorf("apply table inet %s: read the current table: %w", TableName, err)
		}
		res.Created = !sameShape
		if sameShape {
			for _, c := range o.chains {
				b.add("flush chain "+c.Name, func(cc *nftables.Conn) error { cc.FlushChain(c); return nil })
			}
			for _, s := range o.sets {
				b.add("flush set "+s.Name, func(cc *nftables.Conn) error { cc.FlushSet(s); return nil })
			}
		} else {
			if exists {
				b.add("delete the table, whose sets or chains are not the agent's",
					func(cc *nftables.Conn) error { cc.DelTable(o.table); return nil })
			}
			b.add("add table", func(cc *nftables.Conn) error { cc.AddTable(o.table); return nil })
			for _, s := range o.sets {
				b.add("add set "+s.Name, func(cc *nftables.Conn) error { return cc.AddSet(s, nil) })
			}
			for _, c := range o.chains {
				b.add("add chain "+c.Name, func(cc *nftables.Conn) error { cc.AddChain(c); return nil })
			}
		}
		for i, rules := range rs.chains() {
			addRules(b, o.chains[i].Name, rules)
		}
		for i, s := range rs.Sets {
			addElements(b, o.sets[i], "add", s.Prefixes)
		}
	}
	if b.err != nil {
		// Never send a batch after a builder error.
		return Result{}, fmt.Errorf("apply table inet %s: %w", TableName, b.err)
	}
	res.Messages, res.Bytes = len(b.msgs), b.size()
	before, _ := generation(conn)
	err = b.send(conn, a.own)
	after, _ := generation(conn)
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		a.applied = nil // the kernel refused the batch; whatever it holds, it is not ours to assume
		return res, fmt.Errorf("apply table inet %s: %w", TableName, err)
	}
	// A foreign change seen while this batch was built or sent may not be
	// undone by it: stay dirty, the watcher's callback brings a full apply.
	a.applied, a.dirty, a.gen = &rs, a.changes != epoch, 0
	// Our commit made generation before+1; if after is that, nothing else
	// committed in between and after identifies our state.
	if before != 0 && after == before+1 {
		a.gen = after
	}
	return res, nil
}

// known returns the ruleset the kernel holds, if it is provably still the
// last one applied, or nil when unsure; and the count of changes seen.
func (a *Applier) known(conn *netlink.Conn) (*Ruleset, uint64, error) {
	a.mu.Lock()
	last, gen, dirty, watching, epoch := a.applied, a.gen, a.dirty, a.watching, a.changes
	a.mu.Unlock()
	if last == nil || dirty {
		return nil, epoch, nil
	}
	if watching {
		return last, epoch, nil
	}
	cur, err := generation(conn)
	if err != nil || gen == 0 || cur != gen {
		return nil, epoch, err
	}
	return last, epoch, nil
}

// Forget makes the next Apply rewrite the whole table, trusting nothing.
func (a *Applier) Forget() {
	a.mu.Lock()
	a.applied = nil
	a.mu.Unlock()
}

// addChanges adds what turns the table from last into rs: removed and
// added elements, and the rules of the chains whose rules differ.
func (a *Applier) addChanges(b *batch, o objects, last, rs Ruleset) {
	for i, rules := range rs.chains() {
		if !slices.EqualFunc(last.chains()[i], rules, Rule.equal) {
			c := o.chains[i]
			b.add("flush chain "+c.Name, func(cc *nftables.Conn) error { cc.FlushChain(c); return nil })
			addRules(b, c.Name, rules)
		}
	}
	for i, s := range rs.Sets {
		removed, added := diffPrefixes(last.Sets[i].Prefixes, s.Prefixes)
		addElements(b, o.sets[i], "delete", removed)
		addElements(b, o.sets[i], "add", added)
	}
}

// diffPrefixes returns what is in old but not in new, and the reverse; both
// lists are sorted as Normalize sorts them.
func diffPrefixes(old, new []netip.Prefix) (removed, added []netip.Prefix) {
	i, j := 0, 0
	for i < len(old) || j < len(new) {
		switch {
		case j == len(new) || (i < len(old) && comparePrefix(old[i], new[j]) < 0):
			removed = append(removed, old[i])
			i++
		case i == len(old) || comparePrefix(old[i], new[j]) > 0:
			added = append(added, new[j])
			j++
		default:
			i++
			j++
		}
	}
	return removed, added
}

func addRules(b *batch, chain string, rules []Rule) {
	for _, r := range rules {
		msg, err := ruleMessage(chain, r)
		if err != nil {
			b.fail(fmt.Errorf("encode rule %q: %w", RenderRule(r), err))
			return
		}
		b.addMessage(fmt.Sprintf("add rule to chain %s: %s", chain, RenderRule(r)), msg)
	}
}

// addElements adds or deletes elements, in messages of elementsPerMessage.
func addElements(b *batch, set *nftables.Set, op string, ps []netip.Prefix) {
	for start := 0; start < len(ps); start += elementsPerMessage {
		chunk := ps[start:min(start+elementsPerMessage, len(ps))]
		what := fmt.Sprintf("%s elements %d-%d of %d in set %s", op, start+1, start+len(chunk), len(ps), set.Name)
		b.add(what, func(cc *nftables.Conn) error {
			if op == "delete" {
				return cc.SetDeleteElements(set, intervals(chunk))
			}
			return cc.SetAddElements(set, intervals(chunk))
		})
	}
}

// own records the port id of a socket that sends a transaction of ours.
func (a *Applier) own(port uint32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ownPorts = append(a.ownPorts, port)
	if len(a.ownPorts) > 16 {
		a.ownPorts = a.ownPorts[1:]
	}
}

// dial opens the socket of one Apply: the generation reads and the batch
// share it.
func (a *Applier) dial() (*netlink.Conn, error) {
	return netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: a.NetNS})
}

// closeLater closes a netlink socket in the background: on kernel 6.18
// closing an nftables socket waits for the objects of earlier transactions
// to be freed (an RCU grace period, 10 ms and more), which would delay
// Apply's return long after the rules are in force.
func closeLater(c interface{ Close() error }) { go c.Close() }

// generation returns the kernel's nftables generation id: one small
// request, which says whether anything at all changed since a commit.
func generation(conn *netlink.Conn) (uint32, error) {
	msgs, err := conn.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		Data:   nfgenmsg(unix.AF_UNSPEC, 0),
	})
	if err != nil {
		return 0, err
	}
	for _, m := range msgs {
		if id, ok := genID(m.Data); ok {
			return id, nil
		}
	}
	return 0, errors.New("no generation id in the kernel's answer")
}

// genID reads NFTA_GEN_ID from a NEWGEN message's payload.
func genID(data []byte) (uint32, bool) {
	if len(data) < 4 {
		return 0, false
	}
	ad, err := netlink.NewAttributeDecoder(data[4:])
	if err != nil {
		return 0, false
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		if ad.Type() == unix.NFTA_GEN_ID {
			return ad.Uint32(), true
		}
	}
	return 0, false
}

// Delete removes the agent's table; it is not an error if there is none.
func (a *Applier) Delete() error {
	exists, _, err := a.inspect(Ruleset{})
	if err != nil || !exists {
		return err
	}
	b := newBatch()
	b.add("delete table", func(cc *nftables.Conn) error {
		cc.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: TableName})
		return nil
	})
	a.Forget()
	conn, err := a.dial()
	if err != nil {
		return fmt.Errorf("delete table inet %s: open netlink socket: %w", TableName, err)
	}
	defer conn.Close()
	if err := b.send(conn, a.own); err != nil {
		return fmt.Errorf("delete table inet %s: %w", TableName, err)
	}
	return nil
}

// elementsPerMessage bounds one NEWSETELEM message well below 64 KiB: a
// netlink attribute's length is 16 bits, and google/nftables v0.3.0 lets a
// larger element list wrap silently, so the kernel keeps a fragment of the
// set while the batch succeeds. 512 IPv6 intervals take about 36 KiB.
const elementsPerMessage = 512

// intervals encodes prefixes as interval-set elements: the first address,
// and the address after the last flagged as interval end. A prefix that
// reaches the top of the address space (0.0.0.0/0, 240.0.0.0/4, ::/0) has no
// address after it and gets no end element, as nft does.
func intervals(ps []netip.Prefix) []nftables.SetElement {
	out := make([]nftables.SetElement, 0, 2*len(ps))
	for _, p := range ps {
		out = append(out, nftables.SetElement{Key: p.Addr().AsSlice()})
		last := p.Addr()
		if bits := p.Bits(); bits < last.BitLen() {
			last = lastAddr(p)
		}
		if end := last.Next(); end.IsValid() {
			out = append(out, nftables.SetElement{Key: end.AsSlice(), IntervalEnd: true})
		}
	}
	return out
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// objects are the google/nftables values of the table, its sets (in
// Ruleset.Sets order) and its chains (base, decision, masquerade).
type objects struct {
	table  *nftables.Table
	sets   []*nftables.Set
	chains []*nftables.Chain
}

func objectsFor(rs Ruleset) objects {
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
	o := objects{table: t}
	for _, s := range rs.Sets {
		key := nftables.TypeIPAddr
		if s.Family == 6 {
			key = nftables.TypeIP6Addr
		}
		o.sets = append(o.sets, &nftables.Set{Table: t, Name: s.Name, KeyType: key, Interval: true,
			KeyByteOrder: binaryutil.BigEndian, Comment: s.Comment})
	}
	accept := nftables.ChainPolicyAccept
	o.chains = []*nftables.Chain{
		{Table: t, Name: BaseChainName, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting,
			Priority: nftables.ChainPriorityRef(Priority), Policy: &accept},
		{Table: t, Name: rs.Chain},
		{Table: t, Name: MasqChainName},
	}
	return o
}

// inspect reports whether the table exists and whether its sets and chains
// are exactly those rs needs (so that they can be refilled in place).
func (a *Applier) inspect(rs Ruleset) (exists, sameShape bool, err error) {
	// One socket for the three reads (see closeLater).
	c, err := nftables.New(nftables.WithNetNSFd(a.NetNS), nftables.AsLasting())
	if err != nil {
		return false, false, err
	}
	defer closeLater(closerFunc(c.CloseLasting))
	t, err := c.ListTableOfFamily(TableName, nftables.TableFamilyINet)
	if errors.Is(err, os.ErrNotExist) {
		return false, false, nil
	}
	if err != nil {
		return false, false, fmt.Errorf("list table: %w", err)
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return true, false, fmt.Errorf("list chains: %w", err)
	}
	sets, err := c.GetSets(t)
	if err != nil {
		return true, false, fmt.Errorf("list sets: %w", err)
	}
	want := objectsFor(rs)
	if t.Flags != 0 { // e.g. dormant: the rules would not run
		return true, false, nil
	}
	var gotChains []string
	for _, ch := range chains {
		if ch.Table == nil || ch.Table.Name != TableName {
			continue
		}
		gotChains = append(gotChains, ch.Name)
		if ch.Name == BaseChainName && (ch.Hooknum == nil || *ch.Hooknum != *nftables.ChainHookPostrouting ||
			ch.Priority == nil || *ch.Priority != Priority || ch.Type != nftables.ChainTypeNAT ||
			ch.Policy == nil || *ch.Policy != nftables.ChainPolicyAccept) {
			return true, false, nil
		}
	}
	var wantChains []string
	for _, ch := range want.chains {
		wantChains = append(wantChains, ch.Name)
	}
	if !sameNames(gotChains, wantChains) || len(sets) != len(want.sets) {
		return true, false, nil
	}
	for _, w := range want.sets {
		i := slices.IndexFunc(sets, func(s *nftables.Set) bool { return s.Name == w.Name })
		// Anything but a plain interval set (a size limit, a timeout, ...)
		// was set by someone else and would make refills fail or expire.
		if i < 0 {
			return true, false, nil
		}
		g := sets[i]
		if !g.Interval || g.KeyType.Name != w.KeyType.Name || g.IsMap || g.Size != 0 ||
			g.Constant || g.HasTimeout || g.Dynamic || g.Concatenation || g.Anonymous {
			return true, false, nil
		}
	}
	return true, true, nil
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

func sameNames(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// ruleMessage encodes a NEWRULE message. Rules are encoded here rather than
// with nftables.Conn.AddRule because expr.Masq of google/nftables v0.3.0
// drops fully-random when it has a port range, and AddRule asks the kernel
// to echo every rule back.
func ruleMessage(chain string, r Rule) (netlink.Message, error) {
	var exprs []expr.Any
	if r.NotLocal {
		// fib's address type is a host-endian u32 (RTN_LOCAL is 2).
		exprs = append(exprs,
			&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)})
	}
	if r.Family != 0 {
		proto := byte(unix.NFPROTO_IPV4)
		if r.Family == 6 {
			proto = unix.NFPROTO_IPV6
		}
		exprs = append(exprs,
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}})
	}
	if r.DaddrSet != "" {
		offset, size := uint32(16), uint32(4) // IPv4 header's daddr
		if r.Family == 6 {
			offset, size = 24, 16
		}
		exprs = append(exprs,
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: size},
			&expr.Lookup{SourceRegister: 1, SetName: r.DaddrSet})
	}
	if r.L4Proto != 0 {
		exprs = append(exprs,
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{r.L4Proto}})
	}
	if r.Share != nil {
		// numgen yields a host-endian u32; cmp lt compares bytes, so
		// convert to network order first, as nft does.
		exprs = append(exprs,
			&expr.Numgen{Register: 1, Modulus: r.Share.Of, Type: unix.NFT_NG_RANDOM},
			&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 4, Size: 4},
			&expr.Cmp{Op: expr.CmpOpLt, Register: 1, Data: binaryutil.BigEndian.PutUint32(r.Share.Below)})
	}
	// The counter goes before the verdict: after masquerade it never counts.
	exprs = append(exprs, &expr.Counter{})
	switch r.Verdict {
	case Return:
		exprs = append(exprs, &expr.Verdict{Kind: expr.VerdictReturn})
	case Jump:
		exprs = append(exprs, &expr.Verdict{Kind: expr.VerdictJump, Chain: r.Target})
	case Goto:
		exprs = append(exprs, &expr.Verdict{Kind: expr.VerdictGoto, Chain: r.Target})
	case Masquerade:
		if r.Ports != nil {
			exprs = append(exprs,
				&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(r.Ports.First)},
				&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(r.Ports.Last)})
		}
	default:
		return netlink.Message{}, fmt.Errorf("unknown verdict %d", r.Verdict)
	}

	var list []netlink.Attribute
	for _, e := range exprs {
		b, err := expr.Marshal(unix.NFPROTO_INET, e)
		if err != nil {
			return netlink.Message{}, err
		}
		list = append(list, netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: b})
	}
	if r.Verdict == Masquerade {
		b, err := masqExpr(r)
		if err != nil {
			return netlink.Message{}, err
		}
		list = append(list, netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: b})
	}
	exprList, err := netlink.MarshalAttributes(list)
	if err != nil {
		return netlink.Message{}, err
	}
	data, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_RULE_TABLE, Data: cstring(TableName)},
		{Type: unix.NFTA_RULE_CHAIN, Data: cstring(chain)},
		{Type: unix.NLA_F_NESTED | unix.NFTA_RULE_EXPRESSIONS, Data: exprList},
		{Type: unix.NFTA_RULE_USERDATA, Data: userdata.AppendString(nil, userdata.TypeComment, r.Comment)},
	})
	if err != nil {
		return netlink.Message{}, err
	}
	return netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWRULE),
			Flags: netlink.Request | netlink.Create | unix.NLM_F_APPEND,
		},
		Data: append(nfgenmsg(unix.NFPROTO_INET, 0), data...),
	}, nil
}

// masqExpr encodes `masquerade [to :min-max] [fully-random]` with the port
// range in registers 1 and 2, flags included (see ruleMessage).
func masqExpr(r Rule) ([]byte, error) {
	var flags uint32
	var attrs []netlink.Attribute
	if r.FullyRandom {
		flags |= unix.NF_NAT_RANGE_PROTO_RANDOM_FULLY
	}
	if r.Ports != nil {
		flags |= unix.NF_NAT_RANGE_PROTO_SPECIFIED
		attrs = append(attrs,
			netlink.Attribute{Type: unix.NFTA_MASQ_REG_PROTO_MIN, Data: binaryutil.BigEndian.PutUint32(1)},
			netlink.Attribute{Type: unix.NFTA_MASQ_REG_PROTO_MAX, Data: binaryutil.BigEndian.PutUint32(2)})
	}
	if flags != 0 {
		attrs = append(attrs, netlink.Attribute{Type: unix.NFTA_MASQ_FLAGS, Data: binaryutil.BigEndian.PutUint32(flags)})
	}
	data, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return nil, err
	}
	return netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_EXPR_NAME, Data: cstring("masq")},
		{Type: unix.NLA_F_NESTED | unix.NFTA_EXPR_DATA, Data: data},
	})
}

func cstring(s string) []byte { return append([]byte(s), 0) }

// nfgenmsg is the header of every nftables message: family, version, resource id.
func nfgenmsg(family uint8, resID uint16) []byte {
	return append([]byte{family, unix.NFNETLINK_V0}, binaryutil.BigEndian.PutUint16(resID)...)
}
