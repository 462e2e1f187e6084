package bench

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// Data plane kinds.
const (
	KindNone      = "no rules"
	KindConntrack = "conntrack only"
	KindAgent     = "agent (nft interval set)"
	// KindAgentNoMark is the agent's table with --conntrack-label=none:
	// its masquerade rules do not set the conntrack label, the data-plane
	// cost of which is the difference to KindAgent.
	KindAgentNoMark = "agent, --conntrack-label=none"
	// KindAgentSelectors is the agent's table with every selector of
	// issue 33 in use (selectorsConfig), traffic passing every rule.
	KindAgentSelectors = "agent, every selector in use"
	KindIPTNFT         = "iptables-nft chain"
	KindIPTLegacy      = "iptables-legacy chain"
)

// dataDst is the destination of every connection: an "internet" host in
// the ext namespace, covered by none of the CIDR lists.
var dataDst = netip.MustParseAddr("203.0.113.10")

const dataPort = 8081 // not testnet.ServerPort: the harness runs its own server

// DataPoint is one configuration of the node.
type DataPoint struct {
	Kind string
	N    int // non-masquerade CIDRs (0 for the baselines)

	Rates   []float64 // new connections per second, per repetition
	CPU     []float64 // harness CPU ns per connection, per repetition (see RunData)
	SysCPU  []float64 // system-wide busy CPU ns per connection, per repetition
	Conns   int64     // connections made, all repetitions
	Errors  int64     // connections that failed
	Masq    int64     // connections the server saw from the node's address
	Direct  int64     // ... from the pod's address
	Other   int64     // ... from any other address
	Skipped string    // why the point was not measured

	topo   *testnet.Topology
	server *acceptServer
}

func (p *DataPoint) Rate() float64  { return median(p.Rates) }
func (p *DataPoint) CPUns() float64 { return median(p.CPU) }
func (p *DataPoint) SysNs() float64 { return median(p.SysCPU) }
func (p *DataPoint) WantMasq() bool { return p.Kind != KindNone && p.Kind != KindConntrack }
func (p *DataPoint) Measured() bool { return p != nil && len(p.Rates) > 0 }
func (p *DataPoint) Label() string  { return fmt.Sprintf("%s, %d CIDRs", p.Kind, p.N) }

// wrongNAT counts the connections that arrived with the wrong source.
func (p *DataPoint) wrongNAT() int64 {
	if p.WantMasq() {
		return p.Direct + p.Other
	}
	return p.Masq + p.Other
}

// agentKind says whether the point is one of the agent's tables.
func (p *DataPoint) agentKind() bool {
	return p.Kind == KindAgent || p.Kind == KindAgentNoMark || p.Kind == KindAgentSelectors
}

// DataResults are the data plane figures.
type DataResults struct {
	Points   []*DataPoint
	Duration time.Duration // per repetition and point
	Reps     int
	Clients  int // connecting threads
	Softirqd bool
}

// Find returns the point of a kind and N, or nil.
func (d *DataResults) Find(kind string, n int) *DataPoint {
	for _, p := range d.Points {
		if p.Kind == kind && p.N == n {
			return p
		}
	}
	return nil
}

// Ns are the CIDR counts of the data plane.
func (d *DataResults) Ns() []int {
	var ns []int
	for _, p := range d.Points {
		if p.Kind == KindAgent {
			ns = append(ns, p.N)
		}
	}
	return ns
}

// RunData measures new TCP connections per second from the pod through the
// node to an external host, and the CPU time each one costs, for each
// configuration of the node: no rules, conntrack only, the agent's table
// and the original agent's iptables chain (nft and legacy backends), at
// several list sizes. Each configuration has its own topology, set up
// first; the repetitions then go round all of them in turn, so that a
// change of the load from other tenants hits every configuration alike.
//
// A connection is socket, connect (the whole handshake), and close with
// SO_LINGER 0 (a reset: no TIME_WAIT, so ports never run out); the server
// in the ext namespace accepts and closes. CPU per connection is the CPU
// time of this process (client, server and the softirq work done in their
// context: the kernel here does no separate IRQ time accounting) plus that
// of the ksoftirqd threads, over the connections made: other tenants'
// load does not enter it. The system-wide busy time from /proc/stat is
// reported next to it.
func RunData(ctx context.Context, cfg Config) (*DataResults, error) {
	res := &DataResults{Duration: 2 * time.Second, Reps: 5, Clients: 2 * runtime.NumCPU()}
	ns := []int{1, 64, 1000, 10_000, 50_000}
	if cfg.Quick {
		res.Duration, res.Reps, ns = 300*time.Millisecond, 1, []int{1, 1000}
	}
	res.Points = append(res.Points, &DataPoint{Kind: KindNone}, &DataPoint{Kind: KindConntrack})
	for _, kind := range []string{KindAgent, KindIPTNFT, KindIPTLegacy} {
		for _, n := range ns {
			res.Points = append(res.Points, &DataPoint{Kind: kind, N: n})
		}
	}
	// The cost of the conntrack mark: the agent's table without it, at
	// the smallest list (where the mark's share of the cost is largest).
	res.Points = append(res.Points, &DataPoint{Kind: KindAgentNoMark, N: ns[0]})
	return res, runPoints(ctx, cfg, "data plane", res, nil)
}

