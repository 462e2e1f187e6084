package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
)

// The agent's CPU per one-CIDR change (issue 34): the daemon's process,
// all its threads (the garbage collector's too), from the kubelet's swap
// of the ConfigMap volume to the end of the sync it causes: the file read
// and parsed, the table built, compared, planned, sent and verified, the
// conntrack cleanup, the log line.

// ChangeCPURow is one list size, with the agent's default flags or
// with Flag too.
type ChangeCPURow struct {
	N    int
	Flag string // "--conntrack-cleanup=none": the cleanup's dump of the conntrack table left out
	// CPU is the process's CPU time of each change (from
	// /proc/PID/task/*/schedstat), from just before the swap to
	// changeSettle after the agent logged the change, less what the
	// process used idle over as long (Idle: per second, measured before).
	CPU  []time.Duration
	Idle time.Duration
	// User and Sys split the changes' CPU, on average (from /proc/PID/stat,
	// in clock ticks: summed over all the changes).
	User, Sys time.Duration
	// Resync is the CPU of one unchanged resync (the same file's bytes),
	// each measured alike: a touch of the file, which the agent reads.
	Resync []time.Duration
	// The kernel's floor of each change (floor.go), measured right after
	// it, the agent idle: Commit, the CPU of a bare client's commit of the
	// same change to the same table; Dump, of a bare conntrack dump of the
	// agent's namespace (none with --conntrack-cleanup=none).
	Commit, Dump []time.Duration
}

// ChangeCPUResults are the figures of part "cpu".
type ChangeCPUResults struct{ Rows []ChangeCPURow }

const noCleanup = "--conntrack-cleanup=none"

// changeSettle is how long after its log line a change's CPU still
// counts: the garbage collector finishes the cycle the sync started.
const changeSettle = 200 * time.Millisecond

// RunChangeCPU runs the agent binary as a daemon (resyncInterval 1h,
// the table owned where the kernel can: what a node runs) and changes
// one CIDR of its config's list at a time, as the bench's other parts do
// (oneChanged).
func RunChangeCPU(ctx context.Context, cfg Config) (*ChangeCPUResults, error) {
	if cfg.Agent == "" {
		return nil, errors.New("no agent binary given")
	}
	res := &ChangeCPUResults{}
	rows, changes := []ChangeCPURow{{N: 10_000}, {N: 100_000}, {N: 100_000, Flag: noCleanup}}, 20
	if cfg.Quick {
		rows, changes = []ChangeCPURow{{N: 10_000}}, 4
	}
	for _, row := range rows {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		n := row.N
		cfg.logf("CPU per one-CIDR change: %d CIDRs, %d changes %s", n, changes, row.Flag)
		err := withTopology("cpu", func(topo *testnet.Topology) error {
			return changeCPURow(ctx, cfg, topo, changes, &row)
		})
		res.Rows = append(res.Rows, row)
		if err != nil {
			return res, fmt.Errorf("%d CIDRs: %w", n, err)
		}
	}
	return res, nil
}

