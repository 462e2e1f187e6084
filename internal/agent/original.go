package agent

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/original"
)

// The original (iptables) ip-masq-agent never removes its rules, and while
// they are there they decide first: iptables' nat POSTROUTING runs at
// priority srcnat, this agent's chain at srcnat + 10. The agent finds them
// at start and at every sync, reports them, and removes them once the
// original agent is gone, without ever fighting one that still runs:
//
//   - The original rewrites its chain whole (iptables-restore --noflush) at
//     every resync, which gives its rules new handles: the handles are a
//     fingerprint.
//   - While the fingerprint changes, the original runs: nothing is removed.
//   - Once it has not changed for originalQuiet (twice the longest resync
//     interval in force since the original's last rewrite, plus
//     originalMargin: the original sleeps the interval of the config it
//     read at its last rewrite, then re-syncs, which takes a while), the
//     rules are removed in one transaction that the kernel refuses if
//     anything changed since they were read, and only if their fingerprint
//     is still the one watched.
//   - Never while the config fails to load: the original skips its rewrite
//     on a bad config too, so a quiet chain then proves nothing.
//
// The rules are found by what they are (nft.FindOriginal): the chain's
// name is whatever the original's --masq-chain said, and need not be this
// agent's. A chain of a well-known name that holds something else is
// reported and left alone.
//
// Only the families this agent programs are taken over and removed: the
// original's IPv6 rules stay while this agent runs without --enable-ipv6
// (removing them would stop masquerading that traffic, silently). What
// the switch changes of the rest is computed exactly (original.Compare)
// and said: a WARN at every change, and a gauge.
//
// "In force" counts every interval the agent had within configPropagation
// before the rewrite was seen: the kubelet updates each pod's ConfigMap
// volume in its own time, so the original may have read a config that
// this agent had already replaced (a shortened resyncInterval), or not
// yet received.

// originalMargin is added to twice the resync interval: the original's
// period is its resync interval plus the time of its sync.
const originalMargin = 5 * time.Second

// configPropagation bounds how much later (or earlier) than this agent
// the original sees a change of the shared ConfigMap: the kubelet's sync
// period (1 min) plus its ConfigMap cache's TTL (1 min).
const configPropagation = 2 * time.Minute

// originalState is what the agent knows of the original's rules.
type originalState struct {
	fingerprint string    // "" when there are none
	changed     time.Time // when the fingerprint was first seen, or last seen to change
	checkAt     time.Time // the next look; zero: at the next sync
	running     bool      // "still running" logged
	lastErr     string    // the last error of a look
	removeErr   string    // the last error of a removal
	chains      string    // the chains last logged as found
	reported    reported
	// The last comparison (compareOriginal): of these rules and config.
	compared   bool
	compareKey string
	compareCfg config.Config
	// intervals are the resync intervals in force at each look within
	// configPropagation before changed, and since; longest is the
	// longest of those since changed - configPropagation.
	intervals []seenInterval
	longest   time.Duration
}

// reported is what was last logged, each reported once until it changes.
type reported struct {
	exemptions  string // the exemptions
	legacy      string // the legacy warning
	foreign     string // the foreign chains
	kept        string // the families kept
	differences string // the decisions the switch changes
}

// seenInterval is the resync interval in force at a look.
type seenInterval struct {
	at time.Time
	d  time.Duration
}

// originalQuiet is how long the original's rules must stay unchanged
// before they are removed: twice the longest interval in force since the
// original's last rewrite (and now), plus the margin.
func (a *Agent) originalQuiet() time.Duration {
	return 2*max(a.original.longest, a.interval()) + originalMargin
}

// noteInterval records the interval in force at a look, and keeps longest
// the longest one since changed - configPropagation.
func (st *originalState) noteInterval(now time.Time, d time.Duration) {
	st.intervals = append(st.intervals, seenInterval{now, d})
	from := st.changed.Add(-configPropagation)
	// Keep the last look before from too: its interval was in force at from.
	i := 0
	for i+1 < len(st.intervals) && !st.intervals[i+1].at.After(from) {
		i++
	}
	st.intervals = st.intervals[i:]
	st.longest = 0
	for _, x := range st.intervals {
		st.longest = max(st.longest, x.d)
	}
}