// runPoints sets up every point of res (then calls after, if not nil, on
// each point set up), then measures them all, res.Reps times round.
func runPoints(ctx context.Context, cfg Config, part string, res *DataResults, after func(*DataPoint) error) (err error) {
	dir, err := os.MkdirTemp("", "ip-masq-agent-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	defer func() {
		for _, p := range res.Points {
			if p.server != nil {
				p.server.close()
			}
			if p.topo != nil {
				err = errors.Join(err, p.topo.Close())
			}
		}
	}()

	for _, p := range res.Points {
		if err := ctx.Err(); err != nil {
			return err
		}
		cfg.logf("%s: set up %s", part, p.Label())
		if err := setupPoint(ctx, dir, p); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if p.agentKind() || p.Kind == KindNone || p.Kind == KindConntrack {
				return fmt.Errorf("%s: %w", p.Label(), err)
			}
			p.Skipped = oneLine(err.Error())
			cfg.logf("%s: %s not measured: %s", part, p.Label(), p.Skipped)
			continue
		}
		if after != nil {
			if err := after(p); err != nil {
				return fmt.Errorf("%s: %w", p.Label(), err)
			}
		}
	}
	cpu := newCPUMeter()
	res.Softirqd = len(cpu.softirqd) > 0
	for rep := range res.Reps {
		// Rotate the order, so that no configuration always runs first.
		for i := range res.Points {
			p := res.Points[(i+rep)%len(res.Points)]
			if p.Skipped != "" {
				continue
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := measurePoint(ctx, p, res.Duration, res.Clients, cpu); err != nil {
				return fmt.Errorf("%s: %w", p.Label(), err)
			}
			last := len(p.Rates) - 1
			cfg.logf("%s: %-40s rep %d: %8.0f conn/s  %6.1f µs CPU/conn", part, p.Label(), rep+1, p.Rates[last], p.CPU[last]/1e3)
			if p.Kind == KindIPTNFT || p.Kind == KindIPTLegacy || p.agentKind() {
				// Give conntrack's garbage collection room between points.
				sleepCtx(ctx, 100*time.Millisecond)
			}
		}
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// setupPoint creates the point's topology, its rules and its server.
func setupPoint(ctx context.Context, dir string, p *DataPoint) error {
	topo, err := newTopology("dp")
	if err != nil {
		return err
	}
	p.topo = topo
	if err := topo.AddDestination(dataDst); err != nil {
		return err
	}
	node := topo.NodeHandle()
	masqAddr := topo.NodeUplink4 // the source a masqueraded connection carries
	switch p.Kind {
	case KindNone:
	case KindConntrack:
		// One rule that needs conntrack, no NAT.
		if _, err := topo.NFT("add table inet bench-ct; " +
			"add chain inet bench-ct c { type filter hook postrouting priority srcnat + 10; policy accept; }; " +
			"add rule inet bench-ct c ct state new counter"); err != nil {
			return err
		}
	case KindAgent, KindAgentNoMark:
		c := config.Default(config.Flags{})
		c.NonMasqueradeCIDRs = cidrList(4, 0, p.N)
		c.CIDRLimit = max(p.N, 64)
		rs := nft.Build(c, agentOptions(p.Kind == KindAgent))
		if err := ensureClosed(int(node), rs); err != nil {
			return err
		}
	case KindAgentSelectors:
		// snatAddress is a second address of the uplink: the server
		// counts a connection masqueraded only if the snat rule took it.
		if err := topo.AddNodeAddress(testnet.NodeUplinkIf, netip.PrefixFrom(selectorsSNAT, 24)); err != nil {
			return err
		}
		masqAddr = selectorsSNAT
		c, o := selectorsConfig(p.N)
		rs := nft.Build(c, o)
		if err := ensureClosed(int(node), rs); err != nil {
			return err
		}
	case KindIPTNFT, KindIPTLegacy:
		bin := "iptables-nft"
		if p.Kind == KindIPTLegacy {
			bin = "iptables-legacy"
		}
		if !have(bin, bin+"-restore") {
			return fmt.Errorf("%s is not installed", bin)
		}
		file := filepath.Join(dir, fmt.Sprintf("dp-%d.rules", p.N))
		if err := os.WriteFile(file, []byte(iptablesRestoreText(4, cidrList(4, 0, p.N))), 0o644); err != nil {
			return err
		}
		if err := iptablesSetup(ctx, node, bin); err != nil {
			return err
		}
		if _, err := runIn(ctx, node, bin+"-restore", "--noflush", file); err != nil {
			return err
		}
	}
	p.server, err = newAcceptServer(topo, dataPort, masqAddr)
	if err != nil {
		return err
	}
	// One connection, to check that the path works before timing it.
	clients := startClients(topo, 1, 1)
	defer clients.stop()
	if c, _ := clients.wait(); c != 1 {
		return fmt.Errorf("a test connection to %s:%d failed", dataDst, dataPort)
	}
	return nil
}

// measurePoint runs one repetition: clients connect for d.
func measurePoint(ctx context.Context, p *DataPoint, d time.Duration, n int, cpu *cpuMeter) error {
	m0, d0, o0 := p.server.masq.Load(), p.server.direct.Load(), p.server.other.Load()
	clients := startClients(p.topo, n, 50_000_000)
	defer clients.stop()
	if err := clients.ready(); err != nil {
		return err
	}
	before := cpu.read()
	start := time.Now()
	clients.go_()
	sleepCtx(ctx, d)
	clients.stop()
	conns, errs := clients.wait()
	wall := time.Since(start)
	after := cpu.read()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if conns == 0 {
		return fmt.Errorf("no connection succeeded (%d failed)", errs)
	}
	p.Conns += conns
	p.Errors += errs
	p.Rates = append(p.Rates, float64(conns)/wall.Seconds())
	p.CPU = append(p.CPU, float64(after.harness-before.harness)/float64(conns))
	p.SysCPU = append(p.SysCPU, float64(after.system-before.system)/float64(conns))
	// The server may still be accepting the last ones.
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) && p.server.masq.Load()+p.server.direct.Load()+p.server.other.Load()-m0-d0-o0 < conns {
		time.Sleep(10 * time.Millisecond)
	}
	p.Masq += p.server.masq.Load() - m0
	p.Direct += p.server.direct.Load() - d0
	p.Other += p.server.other.Load() - o0
	return nil
}

// --- clients ---

type clients struct {
	wg               sync.WaitGroup
	readyc           chan error
	start            chan struct{}
	started          atomic.Bool
	stopped          atomic.Bool
	conns, errs      atomic.Int64
	n                int
	stopOnce, goOnce sync.Once
}

// startClients starts n connecting threads in the pod namespace; each
// makes at most limit connections. They wait for go_.
func startClients(topo *testnet.Topology, n int, limit int64) *clients {
	c := &clients{readyc: make(chan error, n), start: make(chan struct{}), n: n}
	podNS, err := netns.GetFromName(topo.PodNS)
	for range n {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			sa := &unix.SockaddrInet4{Port: dataPort, Addr: dataDst.As4()} // one each: Connect writes to it
			// The thread stays in the pod namespace and is never unlocked:
			// it ends with this goroutine.
			runtime.LockOSThread()
			if err != nil {
				c.readyc <- err
				return
			}
			if err := netns.Set(podNS); err != nil {
				c.readyc <- err
				return
			}
			c.readyc <- nil
			<-c.start
			for i := int64(0); i < limit && !c.stopped.Load(); i++ {
				if connectOnce(sa) {
					c.conns.Add(1)
				} else {
					c.errs.Add(1)
				}
			}
		}()
	}
	go func() {
		c.wg.Wait()
		if err == nil {
			podNS.Close()
		}
	}()
	return c
}

