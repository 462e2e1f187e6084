package bench

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// selectorsSNAT is the every-selector table's snatAddress: a second
// address of the node's uplink (in its 192.0.2.0/24).
var selectorsSNAT = netip.MustParseAddr("192.0.2.5")

// selectorsPods is masqueradeSourceCIDRs: it holds the pod (10.244.1.2).
var selectorsPods = netip.MustParsePrefix("10.244.0.0/16")

// selectorsConfig is destination-only's config (n nonMasqueradeCIDRs,
// cidrList list 0) with every selector of issue 33 in use, each passed by
// the data plane's traffic (pod 10.244.1.2 to 203.0.113.10 out of the
// uplink), so that a new connection goes through every rule:
//
//   - nonMasqueradeSourceCIDRs: n /29s (cidrList list 1), none the pod's;
//   - masqueradeSourceCIDRs: 10.244.0.0/16, the pod's;
//   - egressInterfaces: the uplink and a wildcard;
//   - cidrMatch: mostSpecific, with nesting three deep: masqueradeCIDRs
//     100.64.0.0/10 around every nonMasqueradeCIDR, and a masqueraded
//     /30 inside every tenth of them (n/10+1);
//   - snatAddress 192.0.2.5 on the uplink (o.Links).
//
// The options are destination-only's (the daemon's defaults).
func selectorsConfig(n int) (config.Config, nft.Options) {
	c := config.Default(config.Flags{})
	c.NonMasqueradeCIDRs = cidrList(4, 0, n)
	c.CIDRLimit = max(n, 64)
	c.CIDRMatch = config.MostSpecific
	c.MasqueradeCIDRs = []netip.Prefix{netip.MustParsePrefix("100.64.0.0/10")}
	for i := 0; i < n; i += 10 {
		c.MasqueradeCIDRs = append(c.MasqueradeCIDRs, netip.PrefixFrom(cidrAt(4, 0, i).Addr(), 30))
	}
	c.NonMasqueradeSourceCIDRs = cidrList(4, 1, n)
	c.MasqueradeSourceCIDRs = []netip.Prefix{selectorsPods}
	c.EgressInterfaces = []string{testnet.NodeUplinkIf, "ens*"}
	c.SNATAddress = selectorsSNAT
	o := agentOptions(true)
	o.Links = func(a netip.Addr) []string {
		if a == selectorsSNAT {
			return []string{testnet.NodeUplinkIf}
		}
		return nil
	}
	return c, o
}

// agentOptions are the options of the data plane's agent tables: the
// daemon's defaults, with or without the conntrack label.
func agentOptions(label bool) nft.Options {
	o := nft.Options{Chain: nft.DefaultChain, RandomFully: true}
	if label {
		bit := uint8(nft.DefaultConntrackLabel) // the daemon's default: as it ships
		o.CtLabel = &bit
	}
	return o
}

// RuleCount is the number of rules of a table.
type RuleCount struct {
	N              int // the size of every list
	Decision, Masq int // rules of the decision chain and of the masquerade chain
}

// rulesOf counts t's rules.
func rulesOf(n int, t nft.Table) RuleCount {
	rc := RuleCount{N: n, Decision: len(t.DecisionChain().Rules)}
	if c := t.Chain(nft.MasqChainName); c != nil {
		rc.Masq = len(c.Rules)
	}
	return rc
}

// SelectorResults are the figures of issue 33: the data plane with every
// selector in use against destination-only, and the table's size.
type SelectorResults struct {
	Data *DataResults // no rules; the agent, destination-only; the agent, every selector: all at N
	N    int
	// Rules are the every-selector table's rules (nft.Build) at several
	// sizes of every list, Dest destination-only's at N.
	Rules []RuleCount
	Dest  RuleCount
	// KernelRules are the rules `nft -j list table` shows in the node
	// namespace of each agent point, by kind: an independent reader.
	KernelRules map[string]int
}

// Constant says whether the every-selector table has as many rules at
// every list size.
func (s *SelectorResults) Constant() bool {
	if s == nil || len(s.Rules) < 2 {
		return false
	}
	for _, r := range s.Rules[1:] {
		if r.Decision != s.Rules[0].Decision || r.Masq != s.Rules[0].Masq {
			return false
		}
	}
	return true
}

