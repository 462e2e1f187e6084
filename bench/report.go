package bench

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Target is one goal of the project's issue 6 and what this run measured.
type Target struct {
	Goal     string
	Measured string
	Met      *bool // nil: not measured in this run
}

func (t Target) verdict() string {
	switch {
	case t.Met == nil:
		return "not measured"
	case *t.Met:
		return "**met**"
	default:
		return "**missed**"
	}
}

func ptr(b bool) *bool { return &b }

// Targets evaluates the targets against the results.
func Targets(r *Results) []Target {
	var ts []Target
	add := func(goal, measured string, met *bool) {
		ts = append(ts, Target{Goal: goal, Measured: measured, Met: met})
	}
	row := func(family, n int) *ControlRow {
		if r.Control == nil {
			return nil
		}
		for i := range r.Control.Rows {
			if x := &r.Control.Rows[i]; x.Family == family && x.N == n && x.Times[0][First].Reps() > 0 {
				return x
			}
		}
		return nil
	}
	// Control plane.
	firstVsNFT := func(n int, limit time.Duration) {
		goal := fmt.Sprintf("first apply of %s IPv4 CIDRs at most 0.5× the time of `nft -f`", num(n))
		if limit > 0 {
			goal += " and under " + fmtDur(limit)
		}
		x := row(4, n)
		if x == nil || x.Times[1][First].Reps() == 0 {
			add(goal, "", nil)
			return
		}
		a, f := x.Times[0][First].Median(), x.Times[1][First].Median()
		ratio := float64(a) / float64(f)
		met := ratio <= 0.5 && (limit == 0 || a < limit)
		add(goal, fmt.Sprintf("%s vs %s: %.2f×", fmtDur(a), fmtDur(f), ratio), &met)
	}
	firstVsNFT(10_000, 0)
	firstVsNFT(100_000, time.Second)
	// The whole binary (parse, build, probe, apply, verify) against nft -f
	// of the same ruleset, both from a deleted table (issue 34).
	if x := row(4, 100_000); x != nil && x.Times[1][First].Reps() > 0 && x.OnceWall.Reps() > 0 {
		o, f := x.OnceWall.Median(), x.Times[1][First].Median()
		add("the whole `ip-masq-agent --once` of 100,000 CIDRs no slower than `nft -f` of its ruleset (issue 34)",
			fmt.Sprintf("%s vs %s: %.2f×", fmtDur(o), fmtDur(f), float64(o)/float64(f)), ptr(o <= f))
	} else {
		add("the whole `ip-masq-agent --once` of 100,000 CIDRs no slower than `nft -f` of its ruleset (issue 34)", "", nil)
	}

	if r.Control != nil && len(r.Control.Rows) > 0 {
		var worst, parse, build time.Duration
		var worstRow string
		sent, moves := 0, 0
		for _, x := range r.Control.Rows {
			if d := x.Times[0][Unchanged].Median(); d >= worst {
				worst, worstRow = d, fmt.Sprintf("IPv%d %s", x.Family, num(x.N))
			}
			parse, build = max(parse, x.Parse.Median()), max(build, x.Build.Median())
			sent += x.UnchangedSent
			moves += x.UnchangedGenMoves
		}
		add("an unchanged resync under 1 ms with no kernel write (every list size)",
			fmt.Sprintf("`nft.Ensure` at most %s (%s); messages sent: %d, nftables generation moves: %d. "+
				"The daemon's resync also re-reads the file: parsing up to %s and `nft.Build` up to %s (at the largest list)",
				fmtDur(worst), worstRow, sent, moves, fmtDur(parse), fmtDur(build)),
			ptr(worst < time.Millisecond && sent == 0 && moves == 0))
	} else {
		add("an unchanged resync under 1 ms with no kernel write", "", nil)
	}
	if x := row(4, 10_000); x != nil {
		d := x.Times[0][OneChanged].Median()
		add("one CIDR changed out of 10,000 under 5 ms",
			fmt.Sprintf("%s until nft.Ensure returns; the new rules are in force after %s (%d messages; adding one CIDR alone: %s, removing one: %s)",
				fmtDur(d), fmtDur(x.InForce[OneChanged].Median()), x.OneChangedMessages,
				fmtDur(x.AddOne.Median()), fmtDur(x.RemoveOne.Median())),
			ptr(d < 5*time.Millisecond))
	} else {
		add("one CIDR changed out of 10,000 under 5 ms", "", nil)
	}
	for _, c := range []struct {
		n     int
		limit int64
		issue string
	}{{64, 20 << 20, ""}, {100_000, 64 << 20, " (issue 34; was 100 MB)"}} {
		goal := fmt.Sprintf("peak RSS of the agent at %s CIDRs under %d MB%s", num(c.n), c.limit>>20, c.issue)
		if x := row(4, c.n); x != nil && len(x.RSS) > 0 {
			m := median(x.RSS)
			add(goal, fmtMB(m), ptr(m < c.limit))
		} else {
			add(goal, "", nil)
		}
	}

	// Data plane.
	if d := r.Data; d != nil {
		a1, a50 := d.Find(KindAgent, 1), d.Find(KindAgent, 50_000)
		goal := "data plane: the agent's CPU per new connection at 50,000 CIDRs within 10% of its cost at 1 CIDR"
		if a1.Measured() && a50 != nil && a50.Measured() {
			ratio := a50.CPUns() / a1.CPUns()
			add(goal, fmt.Sprintf("%.1f µs vs %.1f µs: %+.1f%%", a50.CPUns()/1e3, a1.CPUns()/1e3, (ratio-1)*100), ptr(ratio <= 1.10))
		} else {
			add(goal, "", nil)
		}
		if ns := d.Ns(); len(ns) > 0 {
			marked, unmarked := d.Find(KindAgent, ns[0]), d.Find(KindAgentNoMark, ns[0])
			goal := "data plane: the conntrack mark (--conntrack-label) costs under 2% of the new-connection rate"
			if marked.Measured() && unmarked != nil && unmarked.Measured() {
				diff := 1 - marked.Rate()/unmarked.Rate()
				add(goal, fmt.Sprintf("%.0f conn/s with the mark vs %.0f without, at %s CIDR: %+.1f%%; CPU per connection %.1f vs %.1f µs",
					marked.Rate(), unmarked.Rate(), num(ns[0]), -diff*100, marked.CPUns()/1e3, unmarked.CPUns()/1e3), ptr(diff < 0.02))
			} else {
				add(goal, "", nil)
			}
		}
		a10 := d.Find(KindAgent, 10_000)
		for _, kind := range []string{KindIPTNFT, KindIPTLegacy} {
			goal := fmt.Sprintf("data plane: at 10,000 CIDRs, at least 10× the new-connection rate of the %s", kind)
			i10 := d.Find(kind, 10_000)
			if a10 == nil || i10 == nil || !a10.Measured() || !i10.Measured() {
				add(goal, "", nil)
				continue
			}
			rate := a10.Rate() / i10.Rate()
			cpu := i10.CPUns() / a10.CPUns()
			none := d.Find(KindNone, 0)
			extra := ""
			if none.Measured() {
				ea, ei := a10.CPUns()-none.CPUns(), i10.CPUns()-none.CPUns()
				if ea > 0 {
					extra = fmt.Sprintf("; CPU above the no-rules baseline: %.1f µs vs %.1f µs (%.0f×)", ea/1e3, ei/1e3, ei/ea)
				} else {
					extra = fmt.Sprintf("; CPU above the no-rules baseline: %.1f µs vs %.1f µs", ea/1e3, ei/1e3)
				}
			}
			add(goal, fmt.Sprintf("rate %.0f vs %.0f conn/s: %.1f×; CPU per connection %.1f vs %.1f µs: %.1f×%s",
				a10.Rate(), i10.Rate(), rate, a10.CPUns()/1e3, i10.CPUns()/1e3, cpu, extra), ptr(rate >= 10))
		}
	} else {
		add("data plane targets", "", nil)
	}
	selectorsTarget(r, add)

	// Live operation, at each list size measured.
	if l := r.Live; l != nil && len(l.Rows) > 0 {
		for _, c := range []struct {
			what  string
			limit time.Duration
			get   func(LiveRow) ([]time.Duration, int)
		}{
			{"reload (`..data` swap to rules in the kernel) p99 under 40 ms at 64 CIDRs, 60 ms at 10,000 (issue 26)", 40 * time.Millisecond, func(x LiveRow) ([]time.Duration, int) { return x.Reload, x.ReloadFailed }},
			{"repair (foreign `delete table` to the table restored) p99 under 50 ms", 50 * time.Millisecond, func(x LiveRow) ([]time.Duration, int) { return x.Repair, x.RepairFailed }},
		} {
			for _, x := range l.Rows {
				ds, failed := c.get(x)
				if len(ds)+failed == 0 {
					continue // repairs are not measured with a neighbour
				}
				limit := c.limit
				if strings.HasPrefix(c.what, "reload") && x.N >= 10_000 {
					limit = 60 * time.Millisecond
				}
				p99 := percentile(ds, 99)
				measured := fmt.Sprintf("p99 %s (p50 %s, max %s) over %d trials", fmtDur(p99), fmtDur(percentile(ds, 50)), fmtDur(percentile(ds, 100)), len(ds)+failed)
				if failed > 0 {
					measured += fmt.Sprintf(", %d timed out", failed)
				}
				if strings.HasPrefix(c.what, "repair") && len(x.RepairFloor) > 0 {
					measured += fmt.Sprintf("; the kernel's floor, measured apart (the same table deleted the same way, and created again by a bare client as soon as the deletion's notification is read): p99 %s (p50 %s)",
						fmtDur(percentile(x.RepairFloor, 99)), fmtDur(percentile(x.RepairFloor, 50)))
				}
				what := fmt.Sprintf("%s, %s CIDRs", c.what, num(x.N))
				if x.Neighbour {
					what += ", a neighbour committing every second"
				}
				add(what, measured, ptr(len(ds) > 0 && failed == 0 && p99 < limit))
			}
		}
	} else {
		add("live operation targets", "", nil)
	}
	kernelTargets(r, add)
	conntrackTargets(r, add)
	busyTargets(r, add)
	changeCPUTargets(r, add)
	return ts
}

