package bench

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/conntrack"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
)

// The conntrack cleanup of issue 14, measured as conntrack's
// BenchmarkCleanup does (conntrack/cleanup_bench_test.go): the node
// namespace's table filled with UDP entries over ctnetlink, a fraction of
// them stale, then conntrack.CleanupMarked timed; here with a UDP probe of the
// data plane running through the node during each cleanup.

// CleanupRow is one table size and stale fraction.
type CleanupRow struct {
	N       int
	Stale   float64
	Skipped string // why not measured
	Fill    time.Duration
	Took    []time.Duration // conntrack.CleanupMarked, per repetition
	Result  conntrack.Result
	Left    int    // nf_conntrack_count after the (last) cleanup, the probe's entry aside
	Alloc   uint64 // bytes allocated during the (last) cleanup, the probe's few included
	Wrong   string // the count deleted or left is not the expected one
	Probe   Probe  // the data plane during the cleanups
	Before  Probe  // the same probe for as long, just before, without a cleanup
}

// Probe is UDP round trips from the pod to a host behind the node, one at a
// time, probeInterval apart, on one flow (one conntrack entry that the cleanup
// must keep): how many were answered, and how long they took.
type Probe struct {
	Sent, Answered int
	RTTs           []time.Duration
}

// CleanupResults are the conntrack cleanup figures.
type CleanupResults struct {
	Max  int // nf_conntrack_max of the namespace
	Rows []CleanupRow
}

// firstVersion is the cost of the first version of the cleanup
// (netlink.Handle.ConntrackDeleteFilters), measured once by hand on
// 2026-11-23 with `go test -bench Cleanup ./conntrack/` on the same kind of
// machine: a reference that no run repeats.
var firstVersion = map[[2]int]string{
	{10_000, 10}: "36 ms", {100_000, 0}: "280 ms", {100_000, 10}: "357 ms", {100_000, 100}: "836 ms", {250_000, 10}: "972 ms, 251 MB",
}

var ctChanged = netip.MustParsePrefix("203.0.113.0/24")

// ctProbeDst is the probe's destination: masqueraded before and after the
// change, so its entry is not stale.
var ctProbeDst = netip.MustParseAddr("198.51.100.200")

// RunConntrack measures conntrack.CleanupMarked at growing table sizes.
func RunConntrack(ctx context.Context, cfg Config) (*CleanupResults, error) {
	res := &CleanupResults{}
	cases := []struct {
		n     int
		stale float64
	}{{10_000, 0.1}, {100_000, 0}, {100_000, 0.1}, {100_000, 1}, {250_000, 0.1}, {1_000_000, 0.1}}
	reps := func(n int) int { return max(1, min(3, 200_000/n)) } // filling the table is the slow part
	if cfg.Quick {
		reps = func(int) int { return 1 }
		cases = cases[:1]
		cases[0].n = 1000
	}
	err := withTopology("ct", func(topo *testnet.Topology) error {
		h, err := netlink.NewHandleAt(topo.NodeHandle(), unix.NETLINK_NETFILTER)
		if err != nil {
			return err
		}
		defer h.Close()
		if err := testnet.InNS(topo.NodeHandle(), func() error {
			res.Max, err = strconv.Atoi(readTrim("/proc/sys/net/netfilter/nf_conntrack_max"))
			return err
		}); err != nil {
			return fmt.Errorf("nf_conntrack_max: %w", err)
		}
		if err := topo.EnableConntrack(); err != nil {
			return err
		}
		if err := topo.AddDestination(ctProbeDst); err != nil {
			return err
		}
		probe, err := topo.DialPodUDP(ctProbeDst)
		if err != nil {
			return err
		}
		defer probe.Close()
		if p := runProbe(probe, 200*time.Millisecond, nil); p.Answered == 0 {
			return fmt.Errorf("the probe got no answer from %s", ctProbeDst)
		}
		for _, c := range cases {
			if err := ctx.Err(); err != nil {
				return err
			}
			row := CleanupRow{N: c.n, Stale: c.stale}
			if c.n > res.Max-1000 {
				row.Skipped = fmt.Sprintf("nf_conntrack_max is %s here: global, and read-only inside a child network namespace", num(res.Max))
				res.Rows = append(res.Rows, row)
				continue
			}
			cfg.logf("conntrack cleanup: %d entries, %.0f%% stale", c.n, c.stale*100)
			if err := cleanupRow(ctx, topo, h, probe, reps(c.n), &row); err != nil {
				return fmt.Errorf("%d entries: %w", c.n, err)
			}
			res.Rows = append(res.Rows, row)
		}
		return nil
	})
	return res, err
}