func (c *clients) ready() error {
	var errs []error
	for range c.n {
		errs = append(errs, <-c.readyc)
	}
	return errors.Join(errs...)
}

func (c *clients) go_() { c.goOnce.Do(func() { close(c.start) }) }

func (c *clients) stop() {
	c.stopped.Store(true)
	c.go_() // threads still waiting to start end at once
}

// wait waits for the threads to end (at most 10s: each connection attempt
// is bounded by its 1s timeout) and returns the counts.
func (c *clients) wait() (conns, errs int64) {
	c.go_()
	done := make(chan struct{})
	go func() { c.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
	return c.conns.Load(), c.errs.Load()
}

// connectOnce makes one TCP connection from the calling thread's namespace
// and resets it.
func connectOnce(sa *unix.SockaddrInet4) bool {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	// Close sends a reset: no TIME_WAIT, no port exhaustion.
	_ = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
	// Bounds the blocking connect.
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &unix.Timeval{Sec: 1})
	return unix.Connect(fd, sa) == nil
}

// --- the server ---

// acceptServer accepts and closes connections in the ext namespace, and
// counts their source addresses.
type acceptServer struct {
	fd            int
	wg            sync.WaitGroup
	masq, direct  atomic.Int64
	other         atomic.Int64
	closeOnce     sync.Once
	nodeAddr, pod [4]byte
}

