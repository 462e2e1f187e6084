// Package kernel is the only code on the netfilter socket: it sends the
// plans of package nft as netlink transactions, reads table inet
// ip-masq-agent back (netlink.go, read.go), watches nftables
// notifications (monitor.go, watch.go), reads counters, probes what the
// kernel can do, and lends its sockets to original/ (session.go).
package kernel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/userdata"
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
	rconn       *netlink.Conn // reads: a read that fails never closes the owner
	unsupported bool          // the kernel refused owner+persist flags
	mon         *monitor      // notifications: who touched the table (monitor.go)
	cmu         sync.Mutex
	counters    *netlink.Conn // DecisionCounters' socket; guarded by cmu

	// The last table read whole (nil: none). It is the kernel's table for
	// as long as nothing but this socket can change it (owned), or no
	// transaction of another process has touched it since (the monitor).
	last   *nft.Table
	lastAt time.Time

	afterDump func()     // tests: a commit by another process during a read
	lostRead  *nft.Table // the last read thrown away for lost notifications only
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

// Apply makes the kernel hold t (see Ensure).
func (n *Netlink) Apply(t nft.Table) (nft.Result, error) { return nft.Ensure(n, t) }

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

// reader returns the lasting socket for reads, dialing it first if needed.
func (n *Netlink) reader() (*netlink.Conn, error) {
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
	n.last = nil
}

