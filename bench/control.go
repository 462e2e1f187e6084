package bench

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/harness"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft/kernel"
)

// Scenario is one kind of apply.
type Scenario int

const (
	First      Scenario = iota // the table (chain) is empty or absent
	Unchanged                  // a resync with the same list
	OneChanged                 // a resync with one CIDR replaced
	FullChange                 // a different list of the same size
	numScenarios
)

var scenarioNames = [numScenarios]string{"first apply", "unchanged resync", "one CIDR changed", "full change (other list, same size)"}

func (s Scenario) String() string { return scenarioNames[s] }

// Tool is a way of putting the rules in the kernel.
type Tool struct {
	Name    string // as shown in the tables
	Restore string // the binary run with the rules file (empty: the agent, in-process)
	Setup   string // iptables binary for the chain and the POSTROUTING jump
	NFT     bool   // Restore is nft -f
}

func tools(family int) []Tool {
	six := ""
	if family == 6 {
		six = "6"
	}
	return []Tool{
		{Name: "agent (kernel.Netlink)"},
		{Name: "nft -f", Restore: "nft", NFT: true},
		{Name: "ip" + six + "tables-nft-restore", Restore: "ip" + six + "tables-nft-restore", Setup: "ip" + six + "tables-nft"},
		{Name: "ip" + six + "tables-legacy-restore", Restore: "ip" + six + "tables-legacy-restore", Setup: "ip" + six + "tables-legacy"},
	}
}

// Timing is the repetitions of one measurement.
type Timing struct {
	All []time.Duration
}

func (t Timing) Median() time.Duration { return median(t.All) }
func (t Timing) Reps() int             { return len(t.All) }

// ControlRow is one list size of one family.
type ControlRow struct {
	Family, N int
	Reps      int    // repetitions planned per cell (fewer when a cell exceeds cellBudget)
	Parse     Timing // config.Parse of the YAML file (what the daemon reads each resync)
	Build     Timing // nft.Build of the parsed config
	// Times[tool][scenario], tools in the order of tools(Family).
	Tools   []Tool
	Times   [][numScenarios]Timing
	Skipped []string // tools not measured, with the reason

	// The agent's unchanged resyncs and one-CIDR changes.
	UnchangedSent      int // netlink messages sent by unchanged resyncs (want 0)
	UnchangedGenMoves  int // nftables generation changes across unchanged resyncs (want 0)
	OneChangedMessages int // messages of a one-CIDR change (want 2: delete one, add one)
	FullChangeMessages int
	// A one-CIDR change taken apart: one CIDR added, then removed again.
	AddOne, RemoveOne Timing
	// CPU time of the first apply: the agent's process (in-process nft.Ensure)
	// and the nft process, user and kernel.
	AgentUser, AgentKernel, NFTUser, NFTKernel []time.Duration
	// The agent's full change done as after a foreign change (Forget):
	// the sets and chains flushed and refilled in place, in one transaction.
	Rewrite Timing
	// InForce[scenario]: from the agent's nft.Ensure call to the kernel's
	// notification of its commit (the new rules in force). nft.Ensure returns
	// later: it closes its netlink socket, which waits for the kernel to
	// free what the transaction replaced.
	InForce [numScenarios]Timing

	// The binary: peak RSS (VmHWM) after its first sync, and the wall time
	// of ip-masq-agent --once --config FILE (a first apply).
	RSS      []int64 // bytes
	OnceWall Timing
	Errors   []string
}

// ControlResults are the control plane figures.
type ControlResults struct {
	Rows []ControlRow
	// ExecOverhead is the time to fork and exec `nft --version` in a
	// namespace: part of every nft -f and iptables-restore figure.
	ExecOverhead Timing
}

type controlCase struct{ family, n, reps int }

func controlCases(quick bool) []controlCase {
	if quick {
		return []controlCase{{4, 64, 2}, {4, 1000, 2}, {6, 1000, 2}}
	}
	return []controlCase{{4, 64, 5}, {4, 1000, 5}, {4, 10_000, 5}, {4, 100_000, 3}, {6, 10_000, 5}}
}

