package test

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
)

// Regression tests from a hostile review of the read path (issue 26).

// injector sends datagrams to the nftables notification group from
// userspace, as any process with CAP_NET_ADMIN may.
func injector(t *testing.T, ns int) func(data []byte) {
	t.Helper()
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	raw, _ := c.SyscallConn()
	return func(data []byte) {
		raw.Write(func(fd uintptr) bool {
			err := unix.Sendto(int(fd), data, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1 << (unix.NFNLGRP_NFTABLES - 1)})
			if err != nil {
				t.Errorf("send to the group: %v", err)
			}
			return true
		})
	}
}

func fakeTouch() []byte {
	attrs, _ := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NFTA_SET_ELEM_LIST_TABLE, Data: []byte("ip-masq-agent\x00")}})
	payload := append([]byte{unix.NFPROTO_INET, 0, 0, 0}, attrs...)
	h := make([]byte, 16)
	putNative := func(b []byte, v uint32) { b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24) }
	putNative(h[0:4], uint32(16+len(payload)))
	typ := uint32(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWSETELEM)
	h[4], h[5] = byte(typ), byte(typ>>8)
	return append(h, payload...)
}

// TestForgedNetlinkDatagrams: a process with CAP_NET_ADMIN sends a
// malformed datagram to every nfnetlink socket of the namespace (their
// port ids are in /proc/net/netlink) and to the notification group, then
// fake "add elements to table inet ip-masq-agent" notifications without
// end. None of it comes from the kernel (port id 0), so none of it is an
// answer or a notification: the owned table stays owned, the watch goes
// on, and a tamper (not owned: before Linux 6.9, or --own-table=false) is
// repaired after the forged datagrams and while the fakes come.
func TestForgedNetlinkDatagrams(t *testing.T) {
	malformed := []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}
	unicastAll := func(t *testing.T, ns int, data []byte) int {
		c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: ns})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		list, err := readNetlinkSockets(netns.NsHandle(ns))
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := c.SyscallConn()
		sent := 0
		for _, pid := range list {
			if pid == c.PID() {
				continue
			}
			raw.Write(func(fd uintptr) bool {
				if unix.Sendto(int(fd), data, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Pid: pid}) == nil {
					sent++
				}
				return true
			})
		}
		return sent
	}
	// Where the table is not owned (a kernel before 6.9, or
	// --own-table=false) a tamper after the forged datagrams is repaired:
	// the watch and the read path took none of them for the kernel's.
	repairedAfter := func(t *testing.T, topo *testnet.Topology, d *daemon) {
		want := withoutCounters(listTable(t, topo))
		if sent := unicastAll(t, int(topo.NodeHandle()), malformed); sent == 0 {
			t.Fatal("no nfnetlink socket to send to")
		}
		send := injector(t, int(topo.NodeHandle()))
		send(malformed)
		send(fakeTouch())
		if out, err := topo.NFT("delete", "element", "inet", "ip-masq-agent", "nonmasq-v4", "{ 10.0.0.0/8 }"); err != nil {
			t.Fatalf("%v %s", err, out)
		}
		eventually(t, "the repair after the forged datagrams", func() bool { return withoutCounters(listTable(t, topo)) == want })
		for _, s := range []string{"watching nftables failed", "level=ERROR"} {
			if strings.Contains(d.output(), s) {
				t.Errorf("after forged datagrams the agent logged %q", s)
			}
		}
	}
	t.Run("owned", func(t *testing.T) {
		topo := newTopology(t)
		cm := newConfigMapDir(t, "resyncInterval: 1s\n")
		d := startDaemon(t, topo, "--config", cm.path(), "--http-address=127.0.0.1:0")
		eventually(t, "the first apply logged", func() bool { return strings.Contains(d.output(), "applied config") })
		if !ownsTable(t, topo, d) {
			// Before Linux 6.9 (the start probe found the owned table
			// refused): verify and repair.
			repairedAfter(t, topo, d)
			return
		}
		if sent := unicastAll(t, int(topo.NodeHandle()), malformed); sent == 0 {
			t.Fatal("no nfnetlink socket to send to")
		}
		injector(t, int(topo.NodeHandle()))(malformed)
		mark := strings.Count(d.output(), "resync: the table read back")
		eventually(t, "three more resyncs", func() bool { return strings.Count(d.output(), "resync: the table read back") >= mark+3 })
		for _, s := range []string{"update table inet ip-masq-agent", "watching nftables failed", "level=ERROR"} {
			if strings.Contains(d.output(), s) {
				t.Errorf("after forged datagrams the agent logged %q", s)
			}
		}
		if !strings.Contains(listTable(t, topo), "flags owner") {
			t.Error("the table is not owned any more")
		}
	})
	t.Run("not owned", func(t *testing.T) {
		topo := newTopology(t)
		cm := newConfigMapDir(t, "resyncInterval: 1h\n")
		d := startDaemon(t, topo, "--config", cm.path(), "--http-address=127.0.0.1:0", "--own-table=false")
		eventually(t, "the first apply logged", func() bool { return strings.Contains(d.output(), "applied config") })
		repairedAfter(t, topo, d)
	})
	t.Run("not owned, fakes while tampered", func(t *testing.T) {
		topo := newTopology(t)
		cm := newConfigMapDir(t, "resyncInterval: 5s\n")
		d := startDaemon(t, topo, "--config", cm.path(), "--http-address=127.0.0.1:0", "--own-table=false")
		eventually(t, "the first apply logged", func() bool { return strings.Contains(d.output(), "applied config") })
		want := withoutCounters(listTable(t, topo))
		send := injector(t, int(topo.NodeHandle()))
		send(malformed)
		var stop atomic.Bool
		var wg sync.WaitGroup
		wg.Go(func() {
			for i := 0; !stop.Load() && i < 200_000; i++ { // bounded: about 40 s
				send(fakeTouch())
				time.Sleep(200 * time.Microsecond)
			}
		})
		defer func() { stop.Store(true); wg.Wait() }()
		if out, err := topo.NFT("delete", "element", "inet", "ip-masq-agent", "nonmasq-v4", "{ 10.0.0.0/8 }"); err != nil {
			t.Fatalf("%v %s", err, out)
		}
		eventually(t, "the repair while fakes come", func() bool { return withoutCounters(listTable(t, topo)) == want })
		if strings.Contains(d.output(), "watching nftables failed") {
			t.Error("a forged datagram stopped the watch")
		}
	})
}

// readNetlinkSockets returns the port ids of the NETLINK_NETFILTER sockets
// of the namespace ns (/proc/net/netlink, read from a thread in it), the
// kernel's (0) left out.
func readNetlinkSockets(ns netns.NsHandle) ([]uint32, error) {
	var out []uint32
	err := testnet.InNS(ns, func() error {
		data, err := os.ReadFile("/proc/thread-self/net/netlink")
		if err != nil {
			return err
		}
		for _, l := range strings.Split(string(data), "\n")[1:] {
			f := strings.Fields(l)
			if len(f) < 3 || f[1] != "12" || f[2] == "0" {
				continue
			}
			var pid uint32
			fmt.Sscan(f[2], &pid)
			out = append(out, pid)
		}
		return nil
	})
	return out, err
}
