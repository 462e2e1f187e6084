package kernel

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"net/netip"
	"slices"
	"testing"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// withCIDRs is defaultTable with the CIDRs added to the IPv4 set.
func withCIDRs(cidrs ...string) nft.Table {
	t := defaultTable()
	s := t.Set(nft.SetNonMasqV4)
	for _, c := range cidrs {
		s.Elements = append(s.Elements, nft.RangeOfPrefix(netip.MustParsePrefix(c)))
	}
	slices.SortFunc(s.Elements, func(a, b nft.Range) int { return a.From().Compare(b.From()) })
	return t
}

// TestVerifyChangeReadsWhatChanged: after its own commit to a table it
// owns, the Netlink reads back what the plan changed, not the table:
// the verified table is the one the plan made, and a whole read follows
// only when the kernel's answers disagree with it.
func TestVerifyChangeReadsWhatChanged(t *testing.T) {
	n, _ := kernelNetlink(t)
	if _, err := nft.Ensure(n, withCIDRs("198.51.100.0/24")); err != nil {
		t.Fatal(err)
	}
	if !n.Owns() {
		t.Skip("the kernel cannot own tables (before 6.9): no read-back of a change")
	}
	readAt := n.lastAt
	// One CIDR out, one in; a chain's rules replaced.
	want := withCIDRs("203.0.113.0/24")
	want.Chains[len(want.Chains)-1].Rules[0].Comment = "changed"
	res, err := nft.Ensure(n, want)
	if err != nil || res.Attempts != 1 || res.Undone != 0 {
		t.Fatalf("change: %+v, %v", res, err)
	}
	if n.last == nil || !n.lastAt.Equal(readAt) {
		t.Fatalf("the read after the change read the table whole (at %v; the first read at %v)", n.lastAt, readAt)
	}
	// The read after the commit verified the change (the table kept is
	// the one the plan made, not read whole since): a whole read agrees.
	conn, err := n.reader()
	if err != nil {
		t.Fatal(err)
	}
	whole, err := readTable(conn, n.ownerPort())
	want.Owner, want.Persist = nft.OwnedByUs, true
	if err != nil || !want.Equal(*whole) || !want.Equal(*n.last) {
		t.Fatalf("whole read %v, %v; kept %v", whole, err, n.last)
	}

	// verifyChange itself: what the kernel holds, and what it does not.
	head, err := readHead(conn, n.ownerPort())
	if err != nil {
		t.Fatal(err)
	}
	r := func(cidr string) nft.Range { return nft.RangeOfPrefix(netip.MustParsePrefix(cidr)) }
	elements := func(verb nft.Verb, cidr string) nft.Op {
		return nft.Op{Verb: verb, Kind: nft.KindElements, Name: nft.SetNonMasqV4, Elements: []nft.Range{r(cidr)}}
	}
	held := withCIDRs("203.0.113.0/24")
	held.Chains = whole.Chains
	held.Owner, held.Persist, held.Use = whole.Owner, whole.Persist, whole.Use
	for _, c := range []struct {
		name  string
		table nft.Table
		op    nft.Op
		ok    bool
	}{
		{"an element the kernel holds", held, elements(nft.Add, "203.0.113.0/24"), true},
		{"an element deleted that the kernel does not hold", held, elements(nft.Delete, "198.51.100.0/24"), true},
		{"an element the kernel does not hold", withTable(held, "203.0.113.0/24", "192.0.2.0/24"), elements(nft.Add, "192.0.2.0/24"), false},
		{"an element deleted that the kernel holds", withTable(held), elements(nft.Delete, "203.0.113.0/24"), false},
		{"a set as the kernel holds it", held, nft.Op{Verb: nft.Add, Kind: nft.KindSet, Name: nft.SetNonMasqV4}, true},
		{"a set with an element it lacks", withTable(held, "203.0.113.0/24", "192.0.2.0/24"), nft.Op{Verb: nft.Add, Kind: nft.KindSet, Name: nft.SetNonMasqV4}, false},
		{"a chain as the kernel holds it", held, nft.Op{Verb: nft.Flush, Kind: nft.KindChain, Name: held.Chains[len(held.Chains)-1].Name}, true},
		{"a chain with a rule it lacks", withoutComment(held), nft.Op{Verb: nft.Flush, Kind: nft.KindChain, Name: held.Chains[len(held.Chains)-1].Name}, false},
	} {
		ok, err := verifyChange(conn, head, &change{table: &c.table, plan: nft.Plan{Ops: []nft.Op{c.op}}})
		if err != nil || ok != c.ok {
			t.Errorf("%s: verified %v (%v), want %v", c.name, ok, err, c.ok)
		}
	}
}

