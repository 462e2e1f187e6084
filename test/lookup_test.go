package test

import (
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/google/nftables"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
)

// TestIntervalLookupDuringCommit measures what the kernel's interval set
// answers, packet by packet, for an address that every state of the set
// holds, while transactions change the elements around it. Each case is a
// shape of change (which start and end elements a transaction deletes and
// adds); its packets must all be found in the set. A kernel whose lookup
// takes an element that a transaction is adding or deleting as the
// interval's start answers "not in the set" for a moment: the agent must
// never send a change of that shape for an address that stays in a set.
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
		if tc.agentSafe && miss > 0 {
			t.Errorf("%s: %d packets to %s, held in every state, were not found in the set", tc.name, miss, stable)
		}
		if !tc.agentSafe && miss > 0 {
			t.Logf("%s: %s", tc.name, fmt.Sprintf("this kernel answers \"not in the set\" during such changes (%d packets)", miss))
		}
	}
}
