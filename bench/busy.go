package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/harness"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// BusyRow is the agent on a busy node: under a CPU quota of QuotaPercent
// of one CPU (the DaemonSet's limit, 100m, is 10), with a neighbour
// committing to its own nftables table Rate times a second, or (NFT)
// running `nft` batches, each with one element operation on its own
// table, one after another as fast as it can (kube-proxy's nftables mode;
// nft reads every element of the agent's sets before each batch).
type BusyRow struct {
	N, Rate, QuotaPercent int
	NFT                   bool
	Owned                 bool
	// From each one-CIDR ConfigMap change (the ..data swap) to the agent's
	// commit that puts the new element in the kernel (its NEWGEN).
	Changes []time.Duration
	// From each change to the agent's "applied new config", logged once
	// it has read the change back: ready for the next one. With NFT the
	// changes are made every Spacing, whether or not the agent is ready.
	Ready   []time.Duration
	Spacing time.Duration
	// The agent's CPU time (user+system, the kernel's work for its
	// requests included) from each change to ready, and of it the system
	// time (/proc's stime, in clock ticks): the kernel's work.
	ChangeCPU, ChangeSys []time.Duration
	ChangesFailed        int // not in the kernel within busyTimeout
	FailedSyncs          int // log lines "sync failed" or "repair failed"
	Probes               int // /healthz and /readyz answers, polled every 200 ms
	ProbesBad            []string
	Commits              int           // the neighbour's
	Throttled            time.Duration // the quota kept the agent off the CPU this long
	// CPU time (user+system) of the agent per unchanged resync, neighbour
	// stopped: what a quiet resync costs.
	ResyncCPU time.Duration
	Resyncs   int
}

// BusyResults are the busy-node figures.
type BusyResults struct {
	Rows    []BusyRow
	Changes int // per row
}

// busyTimeout bounds the wait for one change to reach the kernel.
const busyTimeout = 30 * time.Second

const reloadedMarker = `msg="applied new config"`

// RunBusy runs the agent under a CPU quota with a neighbour committing,
// and measures how long a one-CIDR change takes to reach the kernel,
// failed syncs, the health endpoints, and the CPU cost of an unchanged
// resync.
func RunBusy(ctx context.Context, cfg Config) (*BusyResults, error) {
	if cfg.Agent == "" {
		return nil, errors.New("no agent binary given")
	}
	res := &BusyResults{Changes: 3}
	sizes, rates, nftSize := []int{10_000, 100_000}, []int{1, 20}, 100_000
	if cfg.Quick {
		sizes, rates, nftSize, res.Changes = []int{1000}, []int{20}, 1000, 1
	}
	var rows []BusyRow
	if cfg.wants("busy") {
		for _, n := range sizes {
			for _, rate := range rates {
				for _, owned := range []bool{true, false} {
					rows = append(rows, BusyRow{N: n, Rate: rate, QuotaPercent: 10, Owned: owned})
				}
			}
		}
	}
	// Issue 34's busy node: `nft` batches as fast as they run, changes
	// back to back.
	for _, owned := range []bool{true, false} {
		rows = append(rows, BusyRow{N: nftSize, NFT: true, QuotaPercent: 10, Owned: owned, Spacing: busySpacing})
	}
	for _, row := range rows {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		cfg.logf("busy node: %d CIDRs, %s, cpu quota %d%%, %s", row.N, row.neighbour(), row.QuotaPercent, ownedName(row.Owned))
		err := withTopology("busy", func(topo *testnet.Topology) error {
			return busyRow(ctx, cfg, topo, res.Changes, &row)
		})
		res.Rows = append(res.Rows, row)
		if err != nil {
			return res, fmt.Errorf("%d CIDRs, %s, %s: %w", row.N, row.neighbour(), ownedName(row.Owned), err)
		}
	}
	return res, nil
}

// busySpacing is the time between the changes of the NFT rows.
const busySpacing = 5 * time.Second

func (x BusyRow) neighbour() string {
	if x.NFT {
		return "a neighbour running nft batches as fast as it can"
	}
	return fmt.Sprintf("a neighbour committing %d/s", x.Rate)
}

