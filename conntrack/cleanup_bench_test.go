package conntrack

import (
	"fmt"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
)

// BenchmarkCleanup measures Cleanup on a conntrack table of n UDP entries
// in a node namespace of internal/testnet, of which a fraction is stale
// (masqueraded, to 203.0.113.0/24, which the new decider no longer
// masquerades); the others go to ranges whose decision did not change.
// The entries are created with ctnetlink (ConntrackCreate) while the timer
// is stopped. Run it alone, once per size:
//
//	go test -run '^$' -bench Cleanup -benchtime 1x ./conntrack/
//
// nf_conntrack_max caps the entries of a namespace; it is global and
// read-only outside the root namespace, so sizes above it are skipped.
func BenchmarkCleanup(b *testing.B) {
	testnet.Require(b)
	topo, err := testnet.New("ctbench")
	if err != nil {
		b.Fatal(err)
	}
	defer topo.Close()
	h, err := netlink.NewHandleAt(topo.NodeHandle(), unix.NETLINK_NETFILTER)
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	var max int
	if err := testnet.InNS(topo.NodeHandle(), func() error {
		_, err := fmt.Sscan(readFile("/proc/sys/net/netfilter/nf_conntrack_max"), &max)
		return err
	}); err != nil {
		b.Fatalf("nf_conntrack_max: %v", err)
	}
	old := prefixDecider(false, "0.0.0.0/0")
	new := func(f Flow) (bool, bool) {
		if f.Dst.Is6() {
			return false, false
		}
		return !changed.Contains(f.Dst), true
	}
	for _, c := range []struct {
		n     int
		stale float64
	}{{10_000, 0.1}, {100_000, 0}, {100_000, 0.1}, {100_000, 1}, {250_000, 0.1}, {1_000_000, 0.1}} {
		b.Run(fmt.Sprintf("entries=%d/stale=%d%%", c.n, int(c.stale*100)), func(b *testing.B) {
			if c.n > max-1000 {
				b.Skipf("%d entries: nf_conntrack_max is %d (global, read-only in a child namespace)", c.n, max)
			}
			var res Result
			for range b.N {
				b.StopTimer()
				t0 := time.Now()
				if err := testnet.PopulateConntrack(h, c.n, c.stale); err != nil {
					b.Fatal(err)
				}
				b.Logf("created %d entries in %s", c.n, time.Since(t0).Round(time.Millisecond))
				b.StartTimer()
				res, err = CleanupMarked(topo.NodeHandle(), ModeUDP, old, new, -1)
				if err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.Logf("%s", res)
			want := int(float64(c.n) * c.stale)
			if res.Examined < c.n || res.Deleted != want {
				b.Errorf("examined %d, deleted %d; want %d and %d", res.Examined, res.Deleted, c.n, want)
			}
			var left int
			testnet.InNS(topo.NodeHandle(), func() error {
				_, err := fmt.Sscan(readFile("/proc/sys/net/netfilter/nf_conntrack_count"), &left)
				return err
			})
			if left != c.n-want {
				b.Errorf("%d entries left after the cleanup, want %d", left, c.n-want)
			}
			b.ReportMetric(float64(res.Examined), "entries")
			b.ReportMetric(float64(res.Deleted), "deleted")
			h.ConntrackTableFlush(netlink.ConntrackTable)
		})
	}
}

var changed = netip.MustParsePrefix("203.0.113.0/24")

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}
