package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/harness"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft/kernel"
)

// The kernel side of issue 11: what verifying the table costs (the
// read-back of an unchanged resync), whether the daemon's own watch slows
// its first apply, how much of a cold --once is the kernel's work, and what
// a restart that finds the right table sends.

// ReadBackRow is the read-back of one list size, IPv4.
type ReadBackRow struct {
	N int
	// Read: kernel.Netlink.Read after an unrelated commit moved the nftables
	// generation (the whole table dumped); CachedRead: Read again at the
	// same generation (answered from the last whole read).
	Read, CachedRead Timing
	// Resync: nft.Ensure of the same table after the generation moved (read
	// back whole, compared, nothing sent); CachedResync: at an unchanged
	// generation.
	Resync, CachedResync Timing
	Sent                 int // messages sent by all those resyncs (want 0)
	GenMoves             int // nftables generation changes caused by the resyncs (want 0)
	NotUnchanged         int // resyncs not reported as unchanged (want 0)
}

// OnceRow is cold `ip-masq-agent --once` runs of one list size: the table
// absent, a new process each time.
type OnceRow struct {
	N                  int
	Wall, User, Kernel []time.Duration // per run
	Took               []time.Duration // the "applied config" log line's took= (Ensure)
}

// Ratio is the median of the runs' wall ÷ system time.
func (o OnceRow) Ratio() float64 {
	var rs []float64
	for i := range o.Wall {
		if i < len(o.Kernel) && o.Kernel[i] > 0 {
			rs = append(rs, float64(o.Wall[i])/float64(o.Kernel[i]))
		}
	}
	return median(rs)
}

// DaemonFirst is the daemon's first apply against --once's, side by side.
type DaemonFirst struct {
	N int
	// Took: the "applied config" line's took=; Wall: daemon from its start
	// to that line, --once from its start to its exit.
	DaemonTook, OnceTook, DaemonWall, OnceWall []time.Duration
}

// Restart is what a restarted daemon did on finding its table in place.
type Restart struct {
	Owned         bool
	N             int
	Messages      []int // per restart, from its log line
	Adopted       []bool
	Took          []time.Duration
	GenMoves      []int // commits seen from the restart to its log line
	Before, After []uint64
	CountersKept  bool // every restart: the decision counters did not go down
	Line          string
	NotRecognised int // restarts that did not log "holds the config's table already"
}

// KernelResults are the figures of the kernel side.
type KernelResults struct {
	ReadBack []ReadBackRow
	Daemon   *DaemonFirst
	Once     []OnceRow
	Restarts []Restart
}

// RunKernel measures the kernel side of issue 11.
func RunKernel(ctx context.Context, cfg Config) (*KernelResults, error) {
	res := &KernelResults{}
	dir, err := os.MkdirTemp("", "ip-masq-agent-bench-kernel-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)

	sizes, reps := []int{64, 10_000, 100_000}, 5
	onceSizes, pairs, onceN := []int{10_000, 100_000}, 5, 100_000
	restartN, restarts := 10_000, 3
	if cfg.Quick {
		sizes, reps = []int{64, 1000}, 2
		onceSizes, pairs, onceN = []int{1000}, 1, 1000
		restartN, restarts = 64, 1
	}
	for _, n := range sizes {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		cfg.logf("kernel side: read-back of %d CIDRs", n)
		row := ReadBackRow{N: n}
		err := withTopology("krb", func(topo *testnet.Topology) error { return readBack(ctx, topo, n, reps, &row) })
		res.ReadBack = append(res.ReadBack, row)
		if err != nil {
			return res, fmt.Errorf("read-back, %d CIDRs: %w", n, err)
		}
	}
	if cfg.Agent == "" {
		return res, errors.New("no agent binary given")
	}
	for _, n := range onceSizes {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		cfg.logf("kernel side: cold --once of %d CIDRs", n)
		path, err := writeConfig(dir, n, time.Minute)
		if err != nil {
			return res, err
		}
		row := OnceRow{N: n}
		err = withTopology("konce", func(topo *testnet.Topology) error {
			for range reps {
				if err := onceRun(ctx, cfg, topo, path, &row.Wall, &row.Took, &row.User, &row.Kernel); err != nil {
					return err
				}
				cfg.logf("kernel side: --once wall %s, user %s, system %s, took= %s", row.Wall[len(row.Wall)-1], row.User[len(row.User)-1], row.Kernel[len(row.Kernel)-1], row.Took[len(row.Took)-1])
			}
			return nil
		})
		res.Once = append(res.Once, row)
		if err != nil {
			return res, fmt.Errorf("cold --once, %d CIDRs: %w", n, err)
		}
	}

	cfg.logf("kernel side: the daemon's first apply of %d CIDRs against --once", onceN)
	path, err := writeConfig(dir, onceN, time.Hour)
	if err != nil {
		return res, err
	}
	res.Daemon = &DaemonFirst{N: onceN}
	if err := withTopology("kdf", func(topo *testnet.Topology) error {
		d := res.Daemon
		for i := range 2 * pairs {
			var err error
			if i%4 == 0 || i%4 == 3 { // once, daemon, daemon, once, ...: neither always goes first
				err = onceRun(ctx, cfg, topo, path, &d.OnceWall, &d.OnceTook, nil, nil)
			} else {
				err = daemonFirst(ctx, cfg, topo, path, d)
			}
			if err != nil {
				return err
			}
		}
		cfg.logf("kernel side: took= --once %v, daemon %v", d.OnceTook, d.DaemonTook)
		return nil
	}); err != nil {
		return res, fmt.Errorf("the daemon's first apply: %w", err)
	}

	for _, owned := range []bool{true, false} {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		cfg.logf("kernel side: restarts finding the table, %d CIDRs, owned %v", restartN, owned)
		path, err := writeConfig(dir, restartN, time.Hour)
		if err != nil {
			return res, err
		}
		r := Restart{Owned: owned, N: restartN}
		err = withTopology("krs", func(topo *testnet.Topology) error { return restartRuns(ctx, cfg, topo, path, restarts, &r) })
		res.Restarts = append(res.Restarts, r)
		if err != nil {
			return res, fmt.Errorf("restarts (owned %v): %w", owned, err)
		}
	}
	return res, nil
}

// writeConfig writes a config file of n IPv4 nonMasqueradeCIDRs.
func writeConfig(dir string, n int, resync time.Duration) (string, error) {
	c := config.Default(config.Flags{})
	c.NonMasqueradeCIDRs = cidrList(4, 0, n)
	c.CIDRLimit = max(n, 64)
	c.ResyncInterval = resync
	path := filepath.Join(dir, fmt.Sprintf("k-%d-%s.yaml", n, resync))
	return path, os.WriteFile(path, []byte(c.String()), 0o644)
}

func wantTable(n int) nft.Table {
	c := config.Default(config.Flags{})
	c.NonMasqueradeCIDRs = cidrList(4, 0, n)
	c.CIDRLimit = max(n, 64)
	return nft.Build(c, nft.Options{Chain: nft.DefaultChain, RandomFully: true})
}

// moveGeneration commits a transaction that changes nothing of the agent's
// table (an empty table ip x added and deleted), so that the next Read
// cannot reuse the last whole read.
func moveGeneration(fd int) error {
	c, err := nftables.New(nftables.WithNetNSFd(fd))
	if err != nil {
		return err
	}
	t := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: "x"}
	c.AddTable(t)
	c.DelTable(t)
	return c.Flush()
}