// cellBudget bounds the time spent on one tool and scenario: after it, no
// more repetitions are started (at least one always runs).
const cellBudget = 20 * time.Second

// RunControl measures apply times and the binary's peak RSS.
func RunControl(ctx context.Context, cfg Config) (*ControlResults, error) {
	res := &ControlResults{}
	dir, err := os.MkdirTemp("", "ip-masq-agent-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)

	// Exec overhead, in a throwaway topology.
	if err := withTopology("cpx", func(topo *testnet.Topology) error {
		for range 5 {
			r, err := runIn(ctx, topo.NodeHandle(), "nft", "--version")
			if err != nil {
				return err
			}
			res.ExecOverhead.All = append(res.ExecOverhead.All, r.Took)
		}
		return nil
	}); err != nil {
		return res, err
	}

	for _, c := range controlCases(cfg.Quick) {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		cfg.logf("control plane: IPv%d, %d CIDRs", c.family, c.n)
		row, err := controlRow(ctx, cfg, dir, c)
		res.Rows = append(res.Rows, row)
		if err != nil {
			return res, fmt.Errorf("IPv%d %d CIDRs: %w", c.family, c.n, err)
		}
	}
	return res, nil
}

// withTopology runs f with a new topology, deleted afterwards.
func withTopology(part string, f func(*testnet.Topology) error) (err error) {
	topo, err := newTopology(part)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, topo.Close()) }()
	return f(topo)
}

// lists are the configs of a row: the list, the list with one CIDR
// changed, another list of the same size, and the list with one CIDR added.
type lists struct {
	rules [4]nft.Table
	yaml  [4]string // the config files (paths)
	nft   [4]string // nft -f files
	ipt   [4]string // iptables-restore files
}

func makeLists(dir string, family, n int) (lists, error) {
	var l lists
	flags := config.Flags{EnableIPv6: family == 6}
	opts := nft.Options{Chain: nft.DefaultChain, RandomFully: true, EnableIPv6: family == 6}
	a := cidrList(family, 0, n)
	changed := oneChanged(family, a)
	added := append(slices.Clone(a), changed[len(a)/2])
	for i, cidrs := range [][]netip.Prefix{a, changed, cidrList(family, 1, n), added} {
		c := config.Default(flags)
		c.NonMasqueradeCIDRs = cidrs
		c.CIDRLimit = max(n, 64)
		l.rules[i] = nft.Build(c, opts)
		base := filepath.Join(dir, fmt.Sprintf("v%d-%d-%d", family, n, i))
		l.yaml[i], l.nft[i], l.ipt[i] = base+".yaml", base+".nft", base+".rules"
		files := map[string]string{
			l.yaml[i]: c.String(),
			l.nft[i]:  nftReplaceText(l.rules[i]),
			l.ipt[i]:  iptablesRestoreText(family, cidrs),
		}
		for path, content := range files {
			if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
				return l, err
			}
		}
	}
	return l, nil
}

// nftReplaceText is the agent's ruleset as `nft -f` input that replaces
// the table whether or not it exists.
func nftReplaceText(rs nft.Table) string {
	return "table inet " + nft.TableName + "\ndelete table inet " + nft.TableName + "\n" + nft.Render(rs)
}

// The original agent's comments (kubernetes-sigs/ip-masq-agent, cmd/ip-masq-agent/ip-masq-agent.go).
const (
	origChain          = "IP-MASQ-AGENT"
	origJumpComment    = "ip-masq-agent: ensure nat POSTROUTING directs all non-LOCAL destination traffic to our custom IP-MASQ-AGENT chain"
	origNonMasqComment = "ip-masq-agent: local traffic is not subject to MASQUERADE"
	origMasqComment    = "ip-masq-agent: outbound traffic is subject to MASQUERADE (must be last in chain)"
)

