package original

import (
	"slices"
	"sync"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
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
func (f *Fake) RemoveOriginal(chain, fingerprint string) (Rules, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	o, err := f.findOriginal(chain)
	if err != nil {
		return o, err
	}
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