func busyRow(ctx context.Context, cfg Config, topo *testnet.Topology, changes int, row *BusyRow) (err error) {
	configOf := func(extra int) string {
		c := config.Default(config.Flags{})
		c.NonMasqueradeCIDRs = cidrList(4, 0, row.N)
		for i := range extra {
			c.NonMasqueradeCIDRs = append(c.NonMasqueradeCIDRs, cidrAt(4, 1, i))
		}
		c.CIDRLimit = row.N + changes
		c.ResyncInterval = 2 * time.Second
		return c.String()
	}
	cm, remove, err := newConfigMap("busy", configOf(0))
	if err != nil {
		return err
	}
	defer remove()
	group, err := testnet.NewCPUGroup("bench", row.QuotaPercent)
	if err != nil {
		return fmt.Errorf("a cgroup with a CPU quota: %w", err)
	}
	defer group.Close()
	args := []string{"--config", cm.Path(configKey), "--v=2", fmt.Sprintf("--own-table=%v", row.Owned), "--http-address=127.0.0.1:9753"}
	d, err := startDaemon(ctx, topo, cfg.Agent, args...)
	if err != nil {
		return err
	}
	defer stopDaemon(&d, &err)
	if err := os.WriteFile(group.Procs, []byte(strconv.Itoa(d.Pid())), 0); err != nil {
		return fmt.Errorf("move the agent into the cgroup: %w", err)
	}
	if _, _, err := d.WaitLine(ctx, cmdTimeout, appliedMarker); err != nil {
		return err
	}
	var neighbour *testnet.Neighbour
	if row.NFT {
		neighbour, err = testnet.NewNFTNeighbour(topo.NodeNS)
	} else {
		neighbour, err = testnet.NewNeighbour(topo.NodeHandle(), time.Second/time.Duration(row.Rate))
	}
	if err != nil {
		return err
	}
	defer neighbour.Stop()
	probes := harness.WatchProbes(topo.NodeHTTPClient(), 200*time.Millisecond, "/healthz", "/readyz")
	sleepCtx(ctx, 3*time.Second) // a resync or so with the neighbour committing
	mon, err := newGenMonitor(int(topo.NodeHandle()))
	if err != nil {
		return err
	}
	defer mon.close()
	for i := range changes {
		mon.drain()
		cpu, sys := processCPU(d.Pid()), processSys(d.Pid())
		swapped, err := update(cm, configOf(i+1))
		if err != nil {
			return err
		}
		// The agent's commit (its NEWGEN) puts the element in the kernel.
		if at, ok := mon.waitAgent(ctx, swapped, busyTimeout); ok {
			row.Changes = append(row.Changes, at.Sub(swapped))
		} else {
			row.ChangesFailed++
		}
		// Then it reads the table back and logs the change: ConfigMap
		// updates come seconds apart, not while the last one is read back
		// (at 100,000 CIDRs under the quota that takes seconds).
		if err := d.WaitCount(ctx, 2*busyTimeout, reloadedMarker, i+1); err != nil {
			return err
		}
		row.Ready = append(row.Ready, time.Since(swapped))
		row.ChangeCPU = append(row.ChangeCPU, processCPU(d.Pid())-cpu)
		row.ChangeSys = append(row.ChangeSys, processSys(d.Pid())-sys)
		if row.Spacing > 0 && i+1 < changes {
			sleepCtx(ctx, time.Until(swapped.Add(row.Spacing)))
		}
	}
	row.Probes, row.ProbesBad = probes.Stop()
	row.Commits, _ = neighbour.Stop()
	row.Throttled = group.Throttled()
	// Checked with nft once the neighbour has stopped: nft restarts a dump
	// that a commit interrupts (NLM_F_DUMP_INTR), and a large set's dump
	// never ends while another process commits 20 times a second.
	if out, err := topo.NFT("list", "set", "inet", nft.TableName, nft.SetNonMasqV4); err != nil {
		return fmt.Errorf("nft list set: %w", err)
	} else if last := cidrAt(4, 1, changes-1).String(); row.ChangesFailed == 0 && !strings.Contains(out, last) {
		return fmt.Errorf("the last change's CIDR %s is not in the kernel's set", last)
	}

	// Quiet now: the CPU an unchanged resync costs, over about 10 s, from
	// the first resync after the neighbour stopped.
	const resynced = "resync: the table read back is the wanted one"
	if err := d.WaitCount(ctx, busyTimeout, resynced, strings.Count(d.Output(), resynced)+1); err != nil {
		return err
	}
	before := strings.Count(d.Output(), resynced)
	cpu0 := processCPU(d.Pid())
	sleepCtx(ctx, map[bool]time.Duration{false: 10 * time.Second, true: 2 * time.Second}[cfg.Quick])
	row.Resyncs = strings.Count(d.Output(), resynced) - before
	if row.Resyncs > 0 {
		row.ResyncCPU = (processCPU(d.Pid()) - cpu0) / time.Duration(row.Resyncs)
	}
	logs := d.Output()
	row.FailedSyncs = strings.Count(logs, "sync failed") + strings.Count(logs, "repair failed")
	return ctx.Err()
}

