package test

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/conntrack"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft/kernel"
	"github.com/vishvananda/netns"
)

// Bounds of the conntrack tests: a stream sends one datagram every
// streamEvery until it is stopped, at most streamMax of them (5 minutes:
// far beyond a test's life even in a slow emulated guest, whose agent
// start alone took 20 s, but a traffic loop must end); waits for an answer
// are bounded by seenBound. No assertion is on time: the bounds only end a
// failing test.
const (
	streamEvery = 50 * time.Millisecond
	streamMax   = 6000 // 5 minutes
	seenBuffer  = 600  // answers kept unread; more are dropped
	seenBound   = 5 * time.Second
)

// applyConntrackConfig applies the agent's rules for a config in the node
// namespace and returns the decider of that config (what Cleanup compares).
// The only use of the nft package by the conntrack tests is here.
func applyConntrackConfig(t *testing.T, topo *testnet.Topology, yaml string, ipv6 bool) conntrack.Decider {
	t.Helper()
	cfg, _, err := config.Parse([]byte(yaml), config.Flags{EnableIPv6: ipv6})
	if err != nil {
		t.Fatalf("config %q: %v", yaml, err)
	}
	opts := nft.Options{Chain: nft.DefaultChain, EnableIPv6: ipv6, RandomFully: true}
	if _, err := nft.Ensure(&kernel.Netlink{NetNS: int(topo.NodeHandle()), NoOwner: true}, nft.Build(cfg, opts)); err != nil {
		t.Fatalf("apply config %q: %v", yaml, err)
	}
	return func(f conntrack.Flow) (bool, bool) {
		e := nft.Explain(cfg, opts, nft.Packet{Src: f.Src, Dst: f.Dst})
		if e.Undetermined || (f.Dst.Unmap().Is6() && !opts.EnableIPv6) {
			return false, false
		}
		return e.Masquerade, true
	}
}

// udpStream is a long-lived UDP flow from the pod: one socket (one
// conntrack entry) sending a datagram every streamEvery until stopped (at
// most streamMax); the answers (the source the server saw) arrive on seen.
// ended is closed when the sender has stopped, after sent datagrams.
type udpStream struct {
	dst   netip.Addr
	c     *net.UDPConn
	seen  chan netip.AddrPort
	stop  chan struct{}
	ended chan struct{}
	sent  atomic.Int64
	wg    sync.WaitGroup
}

func startUDPStream(t *testing.T, topo *testnet.Topology, dst string) *udpStream {
	t.Helper()
	c, err := topo.DialPodUDP(netip.MustParseAddr(dst))
	if err != nil {
		t.Fatalf("udp to %s: %v", dst, err)
	}
	return streamOn(t, c, dst)
}

