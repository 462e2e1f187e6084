package kernel

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strconv"
	"strings"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// probeTable is the prefix of the probe transaction's tables, which it
// never commits. Each probe adds a random suffix: a table another process
// made under a fixed name would be reused by the probe's messages (the
// kernel takes a create of an existing table), and could fail the probe
// (an owned one), turn ownership off (an unowned "-owned") or let it
// commit.
const probeTable = nft.TableName + "-probe-"

// feature is what the agent's table needs of the kernel, one part of the
// probe transaction each: what it is, the oldest mainline kernel that has
// it, and the module that brings it. needs, when not nil, says whether
// the table built with the options o uses it (nil: every table does).
type feature struct {
	what, since, module string
	needs               func(o nft.Options) bool
	add                 func(cc *nftables.Conn, t *nftables.Table, o nft.Options)
}

// probeRule adds, to the probe's nat chain, the rule r in the agent's own
// encoding (nft.Rule.Encode), as its table has it.
func probeRule(cc *nftables.Conn, t *nftables.Table, r nft.Rule) {
	cc.AddRule(&nftables.Rule{Table: t, Chain: &nftables.Chain{Name: "c"}, Exprs: r.Encode()})
}

// probePorts is the port range of the probe's masquerade to ports when the
// options have none (Probe: every feature).
var probePorts = nft.PortRange{First: 1024, Last: 65535}

