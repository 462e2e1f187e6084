// Package testnet builds small, disposable network topologies out of Linux
// network namespaces, for tests that need real kernel packet paths (routing,
// conntrack, nftables NAT).
//
// Each Topology is three named network namespaces (visible to
// `ip netns exec NAME ...` under /run/netns):
//
//	pod ns  --veth--  node ns  --veth--  ext ns
//	10.244.1.2/24     10.244.1.1/24
//	fd00:1::2/64      fd00:1::1/64
//	                  192.0.2.1/24     ---  192.0.2.2/24
//	                  2001:db8:1::1/64 ---  2001:db8:1::2/64
//
// The pod routes everything via the node; the node forwards (IPv4 and IPv6
// forwarding are enabled in the node namespace only) and routes everything
// else via ext; ext routes 10.244.0.0/16 and fd00::/16 back via the node and
// owns any extra "destination" addresses added with AddDestination.
//
// Nothing is ever changed in the caller's (root) network namespace: every link
// is created inside the topology's namespaces and every sysctl is written from
// a thread that is inside the namespace concerned. Close removes everything.
//
// Each namespace that owns a destination runs, lazily, a TCP and a UDP server
// on ServerPort, bound to the wildcard address (v4 and v6). The TCP server
// writes the remote address it saw followed by "\n" and then echoes whatever
// the client sends until the client closes; the UDP server answers every
// datagram with the remote address it saw (from the address the datagram was
// sent to).
//
// Two things a test may need to know:
//   - A fresh namespace does no connection tracking until some rule needs it
//     (a ct expression, or a nat statement such as masquerade). Call
//     EnableConntrack first when connections opened before the first NAT
//     rule matter, as they would on a real node.
//   - The kernel never forwards a packet whose destination is IPv6
//     link-local (fe80::/10) out of another interface than the one it came
//     in on, so the pod cannot reach such a destination through the node;
//     test those with SourceSeenFromNode (node-originated traffic).
package testnet

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// ServerPort is the TCP and UDP port of the topology's servers.
const ServerPort = 8080

// Interface names inside the namespaces (they are per namespace, so they do
// not collide between topologies).
const (
	PodIf        = "eth0"     // the pod's interface (pod ns), towards the node
	NodePodIf    = "veth-pod" // the node's interface towards the pod (node ns)
	NodeUplinkIf = "eth0"     // the node's uplink towards ext (node ns)
	ExtIf        = "eth0"     // ext's interface towards the node (ext ns)
	ExtDstIf     = "lo"       // ext's interface holding destinations (ext ns; lo, since CONFIG_DUMMY may be absent)
)

// DialTimeout bounds every connection attempt and every wait for an answer.
const DialTimeout = 2 * time.Second

// execTimeout bounds the commands run by Exec and NFT.
const execTimeout = 60 * time.Second

const netnsDir = "/run/netns"

var counter atomic.Uint64

// Topology is one pod/node/ext set of namespaces. Create it with New and
// always Close it.
type Topology struct {
	Name                     string     // prefix of the namespace names (unique: carries pid and a counter)
	PodNS, NodeNS, ExtNS     string     // names under /run/netns
	Pod4, Pod6               netip.Addr // 10.244.1.2, fd00:1::2
	NodeUplink4, NodeUplink6 netip.Addr // 192.0.2.1, 2001:db8:1::1: the address a masqueraded packet carries
	NodePodSide4             netip.Addr // 10.244.1.1 (a local address of the node)
	NodePodSide6             netip.Addr // fd00:1::1 (a local address of the node)

	mu      sync.Mutex
	closed  bool
	ns      map[string]netns.NsHandle  // open handles, by namespace name
	nl      map[string]*netlink.Handle // netlink handles, by namespace name
	mounted []string                   // namespace names whose /run/netns file we created
	servers map[string]*server         // by namespace name
	wg      sync.WaitGroup             // server goroutines
}

type server struct {
	tcp   net.Listener
	udp   *net.UDPConn
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	done  bool
}

