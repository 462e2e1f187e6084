package testnet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"
)

// A busy production node, for tests and benchmarks: a CPU quota like a
// pod's limit, and a neighbour committing to its own nftables table.

// CPUGroup is a cgroup with a CPU quota (cgroup v2's cpu.max, or v1's
// cpu.cfs_quota_us), made for one test and removed by Close.
type CPUGroup struct {
	dir   string // the cgroup's directory
	Procs string // the file a process's pid is written to, to move it in
}

// NewCPUGroup makes a cgroup whose processes may use percent of one CPU,
// as a pod's CPU limit does (100m is 10). It needs root and the cpu
// controller (cgroup v2 with cpu in the root's subtree_control, which it
// enables, or v1's cpu hierarchy).
func NewCPUGroup(name string, percent int) (*CPUGroup, error) {
	const period = 100000 // µs, the kernel's default and the kubelet's
	quota := period * percent / 100
	name = fmt.Sprintf("ip-masq-agent-test-%s-%d", name, os.Getpid())
	if data, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		if !slices.Contains(strings.Fields(string(data)), "cpu") {
			return nil, errors.New("cgroup v2 without the cpu controller")
		}
		sub, _ := os.ReadFile("/sys/fs/cgroup/cgroup.subtree_control")
		if !slices.Contains(strings.Fields(string(sub)), "cpu") {
			if err := os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte("+cpu"), 0); err != nil {
				return nil, fmt.Errorf("enable the cpu controller: %w", err)
			}
		}
		dir := filepath.Join("/sys/fs/cgroup", name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			return nil, err
		}
		g := &CPUGroup{dir: dir, Procs: filepath.Join(dir, "cgroup.procs")}
		if err := os.WriteFile(filepath.Join(dir, "cpu.max"), []byte(fmt.Sprintf("%d %d", quota, period)), 0); err != nil {
			g.Close()
			return nil, fmt.Errorf("set cpu.max: %w", err)
		}
		return g, nil
	}
	root := "/sys/fs/cgroup/cpu"
	if _, err := os.Stat(filepath.Join(root, "cpu.cfs_quota_us")); err != nil {
		return nil, fmt.Errorf("no cgroup cpu controller (neither /sys/fs/cgroup/cgroup.controllers nor %s/cpu.cfs_quota_us)", root)
	}
	dir := filepath.Join(root, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	g := &CPUGroup{dir: dir, Procs: filepath.Join(dir, "cgroup.procs")}
	for file, v := range map[string]int{"cpu.cfs_period_us": period, "cpu.cfs_quota_us": quota} {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(strconv.Itoa(v)), 0); err != nil {
			g.Close()
			return nil, fmt.Errorf("set %s: %w", file, err)
		}
	}
	return g, nil
}

// Wrap returns the command that runs args in the group: a shell that moves
// itself in, then execs them (so their pid is the shell's).
func (g *CPUGroup) Wrap(args ...string) []string {
	return append([]string{"sh", "-c", `echo $$ > "$0" && exec "$@"`, g.Procs}, args...)
}

// Throttled returns how long the group's processes were kept off the CPU
// by the quota (cpu.stat's throttled time), for reports.
func (g *CPUGroup) Throttled() time.Duration {
	data, _ := os.ReadFile(filepath.Join(g.dir, "cpu.stat"))
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		n, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "throttled_usec":
			return time.Duration(n) * time.Microsecond
		case "throttled_time":
			return time.Duration(n)
		}
	}
	return 0
}

// Close removes the group; its processes must have exited.
func (g *CPUGroup) Close() error {
	var err error
	for range 50 { // a process that just exited may still be counted
		if err = os.Remove(g.dir); err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return err
}

// Neighbour commits to a table of its own in a network namespace at a
// fixed rate, as kube-proxy, a CNI or firewalld do on a busy node: each
// commit adds one element to its set and deletes the one before.
type Neighbour struct {
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	mu      sync.Mutex
	commits int
	err     error
}

// NewNeighbour starts committing every interval in the namespace ns
// (table inet neighbour) until Stop.
func NewNeighbour(ns netns.NsHandle, every time.Duration) (*Neighbour, error) {
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		return nil, err
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "neighbour"})
	s := &nftables.Set{Table: t, Name: "peers", KeyType: nftables.TypeIPAddr}
	if err := c.AddSet(s, nil); err != nil {
		return nil, err
	}
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("neighbour: create its table: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &Neighbour{cancel: cancel}
	n.wg.Go(func() {
		defer func() {
			c.DelTable(t)
			_ = c.Flush()
		}()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			key := func(i int) []byte { return []byte{198, 51, 100, byte(i % 250)} }
			_ = c.SetAddElements(s, []nftables.SetElement{{Key: key(i + 1)}})
			if i > 0 {
				_ = c.SetDeleteElements(s, []nftables.SetElement{{Key: key(i)}})
			}
			err := c.Flush()
			n.mu.Lock()
			if err != nil && n.err == nil {
				n.err = err
			}
			n.commits++
			n.mu.Unlock()
		}
	})
	return n, nil
}

// Stop stops the commits, deletes the table, and returns how many commits
// were made and the first error.
func (n *Neighbour) Stop() (int, error) {
	n.cancel()
	n.wg.Wait()
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.commits, n.err
}

// NewNFTNeighbour starts running the nft command in the namespace named ns,
// one batch after another as fast as it can, until Stop: each adds one
// element to a set of its own table (inet nft-neighbour) and deletes the
// one before, as kube-proxy's nftables mode (knftables, which runs nft)
// does on most syncs. Before such a batch nft reads every element of
// every interval set in the namespace, the agent's included.
func NewNFTNeighbour(ns string) (*Neighbour, error) {
	if out, err := Exec(ns, "nft", "add table inet nft-neighbour; add set inet nft-neighbour peers { type ipv4_addr; }"); err != nil {
		return nil, fmt.Errorf("nft neighbour: create its table: %w: %s", err, out)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &Neighbour{cancel: cancel}
	n.wg.Go(func() {
		defer Exec(ns, "nft", "delete table inet nft-neighbour")
		key := func(i int) string { return fmt.Sprintf("198.51.100.%d", i%250) }
		for i := 0; ctx.Err() == nil; i++ {
			batch := "add element inet nft-neighbour peers { " + key(i+1) + " }"
			if i > 0 {
				batch += "; delete element inet nft-neighbour peers { " + key(i) + " }"
			}
			_, err := Exec(ns, "nft", batch)
			n.mu.Lock()
			if err != nil && n.err == nil {
				n.err = err
			}
			n.commits++
			n.mu.Unlock()
		}
	})
	return n, nil
}

// Commits returns how many commits the neighbour has made so far.
func (n *Neighbour) Commits() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.commits
}
