package testnet

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

var (
	extDst4 = netip.MustParseAddr("203.0.113.10")
	extDst6 = netip.MustParseAddr("2001:db8:2::10")
	imds4   = netip.MustParseAddr("169.254.169.254")
	ll6     = netip.MustParseAddr("fe80::aa")
)

func newTopology(t *testing.T, dsts ...netip.Addr) *Topology {
	t.Helper()
	Require(t)
	top, err := New(strings.ToLower(t.Name()[:min(len(t.Name()), 12)]))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := top.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		for _, n := range []string{top.PodNS, top.NodeNS, top.ExtNS} {
			if _, err := os.Stat(filepath.Join(netnsDir, n)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("namespace %s still present after Close (stat: %v)", n, err)
			}
		}
	})
	for _, d := range dsts {
		if err := top.AddDestination(d); err != nil {
			t.Fatal(err)
		}
	}
	return top
}

// nft runs nft in the node namespace and fails the test on error.
func nft(t *testing.T, top *Topology, args ...string) string {
	t.Helper()
	out, err := top.NFT(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// masquerade installs the quick manual rule of the brief: masquerade what
// leaves through the node's uplink, for family "ip" or "ip6".
func masquerade(t *testing.T, top *Topology, family string) {
	t.Helper()
	nft(t, top, "add", "table", family, "t")
	nft(t, top, "add", "chain", family, "t", "p", "{ type nat hook postrouting priority 100; }")
	nft(t, top, "add", "rule", family, "t", "p", "oifname", NodeUplinkIf, "masquerade")
}

func wantSeen(t *testing.T, what string, f func(netip.Addr) (netip.Addr, error), dst, want netip.Addr) {
	t.Helper()
	got, err := f(dst)
	if err != nil {
		t.Fatalf("%s to %s: %v", what, dst, err)
	}
	if got != want {
		t.Fatalf("%s to %s: server saw %s, want %s", what, dst, got, want)
	}
}

// Finding 1: without NAT the destination sees the pod address; with a manual
// masquerade rule on the uplink it sees the node's uplink address; node-local
// destinations always see the pod (local delivery has no postrouting).
func TestSourceSeenAndMasquerade(t *testing.T) {
	t.Parallel()
	top := newTopology(t, extDst4, extDst6)
	cases := []struct {
		family           string
		ext, local       netip.Addr
		pod, masqueraded netip.Addr
	}{
		{"ip", extDst4, top.NodePodSide4, top.Pod4, top.NodeUplink4},
		{"ip6", extDst6, top.NodePodSide6, top.Pod6, top.NodeUplink6},
	}
	for _, c := range cases {
		wantSeen(t, "tcp", top.SourceSeen, c.ext, c.pod)
		wantSeen(t, "udp", top.SourceSeenUDP, c.ext, c.pod)
		wantSeen(t, "tcp", top.SourceSeen, c.local, c.pod)
		wantSeen(t, "udp", top.SourceSeenUDP, c.local, c.pod)
	}
	for _, c := range cases {
		masquerade(t, top, c.family)
		wantSeen(t, "tcp", top.SourceSeen, c.ext, c.masqueraded)
		wantSeen(t, "udp", top.SourceSeenUDP, c.ext, c.masqueraded)
		wantSeen(t, "tcp", top.SourceSeen, c.local, c.pod)
		wantSeen(t, "udp", top.SourceSeenUDP, c.local, c.pod)
	}
	// the real nft CLI in the node namespace sees the rules...
	if rs := nft(t, top, "list", "ruleset"); strings.Count(rs, "masquerade") != 2 {
		t.Errorf("node ruleset:\n%s", rs)
	}
	// ...and other namespaces do not.
	if out, err := Exec(top.ExtNS, "nft", "list", "ruleset"); err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("ext ruleset: %q, %v", out, err)
	}
}

// Each call is a new connection: many in a row all work and are masqueraded.
func TestManyConnections(t *testing.T) {
	t.Parallel()
	Require(t, "conntrack")
	top := newTopology(t, extDst4)
	masquerade(t, top, "ip")
	for i := range 50 {
		got, err := top.SourceSeen(extDst4)
		if err != nil || got != top.NodeUplink4 {
			t.Fatalf("connection %d: %s, %v", i, got, err)
		}
	}
	out, err := Exec(top.NodeNS, "conntrack", "-L", "-p", "tcp", "--dport", strconv.Itoa(ServerPort))
	if err != nil {
		t.Fatalf("conntrack -L: %v\n%s", err, out)
	}
	if strings.Count(string(out), "dport=8080") < 50 {
		t.Errorf("expected ≥50 conntrack entries:\n%s", out)
	}
}

// lasting opens a connection from the pod to extDst4 and checks the first line.
func lasting(t *testing.T, top *Topology) (io.ReadWriteCloser, *bufio.Reader) {
	t.Helper()
	c, err := top.ConnectPodTo(extDst4, ServerPort)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if ap, perr := parseSeen(line); err != nil || perr != nil || ap.Addr() != top.Pod4 {
		t.Fatalf("first line %q, %v", line, err)
	}
	return c, r
}

// A lasting connection keeps its (absent) NAT when a masquerade rule appears:
// conntrack decides NAT on the first packet only — provided conntrack was
// already tracking the connection (EnableConntrack).
func TestConnectPodTo(t *testing.T) {
	t.Parallel()
	top := newTopology(t, extDst4)
	if err := top.EnableConntrack(); err != nil {
		t.Fatal(err)
	}
	c, r := lasting(t, top)
	masquerade(t, top, "ip")
	if _, err := io.WriteString(c, "ping\n"); err != nil {
		t.Fatal(err)
	}
	if echo, err := r.ReadString('\n'); err != nil || echo != "ping\n" {
		t.Fatalf("echo %q, %v", echo, err)
	}
	wantSeen(t, "tcp", top.SourceSeen, extDst4, top.NodeUplink4)
}

// Surprise: in a fresh namespace nothing is tracked until a rule needs
// conntrack. The first masquerade rule turns it on, the next packet of an
// older connection becomes a NEW mid-stream entry (nf_conntrack_tcp_loose),
// gets masqueraded, and the server answers the unknown 192.0.2.1:port with a
// RST.
func TestConntrackStartsWithFirstNATRule(t *testing.T) {
	t.Parallel()
	top := newTopology(t, extDst4)
	c, r := lasting(t, top)
	masquerade(t, top, "ip")
	if _, err := io.WriteString(c, "ping\n"); err != nil {
		t.Fatal(err)
	}
	echo, err := r.ReadString('\n')
	if err == nil {
		t.Fatalf("connection survived (echo %q): conntrack was already active?", echo)
	}
	t.Logf("pre-existing connection after the first nat chain: %v", err)
	out, _ := Exec(top.NodeNS, "conntrack", "-L", "-p", "tcp")
	t.Logf("node conntrack:\n%s", out)
}

// Finding 2a: 169.254.169.254 as a /32 in ext is reachable from the pod
// through the node, and masquerade applies to it like to any destination.
func TestLinkLocal4(t *testing.T) {
	t.Parallel()
	top := newTopology(t, imds4)
	wantSeen(t, "tcp", top.SourceSeen, imds4, top.Pod4)
	wantSeen(t, "udp", top.SourceSeenUDP, imds4, top.Pod4)
	masquerade(t, top, "ip")
	wantSeen(t, "tcp", top.SourceSeen, imds4, top.NodeUplink4)
	wantSeen(t, "udp", top.SourceSeenUDP, imds4, top.NodeUplink4)
}

var counterRE = regexp.MustCompile(`counter packets (\d+) bytes \d+ comment "([^"]+)"`)

func counters(t *testing.T, top *Topology, family, table string) map[string]int {
	t.Helper()
	m := map[string]int{}
	for _, sm := range counterRE.FindAllStringSubmatch(nft(t, top, "list", "table", family, table), -1) {
		n, _ := strconv.Atoi(sm[1])
		m[sm[2]] = n
	}
	return m
}

// Finding 2b: the node never forwards a packet with an IPv6 link-local
// destination out of another interface than the one it arrived on. Even with
// the pod routing fe80::aa via the node, the pod using a global source, and
// the node holding an explicit route "fe80::aa dev eth0", the forwarded packet
// goes back out of veth-pod (where its postrouting hooks, NAT included, do see
// it), and never reaches ext.
func TestLinkLocal6NotForwarded(t *testing.T) {
	t.Parallel()
	Require(t, "sysctl")
	top := newTopology(t, ll6)
	// The node sends an ICMPv6 redirect for the hairpinned packet; without
	// this the pod would then try fe80::aa on-link directly.
	if _, err := Exec(top.PodNS, "sysctl", "-q", "-w", "net.ipv6.conf.all.accept_redirects=0", "net.ipv6.conf."+PodIf+".accept_redirects=0"); err != nil {
		t.Fatal(err)
	}
	if _, err := Exec(top.PodNS, "ip", "-6", "route", "add", ll6.String()+"/128", "via", top.NodePodSide6.String(), "dev", PodIf); err != nil {
		t.Fatal(err)
	}
	if _, err := Exec(top.NodeNS, "ip", "-6", "route", "add", ll6.String()+"/128", "dev", NodeUplinkIf); err != nil {
		t.Fatal(err)
	}
	out, err := Exec(top.NodeNS, "ip", "-6", "route", "get", ll6.String(), "from", top.Pod6.String(), "iif", NodePodIf)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "dev "+NodePodIf) {
		t.Errorf("expected the node to route fe80::aa from the pod back out of %s, got: %s", NodePodIf, out)
	}
	t.Logf("node: ip -6 route get %s from %s iif %s: %s", ll6, top.Pod6, NodePodIf, strings.TrimSpace(string(out)))

	tbl := fmt.Sprintf(`table ip6 probe {
	chain post { type filter hook postrouting priority 0;
		ip6 daddr %[1]s oifname %[2]q counter comment "out-pod-side"
		ip6 daddr %[1]s oifname %[3]q counter comment "out-uplink"
	}
	chain nat { type nat hook postrouting priority 100;
		ip6 daddr %[1]s counter comment "nat-postrouting"
	}
}`, ll6, NodePodIf, NodeUplinkIf)
	f := filepath.Join(t.TempDir(), "probe.nft")
	if err := os.WriteFile(f, []byte(tbl), 0o644); err != nil {
		t.Fatal(err)
	}
	nft(t, top, "-f", f)
	if _, err := top.server(top.ExtNS); err != nil {
		t.Fatal(err)
	}
	try := func() map[string]int {
		t.Helper()
		c, err := top.dial(top.PodNS, PodIf, "tcp", top.Pod6, ll6, ServerPort)
		if err == nil {
			c.Close()
			t.Fatal("pod reached fe80::aa through the node: the kernel forwarded a link-local destination")
		}
		t.Logf("pod dial [%s%%%s]:%d from %s: %v", ll6, PodIf, ServerPort, top.Pod6, err)
		got := counters(t, top, "ip6", "probe")
		t.Logf("node counters: %v", got)
		return got
	}
	// A nat-type chain with no nat statement does not turn conntrack on, so
	// it is not even traversed...
	got := try()
	if got["out-pod-side"] == 0 || got["out-uplink"] != 0 || got["nat-postrouting"] != 0 {
		t.Errorf("counters %v: want out-pod-side>0, out-uplink=0, nat-postrouting=0", got)
	}
	// ...with conntrack on, the hairpinned packet does cross nat postrouting
	// (once: the first packet of the connection), out of veth-pod.
	if err := top.EnableConntrack(); err != nil {
		t.Fatal(err)
	}
	before := got
	got = try()
	if got["out-pod-side"] <= before["out-pod-side"] || got["out-uplink"] != 0 || got["nat-postrouting"] != 1 {
		t.Errorf("counters %v: want out-pod-side>%d, out-uplink=0, nat-postrouting=1", got, before["out-pod-side"])
	}
}