// New creates the namespaces, links, addresses, routes and sysctls of a new
// topology. name (non-empty, no '/' or white space) becomes the prefix of the
// namespace names, which get a unique "-<pid>-<counter>" suffix. On error
// everything created so far is removed again.
func New(name string) (_ *Topology, err error) {
	if name == "" || strings.ContainsAny(name, "/ \t\n") {
		return nil, fmt.Errorf("testnet: invalid topology name %q", name)
	}
	full := fmt.Sprintf("%s-%d-%d", name, os.Getpid(), counter.Add(1))
	t := &Topology{
		Name:         full,
		PodNS:        full + "-pod",
		NodeNS:       full + "-node",
		ExtNS:        full + "-ext",
		Pod4:         netip.MustParseAddr("10.244.1.2"),
		Pod6:         netip.MustParseAddr("fd00:1::2"),
		NodeUplink4:  netip.MustParseAddr("192.0.2.1"),
		NodeUplink6:  netip.MustParseAddr("2001:db8:1::1"),
		NodePodSide4: netip.MustParseAddr("10.244.1.1"),
		NodePodSide6: netip.MustParseAddr("fd00:1::1"),
		ns:           map[string]netns.NsHandle{},
		nl:           map[string]*netlink.Handle{},
		servers:      map[string]*server{},
	}
	defer func() {
		if err != nil {
			err = errors.Join(fmt.Errorf("testnet: New(%q): %w", name, err), t.Close())
		}
	}()
	if err := t.createNamespaces(); err != nil {
		return nil, err
	}
	if err := t.setup(); err != nil {
		return nil, err
	}
	return t, nil
}

// common sysctls of every namespace: no DAD (no tentative addresses, no
// waiting; this also covers the kernel-generated link-local addresses).
var baseSysctls = [][2]string{
	{"net/ipv6/conf/all/accept_dad", "0"},
	{"net/ipv6/conf/default/accept_dad", "0"},
}

// createNamespaces creates the three named namespaces from one dedicated,
// locked OS thread, which is moved back to its namespace afterwards.
func (t *Topology) createNamespaces() error {
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		return err
	}
	specs := []nsSpec{
		{t.PodNS, [][2]string{{"net/ipv4/ip_forward", "0"}, {"net/ipv6/conf/all/forwarding", "0"}}},
		{t.NodeNS, [][2]string{{"net/ipv4/ip_forward", "1"}, {"net/ipv6/conf/all/forwarding", "1"}}},
		{t.ExtNS, [][2]string{{"net/ipv4/ip_forward", "0"}, {"net/ipv6/conf/all/forwarding", "0"}}},
	}
	return onThread(func() error { return t.unshareNamed(specs) })
}

type nsSpec struct {
	name    string
	sysctls [][2]string
}

// unshareNamed creates the named namespaces one after the other on the
// calling (locked) thread, which ends up in the last one.
func (t *Topology) unshareNamed(specs []nsSpec) error {
	for _, s := range specs {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare(CLONE_NEWNET): %w", err)
		}
		path := filepath.Join(netnsDir, s.name)
		f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
		if err != nil {
			return err
		}
		f.Close()
		t.mounted = append(t.mounted, s.name) // from here on Close removes it
		self := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
		if err := unix.Mount(self, path, "none", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind mount %s on %s: %w", self, path, err)
		}
		h, err := netns.GetFromPath(path)
		if err != nil {
			return err
		}
		t.ns[s.name] = h
		// This thread is inside the new namespace: /proc/sys/net is its.
		for _, kv := range append(append([][2]string{}, baseSysctls...), s.sysctls...) {
			if err := os.WriteFile("/proc/sys/"+kv[0], []byte(kv[1]), 0o644); err != nil {
				return fmt.Errorf("sysctl %s=%s in %s: %w", kv[0], kv[1], s.name, err)
			}
		}
	}
	return nil
}