// Markdown renders the results as BENCHMARKS.md.
func Markdown(r *Results) string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	w("# Benchmarks\n\n")
	w("<!-- Generated by `make bench` (bench/cmd/bench). Rerun it rather than editing this file. -->\n\n")
	w("Measured on %s UTC by `%s` (what `make bench` runs), %s in all.\n", r.Start.UTC().Format("2006-01-02 15:04"), strings.TrimSpace(r.Command), r.End.Sub(r.Start).Round(time.Second))
	if r.Quick {
		w("**This is a quick smoke run (`BENCH_QUICK=1`): tiny sizes, single repetitions; the figures mean little.**\n")
	}
	w("The agent side by side with `nft -f` of the same ruleset and with `iptables-restore` of the chain the\n" +
		"original ip-masq-agent writes (iptables-nft and iptables-legacy), on the control plane, the data plane\n" +
		"and in live operation. The machine is shared with other tenants and noisy: every figure is the median\n" +
		"of several repetitions and is compared with a reference measured in the same run.\n\n")
	if err := r.Err(); err != nil {
		w("**The run is incomplete:** %s\n\n", oneLine(err.Error()))
	}

	m := r.Machine
	w("## Machine\n\n| | |\n| --- | --- |\n")
	w("| kernel | `%s` |\n| CPU | %s, %d CPUs (`nproc`) |\n| memory | %s |\n| Go | %s |\n", m.Kernel, m.CPU, m.CPUs, m.MemTotal, m.Go)
	w("| nft | %s |\n| iptables | %s; %s |\n", m.NFT, m.IPTablesNFT, m.IPTablesLegacy)
	w("| iptables-legacy in a network namespace | %s |\n", legacyStatus(r))
	w("| load average (`/proc/loadavg`) | at the start `%s`; control plane `%s`; kernel side `%s`; data plane `%s`; every selector `%s`; live operation `%s`; conntrack cleanup `%s`; busy node `%s`; CPU per change `%s`; at the end `%s` |\n\n",
		m.LoadStart, orDash(r.Load["control"]), orDash(r.Load["kernel"]), orDash(r.Load["data"]), orDash(r.Load["selectors"]), orDash(r.Load["live"]), orDash(r.Load["conntrack"]), orDash(r.Load["busy"]), orDash(r.Load["cpu"]), r.LoadEnd)

	w("## Targets\n\nThe goals of the issues that asked for these benchmarks (6; the others where marked), and this run's figures.\n\n")
	w("| target | measured | |\n| --- | --- | --- |\n")
	for _, t := range Targets(r) {
		measured := t.Measured
		if measured == "" {
			measured = "—"
		}
		w("| %s | %s | %s |\n", t.Goal, measured, t.verdict())
	}
	w("\n")

	controlMarkdown(&b, r)
	kernelMarkdown(&b, r)
	dataMarkdown(&b, r)
	selectorsMarkdown(&b, r)
	liveMarkdown(&b, r)
	conntrackMarkdown(&b, r)
	busyMarkdown(&b, r)
	neighbourMarkdown(&b, r)
	changeCPUMarkdown(&b, r)

	w("## Rerun\n\n```sh\n" +
		"make bench                # everything, about 13 minutes on 2 CPUs; rewrites BENCHMARKS.md (root)\n" +
		"BENCH_QUICK=1 make bench  # a smoke run of seconds; prints the report, writes nothing\n" +
		"go run ./bench/cmd/bench -help   # -only control,kernel,data,selectors,live,conntrack,busy,neighbour,cpu (busy-nft: busy's nft-neighbour rows alone); -out FILE; -timeout\n" +
		"go test ./bench/          # the smoke run as a test (part of make test)\n" +
		"```\n\n" +
		"Needs root (it creates network namespaces; nothing is changed in the machine's own namespace), Linux with\n" +
		"nf_tables, and the Debian packages `nftables` (nft), `iptables` (iptables-nft, iptables-legacy and their\n" +
		"-restore commands, for the references; missing ones are left out and said so), `iproute2` (ip) and a Go 1.26\n" +
		"toolchain. `make bench` installs nothing. The legacy backend needs the kernel's ip_tables and iptable_nat\n" +
		"(built in or as modules); every namespace the run creates is named `" + nsPrefix + "-*` and is deleted when it ends,\n" +
		"also on Ctrl-C or SIGTERM; a run killed with SIGKILL leaves them for the next run to delete.\n")
	return b.String()
}

