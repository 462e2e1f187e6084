package config

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Diff describes what changed from old to c, one item per key, e.g.
// `nonMasqueradeCIDRs +10.1.0.0/16 -10.0.0.0/8` or `masqOutBound true->false`,
// for a log line that says what changed without the whole config.
func (c Config) Diff(old Config) []string {
	var out []string
	for _, k := range keys {
		if d := k.diff(&old, &c); d != "" {
			out = append(out, d)
		}
	}
	return out
}

// diffList is the change of a CIDR list: its CIDRs added, then removed,
// at most 10; "" when none.
func diffList(key string, o, n []netip.Prefix) string {
	// A reload changes a few CIDRs of a list that is otherwise the same:
	// what both lists begin and end with is in both. The rest is looked
	// up in the whole other list: by a scan when it is a few CIDRs, by
	// a set otherwise (slices.Contains for each of 100,000 CIDRs would
	// take seconds; two sets of 100,000, 40 ms).
	head := 0
	for head < len(o) && head < len(n) && o[head] == n[head] {
		head++
	}
	tail := 0
	for tail < len(o)-head && tail < len(n)-head && o[len(o)-1-tail] == n[len(n)-1-tail] {
		tail++
	}
	om, nm := o[head:len(o)-tail], n[head:len(n)-tail]
	in := func(ps []netip.Prefix) func(netip.Prefix) bool {
		if len(om)+len(nm) <= 64 {
			return func(p netip.Prefix) bool { return slices.Contains(ps, p) }
		}
		m := make(map[netip.Prefix]bool, len(ps))
		for _, p := range ps {
			m[p] = true
		}
		return func(p netip.Prefix) bool { return m[p] }
	}
	var parts []string
	if len(nm) > 0 {
		inOld := in(o)
		for _, p := range nm {
			if !inOld(p) {
				parts = append(parts, "+"+p.String())
			}
		}
	}
	if len(om) > 0 {
		inNew := in(n)
		for _, p := range om {
			if !inNew(p) {
				parts = append(parts, "-"+p.String())
			}
		}
	}
	if len(parts) > 10 {
		parts = append(parts[:10], fmt.Sprintf("(%d more)", len(parts)-10))
	}
	if len(parts) == 0 {
		return ""
	}
	return key + " " + strings.Join(parts, " ")
}