// withTable is t with the IPv4 set holding exactly cidrs.
func withTable(t nft.Table, cidrs ...string) nft.Table {
	c := t.Clone()
	s := c.Set(nft.SetNonMasqV4)
	s.Elements = nil
	for _, p := range cidrs {
		s.Elements = append(s.Elements, nft.RangeOfPrefix(netip.MustParsePrefix(p)))
	}
	slices.SortFunc(s.Elements, func(a, b nft.Range) int { return a.From().Compare(b.From()) })
	return *c
}

// withoutComment is t with the last chain's first rule's comment changed.
func withoutComment(t nft.Table) nft.Table {
	c := t.Clone()
	c.Chains[len(c.Chains)-1].Rules[0].Comment = "not the kernel's"
	return *c
}

// TestVerifyChangeNotOwned: on a table anyone can change, our own small
// commit is read back alone while the monitor saw no other transaction
// touch the table; a foreign change after it is found by the next read.
func TestVerifyChangeNotOwned(t *testing.T) {
	n, topo := kernelNetlink(t)
	n.NoOwner = true
	if _, err := nft.Ensure(n, withCIDRs("198.51.100.0/24")); err != nil {
		t.Fatal(err)
	}
	readAt := n.lastAt
	// A neighbour's commit to its own table meanwhile is no touch.
	if out, err := topo.NFT("add", "table", "inet", "neighbour"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	want := withCIDRs("203.0.113.0/24")
	if res, err := nft.Ensure(n, want); err != nil || res.Attempts != 1 || res.Undone != 0 {
		t.Fatalf("change: %+v, %v", res, err)
	}
	if n.last == nil || !n.lastAt.Equal(readAt) {
		t.Fatalf("the read after the change read the table whole (at %v; the first read at %v)", n.lastAt, readAt)
	}
	// A foreign change to the table: the next read reads it.
	if out, err := topo.NFT("add", "element", "inet", nft.TableName, nft.SetNonMasqV4, "{ 192.0.2.0/24 }"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	got, _, err := n.Read()
	if err != nil || got == nil || len(got.Set(nft.SetNonMasqV4).Elements) != len(want.Set(nft.SetNonMasqV4).Elements)+1 {
		t.Fatalf("read after a foreign change: %v, %v", got, err)
	}
	if res, err := nft.Ensure(n, want); err != nil || res.Unchanged {
		t.Errorf("repair: %+v %v", res, err)
	}
}

// TestRereadWhatWasTouched: not owned, after a foreign transaction the
// read reads again what its notifications name (a set whose elements were
// touched, a chain with its rules, a set added) and finds what a whole read
// finds, down to a lone interval start; the table is not read whole.
func TestRereadWhatWasTouched(t *testing.T) {
	n, topo := kernelNetlink(t)
	n.NoOwner = true
	if _, err := nft.Ensure(n, withCIDRs("20.0.0.1/32")); err != nil {
		t.Fatal(err)
	}
	readAt := n.lastAt
	foreign, err := dial(n.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	defer foreign.Close()
	runNFT := func(args ...string) func() error {
		return func() error {
			if out, err := topo.NFT(args...); err != nil {
				return fmt.Errorf("nft %v: %w\n%s", args, err, out)
			}
			return nil
		}
	}
	for _, step := range []struct {
		name string
		do   func() error
	}{
		{"an element added", runNFT("add", "element", "inet", nft.TableName, nft.SetNonMasqV4, "{ 192.0.2.0/24 }")},
		{"an interval end deleted", func() error {
			end := []nft.Bound{{Addr: netip.MustParseAddr("20.0.0.2"), End: true}}
			_, err := (&batch{msgs: []netlink.Message{rawMessage(unix.NFT_MSG_DELSETELEM, netlink.Request,
				elementsPayload(nft.SetNonMasqV4, end))}, op: []int{0}}).send(foreign, 0)
			return err
		}},
		{"a rule added", runNFT("add", "rule", "inet", nft.TableName, nft.MasqChainName, "counter")},
		{"a set added", runNFT("add", "set", "inet", nft.TableName, "extra", "{ type ipv4_addr; }")},
		{"elements of an IPv6 set added", runNFT("add", "element", "inet", nft.TableName, nft.SetNonMasqV6, "{ 2001:db8::/32 }")},
	} {
		if err := step.do(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		got, _, err := n.Read()
		if err != nil || got == nil {
			t.Fatalf("%s: read: %v", step.name, err)
		}
		conn, err := n.reader()
		if err != nil {
			t.Fatal(err)
		}
		whole, err := readTable(conn, 0)
		if err != nil || !whole.Equal(*got) || !got.Equal(*whole) {
			t.Fatalf("%s: read\n%s\nthe whole table:\n%s (%v)", step.name, nft.Render(*got), nft.Render(*whole), err)
		}
		if !n.lastAt.Equal(readAt) {
			t.Errorf("%s: the table was read whole", step.name)
		}
	}
	if s := n.last.Set(nft.SetNonMasqV4); !strings.Contains(s.Odd, "an interval start without an end") {
		t.Errorf("the lone interval start is not odd: %q", s.Odd)
	}
	if res, err := nft.Ensure(n, withCIDRs("20.0.0.1/32")); err != nil || res.Unchanged {
		t.Errorf("repair: %+v %v", res, err)
	}
}

// manyCIDRs is defaultTable with n /29s (a gap after each) in the IPv4 set:
// 2n bounds, past maxElementGets.
func manyCIDRs(n int) nft.Table {
	t := defaultTable()
	s := t.Set(nft.SetNonMasqV4)
	s.Elements = nil
	for i := range n {
		v := uint32(100<<24|64<<16) + uint32(i)*32
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), 29)
		s.Elements = append(s.Elements, nft.RangeOfPrefix(p))
	}
	return t
}

// elementDumps is a Netlink's read socket that counts the dumps of the
// IPv4 set's elements asked on it.
type elementDumps struct {
	*netlink.Conn
	n int
}

func (c *elementDumps) Send(m netlink.Message) (netlink.Message, error) {
	if m.Header.Type == netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETSETELEM) && m.Header.Flags&netlink.Dump != 0 &&
		strings.Contains(string(m.Data), nft.SetNonMasqV4+"\x00") {
		c.n++
	}
	return c.Conn.Send(m)
}

func countElementDumps(t *testing.T, n *Netlink) *elementDumps {
	t.Helper()
	c, err := dial(n.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	d := &elementDumps{Conn: c}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.rconn != nil {
		n.rconn.Close()
	}
	n.rconn = d
	return d
}

// TestCreatedTableReadBack: the read after a send that created the table
// reads back what it made without dumping a large set's elements (the
// kernel's count of them, on a kernel that gives it), owned or not; not
// owned, a foreign commit after ours makes that read whole, and the
// foreign change is found.
func TestCreatedTableReadBack(t *testing.T) {
	n, topo := kernelNetlink(t)
	want := manyCIDRs(1000) // 2,000 bounds
	counts := func() bool {
		conn, err := n.reader()
		if err != nil {
			t.Fatal(err)
		}
		_, count, found, err := getSetHead(conn, nft.SetNonMasqV4)
		return err == nil && found && count >= 0
	}
	for _, owned := range []bool{true, false} {
		if err := n.Delete(); err != nil {
			t.Fatal(err)
		}
		n.Close()
		n.NoOwner = !owned
		dumps := countElementDumps(t, n)
		res, err := nft.Ensure(n, want)
		if err != nil || !res.Created || res.Attempts != 1 {
			t.Fatalf("owned %v: first apply: %+v, %v", owned, res, err)
		}
		if owned && !n.Owns() {
			continue // the kernel cannot own: the not-owned case below
		}
		if !counts() {
			t.Logf("this kernel does not count a set's elements (NFTA_SET_COUNT, recent kernels): a created set is read whole")
		} else if dumps.n != 0 {
			t.Errorf("owned %v: the read back of the created table dumped the large set's elements %d times", owned, dumps.n)
		}
		if n.last == nil {
			t.Fatalf("owned %v: the read back of the created table was not kept", owned)
		}
		conn, _ := n.reader()
		whole, err := readTable(conn, n.ownerPort())
		if err != nil || !whole.Equal(*n.last) || !n.last.Equal(*whole) {
			t.Errorf("owned %v: the table kept differs from the whole table (%v)", owned, err)
		}
	}

	// The count: a set that holds one element fewer than wanted is not
	// taken for the wanted one.
	conn, _ := n.reader()
	more := want.Clone().Set(nft.SetNonMasqV4)
	more.Elements = append(more.Elements, nft.RangeOfPrefix(netip.MustParsePrefix("203.0.113.0/24")))
	if ok, err := verifyCreatedSet(conn, more); ok || err != nil {
		t.Errorf("a set with an element fewer than wanted verified: %v, %v", ok, err)
	}
	if ok, err := verifyCreatedSet(conn, want.Set(nft.SetNonMasqV4)); !ok || err != nil {
		t.Errorf("the set as created not verified: %v, %v", ok, err)
	}

	// Not owned, another process commits to the table between our create
	// and its read back: the read is whole and finds the foreign element.
	if err := n.Delete(); err != nil {
		t.Fatal(err)
	}
	n.NoOwner = true
	w := want
	w.Owner, w.Persist = nft.NotOwned, false
	p, err := nft.PlanFor(nil, w)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := n.Read(); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Send(p, 0); err != nil {
		t.Fatal(err)
	}
	if n.change == nil || n.change.gen == 0 {
		t.Fatalf("a create with no other commit around it: change %+v, want one with its generation", n.change)
	}
	// One element replaced by another: the set's count stays.
	swap := fmt.Sprintf("delete element inet %[1]s %[2]s { 100.64.0.0/29 }\nadd element inet %[1]s %[2]s { 192.0.2.0/29 }\n", nft.TableName, nft.SetNonMasqV4)
	if out, err := topo.NFT("-f", writeTemp(t, swap)); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	got, _, err := n.Read()
	if err != nil || got == nil || got.Equal(w) || !slices.Contains(got.Set(nft.SetNonMasqV4).Elements, nft.RangeOfPrefix(netip.MustParsePrefix("192.0.2.0/29"))) {
		t.Fatalf("the read after a foreign commit that followed our create did not find it (%v)", err)
	}
	if res, err := nft.Ensure(n, want); err != nil || res.Unchanged {
		t.Errorf("repair: %+v %v", res, err)
	}
}

func writeTemp(t *testing.T, content string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "nft")
	if err := os.WriteFile(f, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// endGetGuard passes datagrams to the kernel but refuses, and counts, an
// interval-end get of a key at or above open: the start of an open
// interval at the top of the address space, a key that the array-based
// lookup answers by reading a NULL pointer (getElements). Refusing makes a
// broken guard a failed test, not a crashed kernel.
type endGetGuard struct {
	*netlink.Conn
	open    netip.Addr
	refused int
	gets    int
}

func (g *endGetGuard) writeDatagram(b []byte) error {
	msgs, err := syscall.ParseNetlinkMessage(b)
	if err != nil {
		return err
	}
	for _, m := range msgs {
		if m.Header.Type != unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETSETELEM {
			continue
		}
		g.gets++
		// A request's elements are laid out as an answer's.
		if b, ok := answerBound(m.Data); ok && b.End && !b.Addr.Less(g.open) {
			g.refused++
			return fmt.Errorf("interval-end get of %s in the open interval from %s", b.Addr, g.open)
		}
	}
	return rawSocket{g.Conn}.writeDatagram(b)
}

func (g *endGetGuard) readDatagram(b []byte) (int, error) { return rawSocket{g.Conn}.readDatagram(b) }
func (g *endGetGuard) growSendBuffer(size int) error      { return rawSocket{g.Conn}.growSendBuffer(size) }

// TestNoEndGetInOpenInterval: a set whose last interval is open (240.0.0.0/4
// reaches the top) is verified by gets only below it; an interval-end get
// at or above its start (the end of a range it swallowed) is not sent, and
// the set is read whole instead.
func TestNoEndGetInOpenInterval(t *testing.T) {
	n, _ := kernelNetlink(t)
	if _, err := nft.Ensure(n, withCIDRs("198.51.100.0/24", "240.0.0.0/4")); err != nil {
		t.Fatal(err)
	}
	c, err := dial(n.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	g := &endGetGuard{Conn: c, open: netip.MustParseAddr("240.0.0.0")}
	below := []nft.Bound{{Addr: netip.MustParseAddr("198.51.100.0")}, {Addr: netip.MustParseAddr("198.51.101.0"), End: true}}
	held, plain, err := getElements(g, nft.SetNonMasqV4, below)
	if err != nil || !plain || !held[0] || !held[1] {
		t.Fatalf("the bounds of 198.51.100.0/24: held %v, plain %v, %v", held, plain, err)
	}
	// 250.0.0.0/8's end, as a plan that swallowed it into 240.0.0.0/4
	// would verify its deletion.
	swallowed := append(below, nft.Bound{Addr: netip.MustParseAddr("251.0.0.0"), End: true})
	gets := g.gets
	_, plain, err = getElements(g, nft.SetNonMasqV4, swallowed)
	if err != nil || plain {
		t.Fatalf("an end in the open interval: plain %v, %v; want not plain (read the set whole)", plain, err)
	}
	if g.refused > 0 {
		t.Fatalf("%d interval-end gets in the open interval sent", g.refused)
	}
	if g.gets-gets != 1 {
		t.Errorf("%d gets for an end in the open interval; want 1 (the top address)", g.gets-gets)
	}
	// And Ensure of a change that swallows a range verifies without one:
	// its reads, too, through a guard (once the open interval is back).
	if _, err := nft.Ensure(n, withCIDRs("198.51.100.0/24", "250.0.0.0/8")); err != nil {
		t.Fatal(err)
	}
	rc, err := dial(n.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	rg := &endGetGuard{Conn: rc, open: netip.MustParseAddr("240.0.0.0")}
	n.mu.Lock()
	if n.rconn != nil {
		n.rconn.Close()
	}
	n.rconn = rg
	n.mu.Unlock()
	if _, err := nft.Ensure(n, withCIDRs("198.51.100.0/24", "240.0.0.0/4")); err != nil || rg.refused > 0 {
		t.Fatalf("the change that swallows 250.0.0.0/8: %v (%d interval-end gets in the open interval)", err, rg.refused)
	}
}