func controlMarkdown(b *strings.Builder, r *Results) {
	w := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	w("## Control plane\n\n")
	c := r.Control
	if c == nil {
		w("Not run.\n\n")
		return
	}
	if r.ControlErr != nil {
		w("**Incomplete:** %s\n\n", oneLine(r.ControlErr.Error()))
	}
	w("Time to put N `nonMasqueradeCIDRs` in the kernel of a fresh network namespace (no traffic), median of the\n" +
		"repetitions (5; 3 at 100,000; `(n=…)` marks cells cut short after 20 s). The list is /29s from 100.64.0.0/10\n" +
		"(IPv6: /48s from fd42::/16); \"one CIDR changed\" replaces its middle entry, \"full change\" swaps it for\n" +
		"another list of the same size (from 240.0.0.0/4; IPv6 fd43::/16), and back.\n\n" +
		"- **agent**: `nft.Ensure` on a `kernel.Netlink` in-process on the namespace (the table not owned), one `kernel.Netlink`\n" +
		"  from the first apply on: each apply reads the table back, compares, sends the plan of the\n" +
		"  differences and reads back again; an unchanged resync here finds the generation of its last whole\n" +
		"  read, reuses it and sends nothing (the cost of a whole read-back is under \"Kernel side\").\n" +
		"  Parsing the YAML and `nft.Build` come before it and are listed separately below.\n" +
		"- **`nft -f`**: `nft.Render` of the same ruleset, prefixed with `table inet ip-masq-agent` and\n" +
		"  `delete table inet ip-masq-agent` so that it replaces the table; a new `nft` process each time.\n" +
		"- **iptables-…-restore**: `iptables-restore --noflush` of what the original agent writes on every\n" +
		"  sync: `:IP-MASQ-AGENT`, one `-d CIDR -m comment --comment … -j RETURN` per CIDR (link-local\n" +
		"  first), then `-j MASQUERADE --random-fully`; the chain and the POSTROUTING jump exist beforehand\n" +
		"  (for \"first apply\" the chain is empty). The original agent also runs `iptables -N` and\n" +
		"  `iptables -C` on each sync; they are not counted. These tools rewrite everything on every run.\n\n")
	w("Starting a process in the namespace (`nft --version`) takes %s: part of every `nft -f` and\n"+
		"iptables figure, as in real use.\n\n", fmtDur(c.ExecOverhead.Median()))

	w("| CIDRs | apply | agent | agent: rules in force | `nft -f` | agent ÷ `nft -f` | iptables-nft-restore | iptables-legacy-restore |\n")
	w("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, x := range c.Rows {
		for s := range numScenarios {
			label := ""
			if s == 0 {
				label = fmt.Sprintf("IPv%d %s", x.Family, num(x.N))
			}
			cells := make([]string, 4)
			for i := range x.Tools {
				if i < len(x.Times) {
					cells[i] = timingCell(x.Times[i][s], x.Reps)
				}
			}
			ratio := "—"
			if a, f := x.Times[0][s], x.Times[1][s]; a.Reps() > 0 && f.Reps() > 0 {
				ratio = fmt.Sprintf("%.2g×", float64(a.Median())/float64(f.Median()))
			}
			w("| %s | %s | %s | %s | %s | %s | %s | %s |\n", label, Scenario(s), cells[0], timingCell(x.InForce[s], 0), cells[1], ratio, cells[2], cells[3])
		}
	}
	w("\n")
	var skipped []string
	for _, x := range c.Rows {
		for _, s := range x.Skipped {
			skipped = append(skipped, fmt.Sprintf("IPv%d %s: %s", x.Family, num(x.N), s))
		}
	}
	if len(skipped) > 0 {
		w("Not measured: %s.\n\n", strings.Join(skipped, "; "))
	}

	w("The agent in detail: what the daemon does besides `nft.Ensure` on each sync (parse the file, `nft.Build`),\n" +
		"what it sends, CPU time of the first apply (the harness process around the in-process `nft.Ensure`, and\n" +
		"the `nft -f` process; user + kernel, split by the kernel in proportion to 4 ms ticks, so small\n" +
		"figures are rough), a full change written as after a foreign change (sets and\n" +
		"chains flushed and refilled in place, one transaction), and the real binary: its peak RSS (VmHWM)\n" +
		"running as a daemon right after its first sync, and the wall time of `ip-masq-agent --once --config\n" +
		"FILE` (a first apply, YAML parsing included). The peak RSS is not `ru_maxrss` of an `--once` child:\n" +
		"Go starts children with vfork, and exec records the high-water mark of the address space it leaves,\n" +
		"the harness's, as the child's.\n\n")
	w("| CIDRs | parse YAML | `nft.Build` | first apply CPU: agent | first apply CPU: `nft -f` | unchanged: messages sent, generation moves | one changed: messages | one CIDR added | one CIDR removed | full change, flush and refill | binary peak RSS | binary `--once` |\n")
	w("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, x := range c.Rows {
		rss := "—"
		if len(x.RSS) > 0 {
			rss = fmtMB(median(x.RSS))
		}
		w("| IPv%d %s | %s | %s | %s | %s | %d, %d | %d | %s | %s | %s | %s | %s |\n", x.Family, num(x.N),
			fmtDur(x.Parse.Median()), fmtDur(x.Build.Median()),
			cpuCell(x.AgentUser, x.AgentKernel), cpuCell(x.NFTUser, x.NFTKernel),
			x.UnchangedSent, x.UnchangedGenMoves,
			x.OneChangedMessages, timingCell(x.AddOne, 0), timingCell(x.RemoveOne, 0), timingCell(x.Rewrite, 0), rss, timingCell(x.OnceWall, 0))
	}
	w("\n")
	for _, x := range c.Rows {
		for _, e := range x.Errors {
			w("- IPv%d %s: %s\n", x.Family, num(x.N), e)
		}
	}
	w("\"Agent\" is the time until `nft.Ensure` returns. For one-CIDR changes, \"rules in force\" is the time until\n" +
		"the kernel's notification of the agent's commit reaches a monitor socket (a netlink subscription to\n" +
		"the namespace's nftables events, open only while those are timed: with a listener the kernel also\n" +
		"builds a notification per element, which would slow the large applies): the new rules decide from\n" +
		"then on. The difference is the read back that follows the commit (what the commit changed, and\n" +
		"the fences around it: the table is not owned here). A fence is an empty transaction, which the\n" +
		"kernel takes its commit lock for and releases; a transaction the kernel refuses would fence as well,\n" +
		"but the kernel's abort of it waits for an RCU grace period (`nf_tables_abort` → `synchronize_rcu`,\n" +
		"10-20 ms here), which every read of a table nobody owns paid twice before issue 34.\n\n")
}

