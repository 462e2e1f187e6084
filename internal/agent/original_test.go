package agent

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/original"
)

// originalRules is what the original agent leaves in table ip nat with
// --masq-chain chain (the fake's view of it).
func originalRules(chain string, exemptions ...original.XTRule) original.Rules {
	return original.Rules{Chain: chain, Families: []original.Family{{
		Family: 4, Chain: chain, ChainPresent: true, ChainHandle: 1,
		Jumps: []original.XTRule{{Handle: 3, Verdict: "jump " + chain, Comment: original.JumpComment(chain),
			Text: `-m comment --comment "` + original.JumpComment(chain) + `" -m addrtype ! --dst-type LOCAL counter jump ` + chain}},
		Rules: []original.XTRule{
			{Handle: 4, Verdict: "return", Comment: "ip-masq-agent: local traffic is not subject to MASQUERADE", Text: "ip daddr 10.0.0.0/8 return"},
			{Handle: 5, Verdict: "masquerade", Comment: "ip-masq-agent: outbound traffic is subject to MASQUERADE (must be last in chain)", Text: "-j MASQUERADE"},
		},
		Exemptions: exemptions,
	}, {Family: 6, Chain: chain}}}
}

func (h *harness) originalPresent() bool {
	o, err := h.orig.FindOriginal(h.a.opts.NFT.Chain)
	if err != nil {
		h.t.Fatal(err)
	}
	return o.Present()
}

// TestOriginalRemovedOnceQuiet: a running original (its chain rewritten at
// every resync) is reported and left alone; once it stops, its rules are
// removed after twice the resync interval plus the margin, at the check
// the agent schedules (not at the next resync), and the gauge follows.
func TestOriginalRemovedOnceQuiet(t *testing.T) {
	h := newHarness(t, nil)
	h.write("resyncInterval: 10s\n")
	h.orig.SetOriginal(originalRules(nft.DefaultChain))
	h.sync(at(0))
	if got := h.metric(`ip_masq_agent_legacy_rules{family="ipv4"}`); !strings.HasSuffix(got, " 1") {
		t.Errorf("gauge: %q, want 1", got)
	}
	if got := h.metric(`ip_masq_agent_legacy_rules{family="ipv6"}`); !strings.HasSuffix(got, " 0") {
		t.Errorf("gauge ipv6: %q, want 0", got)
	}
	quiet := h.a.originalQuiet()
	if quiet != 25*time.Second {
		t.Fatalf("quiet = %s, want 2 × 10s + 5s", quiet)
	}
	// The original rewrites its chain every 10s for a minute: never removed.
	for i := 1; i <= 6; i++ {
		h.orig.RewriteOriginal()
		h.a.Tick(at(time.Duration(i) * 10 * time.Second))
		if !h.originalPresent() {
			t.Fatalf("removed while the original still ran (t=%ds)", i*10)
		}
	}
	// It stops at t=60s. Checks before the deadline leave the rules.
	h.a.Tick(at(70 * time.Second))
	h.a.Tick(at(80 * time.Second))
	if !h.originalPresent() {
		t.Fatal("removed before the quiet period ended")
	}
	// The next look: a quarter interval on (82.5s), before the deadline (85s).
	if want := at(80*time.Second + h.a.originalLook()); !h.a.original.checkAt.Equal(want) || h.a.originalLook() != 2500*time.Millisecond {
		t.Errorf("check scheduled at %s, want %s", h.a.original.checkAt, want)
	}
	h.a.Tick(at(80*time.Second + h.a.originalLook()))
	if !h.originalPresent() || !h.a.original.checkAt.Equal(at(60*time.Second+quiet)) {
		t.Fatalf("the look before the deadline: present %v, next look %s, want the deadline", h.originalPresent(), h.a.original.checkAt)
	}
	h.a.Tick(at(60*time.Second + quiet))
	if h.originalPresent() {
		t.Fatalf("not removed at the end of the quiet period; log:\n%s", h.logs)
	}
	if got := h.metric(`ip_masq_agent_legacy_rules{family="ipv4"}`); !strings.HasSuffix(got, " 0") {
		t.Errorf("gauge after removal: %q, want 0", got)
	}
	logs := h.logs.String()
	for _, want := range []string{"found the original ip-masq-agent's iptables rules", "the original ip-masq-agent still runs", "removed the original ip-masq-agent's iptables rules"} {
		if n := strings.Count(logs, want); n != 1 {
			t.Errorf("%d lines with %q, want 1; log:\n%s", n, want, logs)
		}
	}
	if h.orig.Removals() != 1 {
		t.Errorf("%d removals, want 1", h.orig.Removals())
	}
	// Gone stays gone, quietly.
	h.sync(at(200 * time.Second))
	if strings.Count(h.logs.String(), "are gone") != 0 {
		t.Errorf("a removal by the agent logged as done by someone else")
	}
}

