package conntrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// ctnetlink constants (linux/netfilter/nfnetlink_conntrack.h).
const (
	nfnlSubsysCtnetlink = 1
	ipctnlMsgCtGet      = 1
	ipctnlMsgCtDelete   = 2

	ctaTupleOrig  = 1
	ctaTupleReply = 2
	ctaStatus     = 3
	ctaID         = 12
	ctaZone       = 18
	ctaLabels     = 22 // CTA_LABELS: the label bitmap, when the entry has labels

	ctaTupleIP    = 1
	ctaTupleProto = 2
	ctaIPv4Src    = 1
	ctaIPv4Dst    = 2
	ctaIPv6Src    = 3
	ctaIPv6Dst    = 4
	ctaProtoNum   = 1

	nlaTypeMask = ^uint16(unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)

	nfgenHdrLen = 4
	// deleteBatch bounds the bytes of delete requests sent at once; their
	// acknowledgements (NETLINK_CAP_ACK: 36 bytes each) fit the receive
	// buffer many times over.
	deleteBatch = 64 << 10
)

// conn is a NETLINK_NETFILTER socket, read and written directly: a dump is
// judged as it streams in, without keeping or parsing more than the
// decision needs.
type conn struct {
	fd  int
	seq uint32
	buf []byte
}

func (c *conn) setup() error {
	// Acks without a copy of the request; a large receive buffer for the
	// dump (best effort: capped by net.core.rmem_max without CAP_NET_ADMIN
	// in the init namespace).
	if err := unix.SetsockoptInt(c.fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1); err != nil {
		return fmt.Errorf("conntrack: NETLINK_CAP_ACK: %w", err)
	}
	if err := unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20); err != nil {
		unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	}
	tv := unix.Timeval{Sec: 30}
	return errors.Join(
		unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv),
		unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv))
}

// appendRequest appends a ctnetlink request header (netlink and nfgenmsg)
// to b and returns b and the offset of the length to patch.
func (c *conn) appendRequest(b []byte, msgType uint16, flags uint16, family uint8) ([]byte, int) {
	c.seq++
	at := len(b)
	b = binary.NativeEndian.AppendUint32(b, 0) // length, patched
	b = binary.NativeEndian.AppendUint16(b, nfnlSubsysCtnetlink<<8|msgType)
	b = binary.NativeEndian.AppendUint16(b, unix.NLM_F_REQUEST|flags)
	b = binary.NativeEndian.AppendUint32(b, c.seq)
	b = binary.NativeEndian.AppendUint32(b, 0)
	b = append(b, family, unix.NFNETLINK_V0, 0, 0)
	return b, at
}

func patchLen(b []byte, at int) {
	binary.NativeEndian.PutUint32(b[at:], uint32(len(b)-at))
}

