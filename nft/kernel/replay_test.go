package kernel

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// The read, send and fence code run without root against a replay of a
// kernel's datagrams (testdata/wire-replay.hex): every request the code
// sends must be, byte for byte, the recorded one, and it is answered
// with what the kernel answered then. `go test ./nft/kernel -run Wire
// -record` (root) records the exchange again, in a network namespace of
// its own.
//
// In the file, "> " is a datagram sent and "< " one received, in hex.
// Sequence numbers are written relative to the first message of the last
// datagram sent, and our socket's port id as 1 (both change from run to
// run), also in the header an error or ack quotes.

const replayPath = "testdata/wire-replay.hex"

// replayPort stands for our socket's port id in the file.
const replayPort = 1

// renumber rewrites the sequence number and port id of every message of
// a datagram, and of the request an error or ack quotes, with f; it
// returns a copy.
func renumber(b []byte, f func(seq, pid uint32) (uint32, uint32)) []byte {
	b = bytes.Clone(b)
	fix := func(h []byte) {
		seq, pid := f(binary.NativeEndian.Uint32(h[8:]), binary.NativeEndian.Uint32(h[12:]))
		binary.NativeEndian.PutUint32(h[8:], seq)
		binary.NativeEndian.PutUint32(h[12:], pid)
	}
	for o := 0; o+unix.NLMSG_HDRLEN <= len(b); {
		n := int(binary.NativeEndian.Uint32(b[o:]))
		if n < unix.NLMSG_HDRLEN || o+n > len(b) {
			break
		}
		fix(b[o:])
		if binary.NativeEndian.Uint16(b[o+4:]) == unix.NLMSG_ERROR && n >= 2*unix.NLMSG_HDRLEN+4 {
			fix(b[o+unix.NLMSG_HDRLEN+4:])
		}
		o += (n + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1)
	}
	return b
}

// relative writes a datagram as the file holds it.
func relative(b []byte, base, port uint32) []byte {
	return renumber(b, func(seq, pid uint32) (uint32, uint32) {
		if pid == port {
			pid = replayPort
		}
		return seq - base, pid
	})
}

// absolute is relative undone.
func absolute(b []byte, base, port uint32) []byte {
	return renumber(b, func(seq, pid uint32) (uint32, uint32) {
		if pid == replayPort {
			pid = port
		}
		return seq + base, pid
	})
}

// firstSeq is the sequence number of a datagram's first message.
func firstSeq(b []byte) uint32 {
	if len(b) < unix.NLMSG_HDRLEN {
		return 0
	}
	return binary.NativeEndian.Uint32(b[8:])
}

// marshalRequest is a request as mdlayher/netlink's Conn.Send puts it on
// the wire.
func marshalRequest(m netlink.Message) ([]byte, error) {
	m.Header.Length = uint32(unix.NLMSG_HDRLEN + len(m.Data))
	m.Header.Length = (m.Header.Length + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1)
	return m.MarshalBinary()
}

// recorder is a transport that passes everything to a real socket and
// writes the exchange down.
type recorder struct {
	conn *netlink.Conn
	out  bytes.Buffer
	base uint32
}

func (r *recorder) sent(b []byte) {
	r.base = firstSeq(b)
	fmt.Fprintf(&r.out, "> %x\n", relative(b, r.base, r.conn.PID()))
}

func (r *recorder) Send(m netlink.Message) (netlink.Message, error) {
	m, err := r.conn.Send(m)
	if err != nil {
		return m, err
	}
	b, err := marshalRequest(m)
	if err != nil {
		return m, err
	}
	r.sent(b)
	return m, nil
}

func (r *recorder) SetReadDeadline(t time.Time) error     { return r.conn.SetReadDeadline(t) }
func (r *recorder) SyscallConn() (syscall.RawConn, error) { return r.conn.SyscallConn() }
func (r *recorder) growSendBuffer(size int) error         { return rawSocket{r.conn}.growSendBuffer(size) }
func (r *recorder) step(name string)                      { fmt.Fprintf(&r.out, "# %s\n", name) }
func (r *recorder) writeDatagram(b []byte) error {
	r.sent(b)
	return rawSocket{r.conn}.writeDatagram(b)
}
func (r *recorder) readDatagram(buf []byte) (int, error) {
	n, err := rawSocket{r.conn}.readDatagram(buf)
	if err == nil {
		fmt.Fprintf(&r.out, "< %x\n", relative(buf[:n], r.base, r.conn.PID()))
	}
	return n, err
}