// RunSelectors measures, side by side as RunData does, the CPU per new
// connection through the agent's table of N nonMasqueradeCIDRs alone and
// of the same list with every selector in use (selectorsConfig), and the
// no-rules baseline; and counts the every-selector table's rules at list
// sizes from 1 to 100,000, and in the kernel.
func RunSelectors(ctx context.Context, cfg Config) (*SelectorResults, error) {
	d := &DataResults{Duration: 2 * time.Second, Reps: 9, Clients: 2 * runtime.NumCPU()}
	s := &SelectorResults{Data: d, N: 10_000, KernelRules: map[string]int{}}
	sizes := []int{1, 1_000, 10_000, 100_000}
	if cfg.Quick {
		d.Duration, d.Reps, s.N, sizes = 300*time.Millisecond, 1, 1000, []int{1, 1000}
	}
	for _, n := range sizes {
		s.Rules = append(s.Rules, rulesOf(n, nft.Build(selectorsConfig(n))))
	}
	dc := config.Default(config.Flags{})
	dc.NonMasqueradeCIDRs = cidrList(4, 0, s.N)
	s.Dest = rulesOf(s.N, nft.Build(dc, agentOptions(true)))
	d.Points = []*DataPoint{{Kind: KindNone}, {Kind: KindAgent, N: s.N}, {Kind: KindAgentSelectors, N: s.N}}
	err := runPoints(ctx, cfg, "selectors", d, func(p *DataPoint) error {
		if !p.agentKind() {
			return nil
		}
		out, err := p.topo.NFT("-j", "list", "table", "inet", nft.TableName)
		if err != nil {
			return err
		}
		s.KernelRules[p.Kind] = strings.Count(out, `{"rule":`)
		return nil
	})
	return s, err
}

func selectorsTarget(r *Results, add func(goal, measured string, met *bool)) {
	goal := "data plane: CPU per new connection at 10,000 CIDRs with every selector in use within 10% of destination-only; " +
		"the table one rule per decision, whatever the lists' sizes (issue 33)"
	s := r.Selectors
	if s == nil {
		add(goal, "", nil)
		return
	}
	dest, all := s.Data.Find(KindAgent, s.N), s.Data.Find(KindAgentSelectors, s.N)
	if !dest.Measured() || !all.Measured() {
		add(goal, "", nil)
		return
	}
	if s.N != 10_000 {
		goal = strings.Replace(goal, "10,000", num(s.N), 1)
	}
	ratio := all.CPUns() / dest.CPUns()
	var sizes []string
	for _, x := range s.Rules {
		sizes = append(sizes, num(x.N))
	}
	rules := s.Rules[0]
	paired := pairedRatios(all, dest)
	m := fmt.Sprintf("%.1f µs vs %.1f µs: %.3f× (%+.1f%%); each repetition's ratio: median %.3f× (%.2f–%.2f); "+
		"rules (decision + masquerade chain): %d + %d at %s entries in every list (destination-only: %d + %d); "+
		"in the kernel, all chains: %d (destination-only %d)",
		all.CPUns()/1e3, dest.CPUns()/1e3, ratio, (ratio-1)*100, median(paired), slices.Min(paired), slices.Max(paired),
		rules.Decision, rules.Masq, strings.Join(sizes, ", "),
		s.Dest.Decision, s.Dest.Masq, s.KernelRules[KindAgentSelectors], s.KernelRules[KindAgent])
	// The ratio is of the whole cost of a connection (socket, handshake,
	// reset through three namespaces); the rules' own share is smaller.
	if none := s.Data.Find(KindNone, 0); none.Measured() {
		m += fmt.Sprintf("; above the no-rules baseline (%.1f µs): %.1f µs vs %.1f µs", none.CPUns()/1e3,
			(all.CPUns()-none.CPUns())/1e3, (dest.CPUns()-none.CPUns())/1e3)
	}
	constant := s.Constant()
	if !constant {
		var parts []string
		for _, x := range s.Rules {
			parts = append(parts, fmt.Sprintf("%s: %d + %d", num(x.N), x.Decision, x.Masq))
		}
		m += "; **the rules grow with the lists**: " + strings.Join(parts, ", ")
	}
	add(goal, m, ptr(ratio <= 1.10 && constant && all.wrongNAT() == 0))
}