func (t *Topology) setup() error {
	for _, n := range []string{t.PodNS, t.NodeNS, t.ExtNS} {
		h, err := netlink.NewHandleAt(t.ns[n])
		if err != nil {
			return fmt.Errorf("netlink handle in %s: %w", n, err)
		}
		t.nl[n] = h
	}
	pod, node, ext := t.nl[t.PodNS], t.nl[t.NodeNS], t.nl[t.ExtNS]

	veth := func(name, peer string, peerNS netns.NsHandle) *netlink.Veth {
		la := netlink.NewLinkAttrs()
		la.Name = name
		return &netlink.Veth{LinkAttrs: la, PeerName: peer, PeerNamespace: netlink.NsFd(peerNS)}
	}
	if err := node.LinkAdd(veth(NodePodIf, PodIf, t.ns[t.PodNS])); err != nil {
		return fmt.Errorf("veth %s/%s: %w", NodePodIf, PodIf, err)
	}
	if err := node.LinkAdd(veth(NodeUplinkIf, ExtIf, t.ns[t.ExtNS])); err != nil {
		return fmt.Errorf("veth %s/%s: %w", NodeUplinkIf, ExtIf, err)
	}

	up := []struct {
		h     *netlink.Handle
		links []string
	}{
		{pod, []string{"lo", PodIf}},
		{node, []string{"lo", NodePodIf, NodeUplinkIf}},
		{ext, []string{"lo", ExtIf}},
	}
	for _, u := range up {
		for _, name := range u.links {
			l, err := u.h.LinkByName(name)
			if err != nil {
				return fmt.Errorf("link %s: %w", name, err)
			}
			if err := u.h.LinkSetUp(l); err != nil {
				return fmt.Errorf("link %s up: %w", name, err)
			}
		}
	}

	addrs := []struct {
		h    *netlink.Handle
		link string
		p    string
	}{
		{pod, PodIf, "10.244.1.2/24"},
		{pod, PodIf, "fd00:1::2/64"},
		{node, NodePodIf, "10.244.1.1/24"},
		{node, NodePodIf, "fd00:1::1/64"},
		{node, NodeUplinkIf, "192.0.2.1/24"},
		{node, NodeUplinkIf, "2001:db8:1::1/64"},
		{ext, ExtIf, "192.0.2.2/24"},
		{ext, ExtIf, "2001:db8:1::2/64"},
	}
	for _, a := range addrs {
		if err := addAddr(a.h, a.link, netip.MustParsePrefix(a.p)); err != nil {
			return err
		}
	}

	routes := []struct {
		h    *netlink.Handle
		link string
		dst  string
		gw   string
	}{
		{pod, PodIf, "0.0.0.0/0", "10.244.1.1"},
		{pod, PodIf, "::/0", "fd00:1::1"},
		{node, NodeUplinkIf, "0.0.0.0/0", "192.0.2.2"},
		{node, NodeUplinkIf, "::/0", "2001:db8:1::2"},
		{ext, ExtIf, "10.244.0.0/16", "192.0.2.1"},
		{ext, ExtIf, "fd00::/16", "2001:db8:1::1"},
	}
	for _, r := range routes {
		l, err := r.h.LinkByName(r.link)
		if err != nil {
			return fmt.Errorf("link %s: %w", r.link, err)
		}
		rt := &netlink.Route{
			LinkIndex: l.Attrs().Index,
			Dst:       prefixToIPNet(netip.MustParsePrefix(r.dst)),
			Gw:        net.IP(netip.MustParseAddr(r.gw).AsSlice()),
		}
		if err := r.h.RouteAdd(rt); err != nil {
			return fmt.Errorf("route %s via %s: %w", r.dst, r.gw, err)
		}
	}
	return nil
}

func prefixToIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func addAddr(h *netlink.Handle, link string, p netip.Prefix) error {
	l, err := h.LinkByName(link)
	if err != nil {
		return fmt.Errorf("link %s: %w", link, err)
	}
	a := &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
	if p.Addr().Is6() {
		a.Flags = unix.IFA_F_NODAD
	}
	if err := h.AddrAdd(l, a); err != nil {
		return fmt.Errorf("address %s on %s: %w", p, link, err)
	}
	return nil
}

