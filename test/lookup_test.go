package test

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft/kernel"
)

// TestIntervalLookupDuringCommit measures what the kernel's interval set
// answers, packet by packet, for an address that every state of the set
// holds, while transactions change the elements around it. Each case is a
// shape of change (which start and end elements a transaction deletes and
// adds); its packets must all be found in the set. A kernel whose lookup
// takes an element that a transaction is adding or deleting as the
// interval's start answers "not in the set" for a moment: the agent must
// never send a change of that shape for an address that stays in a set.
//
// The kernel's answer to a get tells the two lookups apart (lookupKind):
// where it says "array", no shape may miss a packet, for merging adjacent
// CIDRs into one element would rest on that.
func TestIntervalLookupDuringCommit(t *testing.T) {
	topo := newTopology(t)
	const stable = "198.51.100.10"
	if out, err := topo.NFT("-f", writeConfig(t, `table inet probe {
	set s { type ipv4_addr; flags interval; elements = { 198.51.100.0/24 } }
	chain out {
		type filter hook output priority 0; policy accept;
		ip daddr `+stable+` ip daddr @s counter drop
		ip daddr `+stable+` counter drop
	}
}
`)); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	nc, err := nftables.New(nftables.WithNetNSFd(int(topo.NodeHandle())))
	if err != nil {
		t.Fatal(err)
	}
	set := &nftables.Set{Table: &nftables.Table{Family: nftables.TableFamilyINet, Name: "probe"}, Name: "s", KeyType: nftables.TypeIPAddr, Interval: true}
	kind := lookupKind(t, topo.NodeHandle(), "probe", "s", netip.MustParseAddr("198.51.100.0"), netip.MustParseAddr("198.51.101.0"))
	t.Logf("this kernel's interval-set lookup, by its answer to a get: %s", kind)
	// The agent's own question (in a table of its own) gets the same
	// answer, and leaves no table behind.
	k := &kernel.Netlink{NetNS: int(topo.NodeHandle())}
	defer k.Close()
	if array, err := k.IntervalLookup(); err != nil || array != (kind == lookupArray) {
		t.Errorf("kernel.Netlink.IntervalLookup: array %v, %v; this test's get says %s", array, err, kind)
	}
	if out, err := topo.NFT("list", "tables"); err != nil || strings.Contains(out, "lookup") {
		t.Errorf("after IntervalLookup, the tables: %v\n%s", err, out)
	}
	start := func(a string) nftables.SetElement { return nftables.SetElement{Key: netip.MustParseAddr(a).AsSlice()} }
	end := func(a string) nftables.SetElement {
		return nftables.SetElement{Key: netip.MustParseAddr(a).AsSlice(), IntervalEnd: true}
	}
	type change struct{ del, add []nftables.SetElement }
	// Each case: from the set's first state (198.51.100.0/24) to another
	// and back, the stable address held throughout.
	cases := []struct {
		name      string
		there     change
		back      change
		agentSafe bool // a shape the agent's plans send for held addresses
	}{
		{"the interval replaced whole, same start", change{[]nftables.SetElement{start("198.51.100.0"), end("198.51.101.0")}, []nftables.SetElement{start("198.51.100.0"), end("198.51.102.0")}},
			change{[]nftables.SetElement{start("198.51.100.0"), end("198.51.102.0")}, []nftables.SetElement{start("198.51.100.0"), end("198.51.101.0")}}, false},
		{"only the end moved", change{[]nftables.SetElement{end("198.51.101.0")}, []nftables.SetElement{end("198.51.102.0")}},
			change{[]nftables.SetElement{end("198.51.102.0")}, []nftables.SetElement{end("198.51.101.0")}}, true},
		{"only the start moved down", change{[]nftables.SetElement{start("198.51.100.0")}, []nftables.SetElement{start("198.51.99.0")}},
			change{[]nftables.SetElement{start("198.51.99.0")}, []nftables.SetElement{start("198.51.100.0")}}, false},
		// Joining with an adjacent interval below moves the held
		// address's start down; a split below it moves it up.
		{"only the start moved up", change{[]nftables.SetElement{start("198.51.100.0")}, []nftables.SetElement{start("198.51.100.5")}},
			change{[]nftables.SetElement{start("198.51.100.5")}, []nftables.SetElement{start("198.51.100.0")}}, false},
		{"an adjacent interval added below", change{nil, []nftables.SetElement{start("198.51.99.0"), end("198.51.100.0")}},
			change{[]nftables.SetElement{start("198.51.99.0"), end("198.51.100.0")}, nil}, true},
		{"an interval added above", change{nil, []nftables.SetElement{start("198.51.102.0"), end("198.51.103.0")}},
			change{[]nftables.SetElement{start("198.51.102.0"), end("198.51.103.0")}, nil}, true},
	}
	flips := pick(200, 3000)
	counters := regexp.MustCompile(`counter packets (\d+) bytes \d+ drop`)
	counts := func() (hit, miss int) {
		out, err := topo.NFT("list", "chain", "inet", "probe", "out")
		if err != nil {
			t.Fatal(err)
		}
		m := counters.FindAllStringSubmatch(out, -1)
		if len(m) != 2 {
			t.Fatalf("counters: %s", out)
		}
		hit, _ = strconv.Atoi(m[0][1])
		miss, _ = strconv.Atoi(m[1][1])
		return hit, miss
	}
	for _, tc := range cases {
		var sent atomic.Int64
		stop := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- testnet.InNS(topo.NodeHandle(), func() error {
				c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(stable+":9")))
				if err != nil {
					return err
				}
				defer c.Close()
				for n := 0; n < 50_000_000; n++ {
					select {
					case <-stop:
						return nil
					default:
					}
					c.Write([]byte("x"))
					sent.Add(1)
				}
				return nil
			})
		}()
		hit0, miss0 := counts()
		for i := 0; i < flips; i++ {
			ch := tc.there
			if i%2 == 1 {
				ch = tc.back
			}
			if len(ch.del) > 0 {
				if err := nc.SetDeleteElements(set, ch.del); err != nil {
					t.Fatal(err)
				}
			}
			if len(ch.add) > 0 {
				if err := nc.SetAddElements(set, ch.add); err != nil {
					t.Fatal(err)
				}
			}
			if err := nc.Flush(); err != nil {
				t.Fatalf("%s, flip %d: %v", tc.name, i, err)
			}
		}
		close(stop)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		hit, miss := counts()
		hit, miss = hit-hit0, miss-miss0
		t.Logf("%s: %d flips, %d packets, %d found in the set, %d not", tc.name, flips, sent.Load(), hit, miss)
		if (tc.agentSafe || kind == lookupArray) && miss > 0 {
			t.Errorf("%s: %d packets to %s, held in every state, were not found in the set (lookup: %s)", tc.name, miss, stable, kind)
		}
		if !tc.agentSafe && miss > 0 {
			t.Logf("%s: %s", tc.name, fmt.Sprintf("this kernel answers \"not in the set\" during such changes (%d packets)", miss))
		}
	}
}

