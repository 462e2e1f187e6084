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
	list := func(key string, o, n []netip.Prefix) {
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
		if len(parts) > 0 {
			out = append(out, key+" "+strings.Join(parts, " "))
		}
	}
	value := func(key string, o, n any) {
		if o != n {
			out = append(out, fmt.Sprintf("%s %v->%v", key, o, n))
		}
	}
	list(keyNonMasq, old.NonMasqueradeCIDRs, c.NonMasqueradeCIDRs)
	list(keyMasq, old.MasqueradeCIDRs, c.MasqueradeCIDRs)
	value(keyLinkLocal, old.MasqLinkLocal, c.MasqLinkLocal)
	value(keyLinkLocal6, old.MasqLinkLocalIPv6, c.MasqLinkLocalIPv6)
	value(keyOutBound, old.MasqOutBound, c.MasqOutBound)
	value(keyOutBound6, old.MasqOutBoundIPv6, c.MasqOutBoundIPv6)
	value(keyResync, old.ResyncInterval, c.ResyncInterval)
	value(keyLimit, old.CIDRLimit, c.CIDRLimit)
	return out
}
