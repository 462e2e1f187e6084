package kernel

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"

	"errors"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// TestChainDumpSkewedByOtherTable: the chain dump is not filtered
// by table (every inet chain comes), and the kernel's dump resumes by
// index. A neighbour that adds and deletes chains in an inet table listed
// before ours (firewalld's inet firewalld, or a hostile process) shifts
// that index between two parts of the dump: one of our chains is skipped
// or listed twice. NLM_F_DUMP_INTR says so, but requestKeep ignores it,
// and the fence + monitor only ask whether our table was touched: the
// skewed read is accepted (Read returns it with no error).
func TestChainDumpSkewedByOtherTable(t *testing.T) {
	n, topo := kernelNetlink(t)
	n.Close()
	// A neighbour's inet table, listed before ours (created first).
	var b strings.Builder
	b.WriteString("table inet aaa {\n")
	for i := range 600 {
		fmt.Fprintf(&b, "chain c%04d { }\n", i)
	}
	b.WriteString("}\n")
	f := t.TempDir() + "/aaa.nft"
	os.WriteFile(f, []byte(b.String()), 0o644)
	if out, err := topo.NFT("-f", f); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	agent := &Netlink{NetNS: n.NetNS, NoOwner: true}
	if _, err := nft.Ensure(agent, defaultTable()); err != nil {
		t.Fatal(err)
	}
	agent.Close()
	truth, err := agent.ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	agent.Close()
	var want []string
	for _, c := range truth.Chains {
		want = append(want, c.Name)
	}
	t.Logf("our chains: %v", want)
	// A foreign chain in our table, which the agent must find and remove.
	if out, err := topo.NFT("add", "chain", "inet", nft.TableName, "zz-evil", "{ type filter hook postrouting priority 0; policy drop; }"); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	hidden := 0

	// The neighbour: delete a chain of its own table, add it back, as
	// fast as it can. It never touches table inet ip-masq-agent.
	nc, err := nftables.New(nftables.WithNetNSFd(n.NetNS))
	if err != nil {
		t.Fatal(err)
	}
	aaa := &nftables.Table{Family: nftables.TableFamilyINet, Name: "aaa"}
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			for i := range 300 {
				nc.DelChain(&nftables.Chain{Table: aaa, Name: fmt.Sprintf("c%04d", i)})
			}
			nc.Flush()
			for i := range 300 {
				nc.AddChain(&nftables.Chain{Table: aaa, Name: fmt.Sprintf("c%04d", i)})
			}
			nc.Flush()
		}
	}()
	skewed := 0
	var examples []string
	deadline := time.Now().Add(5 * time.Second)
	reads := 0
	for ; reads < 400 && time.Now().Before(deadline); reads++ {
		m := &Netlink{NetNS: n.NetNS, NoOwner: true} // a fresh monitor: the first read dumps
		got, _, err := m.Read()
		m.Close()
		if err != nil {
			continue // stale or failed: not accepted
		}
		var names []string
		for _, c := range got.Chains {
			names = append(names, c.Name)
		}
		if slices.Equal(names, want) {
			hidden++
			if defaultTable().Equal(*got) {
				t.Logf("read %d: Equal(want) although the kernel holds chain zz-evil (policy drop)", reads)
			}
		}
		if !slices.Equal(names, append(slices.Clone(want), "zz-evil")) {
			skewed++
			if len(examples) < 5 {
				examples = append(examples, fmt.Sprint(names))
			}
		}
	}
	stop.Store(true)
	wg.Wait()
	if hidden > 0 {
		t.Errorf("%d of %d reads hid the foreign chain zz-evil in table inet %s", hidden, reads, nft.TableName)
	}
	if skewed > 0 {
		t.Errorf("%d of %d reads accepted (no error) with our chains %v read as: %s", skewed, reads, want, strings.Join(examples, " | "))
	}
}

// TestCatchAllElementOdd: a catch-all element (NFT_SET_ELEM_CATCHALL,
// no key) added by another process to the agent's nonmasq-v4 set makes
// every address match it. The read must not find the set as wanted.
func TestCatchAllElementOdd(t *testing.T) {
	n, topo := kernelNetlink(t)
	n.NoOwner = true
	want := defaultTable()
	if _, err := nft.Ensure(n, want); err != nil {
		t.Fatal(err)
	}
	elem := appendAttr(nil, unix.NFTA_SET_ELEM_FLAGS, []byte{0, 0, 0, 2}) // NFT_SET_ELEM_CATCHALL
	list := appendAttr(nil, 1|unix.NLA_F_NESTED, elem)
	data := nfgenmsg(unix.NFPROTO_INET, 0)
	data = appendAttr(data, unix.NFTA_SET_ELEM_LIST_TABLE, cstring(nft.TableName))
	data = appendAttr(data, unix.NFTA_SET_ELEM_LIST_SET, cstring(nft.SetNonMasqV4))
	data = appendAttr(data, unix.NFTA_SET_ELEM_LIST_ELEMENTS|unix.NLA_F_NESTED, list)
	b := &batch{msgs: []netlink.Message{{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWSETELEM), Flags: netlink.Request | netlink.Create},
		Data:   data,
	}}, op: []int{0}}
	other, err := dial(n.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := b.send(other, 0); err != nil {
		t.Skipf("the kernel refused a catch-all element in an interval set: %v", err)
	}
	out, _ := topo.NFT("list", "set", "inet", nft.TableName, nft.SetNonMasqV4)
	t.Logf("nft list:\n%s", out)
	got, _, err := n.Read()
	for errors.Is(err, nft.ErrStale) {
		got, _, err = n.Read()
	}
	if err != nil {
		t.Fatal(err)
	}
	want.Owner = nft.NotOwned
	if want.Equal(*got) {
		t.Errorf("the agent reads its set as wanted though it holds a catch-all element")
	}
	if s := got.Set(nft.SetNonMasqV4); s != nil {
		t.Logf("read: odd %q", s.Odd)
	}
}
