// Package bench measures the agent side by side with the tools it replaces:
// `nft -f` of the same ruleset and `iptables-restore` of the chain the
// original ip-masq-agent writes (iptables-nft and iptables-legacy), on the
// control plane (apply times, peak RSS), the data plane (new connections per
// second and CPU time per new connection through a node namespace) and in
// live operation (reload and repair latency of the real daemon).
//
// Everything kernel-side happens in network namespaces created with
// internal/testnet and deleted afterwards, also when the run is interrupted
// (the context is cancelled: every loop is bounded and checks it, and every
// topology is closed by a deferred call). Namespaces left behind by a run
// that was killed outright (SIGKILL) are removed by the next run (Sweep).
//
// The machine is shared and noisy, so every figure is the median of several
// repetitions and is compared with a reference measured in the same run.
// Run renders nothing: see Markdown.
package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/harness"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
)

// Config says what to run.
type Config struct {
	Agent string    // the agent binary (bin/ip-masq-agent); needed for RSS and live operation
	Quick bool      // tiny sizes, one or two repetitions: a smoke run of seconds
	Log   io.Writer // progress lines; nil: discarded
	// Parts to run: any of "control", "kernel", "data", "selectors", "live",
	// "conntrack", "busy", "neighbour", "cpu"; empty means all. "busy-nft"
	// is busy's rows with an nft neighbour alone.
	Parts []string
}

func (c Config) wants(part string) bool { return len(c.Parts) == 0 || slices.Contains(c.Parts, part) }

func (c Config) logf(format string, a ...any) {
	if c.Log != nil {
		fmt.Fprintf(c.Log, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, a...)...)
	}
}

// Results is everything one run measured.
type Results struct {
	Quick      bool
	Command    string
	Start, End time.Time
	Machine    Machine
	LoadEnd    string            // /proc/loadavg at the end
	Load       map[string]string // /proc/loadavg at the start of each part

	Control      *ControlResults
	ControlErr   error
	Data         *DataResults
	DataErr      error
	Selectors    *SelectorResults
	SelectorsErr error
	Live         *LiveResults
	LiveErr      error
	Kernel       *KernelResults
	KernelErr    error
	Conntrack    *CleanupResults
	ConntrackErr error
	Busy         *BusyResults
	BusyErr      error
	Neighbour    *NeighbourResults
	NeighbourErr error
	ChangeCPU    *ChangeCPUResults
	ChangeCPUErr error
}

// Err is the first error of any part, or nil.
func (r *Results) Err() error {
	return errors.Join(r.ControlErr, r.KernelErr, r.DataErr, r.SelectorsErr, r.LiveErr, r.ConntrackErr, r.BusyErr, r.NeighbourErr, r.ChangeCPUErr)
}

