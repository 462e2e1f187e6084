// Package kernel is the only code on the netfilter socket: it sends the
// plans of package nft as netlink transactions (batch.go), reads table
// inet ip-masq-agent back (read.go, on the requests and answers of
// request.go), watches nftables notifications (monitor.go, watch.go),
// reads counters, probes what the kernel can do, and lends its sockets
// to original/ (session.go). The read path, the batch send and the fence
// go through a small transport (request.go), which is *netlink.Conn or,
// in tests without root, a replay of a kernel's recorded datagrams
// (testdata/wire-replay.hex) that checks every request byte for byte.
package kernel

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Kernel attributes and flags that golang.org/x/sys/unix v0.48 lacks.
const (
	tableFlagOwner   = 0x2 // NFT_TABLE_F_OWNER (Linux 5.12)
	tableFlagPersist = 0x4 // NFT_TABLE_F_PERSIST (Linux 6.9)
	tableAttrOwner   = 7   // NFTA_TABLE_OWNER

	setAttrExpr        = 17 // NFTA_SET_EXPR
	setAttrExpressions = 18 // NFTA_SET_EXPRESSIONS
	setAttrCount       = 20 // NFTA_SET_COUNT (recent kernels; 6.18 has it): the elements the kernel counts
	elemAttrKeyEnd     = 10 // NFTA_SET_ELEM_KEY_END
	elemAttrExprs      = 11 // NFTA_SET_ELEM_EXPRESSIONS
	chainAttrFlags     = 10 // NFTA_CHAIN_FLAGS
	chainFlagBase      = 1  // NFT_CHAIN_BASE
	hookAttrDevs       = 4  // NFTA_HOOK_DEVS

	flowtableAttrTable = 1 // NFTA_FLOWTABLE_TABLE
	flowtableAttrName  = 2 // NFTA_FLOWTABLE_NAME
)

// Netlink is the Kernel of the machine (or of the network namespace NetNS):
// the only code that talks to nftables. It keeps one netlink socket for
// its life: when ownership is on and the kernel supports it, that socket
// owns the table, so that no other process can change it while the agent
// runs, and the table stays in force (orphaned, adoptable) when it exits.
// Its methods are safe for concurrent use; they are serialized.
type Netlink struct {
	// NetNS is a file descriptor of the network namespace to program;
	// 0 means the caller's own.
	NetNS int
	// NoOwner turns ownership off: the table is verified and repaired,
	// but other processes can change it (--own-table=false).
	NoOwner bool

	mu          sync.Mutex
	conn        *netlink.Conn // commits; it owns the table
	rconn       readConn      // reads: a read that fails never closes the owner
	unsupported bool          // the kernel refused owner+persist flags
	mon         *monitor      // notifications: who touched the table (monitor.go)
	cmu         sync.Mutex
	counters    *netlink.Conn // DecisionCounters' socket; guarded by cmu

	// The last table read whole (nil: none). It is the kernel's table for
	// as long as nothing but this socket can change it (owned), or no
	// transaction of another process has touched it since (the monitor).
	last   *nft.Table
	lastAt time.Time
	// Our last commit to the table this socket owns, not yet read back
	// (verify.go); nil: none, or the next read reads the table whole.
	change *change

	lostRead *nft.Table // the last read thrown away for lost notifications only
	lookup   int        // the kernel's interval-set lookup, once learnt (lookup.go)

	// Log, if set, is told at debug level what a read of a table that is
	// not owned read, and why: the touched parts, or the whole table.
	Log   *slog.Logger
	reads readCounts
}

// readCounts counts the reads of a table that is not owned, for tests:
// whole tables, sets read whole after a foreign touch, and elements asked
// one by one after one.
type readCounts struct{ tables, sets, elements int }

func (n *Netlink) debug(msg string, args ...any) {
	if n.Log != nil {
		n.Log.Debug(msg, args...)
	}
}

// maxReuse bounds how long a read may be answered from the last one: a
// whole read at least this often, whatever the kernel says.
const maxReuse = 5 * time.Minute

// Owns reports whether the table is to be owned by this Netlink's socket.
func (n *Netlink) Owns() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return !n.NoOwner && !n.unsupported
}

// Close closes the sockets. An owned table stays in force, orphaned, for
// the next agent to adopt.
func (n *Netlink) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.mon.close()
	n.mon = nil
	if n.rconn != nil {
		n.rconn.Close()
		n.rconn = nil
	}
	n.cmu.Lock()
	if n.counters != nil {
		n.counters.Close()
		n.counters = nil
	}
	n.cmu.Unlock()
	if n.conn == nil {
		return nil
	}
	err := n.conn.Close()
	n.conn = nil
	return err
}

// socket returns the lasting socket, dialing it first if needed.
func (n *Netlink) socket() (*netlink.Conn, error) {
	if n.conn != nil {
		return n.conn, nil
	}
	c, err := dial(n.NetNS)
	if err != nil {
		return nil, err
	}
	n.conn = c
	return c, nil
}

func dial(netns int) (*netlink.Conn, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: netns})
	if err != nil {
		return nil, fmt.Errorf("open netlink socket: %w", err)
	}
	// Acks and errors carry only the header of the failed message, not all
	// of it: an element message can be 40 KiB.
	if err := c.SetOption(netlink.CapAcknowledge, true); err != nil {
		c.Close()
		return nil, fmt.Errorf("set NETLINK_CAP_ACK: %w", err)
	}
	// No NETLINK_EXT_ACK: with it, mdlayher/netlink v1.11 fails to parse
	// answers ("not enough data for netlink error code").
	return c, nil
}