// Close stops the servers, closes all handles and deletes the namespaces. It
// is safe to call more than once and on a partially built topology.
func (t *Topology) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	servers := t.servers
	t.servers = nil
	t.mu.Unlock()

	var errs []error
	for _, s := range servers {
		s.close()
	}
	t.wg.Wait()
	for _, h := range t.nl {
		h.Close()
	}
	for _, h := range t.ns {
		if err := h.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, name := range t.mounted {
		path := filepath.Join(netnsDir, name)
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", path, err))
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ConntrackTable is the nftables table (family inet, node namespace) that
// EnableConntrack adds.
const ConntrackTable = "testnet-conntrack"

// EnableConntrack makes connection tracking active in the node namespace now,
// as it is on any real node (where kube-proxy or the host firewall already use
// it), by adding the table "inet testnet-conntrack" whose only rule counts
// `ct state invalid` packets. Without it, a fresh namespace tracks nothing
// until some rule needs conntrack (a ct expression or a nat statement such as
// masquerade; a nat-type chain alone does not, and is not even traversed): a
// connection opened before that is then picked up mid-stream as NEW and
// NATed, which breaks it.
func (t *Topology) EnableConntrack() error {
	_, err := t.NFT("add table inet " + ConntrackTable + "; " +
		"add chain inet " + ConntrackTable + " c { type filter hook prerouting priority -300; }; " +
		"add rule inet " + ConntrackTable + " c ct state invalid counter")
	return err
}

// NodeHandle returns an open netns handle (fd) to the node namespace; the
// caller must not close it; valid until Close.
func (t *Topology) NodeHandle() netns.NsHandle {
	return t.ns[t.NodeNS]
}

// AddDestination makes addr an address of the ext namespace (a reachable
// "remote host"): a /32 or /128 on ext's loopback (ExtDstIf), except IPv6
// link-local addresses, which go on ExtIf (the link shared with the node's
// uplink), the only place where they can be reached. Adding an address that
// is already there is not an error.
func (t *Topology) AddDestination(addr netip.Addr) error {
	addr = addr.WithZone("").Unmap()
	if !addr.IsValid() {
		return errors.New("testnet: AddDestination: invalid address")
	}
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return errors.New("testnet: topology closed")
	}
	link := ExtDstIf
	if addr.Is6() && addr.IsLinkLocalUnicast() {
		link = ExtIf
	}
	err := addAddr(t.nl[t.ExtNS], link, netip.PrefixFrom(addr, addr.BitLen()))
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	return err
}

// owner returns the namespace (node or ext) holding addr as a local address.
func (t *Topology) owner(addr netip.Addr) (string, error) {
	addr = addr.WithZone("").Unmap()
	for _, n := range []string{t.NodeNS, t.ExtNS} {
		list, err := t.nl[n].AddrList(nil, netlink.FAMILY_ALL)
		if err != nil {
			return "", fmt.Errorf("addresses of %s: %w", n, err)
		}
		for _, a := range list {
			if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == addr {
				return n, nil
			}
		}
	}
	return "", fmt.Errorf("testnet: no namespace of %s owns %s (AddDestination first)", t.Name, addr)
}

// InNS runs f on a fresh locked OS thread that is inside namespace h, and then
// moves the thread back. If moving back fails the thread stays locked and is
// terminated when the goroutine exits, so no other goroutine ever runs in h.
func InNS(h netns.NsHandle, f func() error) error {
	return onThread(func() error {
		if err := netns.Set(h); err != nil {
			return fmt.Errorf("setns: %w", err)
		}
		return f()
	})
}

// onThread runs f on a new goroutine locked to its OS thread, and then
// moves the thread back to the network namespace it started in, and
// unlocks it. Should that fail, it stays locked: the runtime then ends
// the thread with the goroutine, so no other goroutine ever runs in a
// namespace f entered.
func onThread(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("current netns: %w", err)
			return
		}
		defer orig.Close()
		err = f()
		if serr := netns.Set(orig); serr != nil {
			errc <- errors.Join(err, fmt.Errorf("setns back: %w", serr))
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// serve starts the server of the namespace that owns dst, if it is not
// running yet.
func (t *Topology) serve(dst netip.Addr) error {
	owner, err := t.owner(dst)
	if err != nil {
		return err
	}
	_, err = t.server(owner)
	return err
}

// server returns the (lazily started) servers of namespace ns.
func (t *Topology) server(ns string) (*server, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, errors.New("testnet: topology closed")
	}
	if s := t.servers[ns]; s != nil {
		return s, nil
	}
	s := &server{conns: map[net.Conn]struct{}{}}
	laddr := fmt.Sprintf(":%d", ServerPort) // wildcard: one dual-stack socket
	err := InNS(t.ns[ns], func() error {
		var err error
		if s.tcp, err = net.Listen("tcp", laddr); err != nil {
			return err
		}
		pc, err := net.ListenPacket("udp", laddr)
		if err != nil {
			s.tcp.Close()
			return err
		}
		s.udp = pc.(*net.UDPConn)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("testnet: servers in %s: %w", ns, err)
	}
	if err := setPktinfo(s.udp); err != nil {
		s.tcp.Close()
		s.udp.Close()
		return nil, fmt.Errorf("testnet: udp server in %s: %w", ns, err)
	}
	t.servers[ns] = s
	t.wg.Add(2)
	go func() { defer t.wg.Done(); s.serveTCP(&t.wg) }()
	go func() { defer t.wg.Done(); s.serveUDP() }()
	return s, nil
}

// setPktinfo asks for the destination address of received datagrams (so that
// the answer leaves from that address, whatever the routing would pick).
// IPV6_PKTINFO on the dual-stack socket covers IPv4 as v4-mapped addresses.
func setPktinfo(c *net.UDPConn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		if la, ok := c.LocalAddr().(*net.UDPAddr); ok && la.IP.To4() != nil {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_PKTINFO, 1)
			return
		}
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1)
	})
	return errors.Join(err, serr)
}

