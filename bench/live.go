package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/harness"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// LiveRow is the reload and repair latencies of the daemon at one list size.
type LiveRow struct {
	N              int
	Neighbour      bool            // a neighbour committed to its own table every second (reloads only)
	Reload, Repair []time.Duration // one per successful trial
	ReloadFailed   int             // trials with no commit by the agent within trialTimeout
	RepairFailed   int
	// How long the agent's threads waited on a run queue for a CPU during
	// each trial (from /proc/PID/task/*/schedstat): on a loaded machine the
	// slow trials are mostly this.
	ReloadWait, RepairWait []time.Duration
	// RepairFloor is, after each repair trial, the floor's (floor.go):
	// the same table deleted the same way in another namespace and
	// created again by a bare client as soon as the deletion's
	// notification is read.
	RepairFloor []time.Duration
	// The agent is restarted every repairsPerLife repairs: messages its
	// restarts sent and commits seen across them (want 0: not owned, the
	// table found in place is left alone).
	Restarts, RestartMessages, RestartGenMoves int
}

// repairsPerLife is how many repairs one agent process makes in the
// trials: the agent takes a third repair within 10 s for the sign of a
// rival writer and backs off before the next one.
const repairsPerLife = 3

// LiveResults are the live operation figures.
type LiveResults struct {
	Rows   []LiveRow
	Trials int
}

// slowTrial is a trial slow enough for the agent's log to be shown.
const slowTrial = 500 * time.Millisecond

// trialTimeout bounds the wait for the agent's commit in one trial.
const trialTimeout = 5 * time.Second

// agentComm is the agent's command name, which the kernel puts in the
// NEWGEN notification of every transaction it commits.
const agentComm = "ip-masq-agent"

// RunLive runs the agent binary as a daemon in a node namespace (resync
// interval 1h, so that every commit it makes is caused by a trial) and
// measures, from the nftables notifications of the namespace:
//
//   - reload latency: from the rename that swaps a ConfigMap volume's ..data
//     symlink (the kubelet's atomic update; each trial changes one CIDR) to
//     the agent's commit of the new rules;
//   - repair latency: from the commit of a foreign `delete table` (sent by
//     this process over netlink) to the agent's commit re-creating it.
func RunLive(ctx context.Context, cfg Config) (*LiveResults, error) {
	if cfg.Agent == "" {
		return nil, errors.New("no agent binary given")
	}
	res := &LiveResults{Trials: 100}
	sizes := []int{64, 10_000}
	if cfg.Quick {
		res.Trials, sizes = 5, []int{64}
	}
	for _, neighbour := range []bool{false, true} {
		for _, n := range sizes {
			if err := ctx.Err(); err != nil {
				return res, err
			}
			cfg.logf("live operation: %d CIDRs, %d trials each, neighbour %v", n, res.Trials, neighbour)
			row := LiveRow{N: n, Neighbour: neighbour}
			err := withTopology("live", func(topo *testnet.Topology) error {
				return liveRow(ctx, cfg, topo, res.Trials, &row)
			})
			res.Rows = append(res.Rows, row)
			if err != nil {
				return res, fmt.Errorf("%d CIDRs: %w", n, err)
			}
		}
	}
	return res, nil
}