// legacyStatus says whether the legacy iptables backend worked in the
// namespaces (it needs the kernel's ip_tables and iptable_nat).
func legacyStatus(r *Results) string {
	var reasons []string
	if r.Control != nil {
		for _, x := range r.Control.Rows {
			for i, t := range x.Tools {
				if strings.Contains(t.Name, "legacy") && i < len(x.Times) && x.Times[i][First].Reps() > 0 {
					return "works (measured below)"
				}
			}
			for _, s := range x.Skipped {
				if strings.Contains(s, "legacy") {
					reasons = append(reasons, s)
				}
			}
		}
	}
	if r.Data != nil {
		for _, p := range r.Data.Points {
			if p.Kind == KindIPTLegacy {
				if p.Measured() {
					return "works (measured below)"
				}
				if p.Skipped != "" {
					reasons = append(reasons, p.Skipped)
				}
			}
		}
	}
	if len(reasons) > 0 {
		return "does not work here, so only iptables-nft is compared: " + reasons[0]
	}
	return "not tried"
}

// cpuCell is "user + kernel" CPU time, medians.
func cpuCell(user, kernel []time.Duration) string {
	if len(user) == 0 {
		return "—"
	}
	f := func(d time.Duration) string {
		if d <= 0 {
			return "0"
		}
		return fmtDur(d)
	}
	return f(median(user)) + " + " + f(median(kernel))
}

func timingCell(t Timing, planned int) string {
	if t.Reps() == 0 {
		return "—"
	}
	s := fmtDur(t.Median())
	if planned > 0 && t.Reps() < planned {
		s += fmt.Sprintf(" (n=%d)", t.Reps())
	}
	return s
}