// TestOriginalCustomChain: --masq-chain names the chain looked for.
func TestOriginalCustomChain(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.NFT.Chain = "IP-MASQ" })
	h.write("resyncInterval: 1s\n")
	h.orig.SetOriginal(originalRules("IP-MASQ"))
	h.sync(at(0))
	if !strings.Contains(h.logs.String(), "chain IP-MASQ (2 rules)") {
		t.Errorf("the custom chain was not reported; log:\n%s", h.logs)
	}
	h.a.Tick(at(7 * time.Second))
	if h.originalPresent() {
		t.Error("the custom chain was not removed")
	}

	// An agent with the default --masq-chain finds it too, by what it
	// is, says which --masq-chain the original used, and removes it.
	h2 := newHarness(t, nil)
	h2.write("resyncInterval: 1s\n")
	h2.orig.SetOriginal(originalRules("IP-MASQ"))
	h2.sync(at(0))
	if !strings.Contains(h2.logs.String(), `found the original`) || !strings.Contains(h2.logs.String(), `chain=IP-MASQ "original --masq-chain"=IP-MASQ`) {
		t.Errorf("a chain of another name was not reported with its name; log:\n%s", h2.logs)
	}
	if got := h2.metric(`ip_masq_agent_legacy_rules{family="ipv4"}`); !strings.HasSuffix(got, " 1") {
		t.Errorf("gauge: %q, want 1", got)
	}
	h2.a.Tick(at(7 * time.Second))
	if h2.originalPresent() {
		t.Error("the chain of another name was not removed")
	}
	if got := h2.metric(`ip_masq_agent_legacy_rules{family="ipv4"}`); !strings.HasSuffix(got, " 0") {
		t.Errorf("gauge after removal: %q, want 0", got)
	}
}

// TestOriginalQuietCoversLongestInterval: the original sleeps the interval
// of the config it read at its last rewrite; a config that shortens the
// interval afterwards does not shorten the wait. Once the original has
// rewritten under the short interval (and the propagation bound has
// passed), the short interval counts.
func TestOriginalQuietCoversLongestInterval(t *testing.T) {
	h := newHarness(t, nil)
	h.write("resyncInterval: 20s\n")
	h.orig.SetOriginal(originalRules(nft.DefaultChain))
	h.sync(at(0)) // the original's last rewrite under 20s: seen at 0
	h.write("resyncInterval: 2s\n")
	h.sync(at(time.Second))
	if q := h.a.originalQuiet(); q != 45*time.Second {
		t.Errorf("quiet after the interval was shortened: %s, want 2 × 20s + 5s", q)
	}
	// The original, still sleeping its 20s, is silent until 20s: nothing
	// may go before 45s.
	for s := 2; s < 20; s++ {
		h.a.Tick(at(time.Duration(s) * time.Second))
	}
	if !h.originalPresent() {
		t.Fatalf("removed while the original slept its old interval; log:\n%s", h.logs)
	}
	// It wakes, rewrites, and from then on rewrites every 2s.
	for s := 20; s <= 200; s += 2 {
		h.orig.RewriteOriginal()
		h.a.Tick(at(time.Duration(s) * time.Second))
		if !h.originalPresent() {
			t.Fatalf("removed at %ds while the original ran", s)
		}
	}
	// Long after the change, only the short interval is in force.
	if q := h.a.originalQuiet(); q != 9*time.Second {
		t.Errorf("quiet long after the change: %s, want 2 × 2s + 5s", q)
	}
	// It stops: gone 9s after its last rewrite.
	h.a.Tick(at(205 * time.Second))
	if !h.originalPresent() {
		t.Fatal("removed before 2 × 2s + 5s")
	}
	h.a.Tick(at(209 * time.Second))
	if h.originalPresent() {
		t.Fatalf("not removed 9s after the last rewrite; log:\n%s", h.logs)
	}
}

// TestOriginalQuietLengthened: a longer interval counts at once.
func TestOriginalQuietLengthened(t *testing.T) {
	h := newHarness(t, nil)
	h.write("resyncInterval: 2s\n")
	h.orig.SetOriginal(originalRules(nft.DefaultChain))
	h.sync(at(0))
	h.write("resyncInterval: 30s\n")
	h.sync(at(time.Second))
	h.a.Tick(at(20 * time.Second))
	if !h.originalPresent() || h.a.originalQuiet() != 65*time.Second {
		t.Fatalf("present %v quiet %s", h.originalPresent(), h.a.originalQuiet())
	}
}

