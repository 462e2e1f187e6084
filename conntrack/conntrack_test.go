package conntrack

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

func TestConntrackParseMode(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Mode
		err  bool
	}{
		{"", ModeUDP, false},
		{"udp", ModeUDP, false},
		{" UDP ", ModeUDP, false},
		{"all", ModeAll, false},
		{"none", ModeNone, false},
		{"tcp", "", true},
		{"yes", "", true},
	} {
		got, err := ParseMode(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("ParseMode(%q) = %q, %v; want %q, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
	var m Mode
	if m.String() != "udp" {
		t.Errorf("zero Mode is %q, want udp", m.String())
	}
	if err := m.Set("all"); err != nil || m != ModeAll {
		t.Errorf("Set(all): %v, %q", err, m)
	}
	if err := m.Set("bogus"); err == nil || m != ModeAll {
		t.Errorf("Set(bogus): %v, %q; want an error and the mode unchanged", err, m)
	}
}

// prefixDecider masquerades the prefixes listed, handles IPv6 only when v6.
func prefixDecider(v6 bool, masq ...string) Decider {
	var ps []netip.Prefix
	for _, s := range masq {
		ps = append(ps, netip.MustParsePrefix(s))
	}
	return func(f Flow) (bool, bool) {
		a := f.Dst
		if a.Is6() && !v6 {
			return false, false
		}
		for _, p := range ps {
			if p.Contains(a) {
				return true, true
			}
		}
		return false, true
	}
}

func TestConntrackJudge(t *testing.T) {
	const (
		pod    = "10.244.1.2"
		node   = "192.0.2.1"
		ext    = "203.0.113.10" // moved
		other  = "198.51.100.10"
		pod6   = "fd00:1::2"
		node6  = "2001:db8:1::1"
		ext6   = "2001:db8:aa::10"
		backnd = "203.0.113.99" // a Service backend, after DNAT
	)
	locals := &localAddrs{}
	for _, p := range []string{"192.0.2.1/32", "10.244.1.1/32", "127.0.0.0/8", "2001:db8:1::1/128", "fd00:1::1/128", "::1/128"} {
		locals.add(netip.MustParsePrefix(p))
	}
	// "masq": ext is masqueraded; "nomasq": it is not. other is
	// masqueraded by both.
	masq := prefixDecider(false, "203.0.113.0/24", "198.51.100.0/24")
	nomasq := prefixDecider(false, "198.51.100.0/24")
	masq6 := prefixDecider(true, "2001:db8:aa::/48")
	nomasq6 := prefixDecider(true)

	udp := func(src, dst, rsrc, rdst string) entry {
		return entry{proto: unix.IPPROTO_UDP, origSrc: netip.MustParseAddr(src), origDst: netip.MustParseAddr(dst),
			replySrc: netip.MustParseAddr(rsrc), replyDst: netip.MustParseAddr(rdst)}
	}
	tcp := func(src, dst, rsrc, rdst string) entry {
		e := udp(src, dst, rsrc, rdst)
		e.proto = unix.IPPROTO_TCP
		return e
	}
	for _, tc := range []struct {
		name     string
		e        entry
		mode     Mode
		old, new Decider
		want     verdict
	}{
		{"masq to nomasq: masqueraded UDP entry deleted", udp(pod, ext, ext, node), ModeUDP, masq, nomasq, deleteStale},
		{"zero mode is udp", udp(pod, ext, ext, node), "", masq, nomasq, deleteStale},
		{"masq to nomasq: unmasqueraded UDP entry agrees", udp(pod, ext, ext, pod), ModeUDP, masq, nomasq, keepAgrees},
		{"nomasq to masq: unmasqueraded UDP entry deleted", udp(pod, ext, ext, pod), ModeUDP, nomasq, masq, deleteStale},
		{"nomasq to masq: masqueraded UDP entry agrees", udp(pod, ext, ext, node), ModeUDP, nomasq, masq, keepAgrees},
		{"mode none deletes nothing", udp(pod, ext, ext, node), ModeNone, masq, nomasq, keepProtocol},
		{"TCP left alone with udp", tcp(pod, ext, ext, node), ModeUDP, masq, nomasq, keepProtocol},
		{"TCP deleted with all", tcp(pod, ext, ext, node), ModeAll, masq, nomasq, deleteStale},
		{"ICMP deleted with all", entry{proto: unix.IPPROTO_ICMP, origSrc: netip.MustParseAddr(pod), origDst: netip.MustParseAddr(ext),
			replySrc: netip.MustParseAddr(ext), replyDst: netip.MustParseAddr(node)}, ModeAll, masq, nomasq, deleteStale},
		{"unchanged destination kept", udp(pod, other, other, node), ModeUDP, masq, nomasq, keepUnchanged},
		{"unchanged destination kept though it disagrees (not ours to fix)", udp(pod, other, other, pod), ModeUDP, masq, nomasq, keepUnchanged},
		{"destination local to the node", udp(pod, "10.244.1.1", "10.244.1.1", pod), ModeUDP, nomasq, masq, keepLocalDst},
		{"destination in 127/8", udp(pod, "127.0.0.5", "127.0.0.5", pod), ModeUDP, nomasq, prefixDecider(false, "0.0.0.0/0"), keepLocalDst},
		{"node-originated", udp(node, ext, ext, node), ModeUDP, nomasq, masq, keepLocalSrc},
		{"DNAT: the backend decides, not the Service address", udp(pod, "10.96.0.10", backnd, node), ModeUDP, masq, nomasq, deleteStale},
		{"DNAT: backend unchanged, Service address would have changed", udp(pod, ext, "10.1.2.3", pod), ModeUDP, nomasq, masq, keepUnchanged},
		{"DNAT to a local address (NodePort to a host-network pod)", udp("198.51.100.7", ext, "10.244.1.1", "198.51.100.7"), ModeUDP, nomasq, masq, keepLocalDst},
		{"another table's SNAT to a foreign address", udp(pod, ext, ext, "192.0.2.77"), ModeUDP, masq, nomasq, keepForeignSNAT},
		{"IPv6 not handled: left alone", udp(pod6, ext6, ext6, node6), ModeUDP, masq, nomasq, keepUnhandled},
		{"IPv6 masq to nomasq", udp(pod6, ext6, ext6, node6), ModeUDP, masq6, nomasq6, deleteStale},
		{"IPv6 nomasq to masq", udp(pod6, ext6, ext6, pod6), ModeUDP, nomasq6, masq6, deleteStale},
		{"IPv6 newly enabled and masqueraded: unmasqueraded entry deleted", udp(pod6, ext6, ext6, pod6), ModeUDP, masq, masq6, deleteStale},
		{"IPv6 newly enabled, not masqueraded: unchanged", udp(pod6, "2001:db8:bb::1", "2001:db8:bb::1", pod6), ModeUDP, masq, masq6, keepUnchanged},
		{"IPv6 disabled: left alone", udp(pod6, ext6, ext6, node6), ModeUDP, masq6, nomasq, keepUnhandled},
		{"IPv6 node-local destination", udp(pod6, "fd00:1::1", "fd00:1::1", pod6), ModeUDP, nomasq6, masq6, keepLocalDst},
		{"missing addresses", entry{proto: unix.IPPROTO_UDP}, ModeUDP, masq, nomasq, keepBroken},
		{"mixed families", udp(pod, ext, ext6, node), ModeUDP, masq, nomasq, keepBroken},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := judge(tc.e, tc.mode, tc.old, tc.new, locals.contains, -1); got != tc.want {
				t.Errorf("judge = %s, want %s", got, tc.want)
			}
		})
	}
	// With the mark (label bit 20): only the agent's masquerade is undone.
	const bit = 20
	marked := func(e entry, bits ...int) entry {
		e.labels = make([]byte, 16)
		for _, b := range bits {
			binary.NativeEndian.PutUint64(e.labels[b/64*8:], binary.NativeEndian.Uint64(e.labels[b/64*8:])|1<<(b%64))
		}
		return e
	}
	for _, tc := range []struct {
		name     string
		e        entry
		mode     Mode
		old, new Decider
		want     verdict
	}{
		{"marked: masq to nomasq deleted", marked(udp(pod, ext, ext, node), bit), ModeUDP, masq, nomasq, deleteStale},
		{"marked: other label bits only: kept", marked(udp(pod, ext, ext, node), 0, 21, 100), ModeUDP, masq, nomasq, keepUnmarked},
		{"marked: kube-proxy's masquerade (no labels) kept", udp(pod, ext, ext, node), ModeUDP, masq, nomasq, keepUnmarked},
		{"marked: kube-proxy's masquerade kept with all", tcp(pod, ext, ext, node), ModeAll, masq, nomasq, keepUnmarked},
		{"marked: TCP still left alone with udp", marked(tcp(pod, ext, ext, node), bit), ModeUDP, masq, nomasq, keepProtocol},
		{"marked: old table said return, entry marked by an older one: deleted", marked(udp(pod, ext, ext, node), bit), ModeUDP, nomasq, nomasq, deleteStale},
		{"marked: unmasqueraded entry agrees", udp(pod, ext, ext, pod), ModeUDP, masq, nomasq, keepAgrees},
		{"marked: nomasq to masq: unNATed entry deleted", udp(pod, ext, ext, pod), ModeUDP, nomasq, masq, deleteStale},
		{"marked: nomasq to masq: someone's masquerade kept", udp(pod, ext, ext, node), ModeUDP, nomasq, masq, keepAgrees},
		{"marked: high bit", marked(udp(pod, ext, ext, node), 100), ModeUDP, masq, nomasq, keepUnmarked},
		{"marked: local destination", marked(udp(pod, "10.244.1.1", "10.244.1.1", node), bit), ModeUDP, masq, nomasq, keepLocalDst},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := judge(tc.e, tc.mode, tc.old, tc.new, locals.contains, bit); got != tc.want {
				t.Errorf("judge = %s, want %s", got, tc.want)
			}
		})
	}
}