// streamOn is startUDPStream on a socket already connected to dst.
func streamOn(t *testing.T, c *net.UDPConn, dst string) *udpStream {
	s := &udpStream{dst: netip.MustParseAddr(dst), seen: make(chan netip.AddrPort, seenBuffer), stop: make(chan struct{}), ended: make(chan struct{})}
	s.c = c
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		defer close(s.ended)
		tick := time.NewTicker(streamEvery)
		defer tick.Stop()
		for i := 0; i < streamMax; i++ {
			c.Write([]byte("?"))
			s.sent.Add(1)
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	go func() {
		defer s.wg.Done()
		buf := make([]byte, 512)
		for {
			n, err := c.Read(buf)
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if err != nil {
				continue // e.g. ICMP unreachable while a rule changes
			}
			if ap, err := testnet.ParseSeen(string(buf[:n])); err == nil {
				select {
				case s.seen <- ap:
				default:
				}
			}
		}
	}()
	t.Cleanup(s.close)
	return s
}

func (s *udpStream) close() {
	select {
	case <-s.stop:
		return
	default:
	}
	close(s.stop)
	s.c.Close()
	s.wg.Wait()
}

// waitFor reads answers until one shows source addr; it fails the test
// after seenBound.
func (s *udpStream) waitFor(t *testing.T, addr netip.Addr) netip.AddrPort {
	t.Helper()
	return s.waitForOr(t, addr, nil)
}

// waitForOr is waitFor, calling other after each answer that shows
// another source.
func (s *udpStream) waitForOr(t *testing.T, addr netip.Addr, other func()) netip.AddrPort {
	t.Helper()
	timeout := time.After(seenBound)
	var last []netip.AddrPort
	for {
		select {
		case ap := <-s.seen:
			if ap.Addr() == addr {
				return ap
			}
			if last = append(last, ap); len(last) > 5 {
				last = last[1:]
			}
			if other != nil {
				other()
			}
		case <-timeout:
			t.Fatalf("the stream to %s never showed source %s within %s; last answers %v%s", s.dst, addr, seenBound, last, s.senderState())
		}
	}
}

// waitForAfterCleanup is waitFor after CleanupMarked deleted the stream's
// entry (res), doing what the daemon does after it: each answer that still
// shows another source may be the flow's datagram matching an entry that
// the server's reply, in flight at the deletion, made the other way round
// (conntrack.md), so CleanupReplies looks again.
func (s *udpStream) waitForAfterCleanup(t *testing.T, ns netns.NsHandle, addr netip.Addr, res conntrack.Result) netip.AddrPort {
	t.Helper()
	return s.waitForOr(t, addr, func() {
		if r, err := conntrack.CleanupReplies(ns, res); err != nil {
			t.Fatalf("CleanupReplies: %v", err)
		} else if r.Deleted > 0 {
			t.Logf("CleanupReplies: %s", r)
		}
	})
}

// expectOnly drops the answers already received and checks that the next
// n all show source want (address and port: the same conntrack entry).
func (s *udpStream) expectOnly(t *testing.T, want netip.AddrPort, n int) {
	t.Helper()
	for len(s.seen) > 0 {
		<-s.seen
	}
	timeout := time.After(seenBound + time.Duration(n)*streamEvery)
	for i := 0; i < n; i++ {
		select {
		case ap := <-s.seen:
			if ap != want {
				t.Fatalf("the stream to %s showed source %s (answer %d after the cleanup), want %s throughout", s.dst, ap, i+1, want)
			}
		case <-timeout:
			t.Fatalf("the stream to %s stopped answering after %d answers%s", s.dst, i, s.senderState())
		}
	}
}

// senderState is, for a failed wait, whether the sender had ended (its
// cap, streamMax, reached or the stream stopped): then the answers that
// did not come were never asked for.
func (s *udpStream) senderState() string {
	select {
	case <-s.ended:
		return fmt.Sprintf(" (the sender had ended after %d datagrams, its cap %d: nothing more was sent)", s.sent.Load(), streamMax)
	default:
		return fmt.Sprintf(" (the sender was still sending: %d datagrams so far)", s.sent.Load())
	}
}

func cleanup(t *testing.T, topo *testnet.Topology, mode conntrack.Mode, old, new conntrack.Decider) conntrack.Result {
	t.Helper()
	res, err := conntrack.CleanupMarked(topo.NodeHandle(), mode, old, new, -1)
	if err != nil {
		t.Fatalf("Cleanup(%s): %v", mode, err)
	}
	t.Logf("Cleanup(%s): %s", mode, res)
	return res
}

// TestConntrackUDPStream: a UDP stream from the pod keeps one conntrack
// entry, so a config change alone never reaches it; after Cleanup the
// external side sees the new decision, and with mode none the old one.
func TestConntrackUDPStream(t *testing.T) {
	const (
		masqAll6    = ""                                                         // with --enable-ipv6: IPv6 masqueraded (masqOutBoundIPv6)
		nomasqNet   = "nonMasqueradeCIDRs: [10.0.0.0/8, 203.0.113.0/24]\n"       // 203.0.113.10 not masqueraded
		nomasqNet6  = "nonMasqueradeCIDRs: [10.0.0.0/8, \"2001:db8:aa::/48\"]\n" // 2001:db8:aa::10 not masqueraded
		defaultsCfg = ""                                                         // 203.0.113.10 masqueraded
	)
	topo := newTopology(t)
	addDestinations(t, topo, internet1, internet6a)
	if err := topo.EnableConntrack(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name           string
		dst            string
		ipv6           bool
		from, to       string
		mode           conntrack.Mode
		masqBefore     bool
		wantMasqAfter  bool
		wantMinDeleted int
	}{
		{"masquerade to not: udp", internet1, false, defaultsCfg, nomasqNet, conntrack.ModeUDP, true, false, 1},
		{"masquerade to not: none", internet1, false, defaultsCfg, nomasqNet, conntrack.ModeNone, true, true, 0},
		{"not to masquerade: udp", internet1, false, nomasqNet, defaultsCfg, conntrack.ModeUDP, false, true, 1},
		{"not to masquerade: none", internet1, false, nomasqNet, defaultsCfg, conntrack.ModeNone, false, false, 0},
		{"IPv6 masquerade to not: udp", internet6a, true, masqAll6, nomasqNet6, conntrack.ModeUDP, true, false, 1},
		{"IPv6 masquerade to not: none", internet6a, true, masqAll6, nomasqNet6, conntrack.ModeNone, true, true, 0},
		{"IPv6 not to masquerade: udp", internet6a, true, nomasqNet6, masqAll6, conntrack.ModeUDP, false, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod, node := topo.Pod4, topo.NodeUplink4
			if tc.ipv6 {
				pod, node = topo.Pod6, topo.NodeUplink6
			}
			source := func(masq bool) netip.Addr {
				if masq {
					return node
				}
				return pod
			}
			old := applyConntrackConfig(t, topo, tc.from, tc.ipv6)
			s := startUDPStream(t, topo, tc.dst)
			before := s.waitFor(t, source(tc.masqBefore))
			newD := applyConntrackConfig(t, topo, tc.to, tc.ipv6)
			// The new rules alone do not reach the running flow.
			s.expectOnly(t, before, 4)
			res := cleanup(t, topo, tc.mode, old, newD)
			if res.Deleted < tc.wantMinDeleted || (tc.wantMinDeleted == 0 && res.Deleted != 0) || res.Failed != 0 {
				t.Errorf("Cleanup deleted %d entries (%d failed), want %s", res.Deleted, res.Failed,
					map[bool]string{true: "at least 1", false: "none"}[tc.wantMinDeleted > 0])
			}
			if tc.masqBefore == tc.wantMasqAfter {
				s.expectOnly(t, before, 20) // 1 s of datagrams: still the old entry
			} else {
				s.waitForAfterCleanup(t, topo.NodeHandle(), source(tc.wantMasqAfter), res)
			}
			s.close()
		})
	}
}