// Run runs the parts the config asks for, one after the other, and returns
// what they measured. A part that fails leaves its error in Results and the
// other parts still run; a cancelled ctx stops everything (each part returns
// ctx's error) after the namespaces are deleted.
func Run(ctx context.Context, cfg Config) *Results {
	r := &Results{Quick: cfg.Quick, Start: time.Now(), Machine: machine(), Load: map[string]string{}}
	if n, err := Sweep(); err != nil {
		cfg.logf("removing namespaces of earlier, killed runs: %v", err)
	} else if n > 0 {
		cfg.logf("removed %d namespaces left by earlier, killed runs", n)
	}
	if cfg.wants("control") && ctx.Err() == nil {
		r.Load["control"] = readTrim("/proc/loadavg")
		r.Control, r.ControlErr = RunControl(ctx, cfg)
	}
	if cfg.wants("kernel") && ctx.Err() == nil {
		r.Load["kernel"] = readTrim("/proc/loadavg")
		r.Kernel, r.KernelErr = RunKernel(ctx, cfg)
	}
	if cfg.wants("data") && ctx.Err() == nil {
		r.Load["data"] = readTrim("/proc/loadavg")
		r.Data, r.DataErr = RunData(ctx, cfg)
	}
	if cfg.wants("selectors") && ctx.Err() == nil {
		r.Load["selectors"] = readTrim("/proc/loadavg")
		r.Selectors, r.SelectorsErr = RunSelectors(ctx, cfg)
	}
	if cfg.wants("live") && ctx.Err() == nil {
		r.Load["live"] = readTrim("/proc/loadavg")
		r.Live, r.LiveErr = RunLive(ctx, cfg)
	}
	if cfg.wants("conntrack") && ctx.Err() == nil {
		r.Load["conntrack"] = readTrim("/proc/loadavg")
		r.Conntrack, r.ConntrackErr = RunConntrack(ctx, cfg)
	}
	if (cfg.wants("busy") || cfg.wants("busy-nft")) && ctx.Err() == nil {
		r.Load["busy"] = readTrim("/proc/loadavg")
		r.Busy, r.BusyErr = RunBusy(ctx, cfg)
	}
	if cfg.wants("neighbour") && ctx.Err() == nil {
		r.Load["neighbour"] = readTrim("/proc/loadavg")
		r.Neighbour, r.NeighbourErr = RunNeighbour(ctx, cfg)
	}
	if cfg.wants("cpu") && ctx.Err() == nil {
		r.Load["cpu"] = readTrim("/proc/loadavg")
		r.ChangeCPU, r.ChangeCPUErr = RunChangeCPU(ctx, cfg)
	}
	r.End = time.Now()
	r.LoadEnd = readTrim("/proc/loadavg")
	return r
}

// nsPrefix starts the name of every namespace the harness creates, so that
// Sweep recognises them: testnet names them PREFIX-PART-PID-COUNTER-ROLE.
const nsPrefix = "imab"

var staleRE = regexp.MustCompile(`^` + nsPrefix + `-[a-z0-9]+-(\d+)-\d+-(pod|node|ext)$`)

// newTopology creates a pod/node/ext topology whose namespaces Sweep knows.
func newTopology(part string) (*testnet.Topology, error) {
	return testnet.New(nsPrefix + "-" + part)
}

// Sweep removes the namespaces (under /run/netns) of harness runs whose
// process no longer exists: a run killed with SIGKILL cannot clean up. It
// returns how many it removed.
func Sweep() (int, error) {
	entries, err := os.ReadDir("/run/netns")
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, e := range entries {
		m := staleRE.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		if pid, _ := strconv.Atoi(m[1]); pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat("/proc/" + m[1]); err == nil {
			continue // its run is still going
		}
		path := filepath.Join("/run/netns", e.Name())
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", path, err))
			continue
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// Machine describes where the run happened.
type Machine struct {
	Kernel, CPU, Go, NFT, IPTablesNFT, IPTablesLegacy string
	CPUs                                              int
	MemTotal, LoadStart                               string
}

func machine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), LoadStart: readTrim("/proc/loadavg")}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "MemTotal:"); ok {
				m.MemTotal = strings.TrimSpace(v)
			}
		}
	}
	m.NFT = version("nft", "--version")
	m.IPTablesNFT = version("iptables-nft", "-V")
	m.IPTablesLegacy = version("iptables-legacy", "-V")
	return m
}

func version(name string, args ...string) string {
	if _, err := exec.LookPath(name); err != nil {
		return "not installed"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return "error: " + err.Error()
	}
	return strings.TrimSpace(string(out))
}

func readTrim(path string) string {
	b, _ := os.ReadFile(path)
	return strings.TrimSpace(string(b))
}

// --- running commands inside a namespace ---

// cmdResult is what a finished command took.
type cmdResult struct {
	Took         time.Duration // wall time from Start to the end of Wait
	User, Kernel time.Duration // CPU time of the process
	Output       string
}

// cmdTimeout bounds every command the harness runs.
const cmdTimeout = 2 * time.Minute