func readBack(ctx context.Context, topo *testnet.Topology, n, reps int, row *ReadBackRow) error {
	fd := int(topo.NodeHandle())
	want := wantTable(n)
	a := &kernel.Netlink{NetNS: fd, NoOwner: true}
	defer a.Close()
	if _, err := nft.Ensure(a, want); err != nil {
		return err
	}
	timed := func(f func() error) (time.Duration, error) {
		start := time.Now()
		err := f()
		return time.Since(start), err
	}
	resync := func(t *Timing) error {
		g0, err := generation(fd)
		if err != nil {
			return err
		}
		var res nft.Result
		d, err := timed(func() (err error) { res, err = nft.Ensure(a, want); return })
		if err != nil {
			return err
		}
		g1, err := generation(fd)
		if err != nil {
			return err
		}
		t.All = append(t.All, d)
		row.Sent += res.Messages
		if g1 != g0 {
			row.GenMoves++
		}
		if !res.Unchanged {
			row.NotUnchanged++
		}
		return nil
	}
	for range reps {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := moveGeneration(fd); err != nil {
			return fmt.Errorf("move the generation: %w", err)
		}
		var found *nft.Table
		d, err := timed(func() (err error) { found, _, err = a.Read(); return })
		if err != nil {
			return err
		}
		if found == nil || !want.Equal(*found) {
			return errors.New("the table read back is not the one applied")
		}
		row.Read.All = append(row.Read.All, d)
		d, err = timed(func() (err error) { _, _, err = a.Read(); return })
		if err != nil {
			return err
		}
		row.CachedRead.All = append(row.CachedRead.All, d)
		if err := moveGeneration(fd); err != nil {
			return fmt.Errorf("move the generation: %w", err)
		}
		if err := resync(&row.Resync); err != nil {
			return err
		}
		if err := resync(&row.CachedResync); err != nil {
			return err
		}
	}
	return nil
}

var (
	tookRE     = regexp.MustCompile(`took=([0-9.]+[a-zµ]+)`)
	messagesRE = regexp.MustCompile(`messages=(\d+)`)
	adoptedRE  = regexp.MustCompile(`adopted=(true|false)`)
)

// logLine returns the first line of out containing marker.
func logLine(out, marker string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, marker) {
			return l
		}
	}
	return ""
}

func tookOf(line string) (time.Duration, bool) {
	m := tookRE.FindStringSubmatch(line)
	if m == nil {
		return 0, false
	}
	d, err := time.ParseDuration(m[1])
	return d, err == nil
}

const appliedMarker = `msg="applied config"`