// iptablesRestoreText is what the original agent feeds to
// `iptables-restore --noflush` on each sync: the chain declared (which
// flushes it within the transaction), link-local first, one RETURN rule per
// CIDR, then MASQUERADE --random-fully.
func iptablesRestoreText(family int, cidrs []netip.Prefix) string {
	var b strings.Builder
	b.WriteString("*nat\n:" + origChain + " - [0:0]\n")
	rule := func(dst string) {
		fmt.Fprintf(&b, "-A %s -d %s -m comment --comment %q -j RETURN\n", origChain, dst, origNonMasqComment)
	}
	if family == 6 {
		rule("fe80::/10")
	} else {
		rule("169.254.0.0/16")
	}
	for _, p := range cidrs {
		rule(p.String())
	}
	fmt.Fprintf(&b, "-A %s -m comment --comment %q -j MASQUERADE --random-fully\nCOMMIT\n", origChain, origMasqComment)
	return b.String()
}

// iptablesSetup creates the chain and the POSTROUTING jump, as the original
// agent's EnsureChain and ensurePostroutingJump do before the first restore.
func iptablesSetup(ctx context.Context, ns netns.NsHandle, bin string) error {
	if _, err := runIn(ctx, ns, bin, "-w", "-t", "nat", "-N", origChain); err != nil {
		return err
	}
	_, err := runIn(ctx, ns, bin, "-w", "-t", "nat", "-A", "POSTROUTING", "-m", "comment", "--comment", origJumpComment,
		"-m", "addrtype", "!", "--dst-type", "LOCAL", "-j", origChain)
	return err
}

func controlRow(ctx context.Context, cfg Config, dir string, c controlCase) (ControlRow, error) {
	row := ControlRow{Family: c.family, N: c.n, Reps: c.reps, Tools: tools(c.family)}
	row.Times = make([][numScenarios]Timing, len(row.Tools))
	l, err := makeLists(dir, c.family, c.n)
	if err != nil {
		return row, err
	}
	yaml, err := os.ReadFile(l.yaml[0])
	if err != nil {
		return row, err
	}
	for range c.reps {
		start := time.Now()
		cfgParsed, _, err := config.Parse(yaml, config.Flags{EnableIPv6: c.family == 6})
		row.Parse.All = append(row.Parse.All, time.Since(start))
		if err != nil {
			return row, fmt.Errorf("parse the generated config: %w", err)
		}
		start = time.Now()
		nft.Build(cfgParsed, nft.Options{Chain: nft.DefaultChain, RandomFully: true, EnableIPv6: c.family == 6})
		row.Build.All = append(row.Build.All, time.Since(start))
	}

	for i, tool := range row.Tools {
		if err := ctx.Err(); err != nil {
			return row, err
		}
		if tool.Restore != "" && !have(tool.Restore, cmp.Or(tool.Setup, tool.Restore)) {
			row.Skipped = append(row.Skipped, tool.Name+": not installed")
			continue
		}
		err := withTopology("cp", func(topo *testnet.Topology) error {
			if tool.Restore == "" {
				return agentTimes(ctx, cfg, topo, l, c, &row)
			}
			return toolTimes(ctx, topo, tool, l, c, &row, &row.Times[i])
		})
		if err != nil {
			if ctx.Err() != nil {
				return row, ctx.Err()
			}
			if tool.Restore == "" {
				return row, err
			}
			// A reference that does not work here is reported, not fatal.
			row.Skipped = append(row.Skipped, fmt.Sprintf("%s: %v", tool.Name, oneLine(err.Error())))
			row.Times[i] = [numScenarios]Timing{}
		}
	}
	return row, nil
}

func oneLine(s string) string { return harness.Tail(strings.Join(strings.Fields(s), " "), 300) }

// reps runs f up to n times, fewer once cellBudget is spent, and collects
// what it returns.
func reps(ctx context.Context, n int, f func(i int) (time.Duration, error)) (Timing, error) {
	var t Timing
	start := time.Now()
	for i := range n {
		if err := ctx.Err(); err != nil {
			return t, err
		}
		if i > 0 && time.Since(start) > cellBudget {
			break
		}
		d, err := f(i)
		if err != nil {
			return t, err
		}
		t.All = append(t.All, d)
	}
	return t, nil
}