// exchange is one datagram sent and the kernel's answers to it.
type exchange struct {
	step    string
	request []byte
	answers [][]byte
}

// replay is a transport that answers from a recorded exchange.
type replay struct {
	errorf    func(format string, args ...any)
	exchanges []exchange
	queue     [][]byte
	seq       uint32
}

// replayPID is the port id of the replay's socket.
const replayPID = 4242

func readReplay(t *testing.T, path string) *replay {
	t.Helper()
	r := &replay{errorf: t.Errorf, seq: 1 << 20}
	scanHex(t, path, func(step, line string) {
		dir, data, _ := strings.Cut(line, " ")
		b, err := hex.DecodeString(data)
		switch {
		case err != nil:
			t.Fatalf("%s: %q: %v", path, line, err)
		case dir == ">":
			r.exchanges = append(r.exchanges, exchange{step: step, request: b})
		case dir == "<" && len(r.exchanges) > 0:
			e := &r.exchanges[len(r.exchanges)-1]
			e.answers = append(e.answers, b)
		default:
			t.Fatalf("%s: %q: not a datagram sent (>) or received after one (<)", path, line)
		}
	})
	return r
}

func (r *replay) Send(m netlink.Message) (netlink.Message, error) {
	r.seq++
	m.Header.Sequence, m.Header.PID = r.seq, replayPID
	b, err := marshalRequest(m)
	if err != nil {
		return m, err
	}
	return m, r.writeDatagram(b)
}

func (r *replay) writeDatagram(b []byte) error {
	if len(r.exchanges) == 0 {
		r.errorf("a datagram sent after the recorded exchange ended:\n%x", relative(b, firstSeq(b), replayPID))
		return errors.New("replay: no more recorded requests")
	}
	e := r.exchanges[0]
	r.exchanges = r.exchanges[1:]
	base := firstSeq(b)
	if got := relative(b, base, replayPID); !bytes.Equal(got, e.request) {
		r.errorf("%s: the datagram sent differs from %s:\n got %x\nwant %x", e.step, replayPath, got, e.request)
		return errors.New("replay: not the recorded request")
	}
	r.queue = r.queue[:0]
	for _, a := range e.answers {
		r.queue = append(r.queue, absolute(a, base, replayPID))
	}
	return nil
}

func (r *replay) readDatagram(buf []byte) (int, error) {
	if len(r.queue) == 0 {
		return 0, os.ErrDeadlineExceeded // the kernel said nothing more
	}
	n := copy(buf, r.queue[0])
	r.queue = r.queue[1:]
	return n, nil
}

func (r *replay) SetReadDeadline(time.Time) error { return nil }
func (r *replay) growSendBuffer(int) error        { return nil }
func (r *replay) step(string)                     {}

func (r *replay) SyscallConn() (syscall.RawConn, error) {
	return nil, errors.New("replay: no socket")
}

// replayed is a transport whose exchange is named step by step.
type replayed interface {
	transport
	step(name string)
}

