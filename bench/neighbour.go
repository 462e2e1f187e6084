package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go4.org/netipx"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft/kernel"
)

// What the agent's sets cost the node's other nft users (issue 34): nft
// (1.0.6 and later) reads every element of every interval set on the
// node before a batch that adds or deletes an element, so a neighbour's
// one-element batch (kube-proxy's nftables mode sends such batches on
// most syncs) slows with the agent's element count. The agent writes one
// element per CIDR (nested ones dropped) where the kernel's interval
// lookup is the tree's, and the fewest ranges that cover them (merged)
// where it is the array's (Linux 7.0, 6.18.14 on; nft/prefix.go's paint
// and kernel.Netlink.IntervalLookup say why and how): the row shows both.

// NeighbourRow is one list size: the elements of the agent's sets
// (Before: one per CIDR, as the agent writes them on a tree-lookup
// kernel) and merged (After: the fewest ranges, as it writes them on an
// array-lookup kernel), and a neighbour's `nft -f` of a
// one-element batch beside each table.
type NeighbourRow struct {
	N             int // CIDRs in nonMasqueradeCIDRs (cloud-shaped: awsShaped)
	Before, After int // elements in the agent's sets: one per CIDR (nested dropped; tree lookup), merged (array lookup)
	// Wall and CPU (user+system) time of one `nft -f` of a batch with one
	// element operation, beside the agent's table of Before and of After
	// elements (and, in Empty*, with no agent table).
	BeforeWall, AfterWall, EmptyWall []time.Duration
	BeforeCPU, AfterCPU, EmptyCPU    []time.Duration
}

// NeighbourResults are the rows, and the element counts of lists of the
// size the issue measured (7,905 CIDRs shaped like AWS's IPv4 list).
type NeighbourResults struct {
	Rows   []NeighbourRow
	Counts []NeighbourRow // element counts only
}

// awsShaped returns n IPv4 prefixes shaped like a cloud provider's
// published list: runs of adjacent prefixes (about 2.75 a run, of mixed
// lengths, mostly /22-/24) apart from each other, and about 7% repeated
// or nested in another (the same ranges listed under two services), from
// 240.0.0.0/4, which no harness address is in. Deterministic.
func awsShaped(n int) []netip.Prefix {
	r := rand.New(rand.NewPCG(34, uint64(n)))
	lengths := []struct{ bits, weight int }{{20, 3}, {21, 4}, {22, 8}, {23, 10}, {24, 40}, {25, 8}, {26, 8}, {27, 7}, {28, 7}, {32, 5}}
	total := 0
	for _, l := range lengths {
		total += l.weight
	}
	pick := func() int {
		w := r.IntN(total)
		for _, l := range lengths {
			if w -= l.weight; w < 0 {
				return l.bits
			}
		}
		return 24
	}
	out := make([]netip.Prefix, 0, n)
	next := uint32(240 << 24)
	for len(out) < n {
		// A run: adjacent prefixes from next.
		start := len(out)
		for len(out) < n {
			bits := pick()
			for bits < 32 && next&(1<<(32-bits)-1) != 0 {
				bits++ // not aligned for that length: the longest that is
			}
			p := netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(next >> 24), byte(next >> 16), byte(next >> 8), byte(next)}), bits)
			out = append(out, p)
			next += 1 << (32 - bits)
			if r.IntN(100) < 7 && len(out) < n { // listed again, or a part of it
				sub := min(32, bits+r.IntN(3))
				q, _ := p.Addr().Prefix(sub)
				out = append(out, q)
			}
			if r.IntN(11) < 4 { // a run ends with probability 4/11: 2.75 a run
				break
			}
		}
		// A gap: the next /20 boundary after one more /24 at least.
		next = (next + 256 + 1<<12 - 1) &^ (1<<12 - 1)
		if next < 240<<24 { // wrapped: no room left (not at the sizes used)
			return out[:start]
		}
	}
	r.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// elementsOf returns the table the agent writes for the list on a kernel
// whose interval lookup is the tree's (one element per CIDR, nested ones
// dropped), and the same with the fewest ranges that cover them (merged:
// what it writes where the lookup is the array's).
func elementsOf(ps []netip.Prefix) (merged, agent nft.Table) {
	c := config.Default(config.Flags{})
	c.NonMasqueradeCIDRs = ps
	c.CIDRLimit = len(ps)
	agent = nft.Build(c, nft.Options{Chain: nft.DefaultChain, RandomFully: true})
	merged = agent
	merged.Sets = slices.Clone(agent.Sets)
	for i, s := range merged.Sets {
		var b netipx.IPSetBuilder
		for _, r := range s.Elements {
			b.AddRange(r.IPRange())
		}
		set, _ := b.IPSet()
		merged.Sets[i].Elements = nil
		for _, r := range set.Ranges() {
			merged.Sets[i].Elements = append(merged.Sets[i].Elements, nft.RangeFrom(r.From(), r.To()))
		}
	}
	return merged, agent
}

func elementCount(t nft.Table) int {
	n := 0
	for _, s := range t.Sets {
		n += len(s.Elements)
	}
	return n
}