// agentTimes measures the agent's Applier in-process, and its binary.
func agentTimes(ctx context.Context, cfg Config, topo *testnet.Topology, l lists, c controlCase, row *ControlRow) error {
	fd := int(topo.NodeHandle())
	times := &row.Times[0]
	// A monitor of the namespace's nftables notifications, only while
	// one-CIDR changes are timed: with a listener, the kernel also builds
	// a notification per element, which would slow the large applies.
	var mon *genMonitor
	// apply times nft.Ensure(a, rs) and, while mon is set, the commit's
	// notification.
	apply := func(a *kernel.Netlink, sc Scenario, rs nft.Table) (nft.Result, time.Duration, error) {
		g0, err := generation(fd)
		if err != nil {
			return nft.Result{}, 0, err
		}
		var ru0, ru1 syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
		start := time.Now()
		res, err := nft.Ensure(a, rs)
		took := time.Since(start)
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
		if err != nil || res.Unchanged {
			return res, took, err
		}
		if sc == First {
			row.AgentUser = append(row.AgentUser, time.Duration(ru1.Utime.Nano()-ru0.Utime.Nano()))
			row.AgentKernel = append(row.AgentKernel, time.Duration(ru1.Stime.Nano()-ru0.Stime.Nano()))
		}
		if mon != nil && sc < numScenarios {
			if at, ok := mon.waitGen(ctx, g0+1, time.Second); ok {
				row.InForce[sc].All = append(row.InForce[sc].All, at.Sub(start))
			}
		}
		return res, took, nil
	}
	var a *kernel.Netlink
	defer func() {
		if a != nil {
			a.Close()
		}
	}()
	var err error
	times[First], err = reps(ctx, c.reps, func(int) (time.Duration, error) {
		if a != nil {
			a.Close() // its monitor, subscribed, would have the kernel build a notification per element of the next apply
		}
		if err := dropTable(fd); err != nil {
			return 0, err
		}
		a = &kernel.Netlink{NetNS: fd, NoOwner: true}
		res, took, err := apply(a, First, l.rules[0])
		if err == nil && !res.Created {
			err = fmt.Errorf("first apply did not create the table: %+v", res)
		}
		return took, err
	})
	if err != nil {
		return fmt.Errorf("agent, first apply: %w", err)
	}
	// The same Applier from here on: it knows what the kernel holds.
	times[Unchanged], err = reps(ctx, c.reps, func(int) (time.Duration, error) {
		before, err := generation(fd)
		if err != nil {
			return 0, err
		}
		start := time.Now()
		res, err := nft.Ensure(a, l.rules[0])
		took := time.Since(start)
		if err != nil {
			return 0, err
		}
		after, err := generation(fd)
		if err != nil {
			return 0, err
		}
		row.UnchangedSent += res.Messages
		if after != before {
			row.UnchangedGenMoves++
		}
		if !res.Unchanged {
			row.Errors = append(row.Errors, fmt.Sprintf("an unchanged resync was not recognised as unchanged: %+v", res))
		}
		return took, nil
	})
	if err != nil {
		return fmt.Errorf("agent, unchanged resync: %w", err)
	}
	// Alternate between the list and the list with one CIDR changed (each
	// apply is a one-CIDR change), then between the two lists.
	for _, s := range []struct {
		sc    Scenario
		other int
		msgs  *int
	}{{OneChanged, 1, &row.OneChangedMessages}, {FullChange, 2, &row.FullChangeMessages}} {
		if s.sc == OneChanged {
			if mon, err = newGenMonitor(fd); err != nil {
				return err
			}
		}
		times[s.sc], err = reps(ctx, c.reps, func(i int) (time.Duration, error) {
			rs := l.rules[s.other]
			if i%2 == 1 {
				rs = l.rules[0]
			}
			res, took, err := apply(a, s.sc, rs)
			if err == nil && !res.Partial {
				row.Errors = append(row.Errors, fmt.Sprintf("%s: not a partial apply: %+v", s.sc, res))
			}
			*s.msgs = res.Messages
			return took, err
		})
		if mon != nil {
			mon.close()
			mon = nil
		}
		if err != nil {
			return fmt.Errorf("agent, %s: %w", s.sc, err)
		}
		if _, err := nft.Ensure(a, l.rules[0]); err != nil { // back to the list
			return err
		}
	}
	for i := range c.reps {
		if err := ctx.Err(); err != nil {
			return err
		}
		for _, s := range []struct {
			rs int
			t  *Timing
		}{{3, &row.AddOne}, {0, &row.RemoveOne}} {
			start := time.Now()
			if _, err := nft.Ensure(a, l.rules[s.rs]); err != nil {
				return fmt.Errorf("agent, one CIDR added or removed (%d): %w", i, err)
			}
			s.t.All = append(s.t.All, time.Since(start))
		}
	}

	// A full change written as the agent writes after a foreign change:
	// flush and refill in place.
	row.Rewrite, err = reps(ctx, c.reps, func(i int) (time.Duration, error) {
		rs := l.rules[2]
		if i%2 == 1 {
			rs = l.rules[0]
		}
		_, took, err := apply(a, numScenarios, rs)
		return took, err
	})
	if err != nil {
		return fmt.Errorf("agent, rewrite in place: %w", err)
	}

	// The binary: its wall time as --once (a first apply, YAML parsing
	// included), and its peak RSS as a daemon after its first sync.
	if cfg.Agent == "" {
		return nil
	}
	// The in-process Netlink closed first: its monitor, subscribed, had
	// the kernel build a notification per element of the binary's apply
	// (1.56 s for an --once of 100,000 CIDRs that takes 0.36 s alone).
	a.Close()
	a = nil
	args := []string{"--config", l.yaml[0]}
	if c.family == 6 {
		args = append(args, "--enable-ipv6")
	}
	runs := min(c.reps, 3)
	for range runs {
		if err := dropTable(fd); err != nil {
			return err
		}
		r, err := runIn(ctx, topo.NodeHandle(), cfg.Agent, append([]string{"--once"}, args...)...)
		if err != nil {
			return fmt.Errorf("the agent binary: %w", err)
		}
		row.OnceWall.All = append(row.OnceWall.All, r.Took)
	}
	for range runs {
		if err := dropTable(fd); err != nil {
			return err
		}
		rss, err := peakRSS(ctx, topo, cfg.Agent, args...)
		if err != nil {
			return fmt.Errorf("the agent binary's peak RSS: %w", err)
		}
		row.RSS = append(row.RSS, rss)
	}
	return nil
}