// originalLook is how often the agent looks at the original's rules while
// they are there (a dump of the nat tables' few rules).
func (a *Agent) originalLook() time.Duration { return max(a.interval()/4, time.Second) }

// checkOriginal looks for the original's rules, compares their decisions
// with this agent's, and removes those it takes over when the original
// agent is gone.
func (a *Agent) checkOriginal(now time.Time) {
	if a.opts.Original == nil {
		return
	}
	st := &a.original
	st.checkAt = time.Time{}
	// Found by what they are, whatever the chain's name.
	found, err := a.opts.Original.FindOriginal("")
	if err != nil {
		if err.Error() != st.lastErr {
			a.log.Warn("cannot look for the original ip-masq-agent's iptables rules", "err", err)
			st.lastErr = err.Error()
		}
		return
	}
	st.lastErr = ""
	a.reportExemptions(found)
	a.reportLegacy(found)
	a.reportForeign(found)
	a.reportKept(found)
	a.compareOriginal(found)
	for _, fam := range []nft.Family{4, 6} {
		a.metrics.LegacyRules(original.Family{Family: fam}.MetricFamily(), found.Removes(fam))
	}
	// Only the families this agent programs are taken over: the others
	// keep the original's rules (reportKept).
	o := found.TakenOver(a.opts.NFT)
	fp := o.Fingerprint()
	if fp == "" {
		if st.fingerprint != "" {
			a.log.Info("the original ip-masq-agent's iptables rules are gone (removed by someone else)", "chain", st.chains)
		}
		st.reset()
		return
	}
	chains := strings.Join(o.RemovableChains(), ",")
	switch {
	case st.fingerprint == "":
		var attrs []any
		for _, f := range o.Families {
			if o.Removable(f) {
				attrs = append(attrs, f.MetricFamily()+" "+f.Chain, f.Summary())
			}
		}
		a.log.Warn("found the original ip-masq-agent's iptables rules: they decide before this agent's table until they are removed; "+
			"they are removed once the original agent is gone (its chains unchanged for "+a.originalQuiet().String()+")",
			append([]any{"chain", chains, "original --masq-chain", originalMasqChain(o)}, attrs...)...)
		st.changed = now
	case fp != st.fingerprint:
		st.changed = now
		if chains != st.chains {
			a.log.Info("the original ip-masq-agent's chains changed", "chain", chains, "original --masq-chain", originalMasqChain(o))
		}
		if !st.running {
			a.log.Info("the original ip-masq-agent still runs (it rewrote its chain); leaving its rules alone until it stops", "chain", chains)
			st.running = true
		}
	}
	st.fingerprint, st.chains = fp, chains
	st.noteInterval(now, a.interval())
	deadline := st.changed.Add(a.originalQuiet())
	if now.Before(deadline) {
		// Look again before the deadline too: the original's last
		// rewrite is then seen at most a quarter interval late.
		st.checkAt = deadline
		if look := now.Add(a.originalLook()); look.Before(deadline) {
			st.checkAt = look
		}
		return
	}
	if a.configBad {
		st.checkAt = now.Add(a.interval())
		return
	}
	removed, err := a.opts.Original.RemoveOriginal("", fp, a.programmed()...)
	switch {
	case errors.Is(err, original.ErrChanged):
		st.fingerprint, st.changed = removed.Fingerprint(), now
		st.checkAt = now.Add(a.originalQuiet())
		a.log.Info("the original ip-masq-agent's rules changed just before their removal; leaving them alone", "chain", chains)
	case err != nil:
		if err.Error() != st.removeErr {
			a.log.Error("cannot remove the original ip-masq-agent's iptables rules; trying again at the next resync", "err", Hint(err))
			st.removeErr = err.Error()
		}
	default:
		var what []string
		for _, f := range removed.Families {
			if f.Present() {
				what = append(what, f.Summary())
			}
			a.metrics.LegacyRules(f.MetricFamily(), false)
		}
		a.log.Info("removed the original ip-masq-agent's iptables rules: unchanged for "+now.Sub(st.changed).Round(time.Second).String()+", the original agent is gone",
			"chain", chains, "removed", strings.Join(what, " | "))
		st.reset()
		// What is left decides alike, or is what this agent does not take over.
		a.compareOriginal(original.Rules{})
	}
}