// TestConntrackTCP: a TCP connection established before the change keeps
// working with the default mode (its entry is left alone), and is cut with
// mode all (its entry deleted, the next segment leaves unmasqueraded and
// the external host resets it).
func TestConntrackTCP(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1)
	if err := topo.EnableConntrack(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mode    conntrack.Mode
		survive bool
	}{{conntrack.ModeUDP, true}, {conntrack.ModeAll, false}} {
		t.Run(string(tc.mode), func(t *testing.T) {
			old := applyConntrackConfig(t, topo, "", false)
			c, r := connectTCP(t, topo, internet1, topo.NodeUplink4)
			newD := applyConntrackConfig(t, topo, "nonMasqueradeCIDRs: [203.0.113.0/24]\n", false)
			echo(t, c, r, true) // the new rules alone do not touch it
			res := cleanup(t, topo, tc.mode, old, newD)
			if tc.survive && res.Deleted != 0 || !tc.survive && res.Deleted < 1 {
				t.Errorf("Cleanup(%s) deleted %d entries", tc.mode, res.Deleted)
			}
			echo(t, c, r, tc.survive)
			c.Close()
			expectSources(t, topo, map[string]bool{internet1: false}) // new connections: the new decision
		})
	}
}

// connectTCP connects from the pod to dst's echo server and checks the
// source the server saw.
func connectTCP(t *testing.T, topo *testnet.Topology, dst string, wantSrc netip.Addr) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := topo.ConnectPodTo(netip.MustParseAddr(dst), testnet.ServerPort)
	if err != nil {
		t.Fatalf("connect to %s: %v", dst, err)
	}
	t.Cleanup(func() { c.Close() })
	r := bufio.NewReader(c)
	c.SetDeadline(time.Now().Add(testnet.DialTimeout))
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("read from %s: %v", dst, err)
	}
	if ap, err := testnet.ParseSeen(line); err != nil || ap.Addr() != wantSrc {
		t.Fatalf("%s saw %q (%v), want source %s", dst, line, err, wantSrc)
	}
	return c, r
}