// peakRSS runs the agent as a daemon until its first sync is done and
// returns its peak resident set size (VmHWM): that of an --once run, plus
// what the daemon's file and table watches add. Not ru_maxrss of an --once
// child: Go starts children with vfork, and exec records the high-water
// mark of the address space it leaves, the harness's, as the child's
// ru_maxrss.
func peakRSS(ctx context.Context, topo *testnet.Topology, bin string, args ...string) (int64, error) {
	d, err := startDaemon(ctx, topo, bin, append(args, "--http-address=127.0.0.1:0")...)
	if err != nil {
		return 0, err
	}
	defer d.Stop()
	if _, _, err := d.WaitLine(ctx, cmdTimeout, appliedMarker); err != nil {
		return 0, err
	}
	sleepCtx(ctx, 200*time.Millisecond) // the end of the sync: logging, the watch reading its own commit
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.Pid()))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmHWM in /proc/PID/status")
}

// toolTimes measures nft -f or iptables-restore --noflush with the rules
// files: every run rewrites everything, as these tools do.
func toolTimes(ctx context.Context, topo *testnet.Topology, tool Tool, l lists, c controlCase, row *ControlRow, times *[numScenarios]Timing) error {
	ns := topo.NodeHandle()
	files := l.ipt
	var last cmdResult
	run := func(file string) (time.Duration, error) {
		args := []string{"--noflush", file}
		if tool.NFT {
			args = []string{"-f", file}
		}
		r, err := runIn(ctx, ns, tool.Restore, args...)
		last = r
		return r.Took, err
	}
	reset := func() error {
		_, err := runIn(ctx, ns, tool.Setup, "-w", "-t", "nat", "-F", origChain)
		return err
	}
	if tool.NFT {
		files = l.nft
		reset = func() error { return dropTable(int(ns)) }
	} else if err := iptablesSetup(ctx, ns, tool.Setup); err != nil {
		return err
	}
	var err error
	times[First], err = reps(ctx, c.reps, func(int) (time.Duration, error) {
		if err := reset(); err != nil {
			return 0, err
		}
		d, err := run(files[0])
		if tool.NFT && err == nil {
			row.NFTUser = append(row.NFTUser, last.User)
			row.NFTKernel = append(row.NFTKernel, last.Kernel)
		}
		return d, err
	})
	if err != nil {
		return err
	}
	times[Unchanged], err = reps(ctx, c.reps, func(int) (time.Duration, error) { return run(files[0]) })
	if err != nil {
		return err
	}
	for _, s := range []struct {
		sc    Scenario
		other int
	}{{OneChanged, 1}, {FullChange, 2}} {
		times[s.sc], err = reps(ctx, c.reps, func(i int) (time.Duration, error) {
			if i%2 == 1 {
				return run(files[0])
			}
			return run(files[s.other])
		})
		if err != nil {
			return err
		}
		if _, err := run(files[0]); err != nil {
			return err
		}
	}
	return nil
}