// The interval-set lookups of Linux (nft_set_rbtree).
const (
	// lookupRBTree walks the tree of elements, locklessly: before Linux
	// 7.0 (and 6.18.14, 6.19.4, which took the array back).
	lookupRBTree = "rbtree (a tree walk; may miss during a commit)"
	// lookupArray searches a sorted array of the intervals, built at
	// each commit (nf-next 2026-01-22, "nft_set_rbtree: translate rbtree
	// to array for binary search"): a packet sees the old or the new set.
	lookupArray = "array (built at commit)"
)

// lookupKind asks the kernel, in namespace ns, for the element of set
// (of table inet tbl) at the start of its interval [start, end) with the
// interval-end flag: the tree's get returns the start element itself
// (an exact key match, whatever the flag), the array's get the interval
// that holds the key, and of it the end element. The interval must have
// no neighbour touching it. Any other answer fails the test.
func lookupKind(t *testing.T, ns netns.NsHandle, tbl, set string, start, end netip.Addr) string {
	t.Helper()
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: int(ns)})
	if err != nil {
		t.Fatalf("lookup kind: %v", err)
	}
	defer c.Close()
	flags := binary.BigEndian.AppendUint32(nil, unix.NFT_SET_ELEM_INTERVAL_END)
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, tbl)
	ae.String(unix.NFTA_SET_ELEM_LIST_SET, set)
	ae.Nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(ae *netlink.AttributeEncoder) error {
		ae.Nested(unix.NFTA_LIST_ELEM, func(ae *netlink.AttributeEncoder) error {
			ae.Nested(unix.NFTA_SET_ELEM_KEY, func(ae *netlink.AttributeEncoder) error {
				ae.Bytes(unix.NFTA_DATA_VALUE, start.AsSlice())
				return nil
			})
			ae.Bytes(unix.NFTA_SET_ELEM_FLAGS, flags)
			return nil
		})
		return nil
	})
	attrs, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETSETELEM), Flags: netlink.Request | netlink.Acknowledge},
		Data:   append([]byte{unix.NFPROTO_INET, unix.NFNETLINK_V0, 0, 0}, attrs...),
	})
	if err != nil {
		t.Fatalf("lookup kind: get element %s with the interval-end flag: %v", start, err)
	}
	var key netip.Addr
	var isEnd bool
	for _, m := range msgs {
		if m.Header.Type != netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWSETELEM) || len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			t.Fatal(err)
		}
		for ad.Next() {
			if ad.Type() != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
				continue
			}
			ad.Nested(func(ad *netlink.AttributeDecoder) error {
				for ad.Next() {
					ad.Nested(func(ad *netlink.AttributeDecoder) error {
						for ad.Next() {
							switch ad.Type() {
							case unix.NFTA_SET_ELEM_KEY:
								ad.Nested(func(ad *netlink.AttributeDecoder) error {
									for ad.Next() {
										if ad.Type() == unix.NFTA_DATA_VALUE {
											key, _ = netip.AddrFromSlice(ad.Bytes())
										}
									}
									return nil
								})
							case unix.NFTA_SET_ELEM_FLAGS:
								isEnd = binary.BigEndian.Uint32(ad.Bytes())&unix.NFT_SET_ELEM_INTERVAL_END != 0
							}
						}
						return nil
					})
				}
				return nil
			})
		}
		if err := ad.Err(); err != nil {
			t.Fatal(err)
		}
	}
	switch {
	case key == start && !isEnd:
		return lookupRBTree
	case key == end && isEnd:
		return lookupArray
	}
	t.Fatalf("lookup kind: the kernel answered a get of %s (interval-end flag) in [%s, %s) with %s (end %v): neither lookup's answer", start, start, end, key, isEnd)
	return ""
}
