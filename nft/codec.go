package nft

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Each part of a Rule, side by side: how it is encoded as expressions, how
// those expressions are decoded back (exactly, or the rule is not the
// agent's), and how nft writes it. A rule is its parts in this order:
// matches, then statements (the counter goes before the verdict: after
// masquerade it would never count). A new part of a Rule is a field in
// table.go, an entry here and its use in build.go.
var parts = []struct {
	encode func(r Rule, out []expr.Any) []expr.Any // appends the part's expressions to out
	decode func(d *decoder, r *Rule) bool          // false: the expressions are not this part's
	render func(Rule) string
}{
	{ // fib daddr type != local; fib's address type is a host-endian u32 (RTN_LOCAL is 2)
		encode: func(r Rule, out []expr.Any) []expr.Any {
			if !r.NotLocal {
				return out
			}
			return append(out, &fibDaddrType, &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)})
		},
		decode: func(d *decoder, r *Rule) bool {
			f, ok := d.peek().(*expr.Fib)
			if !ok {
				return true
			}
			d.i++
			r.NotLocal = *f == fibDaddrType && d.cmp(expr.CmpOpNeq, binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL))
			return r.NotLocal
		},
		render: func(r Rule) string { return cond(r.NotLocal, "fib daddr type != local") },
	},
	{ // meta nfproto ipv4|ipv6; nft folds it into "ip daddr @set" when a lookup of an address follows
		encode: func(r Rule, out []expr.Any) []expr.Any {
			if r.Family == 0 {
				return out
			}
			return append(out, &expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{NFProto(r.Family)}})
		},
		decode: func(d *decoder, r *Rule) bool {
			m, ok := d.peek().(*expr.Meta)
			if !ok || m.Key != expr.MetaKeyNFPROTO {
				return true
			}
			d.i++
			for _, f := range []Family{4, 6} {
				if m.Register == 1 && !m.SourceRegister && d.cmp(expr.CmpOpEq, []byte{NFProto(f)}) {
					r.Family = f
					return true
				}
			}
			return false
		},
		render: func(r Rule) string {
			return cond(!(r.Set != "" && r.Selector.isAddr()) && r.Family != 0, "meta nfproto ipv"+fmt.Sprint(r.Family))
		},
	},
	{ // SELECTOR @set: ip daddr @set, ip6 saddr @set, ... (selector.go)
		encode: func(r Rule, out []expr.Any) []expr.Any {
			if r.Set == "" {
				return out
			}
			return append(out, r.Selector.load(r.Family), &expr.Lookup{SourceRegister: 1, SetName: r.Set})
		},
		decode: func(d *decoder, r *Rule) bool {
			sel := loadedBy(d.peek(), r.Family)
			if sel == 0 {
				return true // no lookup, or not the agent's: the counter decides
			}
			d.i++
			l, ok := d.peek().(*expr.Lookup)
			if !ok || l.SourceRegister != 1 || l.IsDestRegSet || l.Invert || l.SetName == "" {
				return false
			}
			d.i++
			r.Selector, r.Set = sel, l.SetName
			return true
		},
		render: func(r Rule) string {
			return cond(r.Set != "", r.Selector.name(r.Family)+" @"+r.Set)
		},
	},
	{ // meta l4proto tcp|udp|sctp
		encode: func(r Rule, out []expr.Any) []expr.Any {
			if r.L4Proto == 0 {
				return out
			}
			return append(out, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{r.L4Proto}})
		},
		decode: func(d *decoder, r *Rule) bool {
			m, ok := d.peek().(*expr.Meta)
			if !ok || m.Key != expr.MetaKeyL4PROTO {
				return true
			}
			d.i++
			c, ok := d.peek().(*expr.Cmp)
			if m.Register != 1 || m.SourceRegister || !ok || c.Op != expr.CmpOpEq || c.Register != 1 || len(c.Data) != 1 || c.Data[0] == 0 {
				return false
			}
			d.i++
			r.L4Proto = c.Data[0]
			return true
		},
		render: func(r Rule) string { return cond(r.L4Proto != 0, "meta l4proto "+protoName(r.L4Proto)) },
	},
	{ // numgen random mod Of < Below; numgen yields a host-endian u32 and cmp
		// lt compares bytes, so it is converted to network order first, as nft does
		encode: func(r Rule, out []expr.Any) []expr.Any {
			if r.Share == nil {
				return out
			}
			return append(out, &expr.Numgen{Register: 1, Modulus: r.Share.Of, Type: unix.NFT_NG_RANDOM}, &hton32,
				&expr.Cmp{Op: expr.CmpOpLt, Register: 1, Data: binaryutil.BigEndian.PutUint32(r.Share.Below)})
		},
		decode: func(d *decoder, r *Rule) bool {
			n, ok := d.peek().(*expr.Numgen)
			if !ok {
				return true
			}
			d.i++
			b, ok1 := d.peek().(*expr.Byteorder)
			if ok1 {
				d.i++
			}
			c, ok2 := d.peek().(*expr.Cmp)
			if !ok1 || !ok2 || n.Register != 1 || n.Type != unix.NFT_NG_RANDOM || n.Offset != 0 || *b != hton32 ||
				c.Op != expr.CmpOpLt || c.Register != 1 || len(c.Data) != 4 {
				return false
			}
			d.i++
			r.Share = &Share{Below: binary.BigEndian.Uint32(c.Data), Of: n.Modulus}
			return true
		},
		render: func(r Rule) string {
			if r.Share == nil {
				return ""
			}
			return fmt.Sprintf("numgen random mod %d < %d", r.Share.Of, r.Share.Below)
		},
	},
	{ // ct label set BIT: the label bitmap (128 bits, the kernel's unsigned
		// longs) in register 1, then ct set label; the kernel ORs it in
		encode: func(r Rule, out []expr.Any) []expr.Any {
			if r.CtLabel == nil {
				return out
			}
			return append(out, &expr.Immediate{Register: 1, Data: LabelBits(int(*r.CtLabel))}, &ctSetLabel)
		},
		decode: func(d *decoder, r *Rule) bool {
			im, ok := d.peek().(*expr.Immediate)
			if !ok || len(im.Data) != labelBytes {
				return true // a masquerade's port range, or not the agent's: the counter decides
			}
			d.i++
			c, ok := d.peek().(*expr.Ct)
			bit := labelBit(im.Data)
			// google/nftables v0.3.0 decodes no NFTA_CT_SREG: the set
			// reads back as key labels without a register, and
			// sameEncoding (nft/kernel/read.go) checks the kernel's attributes,
			// register 1 among them.
			if !ok || im.Register != 1 || (*c != ctSetLabel && *c != (expr.Ct{Key: expr.CtKeyLABELS})) || bit < 0 {
				return false
			}
			d.i++
			b := uint8(bit)
			r.CtLabel = &b
			return true
		},
		render: func(r Rule) string {
			if r.CtLabel == nil {
				return ""
			}
			return fmt.Sprintf("ct label set %d", *r.CtLabel)
		},
	},
	{ // counter: every rule of the agent's has one
		encode: func(_ Rule, out []expr.Any) []expr.Any { return append(out, &expr.Counter{}) },
		decode: func(d *decoder, _ *Rule) bool {
			_, ok := d.peek().(*expr.Counter)
			d.i++
			return ok
		},
		render: func(Rule) string { return "counter" },
	},
	{ // return, jump CHAIN, goto CHAIN
		encode: func(r Rule, out []expr.Any) []expr.Any {
			if v := modelVerdict(r.Verdict); v != nil {
				return append(out, &expr.Verdict{Kind: v.kind, Chain: cond(v.chain, r.Target)})
			}
			return out
		},
		decode: func(d *decoder, r *Rule) bool {
			e, ok := d.peek().(*expr.Verdict)
			if !ok {
				return true // masquerade, or not the agent's: the end decides
			}
			d.i++
			v := verdictByKind(e.Kind)
			if v == nil || v.model == 0 {
				return false
			}
			r.Verdict, r.Target = v.model, cond(v.chain, e.Chain)
			return true
		},
		render: func(r Rule) string {
			if v := modelVerdict(r.Verdict); v != nil {
				return v.text(r.Target)
			}
			return ""
		},
	},
	{ // masquerade [to :First-Last] [fully-random]: the port range in registers 1 and 2
		encode: func(r Rule, out []expr.Any) []expr.Any {
			if r.Verdict != Masquerade {
				return out
			}
			m := &expr.Masq{FullyRandom: r.FullyRandom}
			if r.Ports == nil {
				return append(out, m)
			}
			m.ToPorts, m.RegProtoMin, m.RegProtoMax = true, 1, 2
			return append(out, &expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(r.Ports.First)},
				&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(r.Ports.Last)}, m)
		},
		decode: func(d *decoder, r *Rule) bool {
			if r.Verdict != 0 {
				return true // a verdict came first: the end decides
			}
			if lo, ok := d.peek().(*expr.Immediate); ok {
				d.i++
				hi, ok := d.peek().(*expr.Immediate)
				if !ok || lo.Register != 1 || hi.Register != 2 || len(lo.Data) != 2 || len(hi.Data) != 2 {
					return false
				}
				d.i++
				r.Ports = &PortRange{First: binary.BigEndian.Uint16(lo.Data), Last: binary.BigEndian.Uint16(hi.Data)}
			}
			m, ok := d.peek().(*expr.Masq)
			if !ok || m.Random || m.Persistent || m.ToPorts != (r.Ports != nil) || (r.Ports != nil && (m.RegProtoMin != 1 || m.RegProtoMax != 2)) {
				return false
			}
			d.i++
			r.Verdict, r.FullyRandom = Masquerade, m.FullyRandom
			return true
		},
		render: func(r Rule) string {
			if r.Verdict != Masquerade {
				return ""
			}
			s := verdictMasquerade
			if r.Ports != nil {
				s += fmt.Sprintf(" to :%d-%d", r.Ports.First, r.Ports.Last)
			}
			return s + cond(r.FullyRandom, " fully-random")
		},
	},
}