func (s *server) close() {
	s.mu.Lock()
	s.done = true
	conns := s.conns
	s.conns = nil
	s.mu.Unlock()
	s.tcp.Close()
	s.udp.Close()
	for c := range conns {
		c.Close()
	}
}

func (s *server) serveTCP(wg *sync.WaitGroup) {
	for {
		c, err := s.tcp.Accept()
		if err != nil {
			return // closed
		}
		s.mu.Lock()
		if s.done {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer wg.Done()
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				c.Close()
			}()
			ap := c.RemoteAddr().(*net.TCPAddr).AddrPort()
			c.SetWriteDeadline(time.Now().Add(DialTimeout))
			if _, err := fmt.Fprintf(c, "%s %d\n", ap.Addr().Unmap().WithZone(""), ap.Port()); err != nil {
				return
			}
			c.SetWriteDeadline(time.Time{})
			io.Copy(c, c) // echo until the client closes (or Close closes c)
		}()
	}
}

func (s *server) serveUDP() {
	buf := make([]byte, 2048)
	oob := make([]byte, 256)
	for {
		_, oobn, _, from, err := s.udp.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		var reply []byte
		if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, m := range msgs {
				switch {
				case m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_PKTINFO && len(m.Data) >= unix.SizeofInet6Pktinfo:
					var pi unix.Inet6Pktinfo
					copy(pi.Addr[:], m.Data[:16])
					ifindex := binary.NativeEndian.Uint32(m.Data[16:20])
					if netip.AddrFrom16(pi.Addr).IsLinkLocalUnicast() {
						pi.Ifindex = ifindex
					}
					if from.Addr().Is6() && from.Addr().IsLinkLocalUnicast() {
						// numeric zone: see dial about Go's zone cache
						from = netip.AddrPortFrom(from.Addr().WithZone(strconv.FormatUint(uint64(ifindex), 10)), from.Port())
					}
					reply = unix.PktInfo6(&pi)
				case m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_PKTINFO && len(m.Data) >= unix.SizeofInet4Pktinfo:
					var pi unix.Inet4Pktinfo
					copy(pi.Spec_dst[:], m.Data[8:12]) // ipi_addr: the header destination
					reply = unix.PktInfo4(&pi)
				}
			}
		}
		msg := fmt.Appendf(nil, "%s %d\n", from.Addr().Unmap().WithZone(""), from.Port())
		s.udp.WriteMsgUDPAddrPort(msg, reply, from)
	}
}