// brokenReader drops the read socket after a failed read.
func (n *Netlink) brokenReader() {
	if n.rconn != nil {
		n.rconn.Close()
		n.rconn = nil
	}
	n.last = nil
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
	if m := n.mon; m != nil {
		m.leave()
		defer m.rejoin()
	}
	n.last = nil // whatever happens, the next read reads the table whole
	sent := nft.Sent{Messages: len(b.msgs), Bytes: b.size()}
	failed, err := b.send(conn, gen)
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
		err = fmt.Errorf("%s: %w", p.Ops[b.op[failed]], err)
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
	touched, lost, err := mon.take()
	if err != nil {
		return nil, 0, err
	}
	if !touched && !lost && fresh {
		return n.last, gen, nil
	}
	n.last = nil
	t, err := readTable(conn, ours)
	if err != nil {
		return nil, 0, err
	}
	if n.afterDump != nil {
		n.afterDump()
	}
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
func readTable(conn *netlink.Conn, ours uint32) (*nft.Table, error) {
	head, err := readHead(conn, ours)
	if err != nil || head == nil {
		return head, err
	}
	return readContents(conn, head)
}

// readContents reads the sets, chains and objects of the table head.
func readContents(conn *netlink.Conn, head *nft.Table) (*nft.Table, error) {
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
func readHead(conn *netlink.Conn, ours uint32) (*nft.Table, error) {
	msgs, err := request(conn, unix.NFT_MSG_GETTABLE, false, attr(unix.NFTA_TABLE_NAME, cstring(nft.TableName)))
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

func readSets(conn *netlink.Conn, t *nft.Table) error {
	msgs, err := request(conn, unix.NFT_MSG_GETSET, true, attr(unix.NFTA_SET_TABLE, cstring(nft.TableName)))
	if err != nil {
		return fmt.Errorf("list sets: %w", err)
	}
	for _, m := range msgs {
		var s nft.Set
		var flags, keyType, keyLen uint32
		var odd []string
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
			return err
		}
		switch {
		case keyType == nftables.TypeIPAddr.GetNFTMagic() && keyLen == 4:
			s.Family = 4
		case keyType == nftables.TypeIP6Addr.GetNFTMagic() && keyLen == 16:
			s.Family = 6
		default:
			odd = append(odd, fmt.Sprintf("key type %d of %d bytes", keyType, keyLen))
		}
		if flags != unix.NFT_SET_INTERVAL {
			odd = append(odd, fmt.Sprintf("flags %#x", flags))
		}
		var oddElems []string
		if slices.Contains([]string{nft.SetMasqV4, nft.SetNonMasqV4, nft.SetMasqV6, nft.SetNonMasqV6}, s.Name) {
			if oddElems, err = readElements(conn, &s); err != nil {
				return fmt.Errorf("list set %s: %w", s.Name, err)
			}
		} else {
			// The plan deletes a set the agent does not make, whatever
			// it holds: its elements (possibly millions) are not read.
			oddElems = []string{"not the agent's (its elements were not read)"}
		}
		s.Odd = joinUnique(append(odd, oddElems...))
		t.Sets = append(t.Sets, s)
	}
	return nil
}

// readElements reads a set's elements as ranges, and what is odd about
// them (timeouts, expressions, comments: never the agent's).
func readElements(conn *netlink.Conn, s *nft.Set) ([]string, error) {
	msgs, err := request(conn, unix.NFT_MSG_GETSETELEM, true,
		attr(unix.NFTA_SET_ELEM_LIST_TABLE, cstring(nft.TableName)), attr(unix.NFTA_SET_ELEM_LIST_SET, cstring(s.Name)))
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

func readChains(conn *netlink.Conn, t *nft.Table) error {
	// The chain dump cannot be filtered by table: every inet chain comes,
	// and only the agent's are kept.
	msgs, err := requestWhole(conn, unix.NFT_MSG_GETCHAIN, func(b []byte) bool {
		ours := false
		walkAttrs(b, func(typ uint16, v []byte) bool {
			if typ == unix.NFTA_CHAIN_TABLE {
				ours = string(v) == nft.TableName+"\x00"
				return false
			}
			return true
		})
		return ours
	})
	if err != nil {
		return fmt.Errorf("list chains: %w", err)
	}
	for _, m := range msgs {
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
			return err
		}
		if table != nft.TableName {
			continue
		}
		if hook != nil {
			hook.Hook = hookName(hooknum)
			c.Hook = hook
		}
		c.Odd = joinUnique(odd)
		t.Chains = append(t.Chains, c)
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

func hookName(n uint32) string {
	names := []string{"prerouting", "input", "forward", "output", "postrouting", "ingress"}
	if int(n) < len(names) {
		return names[n]
	}
	return fmt.Sprintf("hook %d", n)
}

// readRules reads the table's rules by chain, in order. It decodes the
// messages itself: google/nftables v0.3.0 fails a whole GetRules on a
// byteorder expression (which --to-ports rules hold), and drops
// expressions it does not know.
func readRules(conn *netlink.Conn) (map[string][]nft.Rule, error) {
	msgs, err := request(conn, unix.NFT_MSG_GETRULE, true, attr(unix.NFTA_RULE_TABLE, cstring(nft.TableName)))
	if err != nil {
		return nil, err
	}
	return decodeRules(msgs)
}

// decodeRules decodes a rule dump, by chain.
func decodeRules(msgs []netlink.Message) (map[string][]nft.Rule, error) {
	out := map[string][]nft.Rule{}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		r, chain, err := decodeRuleMessage(m.Data[4:])
		if err != nil {
			return nil, err
		}
		out[chain] = append(out[chain], r)
	}
	return out, nil
}

func readObjects(conn *netlink.Conn, t *nft.Table) error {
	msgs, err := requestWhole(conn, unix.NFT_MSG_GETOBJ, nil, attr(unix.NFTA_OBJ_TABLE, cstring(nft.TableName)))
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
	msgs, err = requestWhole(conn, unix.NFT_MSG_GETFLOWTABLE, nil, attr(flowtableAttrTable, cstring(nft.TableName)))
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

// request sends one nftables request for family inet and returns the
// answers (every part of a dump). It reads the answers itself, with a
// 64 KiB buffer: the kernel sizes each part of a dump by the largest read
// the socket has seen (up to 32 KiB), and a set's dump restarts its walk of
// the set for every part, so small reads (mdlayher/netlink peeks with one
// page) make reading 100,000 elements several times slower in the kernel.
func request(conn *netlink.Conn, typ int, dump bool, attrs ...netlink.Attribute) ([]netlink.Message, error) {
	return requestFamily(conn, unix.NFPROTO_INET, typ, dump, attrs...)
}

// requestFamily is request for a table family other than inet (iptables-nft's
// ip and ip6 tables, see iptables.go).
func requestFamily(conn *netlink.Conn, family uint8, typ int, dump bool, attrs ...netlink.Attribute) ([]netlink.Message, error) {
	return requestKeep(conn, family, typ, dump, nil, attrs...)
}

// requestKeep is requestFamily that keeps only the answers keep accepts
// (its argument: the payload after nfgenmsg), before copying them: the
// chain dump holds every chain of the family, the agent's or not.
func requestKeep(conn *netlink.Conn, family uint8, typ int, dump bool, keep func([]byte) bool, attrs ...netlink.Attribute) ([]netlink.Message, error) {
	msgs, _, err := requestIntr(conn, family, typ, dump, keep, attrs...)
	return msgs, err
}

// errDumpInterrupted: a dump that walks other tables' objects too was
// interrupted by a commit (NLM_F_DUMP_INTR).
var errDumpInterrupted = fmt.Errorf("%w: a dump was interrupted by a commit", nft.ErrStale)

// requestWhole is requestKeep for a dump the kernel resumes by an index
// over every table of the family (chains, objects, flowtables): a
// neighbour's commit between two parts shifts that index, and one of our
// objects would be skipped or listed twice. The kernel flags such a dump
// (NLM_F_DUMP_INTR); it is taken again, a few times, then stale.
func requestWhole(conn *netlink.Conn, typ int, keep func([]byte) bool, attrs ...netlink.Attribute) ([]netlink.Message, error) {
	for try := 1; ; try++ {
		msgs, intr, err := requestIntr(conn, unix.NFPROTO_INET, typ, true, keep, attrs...)
		if err != nil || !intr {
			return msgs, err
		}
		if try == 10 {
			return nil, errDumpInterrupted
		}
	}
}

// requestIntr is requestKeep that also says whether the kernel flagged
// the dump as interrupted by a commit.
func requestIntr(conn *netlink.Conn, family uint8, typ int, dump bool, keep func([]byte) bool, attrs ...netlink.Attribute) ([]netlink.Message, bool, error) {
	data, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return nil, false, err
	}
	flags := netlink.Request
	if dump {
		flags |= netlink.Dump
	}
	req, err := conn.Send(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | typ), Flags: flags},
		Data:   append(nfgenmsg(family, 0), data...),
	})
	if err != nil {
		return nil, false, err
	}
	if err := conn.SetReadDeadline(time.Now().Add(replyTimeout)); err != nil {
		return nil, false, err
	}
	defer conn.SetReadDeadline(time.Time{})
	buf := make([]byte, 64<<10)
	var out []netlink.Message
	intr := false
	for {
		msgs, err := receive(conn, buf)
		if err != nil {
			return nil, false, err
		}
		for _, m := range msgs {
			if m.Header.Seq != req.Header.Sequence {
				continue // an answer to an earlier request that timed out
			}
			intr = intr || m.Header.Flags&unix.NLM_F_DUMP_INTR != 0
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return out, intr, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if code := int32(binary.NativeEndian.Uint32(m.Data[:4])); code != 0 {
						return nil, false, syscall.Errno(-code)
					}
				}
				return out, intr, nil
			}
			if len(m.Data) >= 4 && (keep == nil || keep(m.Data[4:])) {
				out = append(out, netlink.Message{
					Header: netlink.Header{Type: netlink.HeaderType(m.Header.Type), Flags: netlink.HeaderFlags(m.Header.Flags),
						Sequence: m.Header.Seq, PID: m.Header.Pid},
					Data: slices.Clone(m.Data),
				})
			}
			if !dump {
				return out, intr, nil
			}
		}
	}
}