// RunNeighbour measures, at 64, 10,000 and 100,000 CIDRs, a neighbour's
// `nft -f` of a one-element batch beside the agent's table with one
// element per CIDR and merged (as it writes it on a tree-lookup and on an
// array-lookup kernel).
func RunNeighbour(ctx context.Context, cfg Config) (*NeighbourResults, error) {
	res := &NeighbourResults{}
	for _, n := range []int{7_905} {
		after, before := elementsOf(awsShaped(n))
		res.Counts = append(res.Counts, NeighbourRow{N: n, Before: elementCount(before), After: elementCount(after)})
	}
	sizes, reps := []int{64, 10_000, 100_000}, 5
	if cfg.Quick {
		sizes, reps = []int{64, 1_000}, 1
	}
	for _, n := range sizes {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		after, before := elementsOf(awsShaped(n))
		row := NeighbourRow{N: n, Before: elementCount(before), After: elementCount(after)}
		cfg.logf("neighbour: %s CIDRs, %s elements one per CIDR, %s merged", num(n), num(row.Before), num(row.After))
		err := withTopology("nbr", func(topo *testnet.Topology) error {
			return neighbourRow(ctx, topo, reps, before, after, &row)
		})
		res.Rows = append(res.Rows, row)
		if err != nil {
			return res, fmt.Errorf("%d CIDRs: %w", n, err)
		}
	}
	return res, nil
}

func neighbourRow(ctx context.Context, topo *testnet.Topology, reps int, before, after nft.Table, row *NeighbourRow) error {
	dir, err := os.MkdirTemp("", "bench-neighbour")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	setup := filepath.Join(dir, "setup.nft")
	if err := os.WriteFile(setup, []byte("table ip neighbour {\n\tset s {\n\t\ttype ipv4_addr\n\t\tflags interval\n\t\telements = { 192.0.2.1 }\n\t}\n}\n"), 0o644); err != nil {
		return err
	}
	if out, err := topo.NFT("-f", setup); err != nil {
		return fmt.Errorf("the neighbour's table: %v: %s", err, out)
	}
	var batches [2]string
	for i, verb := range []string{"add", "delete"} {
		batches[i] = filepath.Join(dir, verb+".nft")
		if err := os.WriteFile(batches[i], []byte(verb+" element ip neighbour s { 192.0.2.77 }\n"), 0o644); err != nil {
			return err
		}
	}
	measure := func(wall, cpu *[]time.Duration) error {
		for i := range 2 * reps {
			if err := ctx.Err(); err != nil {
				return err
			}
			cmd := exec.CommandContext(ctx, "ip", "netns", "exec", topo.NodeNS, "nft", "-f", batches[i%2])
			start := time.Now()
			out, err := cmd.CombinedOutput()
			if err != nil {
				return fmt.Errorf("nft -f %s: %v: %s", batches[i%2], err, out)
			}
			*wall = append(*wall, time.Since(start))
			*cpu = append(*cpu, cmd.ProcessState.UserTime()+cmd.ProcessState.SystemTime())
		}
		return nil
	}
	if err := measure(&row.EmptyWall, &row.EmptyCPU); err != nil {
		return err
	}
	k := &kernel.Netlink{NetNS: int(topo.NodeHandle()), NoOwner: true}
	defer k.Close()
	for _, m := range []struct {
		t         nft.Table
		wall, cpu *[]time.Duration
	}{{before, &row.BeforeWall, &row.BeforeCPU}, {after, &row.AfterWall, &row.AfterCPU}} {
		if _, err := nft.Ensure(k, m.t); err != nil {
			return fmt.Errorf("the agent's table: %w", err)
		}
		if err := measure(m.wall, m.cpu); err != nil {
			return err
		}
	}
	return nil
}

func neighbourMarkdown(b *strings.Builder, r *Results) {
	w := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	w("## The node's other nft users (issue 34)\n\n")
	nr := r.Neighbour
	if nr == nil {
		w("Not run.\n\n")
		return
	}
	if r.NeighbourErr != nil {
		w("**Incomplete:** %s\n\n", oneLine(r.NeighbourErr.Error()))
	}
	w("nft reads every element of every interval set on the node before a batch that adds or deletes an\n" +
		"element. A neighbour (a table `ip neighbour` of its own) runs `nft -f` of a batch that adds, or deletes,\n" +
		"one element, beside the agent's table for a list of CIDRs shaped like a cloud provider's (runs of adjacent\n" +
		"prefixes, some repeated: `awsShaped` in bench/neighbour.go): first with one element per CIDR (nested ones\n" +
		"dropped: what the agent writes where the kernel's interval lookup is a tree walk, which may miss a held\n" +
		"address while a transaction moves the start of its interval), then with the fewest ranges that cover them\n" +
		"(merged: what the agent writes where the lookup is the array's, Linux 7.0 and 6.18.14 on; docs/operation.md). Wall\n" +
		"time and the nft process's CPU time (user+system), medians; the same batch with no agent table for\n" +
		"reference.\n\n")
	for _, x := range nr.Counts {
		w("Element counts of %s CIDRs (the size of AWS's IPv4 list): %s one per CIDR, %s merged.\n\n", num(x.N), num(x.Before), num(x.After))
	}
	w("| CIDRs | elements: one per CIDR | elements: merged | `nft -f`, no agent table | beside one per CIDR: wall / CPU | beside merged: wall / CPU |\n| ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, x := range nr.Rows {
		w("| %s | %s | %s | %s / %s | %s / %s | %s / %s |\n", num(x.N), num(x.Before), num(x.After),
			fmtDur(median(x.EmptyWall)), fmtDur(median(x.EmptyCPU)),
			fmtDur(median(x.BeforeWall)), fmtDur(median(x.BeforeCPU)),
			fmtDur(median(x.AfterWall)), fmtDur(median(x.AfterCPU)))
	}
	w("\n")
}