// reset forgets the original's rules, not what was reported.
func (st *originalState) reset() {
	*st = originalState{reported: st.reported}
}

// programmed are the families this agent programs.
func (a *Agent) programmed() []nft.Family {
	if a.opts.NFT.EnableIPv6 {
		return []nft.Family{4, 6}
	}
	return []nft.Family{4}
}

// compareOriginal computes which destinations the switch from the
// original's rules found changes (original.Compare), sets the metric and
// warns at the first such comparison and at every change of them.
func (a *Agent) compareOriginal(o original.Rules) {
	if a.cfg == nil {
		return // nothing applied yet: nothing to compare with
	}
	st := &a.original
	key := rulesKey(o)
	if st.compared && key == st.compareKey && a.cfg.Equal(st.compareCfg) {
		return
	}
	c := original.Compare(o, *a.cfg, a.opts.Flags, a.opts.NFT)
	st.compared, st.compareKey, st.compareCfg = true, key, *a.cfg
	for _, fam := range []nft.Family{4, 6} {
		a.metrics.OriginalDecisionDifferences(original.Family{Family: fam}.MetricFamily(), c.Count(fam))
		a.metrics.OriginalSwitchOtherChanges(original.Family{Family: fam}.MetricFamily(), c.Others(fam))
	}
	last := st.reported.differences
	if !news(&st.reported.differences, c.Key()) {
		if last != "" && c.Key() == "" && c.Found {
			a.log.Info("the switch from the original ip-masq-agent no longer changes any masquerade decision")
		}
		return
	}
	attrs := []any{"ranges", len(c.Differences), "ipv4", c.Count(4), "ipv6", c.Count(6)}
	for i, d := range c.Differences {
		if i == maxLoggedDifferences {
			attrs = append(attrs, "more", fmt.Sprintf("%d more ranges (ip-masq-agent diff --decisions lists them all)", len(c.Differences)-i))
			break
		}
		v := fmt.Sprintf("original: %s, this agent: %s", d.Original, d.Agent)
		if d.Fix != "" {
			v += "; to keep the original's decision: " + d.Fix
		}
		attrs = append(attrs, d.FamilyName()+" "+d.RangeString(), v)
	}
	for i, n := range c.Notes {
		attrs = append(attrs, fmt.Sprintf("ports%d", i+1), n)
	}
	if c.Inexact {
		attrs = append(attrs, "inexact", "a rule of the original's compares the destination in a way not followed here: ranges may be missing")
	}
	a.log.Warn("the switch from the original ip-masq-agent changes the masquerade decision for these destinations "+
		"(where this agent masquerades what the original's rules return, already now: its table runs after them; the rest once they are removed)", attrs...)
}

// maxLoggedDifferences bounds the ranges named in one log line.
const maxLoggedDifferences = 10