// TestOriginalNotRemovedOnBadConfig: the original skips its rewrite on a
// bad config too; a quiet chain proves nothing then.
func TestOriginalNotRemovedOnBadConfig(t *testing.T) {
	h := newHarness(t, nil)
	h.write("resyncInterval: 1s\n")
	h.orig.SetOriginal(originalRules(nft.DefaultChain))
	h.sync(at(0))
	h.write("nonMasqueradeCIDRs: [10.0.0.1/8]\nresyncInterval: 1s\n")
	if h.a.Sync(at(1*time.Second)) == nil {
		t.Fatal("a bad config loaded")
	}
	h.a.Tick(at(10 * time.Second))
	if !h.originalPresent() {
		t.Fatal("removed while the config fails to load")
	}
	h.write("resyncInterval: 1s\n")
	h.sync(at(11 * time.Second))
	if h.originalPresent() {
		t.Fatal("not removed once the config loads again")
	}
}

// TestOriginalChangedAtRemoval: a rewrite between the look and the removal
// restarts the wait; a kernel error is logged once and retried.
func TestOriginalChangedAtRemoval(t *testing.T) {
	h := newHarness(t, nil)
	h.write("resyncInterval: 1s\n")
	h.orig.SetOriginal(originalRules(nft.DefaultChain))
	h.sync(at(0))
	// Simulate a rewrite between FindOriginal and RemoveOriginal.
	h.a.opts.Original = &racing{OriginalRules: h.orig, before: h.orig.RewriteOriginal}
	h.a.Tick(at(7 * time.Second))
	if !h.originalPresent() {
		t.Fatal("removed although the rules changed")
	}
	if !strings.Contains(h.logs.String(), "changed just before their removal") {
		t.Errorf("log:\n%s", h.logs)
	}
	h.a.opts.Original = h.orig
	h.orig.RemoveErr = errors.New("device or resource busy")
	h.a.Tick(at(14 * time.Second))
	h.a.Tick(at(20 * time.Second))
	if n := strings.Count(h.logs.String(), "cannot remove the original"); n != 1 {
		t.Errorf("%d error lines, want 1; log:\n%s", n, h.logs)
	}
	h.orig.RemoveErr = nil
	h.sync(at(21 * time.Second))
	if h.originalPresent() {
		t.Error("not removed after the error went away")
	}
}

type racing struct {
	OriginalRules
	before func()
}

func (r *racing) RemoveOriginal(chain, fp string, families ...nft.Family) (original.Rules, error) {
	r.before()
	return r.OriginalRules.RemoveOriginal(chain, fp, families...)
}

// TestOriginalReports: exemptions before the jump and legacy nat tables
// are reported once, with their matches and the commands; a chain of the
// name that is not the original's is never removed; a read error is logged
// once.
func TestOriginalReports(t *testing.T) {
	h := newHarness(t, nil)
	h.write("resyncInterval: 1s\n")
	o := originalRules(nft.DefaultChain, original.XTRule{Handle: 2, Verdict: "accept", Text: "ip daddr 203.0.113.0/24 counter accept"})
	o.Legacy = []string{"iptables"}
	o.Families[0].Rules = []original.XTRule{{Handle: 9, Verdict: "return", Text: "ip daddr 10.0.0.0/8 return"}}
	o.Families[0].Jumps[0].Comment = ""
	h.orig.SetOriginal(o)
	h.sync(at(0))
	h.sync(at(time.Second))
	h.a.Tick(at(30 * time.Second))
	logs := h.logs.String()
	for _, want := range []string{
		"ip daddr 203.0.113.0/24 counter accept",
		"README: Foreign exemptions",
		"iptables-legacy -t nat -D POSTROUTING -m comment --comment",
		"iptables-legacy -t nat -X IP-MASQ-AGENT",
		"is not the original ip-masq-agent's",
	} {
		if n := strings.Count(logs, want); n != 1 {
			t.Errorf("%d lines with %q, want 1; log:\n%s", n, want, logs)
		}
	}
	if !h.originalPresent() {
		t.Error("a chain that is not the original's was removed")
	}
	h.orig.OriginalErr = errors.New("netlink: boom")
	h.sync(at(31 * time.Second))
	h.sync(at(32 * time.Second))
	if n := strings.Count(h.logs.String(), "cannot look for the original"); n != 1 {
		t.Errorf("%d error lines, want 1", n)
	}
	// Gone by someone else's hand.
	h.orig.OriginalErr = nil
	h.orig.SetOriginal(originalRules(nft.DefaultChain))
	h.sync(at(32500 * time.Millisecond))
	h.orig.SetOriginal(original.Rules{Chain: nft.DefaultChain, Families: []original.Family{{Family: 4, Chain: nft.DefaultChain}}})
	h.sync(at(33 * time.Second))
	if !strings.Contains(h.logs.String(), "are gone (removed by someone else)") {
		t.Errorf("log:\n%s", h.logs)
	}
}