// pairedRatios are a's CPU per connection over b's, repetition by
// repetition (measured one right after the other): less exposed to a
// change of the machine's load than the ratio of the medians.
func pairedRatios(a, b *DataPoint) []float64 {
	var out []float64
	for i := range min(len(a.CPU), len(b.CPU)) {
		out = append(out, a.CPU[i]/b.CPU[i])
	}
	return out
}

func selectorsMarkdown(b *strings.Builder, r *Results) {
	w := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	w("## Data plane with every selector (issue 33)\n\n")
	s := r.Selectors
	if s == nil {
		w("Not run.\n\n")
		return
	}
	if r.SelectorsErr != nil {
		w("**Incomplete:** %s\n\n", oneLine(r.SelectorsErr.Error()))
	}
	d := s.Data
	w("As under \"Data plane\" (the same connections, clients and CPU accounting; %d repetitions of %s, in\n"+
		"turn, medians), three configurations side by side: no rules; the agent's table with %s\n"+
		"`nonMasqueradeCIDRs` alone (destination-only); and the same list with every selector in use, each\n"+
		"one passed by the traffic (pod 10.244.1.2 to 203.0.113.10 out of the uplink `eth0`), so that a new\n"+
		"connection goes through every rule of the decision chain:\n"+
		"`nonMasqueradeSourceCIDRs` (%s /29s from 240.0.0.0/4, not the pod's), `masqueradeSourceCIDRs`\n"+
		"(10.244.0.0/16, the pod's), `egressInterfaces` (`eth0`, `ens*`), `cidrMatch: mostSpecific` with\n"+
		"`masqueradeCIDRs` 100.64.0.0/10 around every `nonMasqueradeCIDR` and a /30 inside every tenth\n"+
		"(nesting three deep), and `snatAddress` 192.0.2.5 on the uplink (the server counts a connection\n"+
		"masqueraded only when it comes from that address).\n\n", d.Reps, d.Duration, num(s.N), num(s.N))
	none := d.Find(KindNone, 0)
	w("| node's rules | CIDRs | new connections/s | CPU per connection | ruleset cost | rules (decision + masquerade chain) | source seen | failed |\n")
	w("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |\n")
	for _, p := range d.Points {
		n, rules := "—", "—"
		switch p.Kind {
		case KindAgent:
			n, rules = num(p.N), fmt.Sprintf("%d + %d", s.Dest.Decision, s.Dest.Masq)
		case KindAgentSelectors:
			n = num(p.N)
			for _, x := range s.Rules {
				if x.N == p.N {
					rules = fmt.Sprintf("%d + %d", x.Decision, x.Masq)
				}
			}
		}
		if !p.Measured() {
			w("| %s | %s | not measured | | | %s | | |\n", p.Kind, n, rules)
			continue
		}
		cost := "—"
		if none.Measured() {
			cost = fmt.Sprintf("%+.1f µs", (p.CPUns()-none.CPUns())/1e3)
		}
		w("| %s | %s | %.0f | %.1f µs (%.0f–%.0f) | %s | %s | %s | %d |\n", p.Kind, n, p.Rate(), p.CPUns()/1e3,
			slices.Min(p.CPU)/1e3, slices.Max(p.CPU)/1e3, cost, rules, seenCell(p), p.Errors)
	}
	w("\n")
	var parts []string
	for _, x := range s.Rules {
		parts = append(parts, fmt.Sprintf("%s: %d + %d", num(x.N), x.Decision, x.Masq))
	}
	w("The every-selector table's rules as `nft.Build` makes them, by the size of every list (the nested\n"+
		"`masqueradeCIDRs` excepted, a tenth of it): %s. The rule count in the kernel, read with\n"+
		"`nft -j list table inet %s` in each point's node namespace (all chains: the base chain's one rule too):\n"+
		"every selector %d, destination-only %d. The goal (Targets) compares the medians of CPU per connection;\n"+
		"each repetition's own ratio (the two measured one right after the other) is shown next to it.\n\n",
		strings.Join(parts, "; "), nft.TableName, s.KernelRules[KindAgentSelectors], s.KernelRules[KindAgent])
}
