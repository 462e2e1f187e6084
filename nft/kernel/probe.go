package kernel

import (
	"fmt"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// probeTable is the table of the probe transaction, which never commits.
const probeTable = nft.TableName + "-probe"

// feature is what the agent's table needs of the kernel, one part of the
// probe transaction each: what it is, the oldest mainline kernel that has
// it, and the module that brings it.
type feature struct {
	what, since, module string
	add                 func(cc *nftables.Conn, t *nftables.Table)
}

// features are asked in this order: each may use what the ones before made.
var features = []feature{{
	what: "nf_tables tables of the inet family", since: "3.14", module: "nf_tables",
	add: func(cc *nftables.Conn, t *nftables.Table) { cc.AddTable(t) },
}, {
	what: "interval sets of addresses", since: "3.13", module: "nf_tables",
	add: func(cc *nftables.Conn, t *nftables.Table) {
		cc.AddSet(&nftables.Set{Table: t, Name: "s", KeyType: nftables.TypeIPAddr, Interval: true, KeyByteOrder: binaryutil.BigEndian}, nil)
	},
}, {
	what: "nat chains in the inet family", since: "5.2", module: "nft_chain_nat",
	add: func(cc *nftables.Conn, t *nftables.Table) {
		cc.AddChain(&nftables.Chain{Table: t, Name: "c", Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	},
}, {
	what: "the fib expression", since: "4.10", module: "nft_fib_inet",
	add: func(cc *nftables.Conn, t *nftables.Table) {
		f := expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true} // fib daddr type
		cc.AddRule(&nftables.Rule{Table: t, Chain: &nftables.Chain{Name: "c"}, Exprs: []expr.Any{&f,
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)}}})
	},
}, {
	what: "set lookups of the destination address", since: "3.13", module: "nf_tables",
	add: func(cc *nftables.Conn, t *nftables.Table) {
		p := expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4} // ip daddr
		cc.AddRule(&nftables.Rule{Table: t, Chain: &nftables.Chain{Name: "c"}, Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
			&p, &expr.Lookup{SourceRegister: 1, SetName: "s"}}})
	},
}, {
	what: "the counter expression", since: "3.13", module: "nft_counter",
	add: func(cc *nftables.Conn, t *nftables.Table) {
		cc.AddRule(&nftables.Rule{Table: t, Chain: &nftables.Chain{Name: "c"}, Exprs: []expr.Any{&expr.Counter{}}})
	},
}, {
	what: "masquerade in the inet family", since: "5.2", module: "nft_masq",
	add: func(cc *nftables.Conn, t *nftables.Table) {
		cc.AddRule(&nftables.Rule{Table: t, Chain: &nftables.Chain{Name: "c"}, Exprs: []expr.Any{&expr.Masq{FullyRandom: true}}})
	},
}}

// Probe asks the kernel whether it has what the agent's table needs, with
// one transaction that never commits: it creates a table of its own
// (ip-masq-agent-probe) with one set, one nat chain and a rule for each
// expression the agent uses, then deletes a table that does not exist,
// which the kernel refuses, so that it aborts the whole transaction and
// nothing changes (no generation, no notification). The kernel answers for
// each message: the first one refused names what it lacks. A kernel that
// has everything, or a probe that cannot tell (no CAP_NET_ADMIN: the
// transaction is refused as a whole), gives nil. Only the answers are
// used, never the kernel's version: the versions in the error are the
// oldest mainline kernels with the feature, for the operator.
//
// Unless ownership is off (NoOwner), the probe also creates a second table
// owned and persistent, as the agent's own is on Linux 6.9 and later: a
// kernel that refuses it, whatever its answer, cannot own the table, and
// the Netlink does not ask for ownership again (Owns reports false).
func (n *Netlink) Probe() error {
	b, err := probeBatch(!n.NoOwner)
	if err != nil {
		return err
	}
	// A socket of its own, closed after: the probe leaves the Netlink's
	// sockets (commit, read, notifications) as they were.
	conn, err := dial(n.NetNS)
	if err != nil {
		return err
	}
	defer conn.Close()
	failed, err := b.send(conn, 0)
	if failed >= 0 && failed < len(b.op) && b.op[failed] == probeOwned {
		// Not essential: the table is verified and repaired instead,
		// from the first sync on (not after a refused transaction).
		n.mu.Lock()
		n.unsupported = true
		n.mu.Unlock()
		nft.CannotOwn(err)
		return nil
	}
	if err == nil {
		// The sentinel was taken: the probe table exists. Never seen; but
		// the agent must not leave a table that is not its own behind.
		del := &batch{msgs: []netlink.Message{tableMsg(unix.NFT_MSG_DELTABLE, probeTable, 0, 0)}, op: []int{0}}
		_, derr := del.send(conn, 0)
		return fmt.Errorf("the kernel took the deletion of a table that does not exist; delete table inet %s: %v", probeTable, derr)
	}
	return lacks(b.op, failed, err)
}

// lacks reads the answer to the probe: which feature the first refused
// message belongs to (op: the feature of each message, -1 for the sentinel).
func lacks(op []int, failed int, err error) error {
	if failed < 0 || failed >= len(op) || op[failed] < 0 || op[failed] >= len(features) {
		return nil // the sentinel alone, or the whole transaction refused
	}
	f := features[op[failed]]
	return fmt.Errorf("the kernel lacks %s (Linux %s or later; module %s): %w", f.what, f.since, f.module, err)
}

// Message kinds of the probe that are not features.
const (
	probeSentinel = -1 // deletes a table that does not exist
	probeOwned    = -2 // creates an owned, persistent table
)

// probeBatch encodes the probe: the features' messages, with owned the
// owned table's, then the sentinel.
func probeBatch(owned bool) (*batch, error) {
	b := &batch{}
	ack := []netlink.Message{{Header: netlink.Header{Type: netlink.Error}, Data: make([]byte, 4)}}
	cc, _ := nftables.New(nftables.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
		if req == nil {
			return ack, nil
		}
		b.msgs = append(b.msgs, req[1:len(req)-1]...)
		return nil, nil
	}))
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: probeTable}
	for i, f := range features {
		n := len(b.msgs)
		f.add(cc, t)
		if err := cc.Flush(); err != nil {
			return nil, fmt.Errorf("encode the probe of %s: %w", f.what, err)
		}
		for range b.msgs[n:] {
			b.op = append(b.op, i)
		}
	}
	// The sentinel: the deletion of a table that does not exist, which
	// every kernel refuses (ENOENT), so that the transaction aborts.
	if owned {
		b.msgs = append(b.msgs, tableMsg(unix.NFT_MSG_NEWTABLE, probeTable+"-owned", netlink.Create, tableFlagOwner|tableFlagPersist))
		b.op = append(b.op, probeOwned)
	}
	b.msgs = append(b.msgs, tableMsg(unix.NFT_MSG_DELTABLE, probeTable+"-absent", 0, 0))
	b.op = append(b.op, probeSentinel)
	return b, nil
}

// tableMsg is a table message of family inet, with table flags tflags.
func tableMsg(typ int, name string, flags netlink.HeaderFlags, tflags uint32) netlink.Message {
	attrs := []netlink.Attribute{attr(unix.NFTA_TABLE_NAME, cstring(name))}
	if tflags != 0 {
		attrs = append(attrs, attr(unix.NFTA_TABLE_FLAGS, binaryutil.BigEndian.PutUint32(tflags)))
	}
	data, _ := netlink.MarshalAttributes(attrs)
	return netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | typ), Flags: netlink.Request | flags},
		Data:   append(nfgenmsg(unix.NFPROTO_INET, 0), data...),
	}
}
