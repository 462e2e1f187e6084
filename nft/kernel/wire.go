package kernel

import (
	"encoding/binary"
	"net/netip"

	"github.com/google/nftables/binaryutil"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// The wire format: nftables messages and their attributes, built and
// walked.

// message is an nftables message of family: the netlink header (its
// sequence number set when it is sent), nfgenmsg and attrs.
func message(family uint8, typ int, flags netlink.HeaderFlags, attrs ...netlink.Attribute) netlink.Message {
	data, _ := netlink.MarshalAttributes(attrs) // fails only for an attribute over 64 KiB: never a name
	return rawMessage(typ, flags, append(nfgenmsg(family, 0), data...))
}

// rawMessage is an nftables message whose payload (nfgenmsg and
// attributes) is built already.
func rawMessage(typ int, flags netlink.HeaderFlags, data []byte) netlink.Message {
	return netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | typ), Flags: flags}, Data: data}
}

func attr(typ uint16, data []byte) netlink.Attribute { return netlink.Attribute{Type: typ, Data: data} }

// decode walks the attributes of a message's payload (after nfgenmsg).
func decode(data []byte, f func(ad *netlink.AttributeDecoder)) error {
	ad, err := netlink.NewAttributeDecoder(data[4:])
	if err != nil {
		return err
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		f(ad)
	}
	return ad.Err()
}

// dataValue reads NFTA_DATA_VALUE from an nft_data attribute as an address.
func dataValue(b []byte) (a netip.Addr) {
	walkAttrs(b, func(typ uint16, v []byte) bool {
		if typ == unix.NFTA_DATA_VALUE {
			a, _ = netip.AddrFromSlice(v)
		}
		return true
	})
	return a
}

// walkAttrs calls f with the type (flags cleared) and payload of each
// netlink attribute in b, until f returns false; it returns false when f
// did or when b is malformed. It allocates nothing.
func walkAttrs(b []byte, f func(typ uint16, payload []byte) bool) bool {
	return walkAttrsFlags(b, func(typ uint16, _ bool, payload []byte) bool { return f(typ, payload) })
}

// walkAttrsFlags is walkAttrs that also says whether an attribute is
// flagged as nested.
func walkAttrsFlags(b []byte, f func(typ uint16, nested bool, payload []byte) bool) bool {
	for len(b) >= 4 {
		n := int(binary.NativeEndian.Uint16(b))
		if n < 4 || n > len(b) {
			return false
		}
		typ := binary.NativeEndian.Uint16(b[2:])
		if !f(typ&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER), typ&unix.NLA_F_NESTED != 0, b[4:n]) {
			return false
		}
		b = b[min((n+3)&^3, len(b)):]
	}
	return len(b) == 0
}

func cstring(s string) []byte { return append([]byte(s), 0) }

// nfgenmsg is the header of every nftables message: family, version, resource id.
func nfgenmsg(family uint8, resID uint16) []byte {
	return append([]byte{family, unix.NFNETLINK_V0}, binaryutil.BigEndian.PutUint16(resID)...)
}

// appendAttr appends a netlink attribute, padded to 4 bytes.
func appendAttr(b []byte, typ uint16, payload []byte) []byte {
	b = binary.NativeEndian.AppendUint16(b, uint16(4+len(payload)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, payload...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// endNested sets the length of the nested attribute that starts at start
// (appended with an empty payload) to cover everything appended since.
func endNested(b []byte, start int) []byte {
	binary.NativeEndian.PutUint16(b[start:], uint16(len(b)-start))
	return b
}

// sendAll writes messages to the kernel in one datagram, marshalled into
// one buffer of the size they need (mdlayher/netlink's SendMessages grows
// its buffer message by message).
func sendAll(conn transport, msgs []netlink.Message, size int) error {
	return datagramsOf(conn).writeDatagram(marshalDatagram(msgs, size))
}

// marshalDatagram puts messages, whose headers are set, one after another.
func marshalDatagram(msgs []netlink.Message, size int) []byte {
	buf := make([]byte, 0, size)
	for _, m := range msgs {
		n := unix.NLMSG_HDRLEN + len(m.Data)
		buf = binary.NativeEndian.AppendUint32(buf, uint32(n))
		buf = binary.NativeEndian.AppendUint16(buf, uint16(m.Header.Type))
		buf = binary.NativeEndian.AppendUint16(buf, uint16(m.Header.Flags))
		buf = binary.NativeEndian.AppendUint32(buf, m.Header.Sequence)
		buf = binary.NativeEndian.AppendUint32(buf, m.Header.PID)
		buf = append(buf, m.Data...)
		for len(buf)%unix.NLMSG_ALIGNTO != 0 {
			buf = append(buf, 0)
		}
	}
	return buf
}

func attrBytes(typ uint16, payload []byte) []byte { return appendAttr(nil, typ, payload) }