func liveRow(ctx context.Context, cfg Config, topo *testnet.Topology, trials int, row *LiveRow) (err error) {
	configs := oneCIDRApart(row.N)
	cm, remove, err := newConfigMap("live", configs[0])
	if err != nil {
		return err
	}
	defer remove()

	mon, err := newGenMonitor(int(topo.NodeHandle()))
	if err != nil {
		return err
	}
	defer mon.close()

	args := []string{"--config", cm.Path(configKey), "--http-address=127.0.0.1:0", "--own-table=false"} // repairs are measured: nobody could delete an owned table
	d, err := startDaemon(ctx, topo, cfg.Agent, args...)
	if err != nil {
		return err
	}
	defer stopDaemon(&d, &err)
	if _, ok := mon.waitAgent(ctx, time.Time{}, 20*time.Second); !ok {
		return errors.New("the agent made no first commit within 20s")
	}
	// Between trials, wait until the agent is done with the last one (it
	// logs after its nft.Ensure returns), and a little more: in real use, updates
	// come seconds apart, not while the agent still works on the last one.
	idle := func(marker string, n int) {
		d.WaitCount(ctx, trialTimeout, marker, n)
		sleepCtx(ctx, 50*time.Millisecond)
	}
	const reloaded, repaired = `msg="applied new config"`, `msg="the table differed from the wanted one; put it back"`
	pid := d.Pid()
	idle(`msg="applied config"`, 1)
	// measure waits for the agent's commit after since (trial i of kind),
	// and notes how long it took and how long the agent waited for a CPU
	// meanwhile (from w0), or that it failed.
	measure := func(kind string, i int, since time.Time, w0 time.Duration, took, wait *[]time.Duration, failed *int) {
		at, ok := mon.waitAgent(ctx, since, trialTimeout)
		if !ok {
			*failed++
			return
		}
		*took = append(*took, at.Sub(since))
		if at.Sub(since) > slowTrial {
			cfg.logf("live operation: %s trial %d took %s; the agent's log ends:\n%s", kind, i+1, at.Sub(since), harness.Tail(d.Output(), 1500))
		}
		*wait = append(*wait, runQueueWait(pid)-w0)
	}
	if row.Neighbour {
		// Reloads only: the harness tells its own deletions of the table
		// from the agent's commits by process, and the neighbour runs in it.
		n, err := testnet.NewNeighbour(topo.NodeHandle(), time.Second)
		if err != nil {
			return err
		}
		defer n.Stop()
	}

	for i := range trials {
		if err := ctx.Err(); err != nil {
			return err
		}
		mon.drain()
		w0 := runQueueWait(pid)
		swapped, err := update(cm, configs[(i+1)%2])
		if err != nil {
			return err
		}
		measure("reload", i, swapped, w0, &row.Reload, &row.ReloadWait, &row.ReloadFailed)
		idle(reloaded, i+1)
	}
	var fl *floor
	for i := range trials {
		if err := ctx.Err(); err != nil {
			return err
		}
		if row.Neighbour {
			break
		}
		if i > 0 && i%repairsPerLife == 0 {
			// A fourth repair within 10 s would be taken for a rival
			// writer's doing and delayed (backoff): a new agent process,
			// which finds the table in place and sends nothing.
			var line string
			var moved int
			if d, line, moved, err = restartDaemon(ctx, cfg, topo, d, args); err != nil {
				return err
			}
			row.Restarts++
			if m := messagesRE.FindStringSubmatch(line); m != nil {
				n, _ := strconv.Atoi(m[1])
				row.RestartMessages += n
			}
			row.RestartGenMoves += moved
			pid = d.Pid()
			sleepCtx(ctx, 50*time.Millisecond)
		}
		mon.drain()
		w0 := runQueueWait(pid)
		if err := deleteTable(int(topo.NodeHandle())); err != nil {
			return fmt.Errorf("delete the table: %w", err)
		}
		acked := time.Now()
		deleted, ok := mon.waitForeign(ctx, trialTimeout)
		if !ok {
			return errors.New("the monitor did not see the table's deletion")
		}
		// The kernel acked the deletion after committing it: when the
		// monitor reads its notification later than that (it waited for a
		// CPU), the ack's time is the closer one.
		if acked.Before(deleted) {
			deleted = acked
		}
		measure("repair", i, deleted, w0, &row.Repair, &row.RepairWait, &row.RepairFailed)
		idle(repaired, i%repairsPerLife+1)
		if fl == nil {
			if fl, err = newFloor(topo, row.N); err != nil {
				return err
			}
			defer func() { err = errors.Join(err, fl.Close()) }()
		}
		took, err := fl.repair(ctx)
		if err != nil {
			return fmt.Errorf("the floor's repair: %w", err)
		}
		row.RepairFloor = append(row.RepairFloor, took)
	}
	// The table is back and whole.
	if _, err := topo.NFT("list", "set", "inet", nft.TableName, nft.SetNonMasqV4); err != nil {
		return fmt.Errorf("after the trials: %w", err)
	}
	return nil
}