func cleanupRow(ctx context.Context, topo *testnet.Topology, h *netlink.Handle, probe *net.UDPConn, reps int, row *CleanupRow) error {
	old := func(f conntrack.Flow) (bool, bool) { return f.Dst.Is4(), f.Dst.Is4() }
	new := func(f conntrack.Flow) (bool, bool) { return f.Dst.Is4() && !ctChanged.Contains(f.Dst), f.Dst.Is4() }
	want := int(float64(row.N) * row.Stale)
	for range reps {
		if err := ctx.Err(); err != nil {
			return err
		}
		t0 := time.Now()
		if err := testnet.PopulateConntrack(h, row.N, row.Stale); err != nil {
			return err
		}
		row.Fill = time.Since(t0)
		// The probe's flow was flushed with the rest: one round trip makes
		// its entry again.
		runProbe(probe, 20*time.Millisecond, nil)
		var before Probe
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var during Probe
		wg.Add(1)
		go func() { defer wg.Done(); during = runProbe(probe, 0, stop) }()
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		start := time.Now()
		r, err := conntrack.CleanupMarked(topo.NodeHandle(), conntrack.ModeUDP, old, new, -1)
		took := time.Since(start)
		runtime.ReadMemStats(&m1)
		row.Alloc = m1.TotalAlloc - m0.TotalAlloc
		close(stop)
		wg.Wait()
		if err != nil {
			return err
		}
		before = runProbe(probe, took, nil) // as long, without a cleanup
		row.Took = append(row.Took, took)
		row.Result = r
		row.Probe.add(during)
		row.Before.add(before)
		if r.Deleted != want {
			row.Wrong = fmt.Sprintf("deleted %d, want %d", r.Deleted, want)
		}
	}
	if err := testnet.InNS(topo.NodeHandle(), func() (err error) {
		row.Left, err = strconv.Atoi(readTrim("/proc/sys/net/netfilter/nf_conntrack_count"))
		return err
	}); err != nil {
		return err
	}
	// The probe's entry and the odd other one (the harness's own traffic).
	if row.Left < row.N-want || row.Left > row.N-want+5 {
		row.Wrong = strings.TrimPrefix(row.Wrong+fmt.Sprintf("; %d entries left, want %d", row.Left, row.N-want), "; ")
	}
	return h.ConntrackTableFlush(netlink.ConntrackTable)
}

func (p *Probe) add(q Probe) {
	p.Sent += q.Sent
	p.Answered += q.Answered
	p.RTTs = append(p.RTTs, q.RTTs...)
}

// probeInterval paces the probe: a flow of about 1,000 packets a second
// each way, which leaves the CPUs to the cleanup.
const probeInterval = time.Millisecond

// runProbe sends a datagram and waits for its answer (at most 200 ms),
// again and again (probeInterval apart), for d or until stop is closed.
func runProbe(c *net.UDPConn, d time.Duration, stop <-chan struct{}) Probe {
	var p Probe
	buf := make([]byte, 512)
	end := time.Now().Add(d)
	for {
		if stop != nil {
			select {
			case <-stop:
				return p
			default:
			}
		} else if time.Now().After(end) && p.Sent > 0 {
			return p
		}
		if p.Sent > 0 {
			time.Sleep(probeInterval)
		}
		start := time.Now()
		p.Sent++
		if _, err := c.Write([]byte("?")); err != nil {
			continue
		}
		c.SetReadDeadline(start.Add(200 * time.Millisecond))
		if _, err := c.Read(buf); err != nil {
			continue
		}
		p.Answered++
		p.RTTs = append(p.RTTs, time.Since(start))
	}
}