// dial dials network/dst:port from a socket created in namespace ns, bound
// to src if src is valid. An IPv6 link-local dst without zone gets zone
// zoneIf; zone names are resolved in ns (see below).
func (t *Topology) dial(ns, zoneIf, network string, src, dst netip.Addr, port uint16) (net.Conn, error) {
	dst = dst.Unmap()
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return nil, errors.New("testnet: topology closed")
	}
	if dst.Is6() && (dst.IsLinkLocalUnicast() || dst.IsLinkLocalMulticast()) {
		// Go's zone name <-> index cache is process-wide and filled from
		// whatever namespace the refreshing thread is in: never let it
		// resolve a name, give it the index in ns.
		zone := dst.Zone()
		if zone == "" {
			zone = zoneIf
		}
		if _, err := strconv.Atoi(zone); err != nil {
			l, err := t.nl[ns].LinkByName(zone)
			if err != nil {
				return nil, fmt.Errorf("testnet: zone %q in %s: %w", zone, ns, err)
			}
			zone = strconv.Itoa(l.Attrs().Index)
		}
		dst = dst.WithZone(zone)
	}
	d := net.Dialer{Timeout: DialTimeout}
	if src.IsValid() {
		switch network {
		case "tcp":
			d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(src.Unmap(), 0))
		case "udp":
			d.LocalAddr = net.UDPAddrFromAddrPort(netip.AddrPortFrom(src.Unmap(), 0))
		}
	}
	var c net.Conn
	err := InNS(t.ns[ns], func() error {
		var err error
		c, err = d.Dial(network, netip.AddrPortFrom(dst, port).String())
		return err
	})
	return c, err
}

// NodeHTTPClient returns an HTTP client whose connections are made from the
// node namespace, e.g. to the agent's endpoints on the node's loopback.
func (t *Topology) NodeHTTPClient() *http.Client {
	return &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			DisableKeepAlives: true,
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				ap, err := netip.ParseAddrPort(addr)
				if err != nil {
					return nil, err
				}
				return t.dial(t.NodeNS, NodeUplinkIf, network, netip.Addr{}, ap.Addr(), ap.Port())
			},
		},
	}
}

func (t *Topology) podDial(network string, dst netip.Addr, port uint16) (net.Conn, error) {
	return t.dial(t.PodNS, PodIf, network, netip.Addr{}, dst, port)
}

// ConnectPodTo opens a TCP connection from the pod namespace to dst:port (dial
// timeout DialTimeout) and leaves it open; the caller closes it. If port is
// ServerPort the server of the namespace owning dst is started first: it
// writes the source address it saw followed by "\n" and then echoes. An IPv6
// link-local dst without zone gets the zone PodIf (of the pod namespace).
func (t *Topology) ConnectPodTo(dst netip.Addr, port uint16) (net.Conn, error) {
	if port == ServerPort {
		if err := t.serve(dst); err != nil {
			return nil, err
		}
	}
	return t.podDial("tcp", dst, port)
}

// SourceSeen opens a NEW TCP connection from the pod namespace to
// dst:ServerPort and returns the source address the destination's server saw
// (the server runs in whichever namespace owns dst: ext, or node for
// node-local addresses). Each call is a new connection (new conntrack entry).
func (t *Topology) SourceSeen(dst netip.Addr) (netip.Addr, error) {
	ap, err := t.SourcePortSeen("tcp", dst)
	return ap.Addr(), err
}

// SourcePortSeen is SourceSeen (network "tcp") or SourceSeenUDP (network
// "udp") returning the source port the destination saw too.
func (t *Topology) SourcePortSeen(network string, dst netip.Addr) (netip.AddrPort, error) {
	if network == "udp" {
		return t.sourceSeenUDP(dst)
	}
	c, err := t.ConnectPodTo(dst, ServerPort)
	if err != nil {
		return netip.AddrPort{}, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(DialTimeout))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("testnet: reading from %s: %w", dst, err)
	}
	return parseSeen(line)
}

// seenOver opens a NEW TCP connection in namespace ns through ifname from
// src (invalid: the kernel chooses) to dst:ServerPort and returns the
// source address the server there saw.
func (t *Topology) seenOver(ns, ifname, network string, src, dst netip.Addr) (netip.Addr, error) {
	c, err := t.dial(ns, ifname, network, src, dst, ServerPort)
	if err != nil {
		return netip.Addr{}, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(DialTimeout))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return netip.Addr{}, fmt.Errorf("testnet: reading from %s: %w", dst, err)
	}
	ap, err := parseSeen(line)
	return ap.Addr(), err
}

