package agent

import (
	"strings"
	"testing"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/original"
)

var addonList = []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "192.0.0.0/24", "192.0.2.0/24",
	"192.88.99.0/24", "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "240.0.0.0/4"}

const switchWarning = "the switch from the original ip-masq-agent changes the masquerade decision"

// The addon's original (--nomasq-all-reserved-ranges, no ConfigMap) and
// this agent without the flag: one WARN naming the ranges and the flag,
// the metric counts them; not again at the original's rewrites; a config
// that carries the ranges over clears both, and a new difference warns
// anew.
func TestOriginalDecisionDifferences(t *testing.T) {
	h := newHarness(t, nil)
	h.write("resyncInterval: 10s\n")
	h.orig.SetOriginal(original.Written{Chain: original.AddonChain, NonMasq: addonList}.Rules())
	h.sync(at(0))
	logs := h.logs.String()
	if n := strings.Count(logs, switchWarning); n != 1 || !strings.Contains(logs, `"ipv4 100.64.0.0/10"="original: not masqueraded, this agent: masquerade; to keep the original's decision: --nomasq-all-reserved-ranges (the original ran with it)"`) {
		t.Fatalf("%d warnings; log:\n%s", n, logs)
	}
	if got := h.metric(`ip_masq_agent_original_decision_differences{family="ipv4"}`); !strings.HasSuffix(got, " 8") {
		t.Errorf("metric %q, want 8", got)
	}
	if got := h.metric(`ip_masq_agent_original_decision_differences{family="ipv6"}`); !strings.HasSuffix(got, " 0") {
		t.Errorf("metric ipv6 %q, want 0", got)
	}
	for i := 1; i <= 3; i++ {
		h.orig.RewriteOriginal()
		h.a.Tick(at(time.Duration(i) * 10 * time.Second))
	}
	if n := strings.Count(h.logs.String(), switchWarning); n != 1 {
		t.Errorf("%d warnings after unchanged rewrites, want 1", n)
	}
	h.write("resyncInterval: 10s\nnonMasqueradeCIDRs: [" + strings.Join(addonList, ", ") + "]\n")
	h.sync(at(35 * time.Second))
	if got := h.metric(`ip_masq_agent_original_decision_differences{family="ipv4"}`); !strings.HasSuffix(got, " 0") {
		t.Errorf("metric with the ranges carried over %q, want 0", got)
	}
	if !strings.Contains(h.logs.String(), "no longer changes any masquerade decision") {
		t.Errorf("no word that the differences are gone; log:\n%s", h.logs)
	}
	h.write("resyncInterval: 10s\nnonMasqueradeCIDRs: [" + strings.Join(addonList[:10], ", ") + "]\n")
	h.sync(at(40 * time.Second))
	if n := strings.Count(h.logs.String(), switchWarning); n != 2 || !strings.Contains(h.logs.String(), `"ipv4 240.0.0.0/4"="original: not masqueraded, this agent: masquerade; to keep the original's decision: nonMasqueradeCIDRs: add 240.0.0.0/4"`) {
		t.Errorf("%d warnings, want 2; log:\n%s", n, h.logs)
	}
	if got := h.metric(`ip_masq_agent_original_decision_differences{family="ipv4"}`); !strings.HasSuffix(got, " 1") {
		t.Errorf("metric %q, want 1", got)
	}
}

// With the flags carried over, nothing is said.
func TestOriginalSameDecisions(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Flags.NoMasqAllReservedRanges = true })
	h.write("resyncInterval: 10s\n")
	h.orig.SetOriginal(original.Written{Chain: original.AddonChain, NonMasq: addonList}.Rules())
	h.sync(at(0))
	if strings.Contains(h.logs.String(), switchWarning) || strings.Contains(h.logs.String(), "rules stay") {
		t.Errorf("log:\n%s", h.logs)
	}
	if got := h.metric(`ip_masq_agent_original_decision_differences{family="ipv4"}`); !strings.HasSuffix(got, " 0") {
		t.Errorf("metric %q, want 0", got)
	}
}