// features are asked in this order: each may use what the ones before made.
var features = []feature{{
	what: "nf_tables tables of the inet family", since: "3.14", module: "nf_tables",
	add: func(cc *nftables.Conn, t *nftables.Table, _ nft.Options) { cc.AddTable(t) },
}, {
	what: "interval sets of addresses", since: "3.13", module: "nf_tables",
	add: func(cc *nftables.Conn, t *nftables.Table, _ nft.Options) {
		cc.AddSet(&nftables.Set{Table: t, Name: "s", KeyType: nftables.TypeIPAddr, Interval: true, KeyByteOrder: binaryutil.BigEndian}, nil)
	},
}, {
	what: "nat chains in the inet family", since: "5.2", module: "nft_chain_nat",
	add: func(cc *nftables.Conn, t *nftables.Table, _ nft.Options) {
		cc.AddChain(&nftables.Chain{Table: t, Name: "c", Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	},
}, {
	what: "the fib expression", since: "4.10", module: "nft_fib_inet",
	add: func(cc *nftables.Conn, t *nftables.Table, _ nft.Options) {
		f := expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true} // fib daddr type
		cc.AddRule(&nftables.Rule{Table: t, Chain: &nftables.Chain{Name: "c"}, Exprs: []expr.Any{&f,
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)}}})
	},
}, {
	what: "set lookups of the destination address", since: "3.13", module: "nf_tables",
	add: func(cc *nftables.Conn, t *nftables.Table, _ nft.Options) {
		p := nft.Daddr(4)
		cc.AddRule(&nftables.Rule{Table: t, Chain: &nftables.Chain{Name: "c"}, Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
			&p, &expr.Lookup{SourceRegister: 1, SetName: "s"}}})
	},
}, {
	// masqueradeSourceCIDRs: ip saddr != @set return, the lookup's
	// NFTA_LOOKUP_FLAGS (nft/build.go). Asked of every kernel: a config
	// may set the key at any time, and every kernel with inet nat has it.
	what: "inverted set lookups of the source address (ip saddr != @set)", since: "4.10", module: "nf_tables",
	add: func(cc *nftables.Conn, t *nftables.Table, _ nft.Options) {
		probeRule(cc, t, nft.Rule{Family: 4, Selector: nft.SelSaddr, Set: "s", Invert: true, Verdict: nft.Return})
	},
}, {
	// egressInterfaces: an interval set of interface names (nft's
	// "eth*"), looked up with meta oifname, inverted (nft/build.go).
	what: "interval sets of interface names", since: "3.13", module: "nf_tables",
	add: func(cc *nftables.Conn, t *nftables.Table, _ nft.Options) {
		cc.AddSet(&nftables.Set{Table: t, Name: "i", KeyType: nftables.TypeIFName, Interval: true, KeyByteOrder: binaryutil.BigEndian}, nil)
	},
}, {
	what: "inverted set lookups of the out interface (oifname != @set)", since: "4.10", module: "nf_tables",
	add: func(cc *nftables.Conn, t *nftables.Table, _ nft.Options) {
		probeRule(cc, t, nft.Rule{Family: 4, Selector: nft.SelOif, Set: "i", Invert: true, Verdict: nft.Return})
	},
}, {
	what: "the counter expression", since: "3.13", module: "nft_counter",
	add: func(cc *nftables.Conn, t *nftables.Table, _ nft.Options) {
		// counter return: the agent's encoding of a rule, whose verdict
		// (nf_tables' own immediate) every kernel has.
		probeRule(cc, t, nft.Rule{Verdict: nft.Return})
	},
}, {
	what: "masquerade in the inet family", since: "5.2", module: "nft_masq",
	add: func(cc *nftables.Conn, t *nftables.Table, _ nft.Options) {
		cc.AddRule(&nftables.Rule{Table: t, Chain: &nftables.Chain{Name: "c"}, Exprs: []expr.Any{&expr.Masq{FullyRandom: true}}})
	},
}, {
	// --conntrack-label (on by default): every masquerade rule marks the
	// connection, ct label set BIT (nft/codec.go).
	what: "setting conntrack labels (ct label set)", since: "4.7", module: "nft_ct",
	needs: func(o nft.Options) bool { return o.CtLabel != nil },
	add: func(cc *nftables.Conn, t *nftables.Table, o nft.Options) {
		bit := uint8(0)
		if o.CtLabel != nil {
			bit = *o.CtLabel
		}
		probeRule(cc, t, nft.Rule{CtLabel: &bit, Verdict: nft.Masquerade})
	},
}, {
	// --to-ports: masquerade to a source port range, for TCP, UDP, SCTP.
	what: "masquerade to a port range", since: "4.6", module: "nft_masq",
	needs: func(o nft.Options) bool { return len(o.ToPorts) > 0 },
	add: func(cc *nftables.Conn, t *nftables.Table, o nft.Options) {
		p := probePorts
		if len(o.ToPorts) > 0 {
			p = o.ToPorts[0]
		}
		probeRule(cc, t, nft.Rule{L4Proto: unix.IPPROTO_TCP, Verdict: nft.Masquerade, Ports: &p, FullyRandom: o.RandomFully})
	},
}, {
	// --to-ports with more than one range: each but the last is chosen
	// by a random number, numgen random mod N < SIZE (nft/build.go).
	what: "the numgen expression", since: "4.9", module: "nft_numgen",
	needs: func(o nft.Options) bool { return len(o.ToPorts) > 1 },
	add: func(cc *nftables.Conn, t *nftables.Table, _ nft.Options) {
		probeRule(cc, t, nft.Rule{L4Proto: unix.IPPROTO_TCP, Share: &nft.Share{Below: 1, Of: 2}, Verdict: nft.Return})
	},
}, {
	// snatAddress, snatAddressIPv6: snat ip|ip6 to ADDR through the
	// interface that holds it (oifname, nft_meta, which every table's
	// meta nfproto already needs), with the port range of --to-ports.
	what: "source NAT to an address (snat, for snatAddress)", since: "5.2", module: "nft_nat",
	needs: func(o nft.Options) bool { return o.SNAT },
	add: func(cc *nftables.Conn, t *nftables.Table, o nft.Options) {
		r := nft.Rule{Family: 4, OutIf: "probe0", Verdict: nft.Masquerade, To: netip.MustParseAddr("192.0.2.1"), FullyRandom: o.RandomFully}
		probeRule(cc, t, r)
		r.Family, r.To = 6, netip.MustParseAddr("2001:db8::1")
		if len(o.ToPorts) > 0 {
			r.L4Proto, r.Ports = unix.IPPROTO_TCP, &o.ToPorts[0]
		}
		probeRule(cc, t, r)
	},
}}

// probeEverything is the options under which Probe asks for every
// feature: a conntrack label, two port ranges and snat.
var probeEverything = nft.Options{CtLabel: new(uint8), ToPorts: []nft.PortRange{{First: 1024, Last: 32767}, {First: 32768, Last: 65535}}, SNAT: true}

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
//
// Probe asks for every feature any option can need; ProbeFor, the
// agent's start probe, only for those the table built with o uses.
func (n *Netlink) Probe() error { return n.ProbeFor(probeEverything) }

