package config

import (
	"fmt"
	"net/netip"
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
	// Sets, not slices.Contains: 100,000 CIDRs would take seconds.
	in := func(ps []netip.Prefix) map[netip.Prefix]bool {
		m := make(map[netip.Prefix]bool, len(ps))
		for _, p := range ps {
			m[p] = true
		}
		return m
	}
	om, nm := in(o), in(n)
	var parts []string
	for _, p := range n {
		if !om[p] {
			parts = append(parts, "+"+p.String())
		}
	}
	for _, p := range o {
		if !nm[p] {
			parts = append(parts, "-"+p.String())
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