func busyTargets(r *Results, add func(goal, measured string, met *bool)) {
	if r.Busy == nil || len(r.Busy.Rows) == 0 {
		add("busy node (issue 26)", "", nil)
		return
	}
	for _, x := range r.Busy.Rows {
		if x.NFT {
			continue
		}
		limit := time.Second
		if x.N >= 100_000 {
			limit = 3 * time.Second
		}
		goal := fmt.Sprintf("busy node, %s CIDRs, a neighbour committing %d/s, cpu quota %d%%, %s: 0 failed syncs, a one-CIDR change in the kernel under %s, /healthz and /readyz always 200 (issue 26)",
			num(x.N), x.Rate, x.QuotaPercent, ownedName(x.Owned), fmtDur(limit))
		worst := percentile(x.Changes, 100)
		m := fmt.Sprintf("%d failed syncs; change to kernel %s (max of %d)", x.FailedSyncs, fmtDur(worst), len(x.Changes)+x.ChangesFailed)
		if x.ChangesFailed > 0 {
			m += fmt.Sprintf(", %d not in the kernel within %s", x.ChangesFailed, busyTimeout)
		}
		m += fmt.Sprintf("; %d of %d probe answers not 200", len(x.ProbesBad), x.Probes)
		add(goal, m, ptr(x.FailedSyncs == 0 && x.ChangesFailed == 0 && len(x.Changes) > 0 && worst < limit && len(x.ProbesBad) == 0 && x.Probes > 0))
	}
	for _, x := range r.Busy.Rows {
		if !x.NFT {
			continue
		}
		goal := fmt.Sprintf("busy node, %s CIDRs, %s, cpu quota %d%%, %s: a one-CIDR change in the kernel within 1 s and the agent ready for the next within 1 s (changes %s apart), 0 failed syncs (issue 34)",
			num(x.N), x.neighbour(), x.QuotaPercent, ownedName(x.Owned), fmtDur(x.Spacing))
		kernel, ready := percentile(x.Changes, 100), percentile(x.Ready, 100)
		m := fmt.Sprintf("%d failed syncs; change to kernel %s, to ready %s (max of %d; the agent's CPU per change: max %s, of it system %s)",
			x.FailedSyncs, fmtDur(kernel), fmtDur(ready), len(x.Changes)+x.ChangesFailed, fmtDur(percentile(x.ChangeCPU, 100)), fmtDur(percentile(x.ChangeSys, 100)))
		if x.ChangesFailed > 0 {
			m += fmt.Sprintf(", %d not in the kernel within %s", x.ChangesFailed, busyTimeout)
		}
		add(goal, m, ptr(x.FailedSyncs == 0 && x.ChangesFailed == 0 && len(x.Changes) > 0 && len(x.Ready) == len(x.Changes) &&
			kernel <= time.Second && ready <= time.Second))
	}
	for _, x := range r.Busy.Rows {
		if !x.Owned || x.NFT || x.Rate != 1 || x.N != 100_000 {
			continue
		}
		add("the daemon's unchanged resync at 100,000 CIDRs under 10 ms of CPU when owned (issue 26)",
			fmt.Sprintf("%s per resync over %d resyncs", fmtDur(x.ResyncCPU), x.Resyncs), ptr(x.Resyncs > 0 && x.ResyncCPU < 10*time.Millisecond))
	}
}