// deleteAndSettle deletes the table, and waits a little for the kernel to
// free it (deferred work): a first apply on a node does not come right
// after the deletion of a large table.
func deleteAndSettle(ctx context.Context, fd int) error {
	if err := dropTable(fd); err != nil {
		return err
	}
	sleepCtx(ctx, 300*time.Millisecond)
	return ctx.Err()
}

// onceRun deletes the table and runs `ip-masq-agent --once` (defaults:
// the table written unowned, as --once releases it at its end) on path.
func onceRun(ctx context.Context, cfg Config, topo *testnet.Topology, path string, wall, took, user, kernel *[]time.Duration) error {
	if err := deleteAndSettle(ctx, int(topo.NodeHandle())); err != nil {
		return err
	}
	r, err := runIn(ctx, topo.NodeHandle(), cfg.Agent, "--once", "--config", path)
	if err != nil {
		return err
	}
	d, ok := tookOf(logLine(r.Output, appliedMarker))
	if !ok {
		return fmt.Errorf("--once logged no %s with took=: %s", appliedMarker, harness.Tail(r.Output, 400))
	}
	*wall, *took = append(*wall, r.Took), append(*took, d)
	if user != nil {
		*user, *kernel = append(*user, r.User), append(*kernel, r.Kernel)
	}
	return nil
}

// daemonFirst deletes the table and starts the daemon (defaults: the table
// owned, the watch on) until its first apply.
func daemonFirst(ctx context.Context, cfg Config, topo *testnet.Topology, path string, r *DaemonFirst) error {
	if err := deleteAndSettle(ctx, int(topo.NodeHandle())); err != nil {
		return err
	}
	d, err := startDaemon(ctx, topo, cfg.Agent, "--config", path, "--http-address=127.0.0.1:0")
	if err != nil {
		return err
	}
	line, at, err := d.WaitLine(ctx, cmdTimeout, appliedMarker)
	if serr := d.Stop(); err == nil && serr != nil {
		err = serr
	}
	if err != nil {
		return err
	}
	took, ok := tookOf(line)
	if !ok {
		return fmt.Errorf("no took= in %q", line)
	}
	r.DaemonTook = append(r.DaemonTook, took)
	r.DaemonWall = append(r.DaemonWall, at.Sub(d.Started))
	return nil
}

const adoptMarker = `the kernel holds the config's table already`

// restartRuns starts the daemon, makes traffic count in its rules, then
// restarts it n times; each restart must find the table as it is.
func restartRuns(ctx context.Context, cfg Config, topo *testnet.Topology, path string, n int, r *Restart) error {
	fd := int(topo.NodeHandle())
	// --release-on-exit=false: the stopped agent leaves its table orphaned,
	// as a killed one does, and the next adopts it in place (the default
	// releases it at exit, and the next agent re-creates it owned).
	args := []string{"--config", path, "--http-address=127.0.0.1:0", "--own-table=" + strconv.FormatBool(r.Owned), "--release-on-exit=false"}
	d, err := startDaemon(ctx, topo, cfg.Agent, args...)
	if err != nil {
		return err
	}
	if _, _, err := d.WaitLine(ctx, cmdTimeout, appliedMarker); err != nil {
		d.Stop()
		return err
	}
	if err := topo.AddDestination(dataDst); err != nil {
		d.Stop()
		return err
	}
	reader := &kernel.Netlink{NetNS: fd, NoOwner: true}
	defer reader.Close()
	packets := func() (uint64, error) {
		cs, err := reader.DecisionCounters(nft.DefaultChain)
		var sum uint64
		for _, c := range cs {
			sum += c.Packets
		}
		return sum, err
	}
	r.CountersKept = true
	for i := range n {
		// New flows through the node's rules (masqueraded): the counters
		// move, so that a rewrite would show as a reset.
		for range 5 {
			if _, err := topo.SourceSeenUDP(dataDst); err != nil {
				d.Stop()
				return fmt.Errorf("traffic: %w", err)
			}
		}
		before, err := packets()
		if err != nil {
			d.Stop()
			return err
		}
		var line string
		var moved int
		if d, line, moved, err = restartDaemon(ctx, cfg, topo, d, args); err != nil {
			if d != nil {
				d.Stop()
			}
			return err
		}
		after, err := packets()
		if err != nil {
			d.Stop()
			return err
		}
		if !strings.Contains(line, adoptMarker) {
			r.NotRecognised++
		}
		m := messagesRE.FindStringSubmatch(line)
		msgs := -1
		if m != nil {
			msgs, _ = strconv.Atoi(m[1])
		}
		took, _ := tookOf(line)
		r.Messages = append(r.Messages, msgs)
		r.Adopted = append(r.Adopted, adoptedRE.FindStringSubmatch(line) != nil && adoptedRE.FindStringSubmatch(line)[1] == "true")
		r.Took = append(r.Took, took)
		r.GenMoves = append(r.GenMoves, moved)
		r.Before, r.After = append(r.Before, before), append(r.After, after)
		r.CountersKept = r.CountersKept && before > 0 && after >= before
		if i == 0 {
			r.Line = strings.TrimSpace(line)
		}
	}
	return d.Stop()
}