func attr(typ uint16, data []byte) netlink.Attribute { return netlink.Attribute{Type: typ, Data: data} }

// decode walks the attributes of a message's payload (after nfgenmsg).
func decode(data []byte, f func(ad *netlink.AttributeDecoder)) error {
	ad, err := netlink.NewAttributeDecoder(data[4:])
	if err != nil {
		return err
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		f(ad)
	}
	return ad.Err()
}

// dataValue reads NFTA_DATA_VALUE from an nft_data attribute as an address.
func dataValue(b []byte) (a netip.Addr) {
	walkAttrs(b, func(typ uint16, v []byte) bool {
		if typ == unix.NFTA_DATA_VALUE {
			a, _ = netip.AddrFromSlice(v)
		}
		return true
	})
	return a
}

// walkAttrs calls f with the type (flags cleared) and payload of each
// netlink attribute in b, until f returns false; it returns false when f
// did or when b is malformed. It allocates nothing.
func walkAttrs(b []byte, f func(typ uint16, payload []byte) bool) bool {
	return walkAttrsFlags(b, func(typ uint16, _ bool, payload []byte) bool { return f(typ, payload) })
}

// walkAttrsFlags is walkAttrs that also says whether an attribute is
// flagged as nested.
func walkAttrsFlags(b []byte, f func(typ uint16, nested bool, payload []byte) bool) bool {
	for len(b) >= 4 {
		n := int(binary.NativeEndian.Uint16(b))
		if n < 4 || n > len(b) {
			return false
		}
		typ := binary.NativeEndian.Uint16(b[2:])
		if !f(typ&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER), typ&unix.NLA_F_NESTED != 0, b[4:n]) {
			return false
		}
		b = b[min((n+3)&^3, len(b)):]
	}
	return len(b) == 0
}

// generation returns the kernel's nftables generation id.
func generation(conn *netlink.Conn) (uint32, error) {
	// Through requestFamily's receive, which takes only the kernel's
	// datagrams (mdlayher/netlink's Execute takes any process's).
	msgs, err := requestFamily(conn, unix.AF_UNSPEC, unix.NFT_MSG_GETGEN, false)
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
	id, ok := uint32(0), false
	_ = decode(data, func(ad *netlink.AttributeDecoder) {
		if ad.Type() == unix.NFTA_GEN_ID {
			id, ok = ad.Uint32(), true
		}
	})
	return id, ok
}

func cstring(s string) []byte { return append([]byte(s), 0) }

// nfgenmsg is the header of every nftables message: family, version, resource id.
func nfgenmsg(family uint8, resID uint16) []byte {
	return append([]byte{family, unix.NFNETLINK_V0}, binaryutil.BigEndian.PutUint16(resID)...)
}