func dataMarkdown(b *strings.Builder, r *Results) {
	w := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	w("## Data plane\n\n")
	d := r.Data
	if d == nil {
		w("Not run.\n\n")
		return
	}
	if r.DataErr != nil {
		w("**Incomplete:** %s\n\n", oneLine(r.DataErr.Error()))
	}
	w("New TCP connections from a pod namespace through the node namespace (forwarding, and the node's\n"+
		"rules) to a host in the ext namespace (203.0.113.10, covered by none of the CIDRs, so each new\n"+
		"connection is masqueraded after checking all of them). %d threads in the pod each loop on socket,\n"+
		"connect (the whole handshake) and close with SO_LINGER 0 (a reset: no TIME_WAIT); a server in the\n"+
		"ext namespace accepts and closes. Each configuration has its own namespaces; %d repetitions of %s go\n"+
		"round all configurations in turn, and each figure is the median.\n\n", d.Clients, d.Reps, d.Duration)
	w("**CPU per connection** is the CPU time of the harness process (clients, server, and the kernel's\n" +
		"packet processing done in their context) plus the ksoftirqd threads', divided by the connections:\n" +
		"other tenants' load does not enter it, while it does enter the rates and the system-wide figure\n" +
		"(busy time of all CPUs from /proc/stat, shown for reference). In parentheses: the lowest and highest\n" +
		"repetition, a measure of the noise. \"Ruleset cost\" is the CPU per\n" +
		"connection above the no-rules baseline. \"Source seen\" is checked by the server for every connection:\n" +
		"the node's address when masqueraded, the pod's otherwise.\n\n")
	none := d.Find(KindNone, 0)
	w("| node's rules | CIDRs | new connections/s | CPU per connection | ruleset cost | rate ÷ no rules | system-wide CPU per connection | source seen | failed |\n")
	w("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |\n")
	for _, p := range d.Points {
		n := "—"
		if p.Kind != KindNone && p.Kind != KindConntrack {
			n = num(p.N)
		}
		if !p.Measured() {
			reason := "not measured"
			if p.Skipped != "" {
				reason += ": " + p.Skipped
			}
			w("| %s | %s | %s | | | | | | |\n", p.Kind, n, reason)
			continue
		}
		cost, vs := "—", "—"
		if none.Measured() {
			cost = fmt.Sprintf("%+.1f µs", (p.CPUns()-none.CPUns())/1e3)
			vs = fmt.Sprintf("%.2f", p.Rate()/none.Rate())
		}
		seen := seenCell(p)
		w("| %s | %s | %.0f | %.1f µs (%.0f–%.0f) | %s | %s | %.1f µs | %s | %d |\n", p.Kind, n, p.Rate(), p.CPUns()/1e3,
			slices.Min(p.CPU)/1e3, slices.Max(p.CPU)/1e3, cost, vs, p.SysNs()/1e3, seen, p.Errors)
	}
	w("\n")
	// What a rate target asks of the chain.
	a10, n10 := d.Find(KindAgent, 10_000), d.Find(KindIPTLegacy, 10_000)
	if none.Measured() && a10.Measured() && n10.Measured() {
		w("A new connection costs %.1f µs of CPU here with no rules at all (socket, handshake and reset\n"+
			"through three namespaces); at 10,000 CIDRs the agent's table adds %.1f µs and the legacy chain\n"+
			"%.1f µs. The rate ratio is bounded by the ratio of the totals: for the agent to reach 10× the\n"+
			"chain's rate, the chain would have to cost about 9× that baseline more than the agent does.\n\n",
			none.CPUns()/1e3, (a10.CPUns()-none.CPUns())/1e3, (n10.CPUns()-none.CPUns())/1e3)
	}
	// Per-CIDR slopes.
	ns := d.Ns()
	if len(ns) >= 2 {
		lo, hi := ns[0], ns[len(ns)-1]
		w("Cost of one more CIDR per new connection, from the %s-CIDR to the %s-CIDR point: ", num(lo), num(hi))
		var parts []string
		for _, kind := range []string{KindAgent, KindIPTNFT, KindIPTLegacy} {
			a, z := d.Find(kind, lo), d.Find(kind, hi)
			if a == nil || z == nil || !a.Measured() || !z.Measured() {
				continue
			}
			parts = append(parts, fmt.Sprintf("%s %.2f ns", kind, (z.CPUns()-a.CPUns())/float64(hi-lo)))
		}
		w("%s.\n\n", strings.Join(parts, "; "))
	}
}

// seenCell is the sources the server saw: the node's (or the snat
// address) when masqueraded, the pod's otherwise.
func seenCell(p *DataPoint) string {
	seen := fmt.Sprintf("node %d, pod %d", p.Masq, p.Direct)
	if p.Other > 0 {
		seen += fmt.Sprintf(", other %d", p.Other)
	}
	if p.wrongNAT() > 0 {
		seen += " **(wrong)**"
	}
	return seen
}

func liveMarkdown(b *strings.Builder, r *Results) {
	w := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	w("## Live operation\n\n")
	l := r.Live
	if l == nil {
		w("Not run.\n\n")
		return
	}
	if r.LiveErr != nil {
		w("**Incomplete:** %s\n\n", oneLine(r.LiveErr.Error()))
	}
	w("The agent binary runs as a daemon in a node namespace (`--http-address=127.0.0.1:0`, `resyncInterval: 1h`, so\n" +
		"that the periodic resync plays no part). Times come from one netlink subscription to the namespace's\n" +
		"nftables notifications: each committed transaction ends with a NEWGEN message naming the committing\n" +
		"process.\n\n" +
		"- **reload**: from the `rename` that swaps the ConfigMap volume's `..data` symlink to a new\n" +
		"  timestamped directory (the kubelet's atomic update; each trial changes one CIDR) to the agent's\n" +
		"  commit. The agent coalesces file events for 10 ms before reading.\n" +
		"- **repair**: from the commit of a foreign `delete table inet ip-masq-agent` (sent by the harness\n" +
		"  over netlink; the earlier of the kernel's ack and the notification, which the monitor may read\n" +
		"  late when it waits for a CPU) to the agent's commit that re-creates the whole table: it re-reads the file and\n" +
		"  writes everything, as a first apply (see the control plane). The original agent repairs only at\n" +
		"  its next resync: up to one interval, 60 s by default. The agent takes a third repair within 10 s\n" +
		"  for the sign of a rival writer and backs off before the next one, so the harness restarts it after\n" +
		"  every 3 repairs (SIGTERM, then a new process, which finds the table in place; below).\n\n" +
		"Between trials the harness waits until the agent has logged the end of its sync, and 50 ms more.\n" +
		"The agent's sockets last (it opens none to repair), and it sends its batch a few ms after the\n" +
		"notification. At 10,000 CIDRs most of a repair is the kernel's: the deleter closes its netlink\n" +
		"socket right after the ack (as `nft` does when it exits), and the kernel, holding the namespace's\n" +
		"commit lock, first waits for the deleted table's release (an RCU grace period, then the freeing of\n" +
		"its elements: `nft_rcv_nl_event` → `nf_tables_trans_destroy_flush_work`); the agent's batch waits\n" +
		"behind that lock, then the kernel inserts its elements, as in a first apply (control plane).\n" +
		"- **repair, the kernel's floor**: after each repair trial, the harness deletes the same table (nft.Build\n" +
		"  of the same list, the daemon's options) the same way in another namespace of the topology and, as\n" +
		"  soon as its monitor reads the deletion's notification, sends the create, planned beforehand, in one\n" +
		"  batch from a bare `kernel.Netlink` whose socket lasts, as the agent's does; timed as the agent's\n" +
		"  repair, from the deletion's commit to the notification of the create's. The agent does more in\n" +
		"  between (it reads the table, re-reads its file, builds and plans), so it cannot beat the floor\n" +
		"  beyond the noise of the machine.\n\n")
	w("\"Waiting for a CPU\" is how long the agent's threads, summed, sat on a run queue from just before\n" +
		"a trial's trigger to just after its commit was seen (`/proc/PID/task/*/schedstat`): time in which\n" +
		"other work ran instead. It is an indicator of contention, not a part of the latency to subtract.\n\n")
	w("| CIDRs | | trials | p50 | p90 | p99 | max | timed out (%s) | waiting for a CPU: p50, p99, max |\n| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n", trialTimeout)
	for _, x := range l.Rows {
		for _, c := range []struct {
			name     string
			ds, wait []time.Duration
			failed   int
		}{{"reload", x.Reload, x.ReloadWait, x.ReloadFailed}, {"repair", x.Repair, x.RepairWait, x.RepairFailed}} {
			if len(c.ds)+c.failed == 0 {
				continue
			}
			if x.Neighbour {
				c.name += ", a neighbour committing every second"
			}
			w("| %s | %s | %d | %s | %s | %s | %s | %d | %s, %s, %s |\n", num(x.N), c.name, len(c.ds)+c.failed,
				fmtDur(percentile(c.ds, 50)), fmtDur(percentile(c.ds, 90)), fmtDur(percentile(c.ds, 99)), fmtDur(percentile(c.ds, 100)), c.failed,
				fmtWait(percentile(c.wait, 50)), fmtWait(percentile(c.wait, 99)), fmtWait(percentile(c.wait, 100)))
		}
		if f := x.RepairFloor; len(f) > 0 {
			w("| %s | repair, the kernel's floor | %d | %s | %s | %s | %s | — | — |\n", num(x.N), len(f),
				fmtDur(percentile(f, 50)), fmtDur(percentile(f, 90)), fmtDur(percentile(f, 99)), fmtDur(percentile(f, 100)))
		}
	}
	w("\n")
	for _, x := range l.Rows {
		if x.Restarts > 0 {
			w("%s CIDRs: the agent was restarted %d times between repairs; the restarts sent %d messages and made %d commits\n"+
				"(the table not owned: want 0).\n\n", num(x.N), x.Restarts, x.RestartMessages, x.RestartGenMoves)
		}
	}
}