// monitor returns the notification socket, subscribing first if needed.
func (n *Netlink) monitor() (*monitor, error) {
	if n.mon == nil {
		m, err := openMonitor(n.NetNS)
		if err != nil {
			return nil, err
		}
		n.mon = m
	}
	return n.mon, nil
}

// readConn is the socket for reads: a *netlink.Conn (which tests wrap to
// act between its requests).
type readConn interface {
	transport
	Close() error
}

// reader returns the lasting socket for reads, dialing it first if needed.
func (n *Netlink) reader() (readConn, error) {
	if n.rconn == nil {
		c, err := dial(n.NetNS)
		if err != nil {
			return nil, err
		}
		n.rconn = c
	}
	return n.rconn, nil
}

// ownerPort is the port id that owns the table when it is ours (0: we
// have no commit socket, so no table is ours).
func (n *Netlink) ownerPort() uint32 {
	if n.conn == nil {
		return 0
	}
	return n.conn.PID()
}

// broken drops the commit socket, which may be out of step (a reply not
// read): an owned table is orphaned, and adopted again by the next sync.
func (n *Netlink) broken() {
	if n.conn != nil {
		n.conn.Close()
		n.conn = nil
	}
	n.last, n.change = nil, nil
	if n.mon != nil {
		n.mon.stay(0) // its port id may be another socket's from now on
	}
}

// brokenReader drops the read socket after a failed read.
func (n *Netlink) brokenReader() {
	if n.rconn != nil {
		n.rconn.Close()
		n.rconn = nil
	}
	n.last, n.change = nil, nil
}

// Send sends a plan as one transaction. With gen not 0 the kernel refuses
// it (ErrStale) if any transaction committed in the namespace since
// generation gen (NFNL_BATCH_GENID), so that a plan made from a read is
// never applied to anything but what was read.
func (n *Netlink) Send(p nft.Plan, gen uint32) (nft.Sent, error) {
	if p.Empty() {
		return nft.Sent{}, nil
	}
	b, err := encode(p)
	if err != nil {
		return nft.Sent{}, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	conn, err := n.socket()
	if err != nil {
		return nft.Sent{}, err
	}
	// Whatever happens, the next read reads the table whole, unless the
	// kernel took the plan on a table nobody else can change (owned, or
	// created owned by this plan), or the monitor sees every transaction
	// but ours while it commits (a small plan), or the plan created the
	// table and the generations around it say that ours was the only
	// commit (created): then it reads back what the plan changed.
	prev, prevAt := n.last, n.lastAt
	n.last, n.change = nil, nil
	created := createsTable(p)
	owned := (prev != nil && prev.Owner == nft.OwnedByUs) || (created && p.Ops[0].Owned)
	watched := n.mon != nil && prev != nil && prev.Owner == nft.NotOwned && small(p)
	counted := created && !owned
	if created {
		prevAt = time.Now() // nothing was read: the create is the whole table
	}
	if m := n.mon; m != nil {
		if watched {
			m.stay(conn.PID())
		} else {
			m.leave()
			defer m.rejoin()
		}
	}
	var gen0 uint32
	if counted {
		if gen0, err = generation(conn); err != nil {
			counted = false
		}
	}
	sent := nft.Sent{Messages: len(b.msgs), Bytes: b.size()}
	failed, err := b.send(conn, gen)
	if err == nil && (owned || watched || counted) && !p.Recreate {
		// Not owned, the table is what our create made as long as the
		// generation is that of our commit: gen0+1 now, when no other
		// transaction committed between the two reads of it.
		var ours uint32
		if counted {
			if g, gerr := generation(conn); gerr == nil && g == gen0+1 && g != 0 {
				ours = g
			}
		}
		if next, xerr := nft.ExecPlan(prev, p); xerr == nil && (!counted || ours != 0) {
			n.change = &change{table: next, plan: p, readAt: prevAt, gen: ours}
		}
	}
	switch {
	case errors.Is(err, unix.ERESTART):
		return sent, fmt.Errorf("%w: %w", nft.ErrStale, err)
	case err != nil && failed >= 0 && p.Ops[b.op[failed]].Kind == nft.KindTable && p.Ops[b.op[failed]].Exclusive &&
		errors.Is(err, unix.EEXIST):
		return sent, fmt.Errorf("%w: the table appeared since it was read: %w", nft.ErrStale, err)
	case err != nil && failed >= 0 && nft.RefusesOwnership(p.Ops[b.op[failed]], err):
		n.unsupported = true
		return sent, nft.CannotOwn(err)
	case errors.Is(err, nft.ErrNoAnswer):
		n.broken()
	}
	if err != nil && failed >= 0 {
		err = &nft.RefusedError{Op: p.Ops[b.op[failed]].String(), Err: err}
	}
	return sent, err
}

// Delete removes the table; it is not an error if there is none. It
// fails with ErrOwnedByOther while another process (a running agent)
// owns it.
func (n *Netlink) Delete() error {
	for attempt := 1; ; attempt++ {
		found, gen, err := n.Read()
		if errors.Is(err, nft.ErrStale) && attempt < nft.MaxAttempts {
			continue
		}
		if err != nil || found == nil {
			return err
		}
		if found.Owner == nft.OwnedByOther {
			return nft.ErrOwnedByOther
		}
		_, err = n.Send(nft.Plan{Ops: []nft.Op{{Verb: nft.Delete, Kind: nft.KindTable}}}, gen)
		if !errors.Is(err, nft.ErrStale) || attempt == nft.MaxAttempts {
			return err
		}
	}
}