// rulesKey is what the comparison depends on of the original's rules:
// their text, not their handles (which every rewrite changes).
func rulesKey(o original.Rules) string {
	var b strings.Builder
	for _, f := range o.Families {
		fmt.Fprintf(&b, "%d %s %v;", f.Family, f.Chain, o.Removable(f))
		for _, rs := range [][]original.XTRule{f.Exemptions, f.Jumps, f.Rules} {
			for _, r := range rs {
				b.WriteString(r.Text + ";")
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// reportKept says, once until they change, that the original's rules of
// a family this agent does not program stay: removing them would stop
// masquerading that family's traffic, which this agent does not take over.
func (a *Agent) reportKept(o original.Rules) {
	kept := o.KeptFamilies(a.opts.NFT)
	var w []string
	for _, f := range kept {
		w = append(w, f.Summary())
	}
	if !news(&a.original.reported.kept, strings.Join(w, " | ")) {
		return
	}
	for _, f := range kept {
		fam := "--family " + f.MetricFamily()
		a.log.Warn("the original ip-masq-agent's "+f.MetricFamily()+" rules stay in table "+f.Table()+": this agent does not program "+f.MetricFamily()+
			" (no --enable-ipv6), and removing them would stop masquerading that traffic; to take it over run this agent with --enable-ipv6, "+
			"or remove them deliberately with ip-masq-agent cleanup-iptables "+fam, "found", f.Summary())
	}
}

// originalMasqChain says which --masq-chain the original agent ran with:
// its chains' names, and the name its jump's comment gives when that
// differs.
func originalMasqChain(o original.Rules) string {
	var w []string
	for _, f := range o.Families {
		if !o.Removable(f) {
			continue
		}
		s := f.Chain
		if f.CommentChain != "" && f.CommentChain != f.Chain {
			s += " (its jump's comment names " + f.CommentChain + ")"
		}
		if !slices.Contains(w, s) {
			w = append(w, s)
		}
	}
	return strings.Join(w, ", ")
}

// reportForeign warns, once until they change, about chains of the
// original's well-known names that are not the original's.
func (a *Agent) reportForeign(o original.Rules) {
	var found []string
	for _, f := range o.Foreign() {
		found = append(found, f.Summary())
	}
	s := strings.Join(found, " | ")
	if !news(&a.original.reported.foreign, s) {
		return
	}
	a.log.Warn("a chain of the original ip-masq-agent's name is not the original ip-masq-agent's (no rule carries its comments); "+
		"left alone: remove it with ip-masq-agent cleanup-iptables --masq-chain NAME if it is", "found", s)
}

// reportExemptions warns, once until they change, about rules in iptables'
// nat POSTROUTING that accept or return before the original's jump.
func (a *Agent) reportExemptions(o original.Rules) {
	var rules []string
	for _, f := range o.Families {
		for _, r := range f.Exemptions {
			rules = append(rules, "table "+f.Table()+" POSTROUTING: "+r.Text+" ("+r.Verdict+")")
		}
	}
	s := strings.Join(rules, " | ")
	if !news(&a.original.reported.exemptions, s) {
		return
	}
	a.log.Warn("rules in iptables nat POSTROUTING exempt traffic from masquerade before the original agent's jump; "+
		"this agent's table runs after them and masquerades that traffic anyway: carry their destinations into nonMasqueradeCIDRs "+
		"(README: Foreign exemptions)", "rules", s)
}

// reportLegacy warns, once, that a legacy (x_tables) nat table exists:
// an original agent run with iptables-legacy wrote its rules there.
func (a *Agent) reportLegacy(o original.Rules) {
	// Rules there cannot be seen: name the chain this agent was given
	// (the operator copies the original's --masq-chain).
	chain := a.opts.NFT.Chain
	if chain == "" {
		chain = nft.DefaultChain
	}
	var cmds []string
	for _, tool := range o.Legacy {
		cmds = append(cmds, original.LegacyCommands(chain, tool)...)
	}
	s := strings.Join(cmds, "; ")
	if !news(&a.original.reported.legacy, s) {
		return
	}
	a.log.Warn("a legacy iptables nat table exists in the node's network namespace ("+strings.Join(o.Legacy, ", ")+
		"-legacy): rules there cannot be seen over nftables and are not removed by this agent; "+
		"if the original agent ran with iptables-legacy, remove its rules on the node with these commands", "commands", s)
}

// news records s in *last and reports whether it is news: not empty and
// not what was reported last, so that each warning is logged once until
// what it is about changes.
func news(last *string, s string) bool {
	if s == *last {
		return false
	}
	*last = s
	return s != ""
}
