package conntrack

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"reflect"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// tupleAttr builds a CTA_TUPLE_ORIG or CTA_TUPLE_REPLY as the kernel dumps
// it (nested, IP then proto).
func tupleAttr(typ int, src, dst netip.Addr, proto uint8, sport, dport uint16) *nl.RtAttr {
	t := nl.NewRtAttr(unix.NLA_F_NESTED|typ, nil)
	ip := t.AddRtAttr(unix.NLA_F_NESTED|ctaTupleIP, nil)
	s, d := ctaIPv4Src, ctaIPv4Dst
	if src.Is6() {
		s, d = ctaIPv6Src, ctaIPv6Dst
	}
	ip.AddRtAttr(s, src.AsSlice())
	ip.AddRtAttr(d, dst.AsSlice())
	p := t.AddRtAttr(unix.NLA_F_NESTED|ctaTupleProto, nil)
	p.AddRtAttr(ctaProtoNum, []byte{proto})
	p.AddRtAttr(2, nl.BEUint16Attr(sport))
	p.AddRtAttr(3, nl.BEUint16Attr(dport))
	return t
}

func TestConntrackParseEntry(t *testing.T) {
	pod, ext, node := netip.MustParseAddr("10.244.1.2"), netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("192.0.2.1")
	orig := tupleAttr(ctaTupleOrig, pod, ext, unix.IPPROTO_UDP, 40000, 8080)
	status := nl.NewRtAttr(ctaStatus, binary.BigEndian.AppendUint32(nil, ipsSrcNAT|1<<3))
	zone := nl.NewRtAttr(ctaZone, nl.BEUint16Attr(7))
	id := nl.NewRtAttr(ctaID, binary.BigEndian.AppendUint32(nil, 0xdeadbeef))
	msg := []byte{unix.AF_INET, 0, 0, 0}
	for _, a := range []*nl.RtAttr{orig, tupleAttr(ctaTupleReply, ext, node, unix.IPPROTO_UDP, 8080, 61000), status,
		nl.NewRtAttr(7, binary.BigEndian.AppendUint32(nil, 30)), zone, id} {
		msg = append(msg, a.Serialize()...)
	}
	e, ref, ok := parseEntry(msg)
	want := entry{proto: unix.IPPROTO_UDP, origSrc: pod, origDst: ext, replySrc: ext, replyDst: node, statusSNAT: true,
		origTuple: orig.Serialize()[4:]}
	if !ok || !reflect.DeepEqual(e, want) {
		t.Fatalf("parseEntry = %+v, %v; want %+v", e, ok, want)
	}
	// A reply tuple is keyed as the original tuple of the entry that reply
	// makes the other way round (CleanupReplies).
	reply := tupleAttr(ctaTupleReply, ext, node, unix.IPPROTO_UDP, 8080, 61000).Serialize()[4:]
	reverse := tupleAttr(ctaTupleOrig, ext, node, unix.IPPROTO_UDP, 8080, 61000).Serialize()[4:]
	if !bytes.Equal(ref.reply, reply) || replyKey(ref.reply) != replyKey(reverse) {
		t.Errorf("reply tuple %x (key of the entry the other way round %x), want %x", ref.reply, reverse, reply)
	}
	wantReq := append(append(orig.Serialize(), zone.Serialize()...), id.Serialize()...)
	if got := ref.request(); !bytes.Equal(got, wantReq) {
		t.Errorf("delete attributes\n%x\nwant\n%x", got, wantReq)
	}

	pod6, ext6 := netip.MustParseAddr("fd00:1::2"), netip.MustParseAddr("2001:db8:aa::10")
	msg6 := []byte{unix.AF_INET6, 0, 0, 0}
	for _, a := range []*nl.RtAttr{tupleAttr(ctaTupleOrig, pod6, ext6, unix.IPPROTO_TCP, 1, 2), tupleAttr(ctaTupleReply, ext6, pod6, unix.IPPROTO_TCP, 2, 1)} {
		msg6 = append(msg6, a.Serialize()...)
	}
	e, _, ok = parseEntry(msg6)
	e.origTuple = nil // checked above
	if want := (entry{proto: unix.IPPROTO_TCP, origSrc: pod6, origDst: ext6, replySrc: ext6, replyDst: pod6}); !ok || !reflect.DeepEqual(e, want) {
		t.Errorf("IPv6: parseEntry = %+v, %v; want %+v", e, ok, want)
	}

	for _, bad := range [][]byte{nil, {2, 0, 0}, {2, 0, 0, 0, 200, 0, 1, 0}, {2, 0, 0, 0}} {
		if _, _, ok := parseEntry(bad); ok {
			t.Errorf("parseEntry(%x) ok, want refused", bad)
		}
	}
}
