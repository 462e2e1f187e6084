package config

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestDiff(t *testing.T) {
	old := Default(Flags{})
	c, _, err := Parse([]byte("nonMasqueradeCIDRs: [10.0.0.0/8, 100.64.0.0/10]\nmasqOutBound: false\nresyncInterval: 5s\n"), Flags{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"nonMasqueradeCIDRs +100.64.0.0/10 -172.16.0.0/12 -192.168.0.0/16",
		"masqOutBound true->false",
		"resyncInterval 1m0s->5s",
	}
	if got := c.Diff(old); !slices.Equal(got, want) {
		t.Errorf("Diff = %q, want %q", got, want)
	}
	// This agent's own keys, a list of names among them.
	n, _, err := Parse([]byte("egressInterfaces: [eth0, \"ens*\"]\nmasqueradeSourceCIDRs: [10.244.0.0/16]\n"), Flags{})
	if err != nil {
		t.Fatal(err)
	}
	m, _, err := Parse([]byte("egressInterfaces: [eth0, wg0]\n"), Flags{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := m.Diff(n), []string{"masqueradeSourceCIDRs -10.244.0.0/16", "egressInterfaces +wg0 -ens*"}; !slices.Equal(got, want) {
		t.Errorf("Diff = %q, want %q", got, want)
	}
	if got := c.Diff(c); len(got) != 0 {
		t.Errorf("Diff of a config with itself = %q, want nothing", got)
	}
}

// TestDiffListAsSets: diffList, which looks up only what lies between
// the lists' common beginning and end, says what a lookup of every CIDR
// in the whole other list says (duplicates, moves and reorders too).
func TestDiffListAsSets(t *testing.T) {
	ref := func(o, n []netip.Prefix) string {
		has := func(ps []netip.Prefix, p netip.Prefix) bool { return slices.Contains(ps, p) }
		var parts []string
		for _, p := range n {
			if !has(o, p) {
				parts = append(parts, "+"+p.String())
			}
		}
		for _, p := range o {
			if !has(n, p) {
				parts = append(parts, "-"+p.String())
			}
		}
		if len(parts) > 10 {
			parts = append(parts[:10], fmt.Sprintf("(%d more)", len(parts)-10))
		}
		if len(parts) == 0 {
			return ""
		}
		return "k " + strings.Join(parts, " ")
	}
	r := rand.New(rand.NewPCG(1, 2))
	list := func(n, of int) []netip.Prefix {
		out := make([]netip.Prefix, n)
		for i := range out {
			out[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(r.IntN(of)), 0}), 24)
		}
		return out
	}
	for range 20000 {
		o := list(r.IntN(40), 1+r.IntN(50))
		n := slices.Clone(o)
		switch r.IntN(4) {
		case 0: // a few changed
			for range 1 + r.IntN(3) {
				if len(n) > 0 {
					n[r.IntN(len(n))] = list(1, 60)[0]
				}
			}
		case 1: // one inserted or removed
			if len(n) > 0 && r.IntN(2) == 0 {
				i := r.IntN(len(n))
				n = slices.Delete(n, i, i+1)
			} else {
				n = slices.Insert(n, r.IntN(len(n)+1), list(1, 60)[0])
			}
		case 2: // another list
			n = list(r.IntN(120), 1+r.IntN(60))
		case 3: // shuffled
			r.Shuffle(len(n), func(i, j int) { n[i], n[j] = n[j], n[i] })
		}
		if got, want := diffList("k", o, n), ref(o, n); got != want {
			t.Fatalf("diffList(%v, %v) = %q, want %q", o, n, got, want)
		}
	}
}