func changeCPURow(ctx context.Context, cfg Config, topo *testnet.Topology, changes int, row *ChangeCPURow) (err error) {
	configs := oneCIDRApart(row.N)
	cm, remove, err := newConfigMap("cpu", configs[0])
	if err != nil {
		return err
	}
	defer remove()
	fl, err := newFloor(topo, row.N)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, fl.Close()) }()
	if _, err := fl.set(0); err != nil {
		return fmt.Errorf("the floor's table: %w", err)
	}
	args := []string{"--config", cm.Path(configKey), "--http-address=127.0.0.1:0"}
	if row.Flag != "" {
		args = append(args, row.Flag)
	}
	d, err := startDaemon(ctx, topo, cfg.Agent, args...)
	if err != nil {
		return err
	}
	defer stopDaemon(&d, &err)
	if _, _, err := d.WaitLine(ctx, cmdTimeout, appliedMarker); err != nil {
		return err
	}
	pid := d.Pid()
	// Idle: after the first apply's garbage is collected.
	sleepCtx(ctx, time.Second)
	c0 := processCPU(pid)
	sleepCtx(ctx, time.Second)
	row.Idle = processCPU(pid) - c0
	idle := func(d time.Duration) time.Duration { return row.Idle * d / time.Second }

	u0, s0 := userSys(pid)
	for i := range changes {
		if err := ctx.Err(); err != nil {
			return err
		}
		start, c0 := time.Now(), processCPU(pid)
		if _, err := update(cm, configs[(i+1)%2]); err != nil {
			return err
		}
		if err := d.WaitCount(ctx, cmdTimeout, reloadedMarker, i+1); err != nil {
			return err
		}
		sleepCtx(ctx, changeSettle)
		row.CPU = append(row.CPU, processCPU(pid)-c0-idle(time.Since(start)))
		c, err := fl.set((i + 1) % 2)
		if err != nil {
			return fmt.Errorf("the floor's commit: %w", err)
		}
		row.Commit = append(row.Commit, c)
		if row.Flag != noCleanup {
			c, err := conntrackDump(topo.NodeHandle())
			if err != nil {
				return fmt.Errorf("the floor's conntrack dump: %w", err)
			}
			row.Dump = append(row.Dump, c)
		}
	}
	u1, s1 := userSys(pid)
	row.User, row.Sys = (u1-u0)/time.Duration(changes), (s1-s0)/time.Duration(changes)
	// Unchanged resyncs: the same content swapped in again (the kubelet's
	// update of another key of the ConfigMap does that); the agent reads
	// the bytes, finds them the same and reads the table back.
	for range changes {
		if err := ctx.Err(); err != nil {
			return err
		}
		// It logs nothing at --v=2: changeSettle is its time.
		start, c0 := time.Now(), processCPU(pid)
		if _, err := update(cm, configs[changes%2]); err != nil {
			return err
		}
		sleepCtx(ctx, changeSettle)
		row.Resync = append(row.Resync, processCPU(pid)-c0-idle(time.Since(start)))
	}
	if n := strings.Count(d.Output(), reloadedMarker); n != changes {
		return fmt.Errorf("the agent logged %d changes, want %d (an unchanged resync taken for a change?)", n, changes)
	}
	return nil
}

// Own is each change's CPU less its floor (Commit and Dump): what the
// agent itself spent; nil when the floor was not measured.
func (x ChangeCPURow) Own() []time.Duration {
	if len(x.Commit) != len(x.CPU) || (x.Flag != noCleanup && len(x.Dump) != len(x.CPU)) {
		return nil
	}
	out := make([]time.Duration, len(x.CPU))
	for i, c := range x.CPU {
		out[i] = c - x.Commit[i]
		if x.Flag != noCleanup {
			out[i] -= x.Dump[i]
		}
	}
	return out
}

// ownMedian is the median of Own, signed; "" when not measured.
func ownMedian(x ChangeCPURow) string {
	own := x.Own()
	if len(own) == 0 {
		return ""
	}
	return fmtSigned(percentile(own, 50))
}

// userSys is the user and system CPU time process pid has used so far
// (/proc/PID/stat: utime, stime, in clock ticks of 10 ms).
func userSys(pid int) (user, sys time.Duration) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0
	}
	// The fields after the command, which is in parentheses.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0, 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u) * 10 * time.Millisecond, time.Duration(s) * 10 * time.Millisecond
}

