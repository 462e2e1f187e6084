package kernel

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"strings"
	"syscall"
	"testing"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Kernel tests of the netlink side that need its insides; each in a
// network namespace of its own (testnet.New).

func kernelNetlink(t *testing.T) (*Netlink, *testnet.Topology) {
	t.Helper()
	testnet.Require(t, "ip", "nft")
	name := strings.ReplaceAll(t.Name(), "/", "-")
	topo, err := testnet.New(name[max(0, len(name)-12):])
	if err != nil {
		t.Fatalf("create namespaces: %v", err)
	}
	t.Cleanup(func() {
		if err := topo.Close(); err != nil {
			t.Errorf("delete namespaces: %v", err)
		}
	})
	n := &Netlink{NetNS: int(topo.NodeHandle())}
	t.Cleanup(func() { n.Close() })
	return n, topo
}

func defaultTable() nft.Table {
	return nft.Build(config.Default(config.Flags{}), nft.Options{Chain: nft.DefaultChain, RandomFully: true})
}

// TestCountersFailureKeepsOwnership: a /metrics scrape whose counter read
// fails must not close the socket that owns the table (that orphans the
// table, writable by anyone, until the next sync).
func TestCountersFailureKeepsOwnership(t *testing.T) {
	n, topo := kernelNetlink(t)
	if _, err := nft.Ensure(n, defaultTable()); err != nil {
		t.Fatal(err)
	}
	if !n.Owns() {
		t.Skip("this kernel cannot own a persistent table (Linux 6.9 or later): nothing to orphan")
	}
	if _, err := n.DecisionCounters(nft.DefaultChain); err != nil {
		t.Fatalf("counters: %v", err)
	}
	// Break the socket the counters are read on, as a failed read would.
	n.cmu.Lock()
	n.counters.Close()
	n.cmu.Unlock()
	if _, err := n.DecisionCounters(nft.DefaultChain); err == nil {
		t.Fatal("a read on a closed socket succeeded")
	}
	if n.conn == nil {
		t.Fatal("a failed counters read closed the socket that owns the table")
	}
	head, err := readHead(n.conn, n.conn.PID())
	if err != nil || head == nil || head.Owner != nft.OwnedByUs {
		t.Fatalf("after a failed counters read the table is %+v (%v), want owned by the agent's socket", head, err)
	}
	if out, err := topo.NFT("delete", "table", "inet", nft.TableName); err == nil {
		t.Errorf("nft deleted the table after a failed counters read: it was orphaned\n%s", out)
	}
	// And the next read works again, on a new socket.
	if cs, err := n.DecisionCounters(nft.DefaultChain); err != nil || len(cs) == 0 {
		t.Errorf("counters after the failure: %v, %v", cs, err)
	}
}