// judge asks the deciders about the flow the rule saw: the original
// source (the pod) and the destination after DNAT.
func TestJudgeAsksBySource(t *testing.T) {
	pod := "10.244.1.5"
	var asked []Flow
	bySource := func(f Flow) (bool, bool) {
		asked = append(asked, f)
		return f.Src != netip.MustParseAddr(pod), true // this pod's traffic is not masqueraded, others' is
	}
	old := prefixDecider(false, "0.0.0.0/0")
	locals := &localAddrs{}
	locals.add(netip.MustParsePrefix("192.168.1.1/32"))
	udp := func(src, dst, rsrc, rdst string) entry {
		return entry{proto: unix.IPPROTO_UDP, origSrc: netip.MustParseAddr(src), origDst: netip.MustParseAddr(dst),
			replySrc: netip.MustParseAddr(rsrc), replyDst: netip.MustParseAddr(rdst)}
	}
	e := udp(pod, "203.0.113.7", "198.51.100.9", "192.168.1.1") // DNATed to 198.51.100.9, masqueraded to the node
	if got := judge(e, ModeUDP, old, bySource, locals.contains, -1); got != deleteStale {
		t.Errorf("judge = %s, want %s", got, deleteStale)
	}
	want := Flow{Src: netip.MustParseAddr(pod), Dst: netip.MustParseAddr("198.51.100.9")}
	if len(asked) == 0 || asked[0] != want {
		t.Errorf("the decider was asked %v, want %v", asked, want)
	}
	e = udp("10.244.1.6", "203.0.113.7", "198.51.100.9", "192.168.1.1")
	if got := judge(e, ModeUDP, old, bySource, locals.contains, -1); got != keepUnchanged {
		t.Errorf("another pod's flow: judge = %s, want %s", got, keepUnchanged)
	}
}
