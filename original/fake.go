package original

import (
	"net/netip"
	"slices"
	"sync"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
)

// Fake is an in-memory iptables-nft holding the original agent's rules,
// for tests: SetOriginal puts them there as another process would.
type Fake struct {
	// OriginalErr fails every FindOriginal and RemoveOriginal; RemoveErr
	// every RemoveOriginal that would remove something.
	OriginalErr, RemoveErr error

	mu       sync.Mutex
	gen      uint32
	original Rules // the original agent's rules (iptables-nft), see SetOriginal
	handle   uint64
	removals int
}

// SetOriginal puts the original agent's rules (as FindOriginal returns
// them) into the fake's iptables-nft tables, as another process would.
func (f *Fake) SetOriginal(o Rules) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.original = o
	f.gen++
}

// RewriteOriginal re-adds the original's chain rules with new handles, as
// the original agent's iptables-restore does at every resync.
func (f *Fake) RewriteOriginal() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.original.Families {
		for j := range f.original.Families[i].Rules {
			f.handle++
			f.original.Families[i].Rules[j].Handle = 1000 + f.handle
		}
	}
	f.gen++
}

// FindOriginal returns the original's rules set by SetOriginal, found as
// Netlink's are: chains that are the original's (Recognised), of a
// well-known name, or named chain.
func (f *Fake) FindOriginal(chain string) (Rules, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.findOriginal(chain)
}

func (f *Fake) findOriginal(chain string) (Rules, error) {
	if f.OriginalErr != nil {
		return Rules{}, f.OriginalErr
	}
	o := Rules{Chain: chain, Legacy: slices.Clone(f.original.Legacy), Gen: f.gen + 1}
	for _, fam := range []nft.Family{4, 6} {
		var found []Family
		var exemptions []XTRule
		for _, e := range f.original.Families {
			if e.Family != fam {
				continue
			}
			exemptions = append(exemptions, e.Exemptions...)
			if !e.Present() || !(e.Recognised() || slices.Contains(wellKnownChains, e.Chain) || e.Chain == chain) {
				continue
			}
			e.Jumps, e.Rules, e.Exemptions = slices.Clone(e.Jumps), slices.Clone(e.Rules), nil
			e.first = len(found)
			if len(e.Jumps) == 0 {
				e.first = -1
			}
			for _, j := range e.Jumps {
				if n, ok := isOriginalJumpComment(j.Comment); ok && e.CommentChain == "" {
					e.CommentChain = n
				}
			}
			found = append(found, e)
		}
		if len(found) == 0 {
			found = append(found, absent(fam, chain))
		}
		found[0].Exemptions = slices.Clone(exemptions)
		o.Families = append(o.Families, found...)
	}
	return o, nil
}

// RemoveOriginal removes the original's removable chains and jumps, as
// Netlink's does.
func (f *Fake) RemoveOriginal(chain, fingerprint string, families ...nft.Family) (Rules, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	o, err := f.findOriginal(chain)
	if err != nil {
		return o, err
	}
	o = o.Of(families...)
	if fingerprint != "" && o.Fingerprint() != fingerprint {
		return o, ErrChanged
	}
	o = o.removable()
	if !o.Present() {
		return o, nil
	}
	if f.RemoveErr != nil {
		return o, f.RemoveErr
	}
	for i := range f.original.Families {
		fam := &f.original.Families[i]
		for _, r := range o.Families {
			if r.Family == fam.Family && r.Chain == fam.Chain {
				fam.ChainPresent, fam.Jumps, fam.Rules = false, nil, nil
			}
		}
	}
	f.gen++
	f.removals++
	return o, nil
}

// Removals counts the RemoveOriginal calls that removed something.
func (f *Fake) Removals() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.removals
}