// SourceSeenFromNode is SourceSeen for a connection that the node itself
// originates (locally generated, so it crosses the node's output and
// postrouting hooks, not forward), from a socket bound to src (an address of
// the node, e.g. NodePodSide6; invalid src: the kernel chooses). An IPv6
// link-local dst without zone gets zone NodeUplinkIf.
//
// This is the way to test IPv6 link-local destinations (fe80::/10): the kernel
// never forwards a packet with a link-local destination to another interface
// than the one it came in on, so pod traffic cannot reach fe80::/10 on the
// ext link. From the node, a connection from fd00:1::1 to a link-local
// AddDestination address arrives unchanged when it is not masqueraded, and
// from the uplink's own link-local address when it is.
func (t *Topology) SourceSeenFromNode(src, dst netip.Addr) (netip.Addr, error) {
	if err := t.serve(dst); err != nil {
		return netip.Addr{}, err
	}
	return t.seenOver(t.NodeNS, NodeUplinkIf, "tcp", src, dst)
}

// SourceSeenUDP does the same as SourceSeen over UDP: one datagram from a
// fresh socket in the pod namespace, answered by the server with the source
// it saw (waiting at most DialTimeout).
func (t *Topology) SourceSeenUDP(dst netip.Addr) (netip.Addr, error) {
	ap, err := t.sourceSeenUDP(dst)
	return ap.Addr(), err
}

func (t *Topology) sourceSeenUDP(dst netip.Addr) (netip.AddrPort, error) {
	if err := t.serve(dst); err != nil {
		return netip.AddrPort{}, err
	}
	c, err := t.podDial("udp", dst, ServerPort)
	if err != nil {
		return netip.AddrPort{}, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(DialTimeout))
	if _, err := c.Write([]byte("?")); err != nil {
		return netip.AddrPort{}, fmt.Errorf("testnet: udp to %s: %w", dst, err)
	}
	buf := make([]byte, 512)
	n, err := c.Read(buf)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("testnet: udp answer from %s: %w", dst, err)
	}
	return parseSeen(string(buf[:n]))
}

// parseSeen parses a server's answer: "ADDRESS PORT\n".
func parseSeen(s string) (netip.AddrPort, error) {
	addr, port, _ := strings.Cut(strings.TrimSpace(s), " ")
	a, err := netip.ParseAddr(addr)
	p, perr := strconv.ParseUint(port, 10, 16)
	if err != nil || perr != nil {
		return netip.AddrPort{}, fmt.Errorf("testnet: bad server answer %q", s)
	}
	return netip.AddrPortFrom(a.Unmap(), uint16(p)), nil
}

// Exec runs a command inside a namespace via `ip netns exec` (at most 60s),
// returning combined output. The error, if any, wraps the command's error
// and quotes the output. name must be declared in packages (or be a path),
// and is named with its package when it is missing.
func Exec(ns string, name string, args ...string) ([]byte, error) {
	if reason := declaredAndPresent(name); reason != "" {
		return nil, fmt.Errorf("testnet: %s", reason)
	}
	ctx, cancel := context.WithTimeout(context.Background(), execTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns, name}, args...)...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("ip netns exec %s %s %s: %w: %s", ns, name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

// NFT runs `nft args...` in the node namespace (the real nft CLI, an
// independent reader of the kernel state).
func (t *Topology) NFT(args ...string) (string, error) {
	out, err := Exec(t.NodeNS, "nft", args...)
	return string(out), err
}

// RunInNode runs a command (e.g. the built agent binary) in the node ns and
// returns combined output and error; ctx bounds it. name must be declared
// in packages (or be a path), as for Exec.
func (t *Topology) RunInNode(ctx context.Context, name string, args ...string) ([]byte, error) {
	if reason := declaredAndPresent(name); reason != "" {
		return nil, fmt.Errorf("testnet: %s", reason)
	}
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", t.NodeNS, name}, args...)...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		err = fmt.Errorf("in %s: %s %s: %w", t.NodeNS, name, strings.Join(args, " "), err)
	}
	return out, err
}
