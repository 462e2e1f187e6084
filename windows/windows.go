// Package windows renders a config as the OutBoundNAT endpoint policy of
// Windows nodes' CNI plugins (ip-masq-agent render --windows).
package windows

import (
	"encoding/json"
	"fmt"
	"net/netip"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
)

// Policy is the endpoint policy that Windows nodes' CNI plugins
// (win-bridge, win-overlay) take in their config's "policies" list:
// outbound traffic is masqueraded (OutBoundNAT) except to the
// ExceptionList.
type Policy struct {
	Name  string `json:"name"`
	Value struct {
		Type          string   `json:"Type"`
		ExceptionList []string `json:"ExceptionList"`
	} `json:"value"`
}

// For returns the OutBoundNAT policy equivalent to cfg, and a warning
// for each part of cfg that the policy cannot express: masqueradeCIDRs,
// nonMasqueradeSourceCIDRs, masqOutBound: false, and IPv6 CIDRs (with
// enableIPv6). The
// ExceptionList holds the IPv4 nonMasqueradeCIDRs as written (IPv4-mapped
// ones unmapped, repeats dropped), then 169.254.0.0/16 unless
// masqLinkLocal is true.
func For(cfg config.Config, enableIPv6 bool) (Policy, []string) {
	var p Policy
	p.Name = "EndpointPolicy"
	p.Value.Type = "OutBoundNAT"
	p.Value.ExceptionList = []string{}
	var warns []string
	seen := make(map[netip.Prefix]bool)
	v6 := 0
	add := func(q netip.Prefix) {
		if !seen[q] {
			seen[q] = true
			p.Value.ExceptionList = append(p.Value.ExceptionList, q.String())
		}
	}
	for _, q := range cfg.NonMasqueradeCIDRs {
		q, _ = config.UnmapPrefix(q)
		if q.Addr().Is6() {
			v6++
			continue
		}
		add(q)
	}
	if !cfg.MasqLinkLocal {
		add(config.LinkLocalIPv4)
	}
	if n := len(cfg.MasqueradeCIDRs); n > 0 {
		warns = append(warns, fmt.Sprintf("masqueradeCIDRs (%d) cannot be expressed: OutBoundNAT masquerades everything "+
			"outside the ExceptionList, so those destinations are not masqueraded if an exception covers them", n))
	}
	if n := len(cfg.NonMasqueradeSourceCIDRs); n > 0 {
		warns = append(warns, fmt.Sprintf("nonMasqueradeSourceCIDRs (%d) cannot be expressed: the ExceptionList holds destinations only, "+
			"so traffic from those sources is masqueraded like any other", n))
	}
	if !cfg.MasqOutBound {
		warns = append(warns, "masqOutBound: false cannot be expressed: OutBoundNAT masquerades all traffic outside the ExceptionList")
	}
	if enableIPv6 && v6 > 0 {
		warns = append(warns, fmt.Sprintf("%d IPv6 nonMasqueradeCIDRs left out: the ExceptionList holds only IPv4 CIDRs", v6))
	}
	return p, warns
}

// Render returns Windows' policy as indented JSON, ending in a newline.
func Render(p Policy) string {
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		panic(err) // strings and a list of strings always marshal
	}
	return string(b) + "\n"
}