// TestFence: the fence is refused by every kernel, changes nothing and
// notifies no one; the monitor sees commits to the agent's table by
// others and not commits to other tables.
func TestFence(t *testing.T) {
	n, topo := kernelNetlink(t)
	n.NoOwner = true
	if _, err := nft.Ensure(n, defaultTable()); err != nil {
		t.Fatal(err)
	}
	conn, err := n.socket()
	if err != nil {
		t.Fatal(err)
	}
	gen, err := generation(conn)
	if err != nil {
		t.Fatal(err)
	}
	mon, err := n.monitor()
	if err != nil {
		t.Fatal(err)
	}
	mon.take()
	if err := fence(conn); err != nil {
		t.Fatalf("fence: %v", err)
	}
	if after, err := generation(conn); err != nil || after != gen {
		t.Errorf("the fence moved the generation %d -> %d (%v)", gen, after, err)
	}
	if touched, lost, err := mon.take(); touched || lost || err != nil {
		t.Errorf("after a fence the monitor says touched=%v lost=%v (%v)", touched, lost, err)
	}
	// Another table: not a touch.
	if out, err := topo.NFT("add", "table", "inet", "neighbour"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if err := fence(conn); err != nil {
		t.Fatal(err)
	}
	if touched, lost, err := mon.take(); touched || lost || err != nil {
		t.Errorf("a commit to another table counted as a touch of ours (%v %v)", lost, err)
	}
	// A read now costs no dump: the last read stands.
	last := n.last
	if got, _, err := n.Read(); err != nil || got != last || last == nil {
		t.Errorf("read after a commit to another table: %p %v, want the last read %p", got, err, last)
	}
	// Ours: a touch, and the next read reads again.
	if out, err := topo.NFT("add", "element", "inet", nft.TableName, nft.SetNonMasqV4, "{ 198.51.100.0/24 }"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	got, _, err := n.Read()
	if err != nil || got == last || got.Set(nft.SetNonMasqV4) == nil || len(got.Set(nft.SetNonMasqV4).Elements) != 5 {
		t.Errorf("read after a foreign change: %v, %v", got, err)
	}
	if res, err := nft.Ensure(n, defaultTable()); err != nil || res.Unchanged {
		t.Errorf("repair: %+v %v", res, err)
	}
}

// TestSendRefusedNamesTheMessage: a transaction the kernel refuses at one
// of its messages (here elements for a set of a table that does not
// exist) comes back as nft.RefusedError naming that message, which
// --once's late probe asks after (cmd/ip-masq-agent onceRefused), and
// the kernel keeps what it had.
func TestSendRefusedNamesTheMessage(t *testing.T) {
	n, topo := kernelNetlink(t)
	n.NoOwner = true
	op := nft.Op{Verb: nft.Add, Kind: nft.KindElements, Name: nft.SetNonMasqV4,
		Elements: []nft.Range{nft.RangeOfPrefix(netip.MustParsePrefix("198.51.100.0/24"))}}
	_, err := n.Send(nft.Plan{Ops: []nft.Op{op}}, 0)
	var refused *nft.RefusedError
	if !errors.As(err, &refused) || refused.Op != op.String() || !errors.Is(err, syscall.ENOENT) ||
		err.Error() != op.String()+": "+refused.Err.Error() {
		t.Fatalf("Send: %v (%T), want the refused message named: %s: ... no such file or directory", err, err, op)
	}
	if out, err := topo.NFT("list", "tables"); err != nil || strings.Contains(out, nft.TableName) {
		t.Errorf("after the refusal: %q %v, want no table", out, err)
	}
}

// TestReadStaleDuringForeignCommit: a transaction of another process that
// touches the table while it is read makes the read stale (ErrStale),
// never a torn table; one that touches another table does not.
func TestReadStaleDuringForeignCommit(t *testing.T) {
	n, topo := kernelNetlink(t)
	n.NoOwner = true
	if _, err := nft.Ensure(n, defaultTable()); err != nil {
		t.Fatal(err)
	}
	runNFT := func(args ...string) {
		if out, err := topo.NFT(args...); err != nil {
			t.Fatalf("nft %v: %v\n%s", args, err, out)
		}
	}
	hook := hookDumps(t, n)
	hook.f = func() { runNFT("add", "table", "inet", "neighbour") }
	if got, _, err := n.Read(); err != nil || got == nil {
		t.Fatalf("a commit to another table during the read: %v", err)
	}
	hook.f = func() { runNFT("add", "element", "inet", nft.TableName, nft.SetNonMasqV4, "{ 198.51.100.0/24 }") }
	n.last = nil
	if _, _, err := n.Read(); !errors.Is(err, nft.ErrStale) {
		t.Fatalf("a commit to the table during the read: %v, want ErrStale", err)
	}
	hook.f = nil
	got, _, err := n.Read()
	if err != nil || len(got.Set(nft.SetNonMasqV4).Elements) != 5 {
		t.Fatalf("the read after: %v, %v", got, err)
	}
	// Ensure reads again by itself.
	hook.f = func() {
		hook.f = nil
		runNFT("add", "element", "inet", nft.TableName, nft.SetNonMasqV4, "{ 192.0.2.0/24 }")
	}
	n.last = nil
	res, err := nft.Ensure(n, defaultTable())
	if err != nil || res.Stale != 1 || res.Found == nil || len(res.Found.Set(nft.SetNonMasqV4).Elements) != 6 {
		t.Errorf("Ensure with a commit during its first read: %+v, %v", res, err)
	}
}

// dumpHook is the read socket of a Netlink, which runs f after each whole
// read of the table (the flowtable dump is its last request), before the
// fence that checks it: a commit of another process during the read.
type dumpHook struct {
	*netlink.Conn
	last netlink.HeaderType
	f    func()
}

// hookDumps gives n a read socket that runs hook.f after each whole read.
func hookDumps(t *testing.T, n *Netlink) *dumpHook {
	t.Helper()
	c, err := dial(n.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	h := &dumpHook{Conn: c}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.rconn != nil {
		n.rconn.Close()
	}
	n.rconn = h
	return h
}

func (h *dumpHook) Send(m netlink.Message) (netlink.Message, error) {
	h.last = m.Header.Type
	return h.Conn.Send(m)
}

func (h *dumpHook) writeDatagram(b []byte) error {
	if h.f != nil && h.last == netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETFLOWTABLE) &&
		len(b) >= 6 && binary.NativeEndian.Uint16(b[4:6]) == unix.NFNL_MSG_BATCH_BEGIN {
		h.f()
	}
	h.last = 0
	return rawSocket{h.Conn}.writeDatagram(b)
}

func (h *dumpHook) readDatagram(b []byte) (int, error) { return rawSocket{h.Conn}.readDatagram(b) }
func (h *dumpHook) growSendBuffer(size int) error      { return rawSocket{h.Conn}.growSendBuffer(size) }