// echo sends a line on an established connection and reads it back; it
// checks that this works (ok) or fails (reset or no answer).
func echo(t *testing.T, c net.Conn, r *bufio.Reader, ok bool) {
	t.Helper()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	_, err := c.Write([]byte("ping\n"))
	var line string
	if err == nil {
		line, err = r.ReadString('\n')
	}
	switch {
	case ok && (err != nil || line != "ping\n"):
		t.Errorf("the established connection broke: %q, %v", line, err)
	case !ok && err == nil:
		t.Errorf("the established connection still echoes %q, want it cut", line)
	case !ok:
		t.Logf("the established connection is cut: %v", err)
	}
}

// TestConntrackLeavesOthersAlone: with the most aggressive mode, a cleanup
// deletes the changed destination's entry only: a stream to an unrelated
// destination and a stream masqueraded by another NAT table (table ip
// othernat, a fully-random masquerade of its own) keep their entries (the
// same source address and port throughout), and so does an established TCP
// connection to the unrelated destination.
func TestConntrackLeavesOthersAlone(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1, internet2, private1)
	if err := topo.EnableConntrack(); err != nil {
		t.Fatal(err)
	}
	other := "table ip othernat {\n\tchain post {\n\t\ttype nat hook postrouting priority srcnat - 5; policy accept;\n" +
		"\t\tip daddr " + private1 + " masquerade fully-random\n\t}\n}\n"
	file := filepath.Join(t.TempDir(), "othernat.nft")
	if err := os.WriteFile(file, []byte(other), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := topo.NFT("-f", file); err != nil {
		t.Fatalf("nft -f othernat: %v\n%s", err, out)
	}
	old := applyConntrackConfig(t, topo, "", false)
	changed := startUDPStream(t, topo, internet1)
	unrelated := startUDPStream(t, topo, internet2)
	otherNAT := startUDPStream(t, topo, private1)
	changed.waitFor(t, topo.NodeUplink4)
	unrelatedSrc := unrelated.waitFor(t, topo.NodeUplink4)
	otherSrc := otherNAT.waitFor(t, topo.NodeUplink4) // by othernat: the agent does not masquerade 10/8
	c, r := connectTCP(t, topo, internet2, topo.NodeUplink4)

	newD := applyConntrackConfig(t, topo, "nonMasqueradeCIDRs: [10.0.0.0/8, 203.0.113.0/24]\n", false)
	res := cleanup(t, topo, conntrack.ModeAll, old, newD)
	if res.Deleted != 1 || res.Failed != 0 {
		t.Errorf("Cleanup deleted %d entries (%d failed), want 1 (the stream to %s)", res.Deleted, res.Failed, internet1)
	}
	changed.waitFor(t, topo.Pod4)
	unrelated.expectOnly(t, unrelatedSrc, 10)
	otherNAT.expectOnly(t, otherSrc, 10)
	echo(t, c, r, true)
	if out, err := topo.NFT("list", "table", "ip", "othernat"); err != nil || !strings.Contains(out, "masquerade") {
		t.Errorf("table ip othernat changed: %v\n%s", err, out)
	}
}