type nftVerdict struct {
	kind  expr.VerdictKind
	name  string
	chain bool    // followed by a chain's name
	model Verdict // 0: the agent writes no such verdict
}

// text writes the verdict as nft does, with its chain.
func (v *nftVerdict) text(chain string) string {
	if v.chain {
		return v.name + " " + chain
	}
	return v.name
}

// verdicts are the verdicts nft writes, by name; model is the Rule's
// Verdict for the ones the agent writes.
var verdicts = []nftVerdict{
	{expr.VerdictReturn, "return", false, Return},
	{expr.VerdictJump, "jump", true, Jump},
	{expr.VerdictGoto, "goto", true, Goto},
	{expr.VerdictAccept, "accept", false, 0},
	{expr.VerdictDrop, "drop", false, 0},
}

// verdictMasquerade is how nft writes masquerade, and the name of the
// verdict of a rule that masquerades (verdictOf).
const verdictMasquerade = "masquerade"

// modelVerdict returns the entry of verdicts for a Rule's Verdict, or nil.
func modelVerdict(v Verdict) *nftVerdict {
	for i := range verdicts {
		if verdicts[i].model == v && v != 0 {
			return &verdicts[i]
		}
	}
	return nil
}

// verdictName writes a verdict as nft does: "return", "jump CHAIN", ...
// (DescribeExprs, RuleVerdict).
func verdictName(e *expr.Verdict) string {
	if v := verdictByKind(e.Kind); v != nil {
		return v.text(e.Chain)
	}
	return fmt.Sprintf("verdict %d", e.Kind)
}

