package nft

import (
	"fmt"
	"net/netip"
	"slices"
)

// DiffTable returns what Apply would change to turn the kernel's table got
// (from Read) into want, one line per change; nil when they are the same:
//
//   - nonmasq-v4 10.1.0.0/16           an element to add
//   - nonmasq-v4 10.0.0.0/8            an element to remove
//   - set masq-v6 / - set foo          a set to create / to delete
//     ~ set masq-v4: comment "x", want "y"
//   - chain X / - chain foo            a chain to create / to delete
//     ~ chain postrouting: type filter hook ..., want type nat hook ...
//     ~ chain IP-MASQ-AGENT rules differ
//   - RULE                         a rule the kernel has and want has not
//   - RULE                         a rule want has and the kernel has not
//
// Rules are compared by their nft text (RenderRule, counters left out);
// rules that the agent did not write show as close to nft's syntax as the
// expressions allow. Sets' comments are not compared: Read cannot read
// them, and Apply never changes them.
func DiffTable(want Ruleset, got *Table) []string {
	var out []string
	for _, w := range want.Sets {
		g := got.Set(w.Name)
		if g == nil {
			out = append(out, "+ set "+w.Name)
			for _, p := range w.Prefixes {
				out = append(out, fmt.Sprintf("+ %s %s", w.Name, p))
			}
			continue
		}
		if g.Family != w.Family {
			out = append(out, fmt.Sprintf("~ set %s: IPv%d addresses, want IPv%d", w.Name, g.Family, w.Family))
		}
		removed, added := diffPrefixes(sortedPrefixes(g.Prefixes), w.Prefixes)
		for _, p := range removed {
			out = append(out, fmt.Sprintf("- %s %s", w.Name, p))
		}
		for _, p := range added {
			out = append(out, fmt.Sprintf("+ %s %s", w.Name, p))
		}
	}
	for _, g := range got.Sets {
		if !slices.ContainsFunc(want.Sets, func(s Set) bool { return s.Name == g.Name }) {
			out = append(out, "- set "+g.Name)
		}
	}
	hook := fmt.Sprintf("type nat hook postrouting priority srcnat + %d; policy accept;", Priority-100)
	wantChains := []wantChain{{BaseChainName, hook, want.Base}, {want.Chain, "", want.Rules}, {MasqChainName, "", want.Masq}}
	for _, w := range wantChains {
		var wantText []string
		for _, r := range w.rules {
			wantText = append(wantText, RenderRule(r))
		}
		g := got.Chain(w.name)
		if g == nil {
			out = append(out, "+ chain "+w.name)
			for _, t := range wantText {
				out = append(out, "    + "+t)
			}
			continue
		}
		if g.Hook != w.hook {
			out = append(out, fmt.Sprintf("~ chain %s: %s, want %s", w.name, orRegular(g.Hook), orRegular(w.hook)))
		}
		var gotText []string
		for _, r := range g.Rules {
			gotText = append(gotText, r.Text)
		}
		if slices.Equal(gotText, wantText) {
			continue
		}
		out = append(out, fmt.Sprintf("~ chain %s rules differ", w.name))
		extra, missing := diffMultiset(gotText, wantText)
		for _, t := range extra {
			out = append(out, "    - "+t)
		}
		for _, t := range missing {
			out = append(out, "    + "+t)
		}
		if len(extra) == 0 && len(missing) == 0 {
			out = append(out, "    (the same rules in another order)")
		}
	}
	for _, g := range got.Chains {
		if !slices.ContainsFunc(wantChains, func(w wantChain) bool { return w.name == g.Name }) {
			out = append(out, "- chain "+g.Name)
		}
	}
	return out
}

type wantChain struct {
	name, hook string
	rules      []Rule
}

func orRegular(hook string) string {
	if hook == "" {
		return "a regular chain"
	}
	return hook
}

func sortedPrefixes(ps []netip.Prefix) []netip.Prefix {
	ps = slices.Clone(ps)
	slices.SortFunc(ps, comparePrefix)
	return ps
}

// diffMultiset returns the items of got not in want and of want not in
// got, counting repeats, each in its list's order.
func diffMultiset(got, want []string) (extra, missing []string) {
	count := make(map[string]int)
	for _, s := range want {
		count[s]++
	}
	for _, s := range got {
		if count[s] > 0 {
			count[s]--
		} else {
			extra = append(extra, s)
		}
	}
	for _, s := range want {
		if count[s] > 0 {
			count[s]--
			missing = append(missing, s)
		}
	}
	return extra, missing
}