// TestConntrackDaemon: the daemon itself cleans up after a ConfigMap
// change: a running UDP stream gets the new decision, and with
// --conntrack-cleanup=none it keeps the old one.
func TestConntrackDaemon(t *testing.T) {
	for _, mode := range []string{"udp", "none"} {
		t.Run(mode, func(t *testing.T) {
			topo := newTopology(t)
			addDestinations(t, topo, internet1)
			if err := topo.EnableConntrack(); err != nil {
				t.Fatal(err)
			}
			cm := newConfigMapDir(t, "resyncInterval: 1h\n")
			d := startDaemon(t, topo, "--config", cm.path(), "--http-address=127.0.0.1:0", "--conntrack-cleanup="+mode)
			eventually(t, "the rules", sourcesAre(topo, map[string]bool{internet1: true}))
			s := startUDPStream(t, topo, internet1)
			before := s.waitFor(t, topo.NodeUplink4)
			cm.update("resyncInterval: 1h\nnonMasqueradeCIDRs: [203.0.113.0/24]\n")
			eventually(t, "the new config", func() bool { return strings.Contains(d.output(), "applied new config") })
			if mode == "none" {
				s.expectOnly(t, before, 20)
				return
			}
			s.waitFor(t, topo.Pod4)
			// The log line follows the deletion that the flow already saw:
			// wait for it rather than read the log at once.
			eventually(t, "the cleanup logged with its count", func() bool {
				return strings.Contains(d.output(), "conntrack cleanup: examined") && strings.Contains(d.output(), "deleted 1 ")
			})
		})
	}
}

// TestConntrackRepliesRecreated: a UDP flow the old rules did not
// masquerade and the new ones do has its entry deleted; the server's
// answer to its last datagram, in flight then, makes an entry the other
// way round (the server to the pod's address and port), which the flow's
// next datagrams match as replies: they leave unmasqueraded for as long as
// the flow goes on, as packets show. CleanupReplies deletes that entry,
// and only it (an entry to another port of the pod stays); the next
// datagram is masqueraded.
func TestConntrackRepliesRecreated(t *testing.T) {
	testnet.Require(t, "conntrack")
	topo := newTopology(t)
	addDestinations(t, topo, internet1)
	if err := topo.EnableConntrack(); err != nil {
		t.Fatal(err)
	}
	old := applyConntrackConfig(t, topo, "nonMasqueradeCIDRs: [10.0.0.0/8, 203.0.113.0/24]\n", false)
	s := startUDPStream(t, topo, internet1)
	from := s.waitFor(t, topo.Pod4)
	s.close()
	newD := applyConntrackConfig(t, topo, "", false)
	res := cleanup(t, topo, conntrack.ModeUDP, old, newD)
	if res.Deleted != 1 || res.Replies() != 1 {
		t.Fatalf("cleanup: deleted %d, %d flows a reply could re-create, want 1 and 1", res.Deleted, res.Replies())
	}
	// What the answer in flight makes, and an entry of another flow.
	reverse := func(dport uint16) {
		t.Helper()
		p := strconv.Itoa(int(dport))
		if out, err := testnet.Exec(topo.NodeNS, "conntrack", "-I", "-p", "udp", "-s", internet1, "-d", topo.Pod4.String(),
			"--sport", strconv.Itoa(testnet.ServerPort), "--dport", p, "-r", topo.Pod4.String(), "-q", internet1,
			"--reply-port-src", p, "--reply-port-dst", strconv.Itoa(testnet.ServerPort), "-t", "120"); err != nil {
			t.Fatalf("conntrack -I: %v\n%s", err, out)
		}
	}
	reverse(from.Port())
	other := from.Port() + 1
	reverse(other)
	c, err := topo.DialPodUDPFromPort(from, netip.MustParseAddr(internet1))
	if err != nil {
		t.Fatal(err)
	}
	again := streamOn(t, c, internet1)
	again.waitFor(t, topo.Pod4) // a reply to the server's entry: not masqueraded

	r, err := conntrack.CleanupReplies(topo.NodeHandle(), res)
	if err != nil {
		t.Fatalf("CleanupReplies: %v", err)
	}
	t.Logf("CleanupReplies: %s", r)
	if r.Deleted != 1 {
		t.Errorf("CleanupReplies deleted %d entries, want 1", r.Deleted)
	}
	again.waitFor(t, topo.NodeUplink4)
	out, err := testnet.Exec(topo.NodeNS, "conntrack", "-L", "-p", "udp", "--dport", strconv.Itoa(int(other)))
	if err != nil || !strings.Contains(string(out), "dport="+strconv.Itoa(int(other))) {
		t.Errorf("the other flow's entry is gone: %v\n%s", err, out)
	}
}