// Without --enable-ipv6 the original's IPv6 rules stay: said once, with
// both ways out; only IPv4's are removed once the original is gone, and
// nothing more is tried. With --enable-ipv6 both go.
func TestOriginalFamilyKept(t *testing.T) {
	h := newHarness(t, nil)
	h.write("resyncInterval: 1s\n")
	h.orig.SetOriginal(original.Written{EnableIPv6: true, NonMasq: []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"}}.Rules())
	h.sync(at(0))
	for i := 1; i <= 20; i++ {
		h.a.Tick(at(time.Duration(i) * time.Second))
	}
	o, _ := h.orig.FindOriginal("")
	if o.Removes(4) || !o.Removes(6) || h.orig.Removals() != 1 {
		t.Fatalf("ipv4 left %v, ipv6 left %v, %d removals; log:\n%s", o.Removes(4), o.Removes(6), h.orig.Removals(), h.logs)
	}
	logs := h.logs.String()
	if n := strings.Count(logs, "the original ip-masq-agent's ipv6 rules stay in table ip6 nat"); n != 1 ||
		!strings.Contains(logs, "run this agent with --enable-ipv6, or remove them deliberately with ip-masq-agent cleanup-iptables --family ipv6") {
		t.Errorf("%d kept messages, want 1; log:\n%s", n, logs)
	}
	if strings.Contains(logs, switchWarning) || strings.Count(logs, "found the original ip-masq-agent's iptables rules") != 1 {
		t.Errorf("log:\n%s", logs)
	}
	for fam, want := range map[string]string{"ipv4": " 0", "ipv6": " 1"} {
		if got := h.metric(`ip_masq_agent_legacy_rules{family="` + fam + `"}`); !strings.HasSuffix(got, want) {
			t.Errorf("legacy_rules %s: %q", fam, got)
		}
	}

	h6 := newHarness(t, func(o *Options) { o.NFT.EnableIPv6, o.Flags.EnableIPv6 = true, true })
	h6.write("resyncInterval: 1s\nnonMasqueradeCIDRs: [10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16]\n")
	h6.orig.SetOriginal(original.Written{EnableIPv6: true, NonMasq: []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"}}.Rules())
	h6.sync(at(0))
	h6.a.Tick(at(10 * time.Second))
	if o, _ := h6.orig.FindOriginal(""); o.Present() || strings.Contains(h6.logs.String(), "rules stay") || strings.Contains(h6.logs.String(), switchWarning) {
		t.Errorf("with --enable-ipv6: present %v; log:\n%s", o.Present(), h6.logs)
	}
}

var _ = nft.DefaultChain

// A hand edit the comparison cannot follow (a RETURN on the address's
// second byte: 8.113.0.1 is returned by the original and masqueraded by
// this agent) is never "no change": the WARN says the comparison is
// inexact even when it found no range.
func TestOriginalInexactSaid(t *testing.T) {
	h := newHarness(t, nil)
	h.write("resyncInterval: 10s\n")
	h.orig.SetOriginal(original.Written{NonMasq: []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"}, HandEdited: true}.Rules())
	h.sync(at(0))
	logs := h.logs.String()
	if !strings.Contains(logs, switchWarning) || !strings.Contains(logs, "inexact") {
		t.Errorf("no WARN that the comparison is inexact; log:\n%s", logs)
	}
}

// The source ports the switch changes are said (original.Comparison.Notes
// in the WARN): a comparison with only them is not "no change".
func TestPrintComparisonNotesKey(t *testing.T) {
	c := original.Comparison{Found: true, Notes: []string{"ipv4 masquerade source ports: ..."}}
	if c.Key() == "" {
		t.Error("notes only: an empty key (no WARN)")
	}
}

// A switch that changes no range but the masquerade's source ports (the
// original ran --random-fully, this agent without it), or whose ranges are
// not known (a hand-edited rule), reads 0 ranges: the other-changes metric
// says it, so the alert fires.
func TestOriginalSwitchOtherChanges(t *testing.T) {
	h := newHarness(t, func(o *Options) {
		o.Flags.NoMasqAllReservedRanges = true
		o.NFT.RandomFully = false
	})
	h.write("resyncInterval: 10s\n")
	h.orig.SetOriginal(original.Written{Chain: original.AddonChain, NonMasq: addonList, RandomFully: true}.Rules())
	h.sync(at(0))
	if got := h.metric(`ip_masq_agent_original_decision_differences{family="ipv4"}`); !strings.HasSuffix(got, " 0") {
		t.Errorf("ranges %q, want 0", got)
	}
	if got := h.metric(`ip_masq_agent_original_switch_other_changes{family="ipv4"}`); !strings.HasSuffix(got, " 1") {
		t.Errorf("other changes %q, want 1 (--random-fully); log:\n%s", got, h.logs)
	}
	if got := h.metric(`ip_masq_agent_original_switch_other_changes{family="ipv6"}`); !strings.HasSuffix(got, " 0") {
		t.Errorf("other changes ipv6 %q, want 0", got)
	}
	h2 := newHarness(t, func(o *Options) { o.Flags.NoMasqAllReservedRanges = true })
	h2.write("resyncInterval: 10s\n")
	h2.orig.SetOriginal(original.Written{Chain: original.AddonChain, NonMasq: addonList, HandEdited: true}.Rules())
	h2.sync(at(0))
	if got := h2.metric(`ip_masq_agent_original_switch_other_changes{family="ipv4"}`); !strings.HasSuffix(got, " 1") {
		t.Errorf("other changes with a hand-edited rule %q, want 1 (inexact); log:\n%s", got, h2.logs)
	}
}
