package agent

import (
	"errors"
	"strings"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
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
//   - Once it has not changed for originalQuiet (twice the resync interval
//     plus originalMargin: the original re-syncs every resyncInterval of the
//     same ConfigMap, plus the time its iptables-restore takes), the rules
//     are removed in one transaction that the kernel refuses if anything
//     changed since they were read, and only if their fingerprint is still
//     the one watched.
//   - Never while the config fails to load: the original skips its rewrite
//     on a bad config too, so a quiet chain then proves nothing.

// originalMargin is added to twice the resync interval: the original's
// period is its resync interval plus the time of its sync.
const originalMargin = 5 * time.Second

// originalState is what the agent knows of the original's rules.
type originalState struct {
	fingerprint string    // "" when there are none
	changed     time.Time // when the fingerprint was first seen, or last seen to change
	checkAt     time.Time // the next look; zero: at the next sync
	running     bool      // "still running" logged
	lastErr     string    // the last error of a look
	removeErr   string    // the last error of a removal
	exemptions  string    // the exemptions last logged
	legacy      string    // the legacy warning last logged
	foreign     bool      // "not the original's, left alone" logged
}

// originalQuiet is how long the original's rules must stay unchanged
// before they are removed.
func (a *Agent) originalQuiet() time.Duration { return 2*a.interval() + originalMargin }

// originalLook is how often the agent looks at the original's rules while
// they are there (a dump of the nat tables' few rules).
func (a *Agent) originalLook() time.Duration { return max(a.interval()/4, time.Second) }

// checkOriginal looks for the original's rules and removes them when the
// original agent is gone.
func (a *Agent) checkOriginal(now time.Time) {
	if a.orig == nil {
		return
	}
	st := &a.original
	st.checkAt = time.Time{}
	chain := a.opts.NFT.Chain
	if chain == "" {
		chain = nft.DefaultChain
	}
	o, err := a.orig.FindOriginal(chain)
	if err != nil {
		if err.Error() != st.lastErr {
			a.log.Warn("cannot look for the original ip-masq-agent's iptables rules", "err", err)
			st.lastErr = err.Error()
		}
		return
	}
	st.lastErr = ""
	a.reportExemptions(o)
	a.reportLegacy(o)
	for _, f := range o.Families {
		a.metrics.LegacyRules(f.MetricFamily(), f.Present())
	}
	if !o.Present() {
		if st.fingerprint != "" {
			a.log.Info("the original ip-masq-agent's iptables rules are gone (removed by someone else)", "chain", chain)
		}
		*st = originalState{exemptions: st.exemptions, legacy: st.legacy}
		return
	}
	fp := o.Fingerprint()
	switch {
	case st.fingerprint == "":
		attrs := []any{"chain", chain}
		for _, f := range o.Families {
			if f.Present() {
				attrs = append(attrs, f.MetricFamily(), f.Summary())
			}
		}
		a.log.Warn("found the original ip-masq-agent's iptables rules: they decide before this agent's table until they are removed; "+
			"they are removed once the original agent is gone (its chain unchanged for "+a.originalQuiet().String()+")", attrs...)
		st.changed = now
	case fp != st.fingerprint:
		st.changed = now
		if !st.running {
			a.log.Info("the original ip-masq-agent still runs (it rewrote its chain); leaving its rules alone until it stops", "chain", chain)
			st.running = true
		}
	}
	st.fingerprint = fp
	for _, f := range o.Families {
		if f.Present() && !f.Recognised() {
			if !st.foreign {
				a.log.Warn("chain "+chain+" in table "+f.Table()+" is not the original ip-masq-agent's (no rule carries its comments); "+
					"left alone: remove it with ip-masq-agent cleanup-iptables if it is", "found", f.Summary())
				st.foreign = true
			}
			return
		}
	}
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
	removed, err := a.orig.RemoveOriginal(chain, fp)
	switch {
	case errors.Is(err, nft.ErrOriginalChanged):
		st.fingerprint, st.changed = removed.Fingerprint(), now
		st.checkAt = now.Add(a.originalQuiet())
		a.log.Info("the original ip-masq-agent's rules changed just before their removal; leaving them alone", "chain", chain)
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
				a.metrics.LegacyRules(f.MetricFamily(), false)
			}
		}
		a.log.Info("removed the original ip-masq-agent's iptables rules: unchanged for "+now.Sub(st.changed).Round(time.Second).String()+", the original agent is gone",
			"chain", chain, "removed", strings.Join(what, " | "))
		*st = originalState{exemptions: st.exemptions, legacy: st.legacy}
	}
}

// reportExemptions warns, once until they change, about rules in iptables'
// nat POSTROUTING that accept or return before the original's jump.
func (a *Agent) reportExemptions(o nft.Original) {
	var rules []string
	for _, f := range o.Families {
		for _, r := range f.Exemptions {
			rules = append(rules, "table "+f.Table()+" POSTROUTING: "+r.Text+" ("+r.Verdict+")")
		}
	}
	s := strings.Join(rules, " | ")
	if s == a.original.exemptions {
		return
	}
	a.original.exemptions = s
	if s == "" {
		return
	}
	a.log.Warn("rules in iptables nat POSTROUTING exempt traffic from masquerade before the original agent's jump; "+
		"this agent's table runs after them and masquerades that traffic anyway: carry their destinations into nonMasqueradeCIDRs "+
		"(README: Foreign exemptions)", "rules", s)
}

// reportLegacy warns, once, that a legacy (x_tables) nat table exists:
// an original agent run with iptables-legacy wrote its rules there.
func (a *Agent) reportLegacy(o nft.Original) {
	var cmds []string
	for _, tool := range o.Legacy {
		cmds = append(cmds, nft.LegacyCommands(o.Chain, tool)...)
	}
	s := strings.Join(cmds, "; ")
	if s == a.original.legacy {
		return
	}
	a.original.legacy = s
	if s == "" {
		return
	}
	a.log.Warn("a legacy iptables nat table exists in the node's network namespace ("+strings.Join(o.Legacy, ", ")+
		"-legacy): rules there cannot be seen over nftables and are not removed by this agent; "+
		"if the original agent ran with iptables-legacy, remove its rules on the node with these commands", "commands", s)
}