// runQueueWait is the time all threads of process pid have spent waiting
// on a run queue for a CPU.
func runQueueWait(pid int) time.Duration { return schedstat(pid, 1) }

// processCPU is the CPU time all threads of process pid have used so far.
func processCPU(pid int) time.Duration { return schedstat(pid, 0) }

// schedstat is the sum over all threads of process pid of field i of
// their /proc schedstat (0: time on a CPU, 1: time waiting on a run
// queue, in nanoseconds).
func schedstat(pid, i int) time.Duration {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var sum int64
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if fields := strings.Fields(string(b)); len(fields) > i {
			v, _ := strconv.ParseInt(fields[i], 10, 64)
			sum += v
		}
	}
	return time.Duration(sum)
}

// deleteTable deletes the agent's table as another program would: one
// transaction over netlink; Flush returns at the kernel's ack.
func deleteTable(netnsFD int) error {
	c, err := nftables.New(nftables.WithNetNSFd(netnsFD))
	if err != nil {
		return err
	}
	c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: nft.TableName})
	return c.Flush()
}

// --- the ConfigMap volume and the daemon ---

// configKey is the ConfigMap's key, the file the agent is given.
const configKey = "ip-masq-agent"

// newConfigMap lays content out as a ConfigMap volume (the kubelet's
// layout) in a new temporary directory, which remove deletes.
func newConfigMap(part, content string) (cm *harness.Volume, remove func(), err error) {
	dir, err := os.MkdirTemp("", "ip-masq-agent-bench-"+part+"-")
	if err != nil {
		return nil, nil, err
	}
	remove = func() { os.RemoveAll(dir) }
	if cm, err = harness.NewVolume(dir, map[string]string{configKey: content}); err != nil {
		remove()
		return nil, nil, err
	}
	return cm, remove, nil
}

// update swaps content in as the ConfigMap's new data and returns the time
// of the swap (the rename of ..data).
func update(cm *harness.Volume, content string) (time.Time, error) {
	return cm.Update(map[string]string{configKey: content})
}

// startDaemon starts the agent binary with args in the node namespace;
// ctx's end sends it SIGTERM, and the harness's death SIGKILL.
func startDaemon(ctx context.Context, topo *testnet.Topology, bin string, args ...string) (*harness.Daemon, error) {
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	d := harness.New(cmd)
	d.MaxLog = 1 << 20
	if err := d.StartIn(topo.NodeHandle()); err != nil {
		return nil, err
	}
	go func() {
		select {
		case <-ctx.Done():
			d.Cmd.Process.Signal(syscall.SIGTERM)
		case <-d.Exited():
		}
	}()
	return d, nil
}

// stopDaemon stops *d (the daemon a row runs last, if any) when the row
// ends, and adds the end of its log to *err, if any.
func stopDaemon(d **harness.Daemon, err *error) {
	if *d == nil {
		return
	}
	if serr := (*d).Stop(); serr != nil {
		*err = errors.Join(*err, serr)
	}
	if *err != nil {
		*err = fmt.Errorf("%w\nagent log (end):\n%s", *err, harness.Tail((*d).Output(), 2000))
	}
}

// restartDaemon stops d and starts the agent again with args, until its
// first sync; it returns the new daemon (also with an error, once
// started: the caller stops it), the sync's log line and by how many the
// nftables generation moved in between.
func restartDaemon(ctx context.Context, cfg Config, topo *testnet.Topology, d *harness.Daemon, args []string) (*harness.Daemon, string, int, error) {
	if err := d.Stop(); err != nil {
		return nil, "", 0, fmt.Errorf("stop the agent: %w", err)
	}
	g0, err := generation(int(topo.NodeHandle()))
	if err != nil {
		return nil, "", 0, err
	}
	if d, err = startDaemon(ctx, topo, cfg.Agent, args...); err != nil {
		return nil, "", 0, err
	}
	line, _, err := d.WaitLine(ctx, cmdTimeout, adoptMarker, appliedMarker)
	if err != nil {
		return d, "", 0, err
	}
	g1, err := generation(int(topo.NodeHandle()))
	if err != nil {
		return d, "", 0, err
	}
	return d, line, int(g1 - g0), nil
}