// verdictByKind returns the entry of verdicts of a kind; nil for the
// kinds nft does not write (continue, break).
func verdictByKind(k expr.VerdictKind) *nftVerdict {
	for i := range verdicts {
		if verdicts[i].kind == k {
			return &verdicts[i]
		}
	}
	return nil
}

// labelBytes is the size of a conntrack label bitmap (XT_CONNLABEL_MAXBIT + 1 bits).
const labelBytes = 16

var ctSetLabel = expr.Ct{Register: 1, SourceRegister: true, Key: expr.CtKeyLABELS}

// LabelBits returns the conntrack label bitmap with only bit set, as the
// kernel lays it out (unsigned longs of the host's byte order), as ct set
// label takes it and ctnetlink's CTA_LABELS carries it.
func LabelBits(bit int) []byte {
	b := make([]byte, labelBytes)
	copy(b[bit/64*8:], binaryutil.NativeEndian.PutUint64(1<<(bit%64))) // 64-bit hosts
	return b
}

// labelBit returns the one bit set in a label bitmap, or -1 when not
// exactly one is.
func labelBit(b []byte) int {
	bit := -1
	for i := 0; i < 128; i++ {
		if hasLabel(b, i) {
			if bit >= 0 {
				return -1
			}
			bit = i
		}
	}
	return bit
}