// --- formatting ---

// fmtSigned is fmtDur for a difference, which may be negative or zero.
func fmtSigned(d time.Duration) string {
	switch {
	case d < 0:
		return "−" + fmtDur(-d)
	case d == 0:
		return "0"
	}
	return fmtDur(d)
}

func fmtDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "—"
	case d < time.Millisecond:
		return fmt.Sprintf("%.0f µs", float64(d)/1e3)
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/1e6)
	case d < time.Second:
		return fmt.Sprintf("%.1f ms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

func fmtWait(d time.Duration) string {
	if d <= 0 {
		return "0"
	}
	return fmtDur(d)
}

func fmtMB(bytes int64) string { return fmt.Sprintf("%.1f MB", float64(bytes)/(1<<20)) }

// num writes n with thousands separators.
func num(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// --- the kernel side (issue 11) and the conntrack cleanup (issue 14) ---

func kernelTargets(r *Results, add func(goal, measured string, met *bool)) {
	k := r.Kernel
	goal := "an unchanged resync sends nothing, the table read back whole; the read-back's cost at 64, 10,000 and 100,000 CIDRs (issue 11)"
	if k == nil || len(k.ReadBack) == 0 {
		add(goal, "", nil)
	} else {
		var full, cached, sizes []string
		sent, moves, not := 0, 0, 0
		for _, x := range k.ReadBack {
			sizes = append(sizes, num(x.N))
			full = append(full, fmtDur(x.Resync.Median()))
			cached = append(cached, fmtDur(x.CachedResync.Median()))
			sent, moves, not = sent+x.Sent, moves+x.GenMoves, not+x.NotUnchanged
		}
		add(goal, fmt.Sprintf("read back whole, compared: %s (%s CIDRs); at an unchanged generation: %s; messages sent: %d, generation moves: %d",
			strings.Join(full, " / "), strings.Join(sizes, " / "), strings.Join(cached, " / "), sent, moves),
			ptr(sent == 0 && moves == 0 && not == 0))
	}
	if d := k.daemon(); d != nil {
		dt, ot := median(d.DaemonTook), median(d.OnceTook)
		dw, ow := median(d.DaemonWall), median(d.OnceWall)
		ratio := float64(dt) / float64(ot)
		add(fmt.Sprintf("the daemon's first apply of %s CIDRs within 1.2× of `--once` (issue 11)", num(d.N)),
			fmt.Sprintf("`took=` %s vs %s: %.2f×; from the process's start to the table applied: %s vs %s: %.2f×",
				fmtDur(dt), fmtDur(ot), ratio, fmtDur(dw), fmtDur(ow), float64(dw)/float64(ow)), ptr(ratio <= 1.2))
	} else {
		add("the daemon's first apply of 100,000 CIDRs within 1.2× of `--once` (issue 11)", "", nil)
	}
	onceGoal := func(n int) string {
		return fmt.Sprintf("a cold `--once` of %s CIDRs at most 1.25× its own kernel (system) time, wall clock (issue 11)", num(n))
	}
	if k == nil || len(k.Once) == 0 {
		add(onceGoal(100_000), "", nil)
	} else {
		for _, o := range k.Once {
			ratio := o.Ratio()
			add(onceGoal(o.N), fmt.Sprintf("wall %s vs system %s: %.2f× (user %s)",
				fmtDur(median(o.Wall)), fmtDur(median(o.Kernel)), ratio, fmtDur(median(o.User))), ptr(ratio > 0 && ratio <= 1.25))
		}
	}
	goal = "a restart that finds the right table sends nothing but the adoption (owned: 1 table-flags message; not owned: none) and keeps the counters (issue 11)"
	if k == nil || len(k.Restarts) == 0 {
		add(goal, "", nil)
	} else {
		var parts []string
		met := true
		for _, x := range k.Restarts {
			want := 0
			if x.Owned {
				want = 1
			}
			for i, m := range x.Messages {
				met = met && m >= 0 && m <= want && x.GenMoves[i] <= want
			}
			met = met && x.CountersKept && x.NotRecognised == 0 && len(x.Messages) > 0
			parts = append(parts, fmt.Sprintf("%s: messages %s, commits %s, counters %s", ownedName(x.Owned),
				joinInts(x.Messages), joinInts(x.GenMoves), keptWord(x.CountersKept)))
		}
		add(goal, strings.Join(parts, "; "), &met)
	}
}

func (k *KernelResults) daemon() *DaemonFirst {
	if k == nil || k.Daemon == nil || len(k.Daemon.DaemonTook) == 0 || len(k.Daemon.OnceTook) == 0 {
		return nil
	}
	return k.Daemon
}

func ownedName(owned bool) string {
	if owned {
		return "owned (`--own-table=true`, the default)"
	}
	return "not owned (`--own-table=false`)"
}

func keptWord(kept bool) string {
	if kept {
		return "kept"
	}
	return "**reset**"
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ", ")
}

func conntrackTargets(r *Results, add func(goal, measured string, met *bool)) {
	goal := "conntrack cleanup of 100,000 entries under 1 s, the data plane undisturbed (issue 14)"
	c := r.Conntrack
	var worst time.Duration
	var probe Probe
	var parts []string
	wrong := false
	for _, x := range rowsOf(c) {
		if x.N != 100_000 || len(x.Took) == 0 {
			continue
		}
		worst = max(worst, median(x.Took))
		probe.add(x.Probe)
		parts = append(parts, fmt.Sprintf("%s with %.0f%% stale", fmtDur(median(x.Took)), x.Stale*100))
		wrong = wrong || x.Wrong != ""
	}
	if len(parts) == 0 {
		add(goal, "", nil)
		return
	}
	m := fmt.Sprintf("%s; a UDP probe through the node during the cleanups: %d of %d round trips answered, max %s",
		strings.Join(parts, ", "), probe.Answered, probe.Sent, fmtDur(percentile(probe.RTTs, 100)))
	if wrong {
		m += "; **a count was wrong** (see below)"
	}
	add(goal, m, ptr(worst < time.Second && probe.Sent > 0 && probe.Answered == probe.Sent && !wrong))
}

func rowsOf(c *CleanupResults) []CleanupRow {
	if c == nil {
		return nil
	}
	return c.Rows
}

func kernelMarkdown(b *strings.Builder, r *Results) {
	w := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	w("## Kernel side: verify, adopt (issue 11)\n\n")
	k := r.Kernel
	if k == nil {
		w("Not run.\n\n")
		return
	}
	if r.KernelErr != nil {
		w("**Incomplete:** %s\n\n", oneLine(r.KernelErr.Error()))
	}
	w("The agent trusts nothing it believes about the kernel: every resync reads its table back and compares\n" +
		"it with the wanted one, and writes only when they differ. A read at the nftables generation of the last\n" +
		"whole read reuses that read (no transaction has committed in the namespace since).\n\n" +
		"- **read back whole**: `kernel.Netlink.Read` in-process (one lasting socket, the table not owned) right\n" +
		"  after an unrelated commit (an empty `table ip x` added and deleted) moved the generation: the table,\n" +
		"  its sets with every element, its chains and rules dumped over netlink.\n" +
		"- **unchanged generation**: the same Read once more, answered from the last whole read.\n" +
		"- **unchanged resync**: `nft.Ensure` of the same table, after the generation moved and at an unchanged one:\n" +
		"  read, compare, nothing to send. Messages are those sent by all these resyncs; generation moves are\n" +
		"  the commits across them (both want 0).\n\n")
	w("| CIDRs | read back whole | read, unchanged generation | unchanged resync, read back whole | unchanged resync, unchanged generation | messages sent | generation moves |\n")
	w("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, x := range k.ReadBack {
		w("| %s | %s | %s | %s | %s | %d | %d |\n", num(x.N), timingCell(x.Read, 0), timingCell(x.CachedRead, 0),
			timingCell(x.Resync, 0), timingCell(x.CachedResync, 0), x.Sent, x.GenMoves)
	}
	w("\n")
	if len(k.Once) > 0 {
		w("A **cold `ip-masq-agent --once --config FILE`** (the table absent, a new process each time, defaults: the\n"+
			"table written unowned, as `--once` releases it at its end): its wall clock from fork to exit against its own CPU time from its rusage, split into user\n"+
			"(YAML decoding, building, encoding, Go's runtime) and system (the kernel's work: mostly the\n"+
			"transaction and the read-back; the two are split by the kernel in proportion to 4 ms ticks). `took=`\n"+
			"is what its \"applied config\" log line says `nft.Ensure` took. Median of %d runs; the ratio is the median\n"+
			"of each run's own.\n\n", len(k.Once[0].Wall))
		w("| CIDRs | wall | user | system | wall ÷ system | `took=` |\n| ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, o := range k.Once {
			w("| %s | %s | %s | %s | %.2f× | %s |\n", num(o.N), fmtDur(median(o.Wall)), fmtDur(median(o.User)),
				fmtDur(median(o.Kernel)), o.Ratio(), fmtDur(median(o.Took)))
		}
		w("\n")
	}
	if d := k.daemon(); d != nil {
		w("**The daemon's first apply against `--once`**, %s CIDRs, in turn in one namespace (the table deleted\n"+
			"before each; defaults: for `--once` the table written unowned, for the daemon owned and its nftables watch subscribed, which the\n"+
			"agent leaves during its own commits so that the kernel does not build a notification per element).\n"+
			"`took=` is the \"applied config\" log line's; \"from the start\" is from the fork to that line\n"+
			"(daemon) or to the exit (`--once`). Medians of %d each.\n\n", num(d.N), len(d.DaemonTook))
		w("| | `--once` | daemon | daemon ÷ `--once` |\n| --- | ---: | ---: | ---: |\n")
		for _, c := range []struct {
			name string
			o, d []time.Duration
		}{{"`took=`", d.OnceTook, d.DaemonTook}, {"from the start", d.OnceWall, d.DaemonWall}} {
			w("| %s | %s | %s | %.2f× |\n", c.name, fmtDur(median(c.o)), fmtDur(median(c.d)), float64(median(c.d))/float64(median(c.o)))
		}
		w("\n")
	}
	if len(k.Restarts) > 0 {
		w("**Restarts that find the right table**: the daemon applies its config, new UDP flows from the pod\n" +
			"are masqueraded (the decision chain's counters move), then it is stopped (SIGTERM, with\n" +
			"`--release-on-exit=false`: the table stays orphaned, as a killed agent leaves it; by default the agent\n" +
			"releases it at exit and the next one re-creates it owned, see docs/upgrade.md) and started again,\n" +
			"several times. Messages are what each restart's log line says it sent (an owned\n" +
			"table is adopted with one message that sets the table's owner flag on the new socket); commits are\n" +
			"the nftables generation moves from the stop to that line; the counters are the decision chain's\n" +
			"packets before the stop and after the restart.\n\n")
		w("| table | CIDRs | restarts | messages sent | adopted | commits | `took=` | counters (packets): before → after |\n")
		w("| --- | ---: | ---: | ---: | --- | ---: | ---: | --- |\n")
		for _, x := range k.Restarts {
			var counters []string
			for i := range x.Before {
				counters = append(counters, fmt.Sprintf("%d → %d", x.Before[i], x.After[i]))
			}
			adopted := make([]string, len(x.Adopted))
			for i, a := range x.Adopted {
				adopted[i] = fmt.Sprint(a)
			}
			took := make([]string, len(x.Took))
			for i, t := range x.Took {
				took[i] = fmtDur(t)
			}
			w("| %s | %s | %d | %s | %s | %s | %s | %s (%s) |\n", ownedName(x.Owned), num(x.N), len(x.Messages), joinInts(x.Messages),
				strings.Join(adopted, ", "), joinInts(x.GenMoves), strings.Join(took, ", "), strings.Join(counters, "; "), keptWord(x.CountersKept))
		}
		w("\n")
		for _, x := range k.Restarts {
			if x.NotRecognised > 0 {
				w("- %s: %d restarts did not log that the kernel held the table already.\n", ownedName(x.Owned), x.NotRecognised)
			}
		}
	}
}

func conntrackMarkdown(b *strings.Builder, r *Results) {
	w := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	w("## Conntrack cleanup (issue 14)\n\n")
	c := r.Conntrack
	if c == nil {
		w("Not run.\n\n")
		return
	}
	if r.ConntrackErr != nil {
		w("**Incomplete:** %s\n\n", oneLine(r.ConntrackErr.Error()))
	}
	w("`conntrack.CleanupMarked` in-process, with the setup of `BenchmarkCleanup` (conntrack/cleanup_bench_test.go, which\n" +
		"`go test -run '^$' -bench Cleanup -benchtime 1x ./conntrack/` runs alone): the table is filled with UDP entries by ctnetlink (not counted) in the\n" +
		"node namespace of an `internal/testnet` topology; \"stale\" entries are masqueraded entries to\n" +
		"203.0.113.0/24, which the new decider no longer masquerades; the others go to ranges whose decision did\n" +
		"not change (half masqueraded, half not). Cleanup time covers opening the sockets, reading the local\n" +
		"addresses, dumping both families, judging every entry and deleting the stale ones; the run checks the\n" +
		"count deleted and `nf_conntrack_count` afterwards. Median of up to 3 repetitions (filling the table is\n" +
		"the slow part: fewer at the larger sizes); \"allocated\" is the Go heap allocated during the last one.\n\n" +
		"**Data plane**: all the while, a UDP probe from the pod to a host behind the node (198.51.100.200, whose\n" +
		"decision does not change: its entry must survive) sends a datagram and waits for the answer (200 ms at\n" +
		"most), again and again 1 ms apart on one flow; the same probe runs for as long right after, without a cleanup, as\n" +
		"the reference.\n\n")
	w("| entries | stale | Cleanup | allocated | examined, deleted | probe during the cleanup: answered, p50, max | probe without a cleanup | first version (by hand, 2026-11-23) |\n")
	w("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, x := range c.Rows {
		first := orDash(firstVersion[[2]int{x.N, int(x.Stale * 100)}])
		if x.Skipped != "" {
			w("| %s | %.0f%% | not measured: %s | | | | | %s |\n", num(x.N), x.Stale*100, x.Skipped, first)
			continue
		}
		took := timingCell(Timing{All: x.Took}, 0)
		if len(x.Took) > 1 {
			took += fmt.Sprintf(" (n=%d)", len(x.Took))
		}
		w("| %s | %.0f%% | %s | %s | %s, %s | %s | %s | %s |\n", num(x.N), x.Stale*100, took, fmtMB(int64(x.Alloc)),
			num(x.Result.Examined), num(x.Result.Deleted), probeCell(x.Probe), probeCell(x.Before), first)
	}
	w("\n")
	for _, x := range c.Rows {
		if x.Wrong != "" {
			w("- %s entries, %.0f%% stale: %s.\n", num(x.N), x.Stale*100, x.Wrong)
		}
	}
	w("The first version used the library's conntrack API (`netlink.Handle.ConntrackDeleteFilters`), which keeps\n" +
		"the whole dump in memory, parses every entry with many allocations and deletes one netlink round trip at\n" +
		"a time; the current one judges entries as the dump streams in and deletes in 64 KiB batches. Its column\n" +
		"was measured once, by hand, and is not rerun.\n\n")
	// A linear extrapolation to the sizes nf_conntrack_max forbids.
	var none, all time.Duration
	for _, x := range c.Rows {
		if x.N == 100_000 && len(x.Took) > 0 {
			switch x.Stale {
			case 0:
				none = median(x.Took)
			case 1:
				all = median(x.Took)
			}
		}
	}
	for _, x := range c.Rows {
		if x.Skipped == "" {
			continue
		}
		w("%s entries could not be created: %s, and the root namespace's value is not ours to change.", num(x.N), x.Skipped)
		if none > 0 && all > none {
			perEntry := float64(none) / 1e5
			perStale := float64(all-none) / 1e5
			est := time.Duration(perEntry*float64(x.N) + perStale*float64(x.N)*x.Stale)
			w(" The cost is linear in the entries (dump and judge: about %.1f µs per entry; delete: about %.1f µs per\n"+
				"stale entry, from the 100,000-entry rows), which puts %s entries with %.0f%% stale near %s: an\n"+
				"extrapolation, not a measurement.", perEntry/1e3, perStale/1e3, num(x.N), x.Stale*100, fmtDur(est.Round(10*time.Millisecond)))
		}
		w("\n\n")
	}
}

func probeCell(p Probe) string {
	if p.Sent == 0 {
		return "—"
	}
	return fmt.Sprintf("%d of %d, %s, %s", p.Answered, p.Sent, fmtDur(percentile(p.RTTs, 50)), fmtDur(percentile(p.RTTs, 100)))
}