// newAcceptServer counts a connection from masqAddr as masqueraded.
func newAcceptServer(topo *testnet.Topology, port int, masqAddr netip.Addr) (*acceptServer, error) {
	s := &acceptServer{fd: -1, nodeAddr: masqAddr.As4(), pod: topo.Pod4.As4()}
	ext, err := netns.GetFromName(topo.ExtNS)
	if err != nil {
		return nil, err
	}
	defer ext.Close()
	// The socket is created in ext; accepting works from any thread.
	err = testnet.InNS(ext, func() error {
		var err error
		s.fd, err = listen(port)
		return err
	})
	if err != nil {
		if s.fd >= 0 {
			unix.Close(s.fd)
		}
		return nil, fmt.Errorf("listen in %s: %w", topo.ExtNS, err)
	}
	for range 2 {
		s.wg.Add(1)
		go s.serve()
	}
	return s, nil
}

func listen(port int) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: port}); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if err := unix.Listen(fd, 4096); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// serve accepts until the socket is shut down (blocking accept: one OS
// thread per serving goroutine, no poller round trips).
func (s *acceptServer) serve() {
	defer s.wg.Done()
	for {
		nfd, sa, err := unix.Accept4(s.fd, unix.SOCK_CLOEXEC)
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.ECONNABORTED) {
			continue
		}
		if err != nil {
			return // shut down
		}
		if a, ok := sa.(*unix.SockaddrInet4); ok {
			switch a.Addr {
			case s.nodeAddr:
				s.masq.Add(1)
			case s.pod:
				s.direct.Add(1)
			default:
				s.other.Add(1)
			}
		}
		unix.Close(nfd)
	}
}

func (s *acceptServer) close() {
	s.closeOnce.Do(func() {
		unix.Shutdown(s.fd, unix.SHUT_RDWR) // wakes the blocked accepts
		done := make(chan struct{})
		go func() { s.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
		}
		unix.Close(s.fd)
	})
}

// --- CPU time ---

type cpuMeter struct {
	softirqd []string // /proc/PID/schedstat of each ksoftirqd thread
}

type cpuSample struct {
	harness int64 // ns: this process (all threads) + ksoftirqd threads
	system  int64 // ns: busy time of all CPUs (/proc/stat)
}

func newCPUMeter() *cpuMeter {
	m := &cpuMeter{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err == nil && strings.HasPrefix(string(comm), "ksoftirqd/") {
			m.softirqd = append(m.softirqd, filepath.Join("/proc", e.Name(), "schedstat"))
		}
	}
	return m
}

// clockTick is USER_HZ, the unit of /proc/stat: 100 on Linux.
const clockTick = 100

func (m *cpuMeter) read() cpuSample {
	var s cpuSample
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.harness = ru.Utime.Nano() + ru.Stime.Nano()
	}
	for _, f := range m.softirqd {
		if b, err := os.ReadFile(f); err == nil {
			if fields := strings.Fields(string(b)); len(fields) > 0 {
				v, _ := strconv.ParseInt(fields[0], 10, 64) // ns on CPU
				s.harness += v
			}
		}
	}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
		if len(f) >= 8 && f[0] == "cpu" {
			var busy int64
			for _, i := range []int{1, 2, 3, 6, 7} {
				v, _ := strconv.ParseInt(f[i], 10, 64)
				busy += v
			}
			s.system = busy * (1e9 / clockTick)
		}
	}
	return s
}
