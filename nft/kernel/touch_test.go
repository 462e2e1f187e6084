package kernel

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// largeCIDRs are n disjoint, non-adjacent /25s in 100.64.0.0/10 and on.
func largeCIDRs(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("100.%d.%d.0/25", 64+i/256, i%256)
	}
	return out
}

// largeTouchSize is the set of the touch tests: large enough that a
// whole read of it would show, small enough for a quick test.
const largeTouchSize = 20_000

// wholeRead reads the table whole through n's read socket, as an
// independent check of what a partial read returned.
func wholeRead(t *testing.T, n *Netlink) *nft.Table {
	t.Helper()
	conn, err := n.reader()
	if err != nil {
		t.Fatal(err)
	}
	whole, err := readTable(conn, 0)
	if err != nil || whole == nil {
		t.Fatalf("whole read: %v", err)
	}
	return whole
}

// TestForeignElementsReadOneByOne: not owned, a foreign transaction that
// adds or deletes elements of a large set is read by asking the kernel for
// the elements its notifications name, not by reading the set (or the
// table) whole; what the read returns is what a whole read finds, and the
// repair that follows puts back the wanted set, read back alike.
func TestForeignElementsReadOneByOne(t *testing.T) {
	n, topo := kernelNetlink(t)
	n.NoOwner = true
	ours := largeCIDRs(largeTouchSize)
	want := withCIDRs(ours...)
	if _, err := nft.Ensure(n, want); err != nil {
		t.Fatal(err)
	}
	// 600 ranges: 1,200 interval bounds, more than maxElementGets, sent
	// raw (nft takes long over so many beside a large set).
	var many []nft.Bound
	for i := range 600 {
		p := netip.MustParsePrefix(fmt.Sprintf("30.%d.%d.0/24", i/128, 2*(i%128)))
		many = append(many, nft.Bounds([]nft.Range{nft.RangeOfPrefix(p)})...)
	}
	foreign, err := dial(n.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	defer foreign.Close()
	raw := func(typ int, bs []nft.Bound) func() error {
		return func() error {
			_, err := (&batch{msgs: []netlink.Message{rawMessage(typ, netlink.Request|netlink.Create,
				elementsPayload(nft.SetNonMasqV4, bs))}, op: []int{0}}).send(foreign, 0)
			return err
		}
	}
	runNFT := func(args ...string) func() error {
		return func() error {
			if out, err := topo.NFT(args...); err != nil {
				return fmt.Errorf("nft %v: %w\n%s", args, err, out)
			}
			return nil
		}
	}
	for _, step := range []struct {
		name  string
		do    func() error
		asked int // elements the read asks of the kernel
		sets  int // sets it reads whole
	}{
		{"an element added (nft)", runNFT("add", "element", "inet", nft.TableName, nft.SetNonMasqV4, "{ 192.0.2.0/24 }"), 2, 0},
		{"one of ours deleted (nft)", runNFT("delete", "element", "inet", nft.TableName, nft.SetNonMasqV4, "{ "+ours[1234]+" }"), 2, 0},
		{"two transactions: one added, one of ours deleted", func() error {
			if err := runNFT("add", "element", "inet", nft.TableName, nft.SetNonMasqV4, "{ 198.51.100.0/24 }")(); err != nil {
				return err
			}
			return runNFT("delete", "element", "inet", nft.TableName, nft.SetNonMasqV4, "{ "+ours[4321]+" }")()
		}, 4, 0},
		{"added and deleted again", func() error {
			if err := runNFT("add", "element", "inet", nft.TableName, nft.SetNonMasqV4, "{ 203.0.113.0/24 }")(); err != nil {
				return err
			}
			return runNFT("delete", "element", "inet", nft.TableName, nft.SetNonMasqV4, "{ 203.0.113.0/24 }")()
		}, 2, 0},
		{"more elements than are asked one by one", raw(unix.NFT_MSG_NEWSETELEM, many), 0, 1},
		{"and deleted again", raw(unix.NFT_MSG_DELSETELEM, many), 0, 1},
	} {
		if err := step.do(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		before := n.reads
		got, _, err := n.Read()
		if err != nil || got == nil {
			t.Fatalf("%s: read: %v", step.name, err)
		}
		if whole := wholeRead(t, n); !whole.Equal(*got) || !got.Equal(*whole) {
			t.Fatalf("%s: the read differs from a whole read:\n%s", step.name, nft.Render(*whole)+"\nread:\n"+nft.Render(*got))
		}
		if r := n.reads; r.tables != before.tables || r.sets-before.sets != step.sets || r.elements-before.elements != step.asked {
			t.Errorf("%s: read %d tables, %d sets whole, %d elements; want 0, %d, %d",
				step.name, r.tables-before.tables, r.sets-before.sets, r.elements-before.elements, step.sets, step.asked)
		}
	}
	// The repair: the wanted set again, without a whole read.
	before := n.reads
	res, err := nft.Ensure(n, want)
	if err != nil || res.Unchanged {
		t.Fatalf("repair: %+v, %v", res, err)
	}
	for _, op := range res.Plan.Ops {
		if op.Kind != nft.KindElements {
			t.Errorf("the repair's plan does more than elements: %s", op)
		}
	}
	if got, _, err := n.Read(); err != nil || got == nil || !got.Equal(want) {
		t.Fatalf("after the repair: %v", err)
	}
	if whole := wholeRead(t, n); !whole.Equal(want) || !want.Equal(*whole) {
		t.Errorf("after the repair the kernel holds:\n%s", nft.Render(*whole))
	}
	if r := n.reads; r.tables != before.tables || r.sets != before.sets {
		t.Errorf("the repair read %d tables and %d sets whole", r.tables-before.tables, r.sets-before.sets)
	}
}

// TestForeignElementsOddShapes: foreign element operations that leave
// shapes the agent never writes (a start where one of its intervals ends,
// a lone start), or whose answers a get cannot give (two elements at one
// address), still read as a whole read finds them: the kernel's answer
// that disagrees with the notifications reads the set whole.
func TestForeignElementsOddShapes(t *testing.T) {
	n, _ := kernelNetlink(t)
	n.NoOwner = true
	want := withCIDRs("20.0.0.0/24", "20.0.2.0/24", "20.0.4.0/24")
	if _, err := nft.Ensure(n, want); err != nil {
		t.Fatal(err)
	}
	foreign, err := dial(n.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	defer foreign.Close()
	send := func(typ int, bs ...nft.Bound) error {
		_, err := (&batch{msgs: []netlink.Message{rawMessage(typ, netlink.Request|netlink.Create,
			elementsPayload(nft.SetNonMasqV4, bs))}, op: []int{0}}).send(foreign, 0)
		return err
	}
	a := netip.MustParseAddr
	for _, step := range []struct {
		name string
		typ  int
		bs   []nft.Bound
	}{
		{"a start where an interval ends", unix.NFT_MSG_NEWSETELEM, []nft.Bound{{Addr: a("20.0.1.0")}}},
		{"an end deleted beside it", unix.NFT_MSG_DELSETELEM, []nft.Bound{{Addr: a("20.0.1.0"), End: true}}},
		{"a lone start", unix.NFT_MSG_NEWSETELEM, []nft.Bound{{Addr: a("20.0.6.0")}}},
		{"a start deleted", unix.NFT_MSG_DELSETELEM, []nft.Bound{{Addr: a("20.0.2.0")}}},
		{"an interval end deleted", unix.NFT_MSG_DELSETELEM, []nft.Bound{{Addr: a("20.0.5.0"), End: true}}},
	} {
		if err := send(step.typ, step.bs...); err != nil {
			t.Logf("%s: the kernel refused it (%v)", step.name, err)
			continue
		}
		got, _, err := n.Read()
		if err != nil || got == nil {
			t.Fatalf("%s: read: %v", step.name, err)
		}
		if whole := wholeRead(t, n); !whole.Equal(*got) || !got.Equal(*whole) {
			t.Fatalf("%s: the read differs from a whole read:\n%s", step.name, nft.Render(*whole)+"\nread:\n"+nft.Render(*got))
		}
	}
	if res, err := nft.Ensure(n, want); err != nil || res.Unchanged {
		t.Fatalf("repair: %+v, %v", res, err)
	}
	if whole := wholeRead(t, n); !whole.Equal(want) || !want.Equal(*whole) {
		t.Errorf("after the repair the kernel holds:\n%s", nft.Render(*whole))
	}
	// A notification that says what the kernel does not hold (here one
	// made up: an interval added that no one added): the kernel's answer
	// disagrees, and the set is read whole.
	if got, _, err := n.Read(); err != nil || got == nil || !got.Equal(want) {
		t.Fatalf("read: %v", err)
	}
	n.mon.mu.Lock()
	n.mon.touched.elems = map[string][]elem{nft.SetNonMasqV4: {{nft.Bound{Addr: a("20.0.8.0")}, true}, {nft.Bound{Addr: a("20.0.9.0"), End: true}, true}}}
	n.mon.mu.Unlock()
	before := n.reads
	got, _, err := n.Read()
	if err != nil || got == nil || !got.Equal(want) || !want.Equal(*got) {
		t.Fatalf("after a made-up notification the read found (%v):\n%s", err, nft.Render(*got))
	}
	if n.reads.sets != before.sets+1 {
		t.Errorf("the kernel's answers disagreed with a notification, and the set was not read whole (%+v, before %+v)", n.reads, before)
	}
}

// TestLostNotificationsReadWhole: notifications lost (the monitor's
// receive buffer overrun) leave the read nothing to go by: it reads the
// table whole, and finds a foreign deletion whose notification may be
// among those lost.
func TestLostNotificationsReadWhole(t *testing.T) {
	n, topo := kernelNetlink(t)
	n.NoOwner = true
	ours := largeCIDRs(2000)
	want := withCIDRs(ours...)
	if _, err := nft.Ensure(n, want); err != nil {
		t.Fatal(err)
	}
	// The smallest receive buffer the kernel allows: a foreign
	// transaction of a few hundred elements overruns it.
	raw, err := n.mon.conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.Control(func(fd uintptr) { err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 0) }); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.WriteString("table ip bulk {\n set s {\n  type ipv4_addr\n  elements = {\n")
	for i := range 2000 {
		fmt.Fprintf(&b, "1.0.%d.%d,\n", i>>8, i&255)
	}
	b.WriteString("  }\n }\n}\n")
	b.WriteString("delete element inet " + nft.TableName + " " + nft.SetNonMasqV4 + " { " + ours[7] + " }\n")
	file := filepath.Join(t.TempDir(), "bulk.nft")
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := topo.NFT("-f", file); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	before := n.reads
	got, _, err := n.Read()
	if err != nil || got == nil {
		t.Fatalf("read: %v", err)
	}
	if n.reads.tables != before.tables+1 {
		t.Fatalf("after lost notifications the read did not read the table whole (%+v, before %+v)", n.reads, before)
	}
	if got.Equal(want) {
		t.Fatal("the read missed the foreign deletion")
	}
	if res, err := nft.Ensure(n, want); err != nil || res.Unchanged {
		t.Fatalf("repair: %+v, %v", res, err)
	}
	if whole := wholeRead(t, n); !whole.Equal(want) || !want.Equal(*whole) {
		t.Errorf("after the repair the kernel holds:\n%s", nft.Render(*whole))
	}
}

// TestApplyElems: the ranges around the bounds named, computed again
// between guards, are what all the set's bounds make (the whole read's
// nft.RangesFromBounds): random sets of adjacent and apart ranges, one at
// each end of the address space, and random additions and deletions of
// starts and ends near them and far from them. No kernel.
func TestApplyElems(t *testing.T) {
	r := rand.New(rand.NewPCG(34, 1))
	addr := func(v uint32) netip.Addr {
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	for round := range 3000 {
		// Sorted, disjoint ranges on a coarse grid (so that operations hit
		// existing bounds), sometimes starting at 0 or ending at the top.
		var rs []nft.Range
		v := uint32(0)
		if r.IntN(4) > 0 {
			v = uint32(r.IntN(4)) << 28
		}
		for v < 15<<28 && len(rs) < 1+r.IntN(12) {
			size := uint32(1+r.IntN(3)) << 26
			rs = append(rs, nft.RangeFrom(addr(v), addr(v+size-1)))
			v += size + uint32(r.IntN(3))<<26
		}
		if r.IntN(5) == 0 {
			rs = append(rs, nft.RangeFrom(addr(15<<28+1<<26), addr(^uint32(0))))
		}
		rs, odd := nft.RangesFromBounds(nft.Bounds(rs)) // as a whole read reads them
		if len(odd) > 0 {
			t.Fatalf("round %d: the test's set is odd: %v", round, odd)
		}
		var ops []elem
		for range 1 + r.IntN(4) {
			b := nft.Bound{Addr: addr(uint32(r.IntN(64)) << 26), End: r.IntN(2) == 0}
			if bs := nft.Bounds(rs); len(bs) > 0 && r.IntN(2) == 0 {
				b = bs[r.IntN(len(bs))] // an existing one
			}
			ops = append(ops, elem{b, r.IntN(2) == 0})
		}
		// What all the bounds make.
		all := map[nft.Bound]bool{}
		for _, b := range nft.Bounds(rs) {
			all[b] = true
		}
		for _, op := range ops {
			if op.add {
				all[op.Bound] = true
			} else {
				delete(all, op.Bound)
			}
		}
		want, wantOdd := nft.RangesFromBounds(slices.Collect(maps.Keys(all)))
		got, gotOdd, held := applyElems(slices.Clone(rs), ops)
		if !slices.Equal(got, want) || (len(gotOdd) > 0) != (len(wantOdd) > 0) || joinUnique(gotOdd) != joinUnique(wantOdd) {
			t.Fatalf("round %d: %v after %v:\ngot  %v %q\nwant %v %q", round, rs, ops, got, gotOdd, want, wantOdd)
		}
		for _, op := range ops {
			if held[op.Bound] != all[op.Bound] {
				t.Fatalf("round %d: %v after %v: held[%v] = %v", round, rs, ops, op.Bound, held[op.Bound])
			}
		}
	}
}

func BenchmarkApplyElems(b *testing.B) {
	var rs []nft.Range
	for i := range 100_000 {
		a := netip.AddrFrom4([4]byte{byte(20 + i/65536), byte(i / 256 % 256), byte(i % 256), 0})
		rs = append(rs, nft.RangeFrom(a, a.Next()))
	}
	ops := []elem{{nft.Bounds(rs[5:6])[0], false}, {nft.Bounds(rs[5:6])[1], false}, {nft.Bound{Addr: netip.MustParseAddr("192.0.2.0")}, true}, {nft.Bound{Addr: netip.MustParseAddr("192.0.3.0"), End: true}, true}}
	for b.Loop() {
		applyElems(rs, ops)
	}
}