// Finding 2b, the alternative: node-originated traffic from fd00:1::1 to a
// link-local destination on the uplink crosses postrouting NAT; the server
// sees fd00:1::1 unless it is masqueraded (then: the uplink's link-local).
func TestLinkLocal6FromNode(t *testing.T) {
	t.Parallel()
	top := newTopology(t, ll6, extDst6)
	l, err := top.nl[top.NodeNS].LinkByName(NodeUplinkIf)
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := top.nl[top.NodeNS].AddrList(l, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	var uplinkLL netip.Addr
	for _, a := range addrs {
		if ip, _ := netip.AddrFromSlice(a.IP); ip.IsLinkLocalUnicast() {
			uplinkLL = ip
		}
	}
	if !uplinkLL.IsValid() {
		t.Fatalf("no link-local address on the node uplink: %v", addrs)
	}
	fromNode := func(dst netip.Addr) (netip.Addr, error) { return top.SourceSeenFromNode(top.NodePodSide6, dst) }
	wantSeen(t, "tcp from node", fromNode, ll6, top.NodePodSide6)
	wantSeen(t, "tcp from node", fromNode, extDst6, top.NodePodSide6)
	masquerade(t, top, "ip6")
	wantSeen(t, "tcp from node", fromNode, ll6, uplinkLL)
	wantSeen(t, "tcp from node", fromNode, extDst6, top.NodeUplink6)
	// what an agent test would check: fe80::/10 is returned, not masqueraded
	nft(t, top, "insert", "rule", "ip6", "t", "p", "ip6", "daddr", "fe80::/10", "return")
	wantSeen(t, "tcp from node", fromNode, ll6, top.NodePodSide6)
	wantSeen(t, "tcp from node", fromNode, extDst6, top.NodeUplink6)
}

// No OS thread of the test binary is left inside a topology namespace.
func TestThreadsStayHome(t *testing.T) {
	Require(t)
	home, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	top, err := New("threads")
	if err != nil {
		t.Fatal(err)
	}
	if err := top.AddDestination(extDst4); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if _, err := top.SourceSeen(extDst4); err != nil {
			t.Fatal(err)
		}
		if _, err := top.SourceSeenUDP(top.NodePodSide4); err != nil {
			t.Fatal(err)
		}
	}
	if err := top.Close(); err != nil {
		t.Fatal(err)
	}
	var foreign []string
	for range 50 { // threads that exited locked take a moment to go away
		foreign = foreign[:0]
		tasks, _ := filepath.Glob("/proc/self/task/*/ns/net")
		for _, p := range tasks {
			if l, err := os.Readlink(p); err == nil && l != home {
				foreign = append(foreign, fmt.Sprintf("%s -> %s (pid %d)", p, l, os.Getpid()))
			}
		}
		if len(foreign) == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("threads outside %s: %v", home, foreign)
}

func TestExecAndRunInNode(t *testing.T) {
	t.Parallel()
	Require(t, "sysctl", "sleep", "false")
	top := newTopology(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := top.RunInNode(ctx, "ip", "-br", "link")
	if err != nil || !strings.Contains(string(out), NodePodIf) || !strings.Contains(string(out), NodeUplinkIf) {
		t.Fatalf("node links: %s, %v", out, err)
	}
	out, err = Exec(top.NodeNS, "sysctl", "-n", "net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding")
	if err != nil || strings.Fields(string(out))[0] != "1" || strings.Fields(string(out))[1] != "1" {
		t.Fatalf("node forwarding: %q, %v", out, err)
	}
	out, err = Exec(top.PodNS, "sysctl", "-n", "net.ipv4.ip_forward")
	if err != nil || strings.TrimSpace(string(out)) != "0" {
		t.Fatalf("pod forwarding: %q, %v", out, err)
	}
	// no tentative (DAD) addresses anywhere
	for _, n := range []string{top.PodNS, top.NodeNS, top.ExtNS} {
		out, err := Exec(n, "ip", "-6", "addr", "show", "tentative")
		if err != nil || strings.TrimSpace(string(out)) != "" {
			t.Errorf("%s tentative addresses: %q, %v", n, out, err)
		}
	}
	if _, err := Exec(top.NodeNS, "false"); err == nil || !strings.Contains(err.Error(), "exit status 1") {
		t.Errorf("Exec of a failing command: %v, want its exit status", err)
	}
	short, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	// Killed at the deadline: an error (sleep 30 would end without one).
	if _, err := top.RunInNode(short, "sleep", "30"); err == nil || short.Err() == nil {
		t.Errorf("RunInNode ignored its context: %v", err)
	}
}

// Finding 3: the cost of a topology.
func TestNewCloseTiming(t *testing.T) {
	Require(t)
	const n = 5
	var newTotal, closeTotal time.Duration
	for range n {
		start := time.Now()
		top, err := New("timing")
		if err != nil {
			t.Fatal(err)
		}
		newTotal += time.Since(start)
		start = time.Now()
		if err := top.Close(); err != nil {
			t.Fatal(err)
		}
		closeTotal += time.Since(start)
		if err := top.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		for _, ns := range []string{top.PodNS, top.NodeNS, top.ExtNS} {
			if _, err := os.Stat(filepath.Join(netnsDir, ns)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("%s left behind", ns)
			}
		}
	}
	t.Logf("New: %v on average, Close: %v on average (%d rounds)", newTotal/n, closeTotal/n, n)
}

func TestNewInvalidName(t *testing.T) {
	for _, name := range []string{"", "a/b", "a b"} {
		if _, err := New(name); err == nil {
			t.Errorf("New(%q) succeeded", name)
		}
	}
}

// fakeTB records Fatalf/Skipf instead of stopping the goroutine.
type fakeTB struct {
	testing.TB
	fatal, skip string
}

func (f *fakeTB) Helper()                        {}
func (f *fakeTB) Fatalf(format string, a ...any) { f.fatal = fmt.Sprintf(format, a...) }
func (f *fakeTB) Skipf(format string, a ...any)  { f.skip = fmt.Sprintf(format, a...) }

// Without root a kernel test skips (fails with CI=true); as root a missing
// binary fails it, naming the package to install; a binary the tests do not
// declare fails it everywhere.
func TestRequire(t *testing.T) {
	t.Setenv("CI", "")
	f := &fakeTB{TB: t}
	Require(f, "testnet-no-such-binary")
	if want := "the binary testnet-no-such-binary is not declared"; f.skip != "" || !strings.Contains(f.fatal, want) {
		t.Errorf("undeclared binary: fatal %q, skip %q; want a failure with %q", f.fatal, f.skip, want)
	}
	t.Setenv("PATH", t.TempDir()) // conntrack is declared, and missing
	f = &fakeTB{TB: t}
	Require(f, "conntrack")
	if os.Geteuid() != 0 {
		if f.fatal != "" || !strings.Contains(f.skip, "needs root") {
			t.Errorf("not root, without CI: fatal %q, skip %q", f.fatal, f.skip)
		}
		t.Setenv("CI", "true")
		f = &fakeTB{TB: t}
		Require(f, "conntrack")
		if f.skip != "" || !strings.Contains(f.fatal, "needs root") || !strings.Contains(f.fatal, "CI=true") {
			t.Errorf("not root, with CI=true: fatal %q, skip %q", f.fatal, f.skip)
		}
		return
	}
	want := "needs the binaries ip, nft, conntrack: apt-get install conntrack iproute2 nftables (or make deps)"
	if f.skip != "" || !strings.Contains(f.fatal, want) {
		t.Errorf("root: fatal %q, skip %q; want a failure with %q", f.fatal, f.skip, want)
	}
}

func TestMissingReason(t *testing.T) {
	if r := MissingReason("sh"); r != "" {
		t.Errorf("MissingReason(sh) = %q", r)
	}
	t.Setenv("PATH", t.TempDir())
	for _, tc := range []struct {
		bins []string
		want string
	}{
		{[]string{"nft"}, "needs the nft binary: apt-get install nftables (or make deps)"},
		{[]string{"ip", "nft", "ip", "podman"}, "needs the binaries ip, nft, podman: apt-get install iproute2 nftables podman (or make deps)"},
		{[]string{"sysctl", "conntrack"}, "needs the binaries sysctl, conntrack: apt-get install conntrack procps (or make deps)"},
		{[]string{"iptables-nft-restore", "ip6tables-nft", "unshare", "grep"},
			"needs the binaries iptables-nft-restore, ip6tables-nft, unshare, grep: apt-get install grep iptables util-linux (or make deps)"},
		{[]string{"nft", "no-such-tool"}, "the binary no-such-tool is not declared: add it and its Debian package to packages in internal/testnet/require.go"},
	} {
		if got := MissingReason(tc.bins...); got != tc.want {
			t.Errorf("MissingReason(%q) = %q, want %q", tc.bins, got, tc.want)
		}
	}
	// Exec and RunInNode refuse an undeclared binary, and name the
	// package of a missing one, before running anything.
	if _, err := Exec("no-such-ns", "no-such-tool"); err == nil || !strings.Contains(err.Error(), "no-such-tool is not declared") {
		t.Errorf("Exec of an undeclared binary: %v", err)
	}
	if _, err := (&Topology{NodeNS: "no-such-ns"}).RunInNode(context.Background(), "conntrack"); err == nil ||
		!strings.Contains(err.Error(), "apt-get install conntrack") {
		t.Errorf("RunInNode of a missing binary: %v", err)
	}
}

// TestPackagesAreDebians: each binary's package in packages is the Debian
// package that installs it, as dpkg says (following the symlinks, such as
// iptables-save's alternatives, hop by hop), or for a binary not installed
// here, a package apt knows. Without dpkg (not Debian) it skips, and says so.
func TestPackagesAreDebians(t *testing.T) {
	if _, err := exec.LookPath("dpkg-query"); err != nil {
		t.Skip("needs dpkg-query (a Debian system) to check the package names")
	}
	paths := map[string][]string{} // binary: the paths on the way to its file
	var all []string
	for bin, pkg := range packages {
		path, err := exec.LookPath(bin)
		if err != nil {
			if _, err := exec.LookPath("apt-cache"); err != nil {
				continue
			}
			if out, err := exec.Command("apt-cache", "show", "--no-all-versions", pkg).CombinedOutput(); err != nil || !strings.Contains(string(out), "Package: "+pkg+"\n") {
				t.Errorf("%s: apt does not know the package %s: %v %s", bin, pkg, err, out)
			}
			continue
		}
		paths[bin] = symlinkHops(path)
		all = append(all, paths[bin]...)
	}
	// One dpkg-query for all the paths (it is slow to start); it fails
	// for the paths no package has, and lists the others.
	out, _ := exec.Command("dpkg-query", append([]string{"-S"}, all...)...).Output()
	owners := map[string][]string{} // path: packages
	for _, l := range strings.Split(string(out), "\n") {
		if pkg, file, ok := strings.Cut(l, ": "); ok && !strings.HasPrefix(l, "diversion by") {
			owners[file] = append(owners[file], strings.Split(pkg, ", ")...)
		}
	}
	for bin, hops := range paths {
		var found []string
		for _, p := range hops {
			found = append(found, owners[p]...)
		}
		if len(found) == 0 {
			// Not a package's file (make deps puts promtool, taken out of
			// Debian's prometheus package, in /usr/local/bin): apt must
			// know the package.
			if out, err := exec.Command("apt-cache", "show", "--no-all-versions", packages[bin]).CombinedOutput(); err != nil || !strings.Contains(string(out), "Package: "+packages[bin]+"\n") {
				t.Errorf("%s (%s, no package's file): apt does not know the package %s: %v %s", bin, hops[0], packages[bin], err, out)
			}
			continue
		}
		if !slices.Contains(found, packages[bin]) {
			t.Errorf("%s (%s) is installed by %q according to dpkg, not by %s", bin, hops[0], found, packages[bin])
		}
	}
}

// symlinkHops returns path and each symlink target on the way to its file,
// each also without a leading /usr (on a merged /usr, dpkg knows /bin/ip,
// not /usr/bin/ip).
func symlinkHops(path string) []string {
	var hops []string
	for hop := 0; hop < 8; hop++ {
		hops = append(hops, path)
		if p := strings.TrimPrefix(path, "/usr"); p != path {
			hops = append(hops, p)
		}
		next, err := os.Readlink(path)
		if err != nil {
			break
		}
		if !filepath.IsAbs(next) {
			next = filepath.Join(filepath.Dir(path), next)
		}
		path = next
	}
	return hops
}

// TestPackagesInDeps: hack/deps.sh (make deps) installs each package the
// tests name for a binary, for the same binary.
func TestPackagesInDeps(t *testing.T) {
	data, err := os.ReadFile("../../hack/deps.sh")
	if err != nil {
		t.Fatal(err)
	}
	_, needs, ok := strings.Cut(string(data), "test_needs='")
	needs, _, ok2 := strings.Cut(needs, "'")
	if !ok || !ok2 {
		t.Fatal("no test_needs='...' in hack/deps.sh")
	}
	deps := map[string]string{}
	for _, l := range strings.Split(needs, "\n") {
		f := strings.Fields(l)
		if len(f) != 3 {
			t.Fatalf("hack/deps.sh: test_needs line %q: want COMMAND DEBIAN FEDORA", l)
		}
		for _, c := range strings.Split(f[0], "|") {
			deps[c] = f[1]
		}
	}
	for bin, pkg := range packages {
		if got, ok := deps[bin]; !ok || got != pkg {
			t.Errorf("hack/deps.sh installs %q for %s, want a line \"%s %s ...\" in test_needs", got, bin, bin, pkg)
		}
	}
}

// A failure half way through New removes what New created, and only that.
func TestNewPartialFailure(t *testing.T) {
	Require(t)
	// Occupy the node namespace name of the next topology: New creates the
	// pod namespace, then fails on the node one.
	next := fmt.Sprintf("partial-%d-%d", os.Getpid(), counter.Load()+1)
	squatter := filepath.Join(netnsDir, next+"-node")
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(squatter, os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	defer os.Remove(squatter)
	top, err := New("partial")
	if err == nil {
		top.Close()
		t.Fatal("New succeeded over an existing namespace name")
	}
	t.Logf("New: %v", err)
	if _, err := os.Stat(filepath.Join(netnsDir, next+"-pod")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pod namespace left behind after a failed New (stat: %v)", err)
	}
	if _, err := os.Stat(squatter); err != nil {
		t.Errorf("New removed a namespace file it did not create: %v", err)
	}
}