func changeCPUTargets(r *Results, add func(goal, measured string, met *bool)) {
	const goal = "the agent's CPU per one-CIDR change at 100,000 CIDRs under 50 ms (issue 34)"
	if r.ChangeCPU == nil {
		add(goal, "", nil)
		return
	}
	var m string
	var met *bool
	for _, x := range r.ChangeCPU.Rows {
		if x.N != 100_000 || len(x.CPU) == 0 {
			continue
		}
		med := percentile(x.CPU, 50)
		if x.Flag == "" {
			m = fmt.Sprintf("median %s (max %s) over %d changes, of it on average %s user, %s system; an unchanged resync %s",
				fmtDur(med), fmtDur(slices.Max(x.CPU)), len(x.CPU), fmtDur(x.User), fmtDur(x.Sys), fmtDur(percentile(x.Resync, 50))) + m
			met = ptr(med < 50*time.Millisecond)
			if own := x.Own(); own != nil {
				m += fmt.Sprintf("; the kernel's floor of the same change, measured apart (a bare client): its commit median %s, a conntrack dump median %s; the agent's CPU less them: median %s",
					fmtDur(percentile(x.Commit, 50)), fmtDur(percentile(x.Dump, 50)), fmtSigned(percentile(own, 50)))
			}
		} else {
			m += fmt.Sprintf("; with %s %s", x.Flag, fmtDur(med))
		}
	}
	add(goal, m, met)
}

func changeCPUMarkdown(b *strings.Builder, r *Results) {
	w := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	w("## The agent's CPU per one-CIDR change (issue 34)\n\n")
	if r.ChangeCPU == nil {
		w("Not run.\n\n")
		return
	}
	if r.ChangeCPUErr != nil {
		w("**Incomplete:** %s\n\n", oneLine(r.ChangeCPUErr.Error()))
	}
	w("The agent as a daemon (`resyncInterval: 1h`, the table owned where the kernel allows it), its config a\n"+
		"ConfigMap volume of n non-adjacent /29s; each change swaps in the list with its middle CIDR replaced, or back.\n"+
		"CPU is the process's (all threads, from `/proc/PID/task/*/schedstat`), from the swap to %s after\n"+
		"the agent's `applied new config`, less its idle CPU over as long. An unchanged resync is the same content\n"+
		"swapped in again, its CPU counted over %s. With %s the agent does not dump the conntrack table\n"+
		"after a change: the dump costs what the kernel's walk of its conntrack hash costs (every bucket, entries\n"+
		"or not), whatever the CIDRs.\n\n", fmtDur(changeSettle), fmtDur(changeSettle), noCleanup)
	w("**The kernel's floor** is measured right after each change, the agent idle, by this process: the CPU of\n" +
		"the thread that commits the same change (the same plan of elements) to the same table, built from the\n" +
		"same lists with the daemon's options in another namespace, from a bare `kernel.Netlink` that reads\n" +
		"nothing back (`CLOCK_THREAD_CPUTIME_ID` around the send: the kernel's commit in the sender's context; on\n" +
		"kernels with the interval sets' lookup array, 6.18 here, it rebuilds the set's whole array at every\n" +
		"commit that changes an element; what the kernel leaves to its workers and to RCU is in neither figure);\n" +
		"and the CPU of the thread that runs the agent's conntrack cleanup in the agent's namespace with old and\n" +
		"new decisions alike (the local addresses read, the dump, nothing deleted; from another namespace, so a\n" +
		"few `setns` calls more than the agent makes). \"Less the floor\" is each change's CPU less its two\n" +
		"floors: what the agent's process spent beyond them, its other kernel work (the read-back, the file,\n" +
		"socket I/O, page faults) included.\n\n")
	w("| CIDRs | flags | changes | CPU per change: median | max | user, system (mean) | floor: commit, conntrack dump (median) | less the floor: median | unchanged resync: median | idle CPU per second |\n| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, x := range r.ChangeCPU.Rows {
		if len(x.CPU) == 0 {
			continue
		}
		w("| %s | %s | %d | %s | %s | %s, %s | %s, %s | %s | %s | %s |\n", num(x.N), orDash(x.Flag), len(x.CPU), fmtDur(percentile(x.CPU, 50)), fmtDur(slices.Max(x.CPU)), fmtDur(x.User), fmtDur(x.Sys),
			fmtDur(percentile(x.Commit, 50)), fmtDur(percentile(x.Dump, 50)), orDash(ownMedian(x)),
			fmtDur(percentile(x.Resync, 50)), fmtDur(x.Idle))
	}
	w("\n")
}