// --- the monitor ---

// genEvent is one committed transaction, as the monitor saw it.
type genEvent struct {
	at   time.Time
	gen  gen
	port uint32 // netlink port id of the committing socket
}

// genMonitor timestamps the nftables NEWGEN notifications of a namespace:
// one per committed transaction, naming the committing process.
type genMonitor struct {
	conn   *netlink.Conn
	events chan genEvent
	done   chan struct{}
}

func newGenMonitor(netnsFD int) (*genMonitor, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: netnsFD})
	if err != nil {
		return nil, err
	}
	if err := conn.JoinGroup(unix.NFNLGRP_NFTABLES); err != nil {
		conn.Close()
		return nil, err
	}
	// The re-creation of a table of 10,000 CIDRs is echoed as about 1 MiB.
	if raw, err := conn.SyscallConn(); err == nil {
		raw.Control(func(fd uintptr) {
			if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20) != nil {
				unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 64<<20)
			}
		})
	}
	m := &genMonitor{conn: conn, events: make(chan genEvent, 4096), done: make(chan struct{})}
	go m.read()
	return m, nil
}

func (m *genMonitor) read() {
	defer close(m.done)
	raw, err := m.conn.SyscallConn()
	if err != nil {
		return
	}
	buf := make([]byte, 1<<20)
	for {
		var n int
		var rerr error
		err := raw.Read(func(fd uintptr) bool {
			n, _, rerr = unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
			return rerr != unix.EAGAIN
		})
		now := time.Now()
		if err == nil {
			err = rerr
		}
		if errors.Is(err, unix.ENOBUFS) {
			continue // lost notifications of elements; a NEWGEN is sent last
		}
		if err != nil {
			return // closed
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			continue
		}
		for _, msg := range msgs {
			if msg.Header.Type != unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWGEN {
				continue
			}
			if g, ok := parseGen(msg.Data); ok {
				select {
				case m.events <- genEvent{at: now, gen: g, port: msg.Header.Pid}:
				default:
				}
			}
		}
	}
}

func (m *genMonitor) drain() {
	for {
		select {
		case <-m.events:
		default:
			return
		}
	}
}

// waitAgent returns the time of the agent's next commit seen after since.
func (m *genMonitor) waitAgent(ctx context.Context, since time.Time, timeout time.Duration) (time.Time, bool) {
	return m.wait(ctx, timeout, func(e genEvent) bool { return e.gen.proc == agentComm && !e.at.Before(since) })
}

// waitForeign returns the time of the next commit by another process than
// the agent (this one).
func (m *genMonitor) waitForeign(ctx context.Context, timeout time.Duration) (time.Time, bool) {
	return m.wait(ctx, timeout, func(e genEvent) bool { return e.gen.proc != agentComm })
}

// waitGen returns the time of the commit that made generation id.
func (m *genMonitor) waitGen(ctx context.Context, id uint32, timeout time.Duration) (time.Time, bool) {
	return m.wait(ctx, timeout, func(e genEvent) bool { return e.gen.id == id })
}

func (m *genMonitor) wait(ctx context.Context, timeout time.Duration, match func(genEvent) bool) (time.Time, bool) {
	deadline := time.After(timeout)
	for {
		select {
		case e := <-m.events:
			if match(e) {
				return e.at, true
			}
		case <-deadline:
			return time.Time{}, false
		case <-ctx.Done():
			return time.Time{}, false
		case <-m.done:
			return time.Time{}, false
		}
	}
}

func (m *genMonitor) close() {
	m.conn.Close()
	<-m.done
}