func (c *conn) send(b []byte) error {
	return unix.Sendto(c.fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
}

// recv reads one datagram of netlink messages from the kernel; another
// process's datagram to our port (any process with CAP_NET_ADMIN can
// send one) is no answer and is dropped.
func (c *conn) recv() ([]byte, error) {
	for {
		n, from, err := unix.Recvfrom(c.fd, c.buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if nl, ok := from.(*unix.SockaddrNetlink); !ok || nl.Pid != 0 {
			continue
		}
		return c.buf[:n], nil
	}
}

var errDumpInterrupted = errors.New("dump interrupted by concurrent changes (NLM_F_DUMP_INTR): some entries may have been missed")

// dump dumps the conntrack table of one family and calls f on each
// entry's message (nfgenmsg and attributes; valid during the call only).
// It returns the number of entries.
func (c *conn) dump(family uint8, f func(msg []byte)) (int, error) {
	req, at := c.appendRequest(nil, ipctnlMsgCtGet, unix.NLM_F_DUMP, family)
	patchLen(req, at)
	if err := c.send(req); err != nil {
		return 0, err
	}
	seq := c.seq
	n := 0
	var intr bool
	for {
		data, err := c.recv()
		if err != nil {
			return n, err
		}
		for len(data) >= unix.NLMSG_HDRLEN {
			l := binary.NativeEndian.Uint32(data)
			if l < unix.NLMSG_HDRLEN || int(l) > len(data) {
				return n, fmt.Errorf("malformed netlink message (length %d of %d)", l, len(data))
			}
			typ := binary.NativeEndian.Uint16(data[4:])
			flags := binary.NativeEndian.Uint16(data[6:])
			mseq := binary.NativeEndian.Uint32(data[8:])
			msg := data[unix.NLMSG_HDRLEN:l]
			data = data[min(int(nlmAlign(l)), len(data)):]
			if mseq != seq {
				continue // a late ack of an earlier request
			}
			if flags&unix.NLM_F_DUMP_INTR != 0 {
				intr = true
			}
			switch typ {
			case unix.NLMSG_DONE:
				if intr {
					return n, errDumpInterrupted
				}
				return n, nil
			case unix.NLMSG_ERROR:
				if len(msg) >= 4 {
					if e := int32(binary.NativeEndian.Uint32(msg)); e != 0 {
						return n, syscall.Errno(-e)
					}
				}
				return n, nil
			case nfnlSubsysCtnetlink<<8 | 0: // IPCTNL_MSG_CT_NEW: an entry
				n++
				f(msg)
			}
		}
	}
}

// delete deletes the entries (their delete request attributes, as
// parseEntry built them) in batches and counts the acknowledgements:
// success or ENOENT (gone already, or replaced: another conntrack id) is
// deleted, any other error failed.
func (c *conn) delete(family uint8, entries [][]byte) (deleted, failed int, err error) {
	var firstErr error
	for len(entries) > 0 {
		var b []byte
		first := c.seq + 1
		for len(entries) > 0 && len(b) < deleteBatch {
			var at int
			b, at = c.appendRequest(b, ipctnlMsgCtDelete, unix.NLM_F_ACK, family)
			b = append(b, entries[0]...)
			patchLen(b, at)
			entries = entries[1:]
		}
		last := c.seq
		if err := c.send(b); err != nil {
			return deleted, failed + int(last-first+1), err
		}
		for pending := int(last - first + 1); pending > 0; {
			data, err := c.recv()
			if err != nil {
				return deleted, failed + pending, err
			}
			for len(data) >= unix.NLMSG_HDRLEN {
				l := binary.NativeEndian.Uint32(data)
				if l < unix.NLMSG_HDRLEN || int(l) > len(data) {
					return deleted, failed + pending, fmt.Errorf("malformed netlink message (length %d of %d)", l, len(data))
				}
				typ := binary.NativeEndian.Uint16(data[4:])
				mseq := binary.NativeEndian.Uint32(data[8:])
				msg := data[unix.NLMSG_HDRLEN:l]
				data = data[min(int(nlmAlign(l)), len(data)):]
				if typ != unix.NLMSG_ERROR || mseq < first || mseq > last || len(msg) < 4 {
					continue
				}
				pending--
				switch e := syscall.Errno(-int32(binary.NativeEndian.Uint32(msg))); e {
				case 0, unix.ENOENT:
					deleted++
				default:
					failed++
					if firstErr == nil {
						firstErr = e
					}
				}
			}
		}
	}
	if firstErr != nil {
		return deleted, failed, fmt.Errorf("%d deletions failed, the first with: %w", failed, firstErr)
	}
	return deleted, failed, nil
}

func nlmAlign(l uint32) uint32 { return (l + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1) }
func nlaAlign(l int) int       { return (l + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1) }

// attrs calls f on each attribute of b (type without flags, value, and
// the whole attribute with its header and padding).
func attrs(b []byte, f func(typ uint16, val, raw []byte)) bool {
	for len(b) >= unix.SizeofNlAttr {
		l := int(binary.NativeEndian.Uint16(b))
		if l < unix.SizeofNlAttr || l > len(b) {
			return false
		}
		typ := binary.NativeEndian.Uint16(b[2:]) & nlaTypeMask
		end := min(nlaAlign(l), len(b))
		f(typ, b[unix.SizeofNlAttr:l], b[:end])
		b = b[end:]
	}
	return true
}

// entryRef holds the attributes that name a dumped entry: its original
// tuple, zone and id, as dumped (valid during the dump callback only).
type entryRef struct{ orig, zone, id, reply []byte }

// replyKey is a tuple's payload (addresses, protocol, ports, zone) as a
// map key: an entry's reply tuple equals, byte for byte, the original
// tuple of an entry made the other way round by that reply.
func replyKey(val []byte) string { return string(val) }

// request copies them: the attributes of the entry's delete request.
func (r entryRef) request() []byte {
	b := make([]byte, 0, len(r.orig)+len(r.zone)+len(r.id))
	return append(append(append(b, r.orig...), r.zone...), r.id...)
}

// parseEntry reads what judge needs of a dumped entry (nfgenmsg and
// attributes), and the attributes that name it.
func parseEntry(msg []byte) (e entry, ref entryRef, ok bool) {
	if len(msg) < nfgenHdrLen {
		return e, ref, false
	}
	ok = attrs(msg[nfgenHdrLen:], func(typ uint16, val, raw []byte) {
		switch typ {
		case ctaTupleOrig:
			ref.orig = raw
			e.origTuple = val
			e.origSrc, e.origDst, e.proto = parseTuple(val)
		case ctaTupleReply:
			ref.reply = val
			e.replySrc, e.replyDst, _ = parseTuple(val)
		case ctaStatus:
			if len(val) >= 4 {
				e.statusSNAT = binary.BigEndian.Uint32(val)&ipsSrcNAT != 0
			}
		case ctaLabels:
			e.labels = val
		case ctaZone:
			ref.zone = raw
		case ctaID:
			ref.id = raw
		}
	})
	return e, ref, ok && ref.orig != nil
}

// parseTuple reads the addresses and protocol of a CTA_TUPLE_ORIG or
// CTA_TUPLE_REPLY.
func parseTuple(b []byte) (src, dst netip.Addr, proto uint8) {
	attrs(b, func(typ uint16, val, _ []byte) {
		switch typ {
		case ctaTupleIP:
			attrs(val, func(typ uint16, val, _ []byte) {
				switch {
				case (typ == ctaIPv4Src || typ == ctaIPv4Dst) && len(val) == 4:
					a := netip.AddrFrom4([4]byte(val))
					if typ == ctaIPv4Src {
						src = a
					} else {
						dst = a
					}
				case (typ == ctaIPv6Src || typ == ctaIPv6Dst) && len(val) == 16:
					a := netip.AddrFrom16([16]byte(val)).Unmap()
					if typ == ctaIPv6Src {
						src = a
					} else {
						dst = a
					}
				}
			})
		case ctaTupleProto:
			attrs(val, func(typ uint16, val, _ []byte) {
				if typ == ctaProtoNum && len(val) >= 1 {
					proto = val[0]
				}
			})
		}
	})
	return src, dst, proto
}