func busyMarkdown(b *strings.Builder, r *Results) {
	w := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	w("## Busy node (issue 26)\n\n")
	br := r.Busy
	if br == nil {
		w("Not run.\n\n")
		return
	}
	if r.BusyErr != nil {
		w("**Incomplete:** %s\n\n", oneLine(r.BusyErr.Error()))
	}
	w("The agent as a daemon (`resyncInterval: 2s`, `--v=2`) in a cgroup whose CPU quota is 10%% of one CPU\n"+
		"(`cpu.max` or `cpu.cfs_quota_us`: the DaemonSet's 100m limit), while a neighbour in the same network\n"+
		"namespace commits to a table of its own (one element added and one deleted per transaction) at the\n"+
		"rate given, as kube-proxy, a CNI or firewalld do. After a few seconds of that, %d ConfigMap updates\n"+
		"(the kubelet's `..data` swap), each adding one CIDR once the agent has logged the last (with the nft neighbour: every %s,\n"+
		"back to back); the time to kernel is from the swap to the agent's commit (its\n"+
		"NEWGEN notification), which puts the new CIDR in the kernel, the time to ready from the swap to the agent's `applied new config`,\n"+
		"logged once it has read the change back; `nft list set` checks it once the neighbour has\n"+
		"stopped (nft restarts a dump that a commit interrupts, and cannot list 100,000 CIDRs at 20 commits a second). `/healthz` and `/readyz` are polled every 200 ms\n"+
		"throughout. Failed syncs are the agent's `sync failed` and `repair failed` log lines. Then the neighbour\n"+
		"stops, and the agent's CPU time (all threads' schedstat) over 10 s of unchanged resyncs is divided by\n"+
		"their number. The nft neighbour (issue 34) runs `nft` batches, each adding one element to a set of its own table and deleting\n"+
		"the one before, one after another as fast as they run; nft reads every element of the agent's sets before each.\n\n", br.Changes, fmtDur(busySpacing))
	w("| CIDRs | neighbour | table | failed syncs | change to kernel: each | to ready: each | probes not 200 | neighbour commits | throttled | CPU per unchanged resync |\n| ---: | ---: | --- | ---: | --- | --- | ---: | ---: | ---: | ---: |\n")
	for _, x := range br.Rows {
		var each []string
		for _, d := range x.Changes {
			each = append(each, fmtDur(d))
		}
		for range x.ChangesFailed {
			each = append(each, "timed out")
		}
		bad := fmt.Sprintf("%d of %d", len(x.ProbesBad), x.Probes)
		if len(x.ProbesBad) > 0 {
			bad += fmt.Sprintf(" (first: %s)", oneLine(x.ProbesBad[0]))
		}
		var ready []string
		for _, d := range x.Ready {
			ready = append(ready, fmtDur(d))
		}
		rate := fmt.Sprintf("%d/s", x.Rate)
		if x.NFT {
			rate = "nft, flat out"
		}
		w("| %s | %s | %s | %d | %s | %s | %s | %d | %s | %s (%d resyncs) |\n", num(x.N), rate, ownedName(x.Owned), x.FailedSyncs,
			strings.Join(each, ", "), orDash(strings.Join(ready, ", ")), bad, x.Commits, fmtDur(x.Throttled), fmtDur(x.ResyncCPU), x.Resyncs)
	}
	w("\n")
}

// processSys is the system time of process pid (all its threads), from
// /proc/PID/stat's stime, in clock ticks (USER_HZ, 100 on Linux).
func processSys(pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	ticks, _ := strconv.ParseInt(f[12], 10, 64) // field 15, stime
	return time.Duration(ticks) * 10 * time.Millisecond
}