// Written is what the original agent writes for a config and its flags,
// for tests: Rules encodes it as iptables-nft does (a prefix as a load of
// the bytes it covers, a mask for the rest; comments and addrtype as
// xtables matches), so that it is read, explained and compared as the
// kernel's would be.
type Written struct {
	Chain                            string // "": IP-MASQ-AGENT
	EnableIPv6                       bool
	MasqLinkLocal, MasqLinkLocalIPv6 bool
	NonMasq                          []string // nonMasqueradeCIDRs as the original resolved them
	// HandEdited inserts, first in the IPv4 chain, a RETURN for every
	// destination whose second byte is 113 (a load from the middle of
	// the address: bounds not known, the comparison inexact).
	HandEdited bool
	// RandomFully: the IPv4 MASQUERADE carries --random-fully (else no
	// options are known of it, and none compared).
	RandomFully bool
}

// Rules are the rules, both families (IPv6 empty without EnableIPv6).
func (w Written) Rules() Rules {
	chain := w.Chain
	if chain == "" {
		chain = nft.DefaultChain
	}
	comment := func(s string) *expr.Match { c := xt.Comment(s); return &expr.Match{Name: "comment", Info: &c} }
	handle := uint64(100)
	next := func() uint64 { handle++; return handle }
	var out Rules
	for _, fam := range []nft.Family{4, 6} {
		if fam == 6 && !w.EnableIPv6 {
			out.Families = append(out.Families, withJumps(6, "", nil, nil, nil)...)
			continue
		}
		cidrs := []string{config.LinkLocalIPv4.String()}
		skip := w.MasqLinkLocal
		if fam == 6 {
			cidrs, skip = []string{config.LinkLocalIPv6.String()}, w.MasqLinkLocalIPv6
		}
		if skip {
			cidrs = nil
		}
		for _, c := range w.NonMasq {
			if p := netip.MustParsePrefix(c); p.Addr().Is6() == (fam == 6) {
				cidrs = append(cidrs, c)
			}
		}
		f := Family{Family: fam, Chain: chain, ChainPresent: true, ChainHandle: next()}
		for _, c := range cidrs {
			f.Rules = append(f.Rules, newXTRule(next(), append(daddrPrefix(fam, netip.MustParsePrefix(c)),
				comment("ip-masq-agent: local traffic is not subject to MASQUERADE"), &expr.Counter{}, &expr.Verdict{Kind: expr.VerdictReturn}), nil))
		}
		if w.HandEdited && fam == 4 {
			f.Rules = append([]XTRule{newXTRule(next(), []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 17, Len: 1},
				&expr.Cmp{Register: 1, Op: expr.CmpOpEq, Data: []byte{113}}, &expr.Counter{}, &expr.Verdict{Kind: expr.VerdictReturn}}, nil)}, f.Rules...)
		}
		masq := &expr.Target{Name: "MASQUERADE"}
		if w.RandomFully && fam == 4 {
			masq.Info = &xt.NatIPv4MultiRangeCompat{{Flags: uint(xt.NatRangeProtoRandomFully)}}
		}
		f.Rules = append(f.Rules, newXTRule(next(), []expr.Any{comment("ip-masq-agent: outbound traffic is subject to MASQUERADE (must be last in chain)"),
			&expr.Counter{}, masq}, nil))
		jump := newXTRule(next(), []expr.Any{comment(JumpComment(chain)),
			&expr.Match{Name: "addrtype", Rev: 1, Info: &xt.AddrTypeV1{Dest: uint16(xt.AddrTypeLocal), Flags: 0x2}},
			&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}, nil)
		out.Families = append(out.Families, withJumps(fam, "", []XTRule{jump}, []Family{f}, nil)...)
	}
	return out
}

// daddrPrefix is iptables-nft's match of a destination prefix.
func daddrPrefix(fam nft.Family, p netip.Prefix) []expr.Any {
	p = p.Masked()
	d := nft.Daddr(fam)
	n := (p.Bits() + 7) / 8
	if n == 0 {
		return nil
	}
	d.Len = uint32(n)
	out := []expr.Any{&d}
	if p.Bits()%8 != 0 {
		mask := make([]byte, n)
		for i := range mask {
			mask[i] = 0xff
		}
		mask[n-1] = byte(0xff << (8 - p.Bits()%8))
		out = append(out, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: uint32(n), Mask: mask, Xor: make([]byte, n)})
	}
	return append(out, &expr.Cmp{Register: 1, Op: expr.CmpOpEq, Data: p.Addr().AsSlice()[:n]})
}