// hasLabel reports whether the label bitmap b has bit set.
func hasLabel(b []byte, bit int) bool {
	if bit < 0 || len(b) < (bit/64+1)*8 {
		return false
	}
	return binaryutil.NativeEndian.Uint64(b[bit/64*8:])&(1<<(bit%64)) != 0
}

var (
	fibDaddrType = expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true}
	hton32       = expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 4, Size: 4}
)

type addrField struct {
	name   string
	family Family
	offset uint32 // in the network header
	len    uint32
	// minPrefix is the shortest load at offset that is a prefix of
	// this field rather than another family's header field.
	minPrefix uint32
}

// addrFields are the address fields of the network headers, as nft names
// them and as payload expressions load them: the selectors (selector.go)
// and the description of foreign rules take them from here.
var addrFields = []addrField{
	{"ip saddr", 4, 12, 4, 1},
	{"ip daddr", 4, 16, 4, 1},
	{"ip6 saddr", 6, 8, 16, 5}, // shorter: an IPv4 header's ttl and protocol
	{"ip6 daddr", 6, 24, 16, 1},
}

func NFProto(f Family) byte {
	if f == 6 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

// Encode returns the agent's encoding of r, from its fields: never a
// found rule's decoded expressions, which google/nftables' decoders may
// have left incomplete (a ct set's source register, for one), so that
// the kernel would refuse them (EINVAL).
func (r Rule) Encode() []expr.Any {
	r.exprs = nil
	return r.expressions()
}

// expressions returns a rule's expressions: the kernel's, for a rule read
// back, or its encoding.
func (r Rule) expressions() []expr.Any {
	if r.exprs != nil {
		return r.exprs
	}
	out := make([]expr.Any, 0, 8)
	for _, p := range parts {
		out = p.encode(r, out)
	}
	return out
}

// decodeRule reads back a rule as the agent encodes it: exactly its
// expressions, in its order, or ok is false.
func decodeRule(exprs []expr.Any, comment string) (r Rule, ok bool) {
	r.Comment = comment
	d := &decoder{exprs: exprs}
	for _, p := range parts {
		if !p.decode(d, &r) {
			return r, false
		}
	}
	return r, r.Verdict != 0 && d.i == len(exprs)
}

type decoder struct {
	exprs []expr.Any
	i     int
}

func (d *decoder) peek() expr.Any {
	if d.i < len(d.exprs) {
		return d.exprs[d.i]
	}
	return nil
}

// cmp consumes a cmp of register 1 with op and data, if it is next.
func (d *decoder) cmp(op expr.CmpOp, data []byte) bool {
	c, ok := d.peek().(*expr.Cmp)
	if ok && c.Op == op && c.Register == 1 && bytes.Equal(c.Data, data) {
		d.i++
		return true
	}
	return false
}

// RenderRule returns one rule in nft syntax, as `nft list` writes it
// (without the counter's values).
func RenderRule(r Rule) string {
	if r.Foreign != "" {
		return r.Foreign
	}
	var w []string
	for _, p := range parts {
		if s := p.render(r); s != "" {
			w = append(w, s)
		}
	}
	if r.Comment != "" {
		w = append(w, fmt.Sprintf("comment %q", r.Comment))
	}
	return strings.Join(w, " ")
}

func cond(ok bool, s string) string {
	if ok {
		return s
	}
	return ""
}

func protoName(p uint8) string {
	switch p {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_SCTP:
		return "sctp"
	}
	return fmt.Sprint(p)
}

// referenced returns the set an expression looks up or the chain it jumps
// or goes to; "" for other expressions.
func referenced(e expr.Any) string {
	switch e := e.(type) {
	case *expr.Lookup:
		return e.SetName
	case *expr.Verdict:
		if e.Kind == expr.VerdictJump || e.Kind == expr.VerdictGoto {
			return e.Chain
		}
	}
	return ""
}
