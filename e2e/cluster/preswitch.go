package main

import (
	"errors"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// The check before the switch (docs/upgrade.md "Before the switch", the
// first step of README's Upgrade), on a node as the Kubernetes addon
// leaves it: the original agent run with the addon's
// --nomasq-all-reserved-ranges and no ConfigMap, so that it exempts the
// reserved ranges (203.0.113.0/24 and 198.51.100.0/24 among them) besides
// RFC 1918. The docs' command runs as printed twice: with FLAGS empty (the
// addon's flag not carried over: it must list the ranges that would
// change, 100.64.0.0/10 first, and exit 1) and with FLAGS as printed (the
// flag carried over: none, exit 0). Then packets show that what it said is
// true: this agent with the flag carried over decides as the original for
// every destination the client tries, and without it masquerades exactly
// the reserved ones the check listed.

// addonArgs are the Kubernetes addon manifest's flags of the original.
var addonArgs = []string{"--masq-chain=" + originalChain, "--nomasq-all-reserved-ranges"}

// preSwitchCheck runs before the operator's ConfigMap and the original's
// DaemonSet exist, and leaves the node as it found it (no rules of either
// agent).
func (s *suite) preSwitchCheck() error {
	s.logf("pre-switch check: the original's rules as the addon writes them without a ConfigMap (%s), then docs/upgrade.md \"Before the switch\" as printed, without and with the flag", strings.Join(addonArgs, " "))
	none := s.n.path("precheck", "no-config") // a file that does not exist: no ConfigMap
	orig := filepath.Join(s.n.path("bin"), "original")
	agent := filepath.Join(s.repo, "bin", "linux-"+runtime.GOARCH, "ip-masq-agent")
	inNode := func(bin string, args ...string) (string, error) {
		return run(s.ctx, time.Minute, "nsenter", append([]string{"--net=" + s.n.nodeNS, "--", bin}, args...)...)
	}
	if out, err := inNode(orig, append([]string{"-once", "-config=" + none}, addonArgs...)...); err != nil {
		return errors.New("the stand-in original's -once: " + err.Error() + ": " + out)
	}
	if s.podIP == "" {
		if err := s.startClient(); err != nil {
			return err
		}
	}
	// 203.0.113.10 and 198.51.100.10 are reserved ranges: the addon's
	// original leaves them alone, as it does 10.250.0.10 (RFC 1918).
	addon := map[string]bool{internetDst: false, partnerDst: false, privateDst: false}
	s.expect("pre-switch: the addon's original, no ConfigMap", addon)

	var cmds []docCommand
	for _, w := range []string{"NODE=", "IMAGE=", "TAG=", "FLAGS=", "kubectl -n kube-system run ip-masq-agent-precheck"} {
		c, err := s.docs.find("docs/upgrade.md", "Before the switch", w)
		if err != nil {
			return err
		}
		cmds = append(cmds, c)
	}
	for _, c := range cmds[:3] {
		s.docs.runChecked(c, nil, "the node, the image and its tag")
	}
	// The addon's flag not carried over: FLAGS empty, as the docs say to
	// write it when there is none.
	s.docs.runChecked(docCommand{file: "docs/upgrade.md", section: "Before the switch", text: "FLAGS="}, nil, "the addon's flag NOT carried over (the docs: FLAGS= when there are none)")
	s.docs.runChecked(cmds[4], func(r docResult) bool {
		return r.err == nil && r.code == 1 && strings.Contains(r.stdout, "change ipv4 100.64.0.0/10: original: not masqueraded, this agent: masquerade; to keep the original's decision: --nomasq-all-reserved-ranges") &&
			strings.Contains(r.stdout, "change ipv4 203.0.113.0/24") && strings.Contains(r.stdout, "change ipv4 198.51.100.0/24") &&
			strings.Contains(r.stdout, "decisions: the switch from the original ip-masq-agent changes 8 ranges (ipv4 8, ipv6 0)")
	}, "without the addon's flag: lists the 8 reserved ranges whose decision would change, exit 1")
	s.docs.runChecked(cmds[3], nil, "FLAGS as printed: the addon's flag carried over")
	s.docs.runChecked(cmds[4], exit0("decisions: the switch from the original ip-masq-agent changes none"), "with the addon's flag: no decision changes, exit 0")

	// Packets: the switch as the check predicted. This agent once with the
	// flag carried over, then the original's rules removed: the same
	// decisions. Without the flag: the reserved ranges masqueraded.
	for _, tc := range []struct {
		what  string
		flags []string
		want  map[string]bool
	}{
		{"with --nomasq-all-reserved-ranges carried over: no decision changes", []string{"--nomasq-all-reserved-ranges"}, addon},
		{"without it: the reserved ranges the check listed are masqueraded", nil, map[string]bool{internetDst: true, partnerDst: true, privateDst: false}},
	} {
		if out, err := inNode(agent, append([]string{"--once", "--config=" + none}, tc.flags...)...); err != nil {
			return errors.New("ip-masq-agent --once: " + err.Error() + ": " + out)
		}
		if out, err := inNode(agent, "cleanup-iptables"); err != nil {
			return errors.New("ip-masq-agent cleanup-iptables: " + err.Error() + ": " + out)
		}
		s.expect("pre-switch: this agent "+tc.what, tc.want)
		if out, err := inNode(agent, "--cleanup"); err != nil {
			return errors.New("ip-masq-agent --cleanup: " + err.Error() + ": " + out)
		}
		// The addon's rules again for the next case (the last one leaves
		// the node without them).
		if tc.flags != nil {
			if out, err := inNode(orig, append([]string{"-once", "-config=" + none}, addonArgs...)...); err != nil {
				return errors.New("the stand-in original's -once: " + err.Error() + ": " + out)
			}
		}
	}
	// Its connections' conntrack entries go too: the upgrade's check of
	// every entry of the pod's counts from there.
	_, _ = run(s.ctx, time.Minute, "nsenter", "--net="+s.n.nodeNS, "--", "conntrack", "-D", "-s", s.podIP)
	rules, err := s.savedOriginalRules()
	tbl, _ := s.nodeNft("list", "tables")
	s.assert(err == nil && len(rules) == 0 && !strings.Contains(tbl, "ip-masq-agent"), "pre-switch: the node is left without either agent's rules (%d of the original's; nft list tables: %s)", len(rules), oneLine(tbl, nil))
	return nil
}