// runIn runs name with args inside ns and waits for it.
func runIn(ctx context.Context, ns netns.NsHandle, name string, args ...string) (cmdResult, error) {
	ctx, cancel := context.WithTimeout(ctx, cmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.WaitDelay = 5 * time.Second
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	var start time.Time
	// Forked inside ns (as harness.Daemon.StartIn): cheaper than ip netns exec.
	if err := testnet.InNS(ns, func() error { start = time.Now(); return cmd.Start() }); err != nil {
		return cmdResult{}, fmt.Errorf("%s: %w", name, err)
	}
	err := cmd.Wait()
	r := cmdResult{Took: time.Since(start), Output: out.String()}
	if cmd.ProcessState != nil {
		// Not ru_maxrss: a child forked by Go (vfork) inherits the
		// harness's peak RSS at exec; see peakRSS.
		r.User, r.Kernel = cmd.ProcessState.UserTime(), cmd.ProcessState.SystemTime()
	}
	if err != nil {
		return r, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, harness.Tail(out.String(), 400))
	}
	return r, nil
}

// have reports whether every binary is in PATH.
func have(names ...string) bool {
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			return false
		}
	}
	return true
}

// --- statistics ---

func median[T int64 | float64 | time.Duration](xs []T) T {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// percentile is the nearest-rank percentile p (0-100) of xs.
func percentile(xs []time.Duration, p float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	rank := int(p/100*float64(len(s))+0.999999) - 1
	return s[max(0, min(rank, len(s)-1))]
}

// --- CIDR lists ---

// cidrList returns n prefixes that cover none of the destinations the
// harness sends to (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24) nor
// the pods' or the topology's own addresses, and that are neither
// adjacent nor overlapping:
//
//	list 0 (the config): IPv4 /29s from 100.64.0.0/10, one every 32 addresses (up to 131,072);
//	list 1 (a different list of the same size): the same from 240.0.0.0/4;
//	IPv6: /48s from fd42::/16 (list 0) and fd43::/16 (list 1), one every
//	second /48 (the 2I-th).
func cidrList(family, list, n int) []netip.Prefix {
	out := make([]netip.Prefix, 0, n)
	for i := range n {
		out = append(out, cidrAt(family, list, i))
	}
	return out
}

func cidrAt(family, list, i int) netip.Prefix {
	if family == 6 {
		v := uint32(i) * 2 // a gap after each: adjacent prefixes would merge into one element
		a := [16]byte{0xfd, 0x42 + byte(list), byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}
		return netip.PrefixFrom(netip.AddrFrom16(a), 48)
	}
	base := uint32(100<<24 | 64<<16)
	if list == 1 {
		base = 240 << 24
	}
	v := base + uint32(i)*32
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), 29)
}

// oneChanged returns list with its middle prefix replaced by one that is
// in neither list (IPv4: the /29 right after it; IPv6: in fd44::/16).
// oneCIDRApart are two config files of n IPv4 nonMasqueradeCIDRs, the
// second with its middle one changed (oneChanged), resyncing hourly.
func oneCIDRApart(n int) [2]string {
	var out [2]string
	for i := range out {
		c := config.Default(config.Flags{})
		c.NonMasqueradeCIDRs = cidrList(4, 0, n)
		if i == 1 {
			c.NonMasqueradeCIDRs = oneChanged(4, c.NonMasqueradeCIDRs)
		}
		c.CIDRLimit = max(n, 64)
		c.ResyncInterval = time.Hour
		out[i] = c.String()
	}
	return out
}

func oneChanged(family int, list []netip.Prefix) []netip.Prefix {
	out := slices.Clone(list)
	if len(out) == 0 {
		return out
	}
	i := len(out) / 2
	if family == 6 {
		out[i] = netip.MustParsePrefix("fd44::/48")
	} else {
		a := out[i].Addr().As4()
		a[3] += 8
		out[i] = netip.PrefixFrom(netip.AddrFrom4(a), 29)
	}
	return out
}