// ProbeFor is Probe for the table built with the options o: the features
// that every table needs, and those of o (a conntrack label, port ranges).
func (n *Netlink) ProbeFor(o nft.Options) error {
	name := probeTable + strconv.FormatUint(rand.Uint64(), 36)
	b, err := probeBatch(name, !n.NoOwner, o)
	if err != nil {
		return err
	}
	// A socket of its own, closed after: the probe leaves the Netlink's
	// sockets (commit, read, notifications) as they were.
	conn, err := dial(n.NetNS)
	if err != nil {
		return fmt.Errorf("probe the kernel: %w", err)
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
		del := &batch{msgs: []netlink.Message{tableMsg(unix.NFT_MSG_DELTABLE, name, 0, 0)}, op: []int{0}}
		if !n.NoOwner {
			del.msgs, del.op = append(del.msgs, tableMsg(unix.NFT_MSG_DELTABLE, name+"-owned", 0, 0)), []int{0, 0}
		}
		_, derr := del.send(conn, 0)
		return fmt.Errorf("the kernel took the deletion of a table that cannot exist; delete table inet %s: %v", name, derr)
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
	return &LacksError{What: f.what, Since: f.since, Module: f.module, Err: err}
}

// LacksError is the probe's finding: the kernel refused the part of the
// probe that asks for What (its answer: Err). Since is the oldest
// mainline kernel with it, Module the module that brings it.
type LacksError struct {
	What, Since, Module string
	Err                 error
}

func (e *LacksError) Error() string {
	return fmt.Sprintf("the kernel lacks %s (Linux %s or later; module %s): %v", e.What, e.Since, e.Module, e.Err)
}

func (e *LacksError) Unwrap() error { return e.Err }

// Message kinds of the probe that are not features.
const (
	probeSentinel = -1 // deletes a table that does not exist
	probeOwned    = -2 // creates an owned, persistent table
)

// probeBatch encodes the probe in table name: the messages of the
// features that the table built with o needs, with owned the owned
// table's, then the sentinel.
func probeBatch(name string, owned bool, o nft.Options) (*batch, error) {
	b := &batch{}
	cc := b.recorder()
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: name}
	for i, f := range features {
		if f.needs != nil && !f.needs(o) {
			continue
		}
		n := len(b.msgs)
		f.add(cc, t, o)
		if err := cc.Flush(); err != nil {
			return nil, fmt.Errorf("encode the probe of %s: %w", f.what, err)
		}
		for range b.msgs[n:] {
			b.op = append(b.op, i)
		}
	}
	// The sentinel: the deletion of a table whose name is too long to
	// exist (fenceName), which every kernel refuses before it looks for
	// it, so that the transaction aborts (the abort waits for an RCU grace
	// period: most of the probe's time).
	if owned {
		b.msgs = append(b.msgs, tableMsg(unix.NFT_MSG_NEWTABLE, name+"-owned", netlink.Create, tableFlagOwner|tableFlagPersist))
		b.op = append(b.op, probeOwned)
	}
	b.msgs = append(b.msgs, tableMsg(unix.NFT_MSG_DELTABLE, fenceName, 0, 0))
	b.op = append(b.op, probeSentinel)
	return b, nil
}

// fenceName is longer than NFT_NAME_MAXLEN (256): no table has it. The
// fence was once a transaction that deleted it; the probe's sentinel still
// does.
var fenceName = strings.Repeat("ip-masq-agent-fence.", 16)

// tableMsg is a table message of family inet, with table flags tflags.
func tableMsg(typ int, name string, flags netlink.HeaderFlags, tflags uint32) netlink.Message {
	attrs := []netlink.Attribute{attr(unix.NFTA_TABLE_NAME, cstring(name))}
	if tflags != 0 {
		attrs = append(attrs, attr(unix.NFTA_TABLE_FLAGS, binaryutil.BigEndian.PutUint32(tflags)))
	}
	return message(unix.NFPROTO_INET, typ, netlink.Request|flags, attrs...)
}