// dropTable deletes the agent's table in the namespace netnsFD, and closes
// the sockets it read it with: a Netlink's monitor stays subscribed to
// the nftables notifications until it is closed, and while any socket on
// the machine is, the kernel builds a notification for every element of
// every commit (the next apply measured, the agent's or nft -f's).
func dropTable(netnsFD int) error {
	k := &kernel.Netlink{NetNS: netnsFD, NoOwner: true}
	defer k.Close()
	return k.Delete()
}

// ensureClosed puts rs in the namespace netnsFD's kernel and closes the
// sockets it did so with (see dropTable).
func ensureClosed(netnsFD int, rs nft.Table) error {
	k := &kernel.Netlink{NetNS: netnsFD, NoOwner: true}
	defer k.Close()
	_, err := nft.Ensure(k, rs)
	return err
}

// generation reads the nftables generation id of the namespace: it moves
// with every commit, so an unchanged one proves nothing was written.
func generation(netnsFD int) (uint32, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: netnsFD})
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	msgs, err := conn.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	})
	if err != nil {
		return 0, err
	}
	for _, m := range msgs {
		if g, ok := parseGen(m.Data); ok {
			return g.id, nil
		}
	}
	return 0, errors.New("no generation id in the kernel's answer")
}

// gen is a NEWGEN message: a committed transaction.
type gen struct {
	id   uint32
	pid  uint32 // NFTA_GEN_PROC_PID: the committing thread
	proc string // NFTA_GEN_PROC_NAME: its command name
}

func parseGen(data []byte) (gen, bool) {
	var g gen
	if len(data) < 4 {
		return g, false
	}
	ad, err := netlink.NewAttributeDecoder(data[4:])
	if err != nil {
		return g, false
	}
	ad.ByteOrder = binary.BigEndian
	ok := false
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_GEN_ID:
			g.id, ok = ad.Uint32(), true
		case unix.NFTA_GEN_PROC_PID:
			g.pid = ad.Uint32()
		case unix.NFTA_GEN_PROC_NAME:
			g.proc = strings.TrimRight(string(ad.Bytes()), "\x00")
		}
	}
	return g, ok && ad.Err() == nil
}