// replayScenario reads table inet ip-masq-agent before it exists, creates
// it with one transaction, reads it whole, changes it and reads back the
// change, fences and reads the
// generation: the read path, the batch send and the fence, on tr.
func replayScenario(t *testing.T, tr replayed) {
	addRules := func(c nft.Chain) (ops []nft.Op) {
		for i := range c.Rules {
			ops = append(ops, nft.Op{Verb: nft.Add, Kind: nft.KindRule, Name: c.Name, Rule: &c.Rules[i]})
		}
		return ops
	}
	want := wireTable(t)
	tr.step("read a table that does not exist")
	if got, err := readTable(tr, 0); err != nil || got != nil {
		t.Fatalf("read before the table exists: %+v, %v; want none", got, err)
	}
	tr.step("send the transaction that creates the table")
	if failed, err := createBatch(t).send(tr, 0); err != nil || failed != -1 {
		t.Fatalf("send: message %d failed: %v", failed, err)
	}
	tr.step("read the table whole")
	got, err := readTable(tr, 0)
	if err != nil || got == nil {
		t.Fatalf("read: %v, %v", got, err)
	}
	if !want.Equal(*got) || !got.Equal(want) || got.Owner != nft.NotOwned || got.Use != uint32(len(want.Sets)+len(want.Chains)) {
		t.Errorf("read:\n%s\nwant:\n%s", nft.Render(*got), nft.Render(want))
	}
	// A change of one element and of a chain's rules, read back alone.
	chain := want.Chains[len(want.Chains)-1]
	plan := nft.Plan{Ops: append([]nft.Op{
		{Verb: nft.Add, Kind: nft.KindElements, Name: nft.SetNonMasqV4, Elements: []nft.Range{nft.RangeOfPrefix(netip.MustParsePrefix("192.0.2.0/24"))}},
		{Verb: nft.Flush, Kind: nft.KindChain, Name: chain.Name},
	}, addRules(chain)...)}
	b, err := encode(plan)
	if err != nil {
		t.Fatal(err)
	}
	tr.step("send a change")
	if failed, err := b.send(tr, 0); err != nil || failed != -1 {
		t.Fatalf("send the change: message %d failed: %v", failed, err)
	}
	next, err := nft.ExecPlan(got, plan)
	if err != nil {
		t.Fatal(err)
	}
	tr.step("read back the change")
	head, err := readHead(tr, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := verifyChange(tr, head, &change{table: next, plan: plan}); !ok || err != nil {
		t.Errorf("the change read back: %v, %v; want verified", ok, err)
	}
	tr.step("fence")
	if err := fence(tr); err != nil {
		t.Errorf("fence: %v", err)
	}
	tr.step("generation")
	if _, err := generation(tr); err != nil {
		t.Errorf("generation: %v", err)
	}
}

// TestWireReplay runs the read path, the batch send and the fence against
// the recorded exchange, without root.
func TestWireReplay(t *testing.T) {
	if *record {
		n, _ := kernelNetlink(t)
		conn, err := n.reader()
		if err != nil {
			t.Fatal(err)
		}
		rec := &recorder{conn: conn.(*netlink.Conn)}
		replayScenario(t, rec)
		if t.Failed() {
			t.FailNow()
		}
		if err := os.WriteFile(replayPath, rec.out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r := readReplay(t, replayPath)
	replayScenario(t, r)
	for _, e := range r.exchanges {
		t.Errorf("%s: a recorded request was not sent:\n%x", e.step, e.request)
	}
}

// TestWireReplayRefusesOtherRequests: a request that is not the recorded
// one fails, and is reported.
func TestWireReplayRefusesOtherRequests(t *testing.T) {
	r := readReplay(t, replayPath)
	var reported []string
	r.errorf = func(format string, args ...any) { reported = append(reported, fmt.Sprintf(format, args...)) }
	_, err := get(unix.NFT_MSG_GETTABLE, attr(unix.NFTA_TABLE_NAME, cstring("another"))).ask(r)
	if err == nil || len(reported) != 1 || !strings.Contains(reported[0], "differs") {
		t.Errorf("a request that is not the recorded one: %v, reported %q", err, reported)
	}
}

// TestWireReplayDumpInterrupted: a dump of objects the kernel flags as
// interrupted by a commit (NLM_F_DUMP_INTR) is taken again; one flagged
// ten times is stale.
func TestWireReplayDumpInterrupted(t *testing.T) {
	var objects exchange
	for _, e := range readReplay(t, replayPath).exchanges {
		if binary.NativeEndian.Uint16(e.request[4:]) == unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETOBJ {
			objects = e
		}
	}
	if len(objects.answers) == 0 {
		t.Fatalf("%s holds no object dump", replayPath)
	}
	interrupted := exchange{step: "objects, interrupted", request: objects.request}
	for _, a := range objects.answers {
		a = bytes.Clone(a)
		binary.NativeEndian.PutUint16(a[6:], binary.NativeEndian.Uint16(a[6:])|unix.NLM_F_DUMP_INTR)
		interrupted.answers = append(interrupted.answers, a)
	}
	for _, c := range []struct {
		name      string
		exchanges []exchange
		want      error
	}{
		{"interrupted once", []exchange{interrupted, objects}, nil},
		{"interrupted every time", slices.Repeat([]exchange{interrupted}, 10), errDumpInterrupted},
	} {
		r := &replay{errorf: t.Errorf, exchanges: c.exchanges}
		_, err := dump(unix.NFT_MSG_GETOBJ, attr(unix.NFTA_OBJ_TABLE, cstring(nft.TableName))).across(nil).ask(r)
		if !errors.Is(err, c.want) || len(r.exchanges) > 0 {
			t.Errorf("%s: %v with %d dumps not taken, want %v", c.name, err, len(r.exchanges), c.want)
		}
	}
}
