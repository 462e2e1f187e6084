package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// The roll back to the original agent, as docs/upgrade.md "Roll back to
// the original agent" tells an operator to do it: the old DaemonSet's
// manifest, saved at the upgrade (step 1) with the documented command, is
// applied again; once it runs, this agent's DaemonSet is deleted and
// deploy/rollback/ removes this agent's table. Meanwhile the client pod
// opens a new connection every 20 ms.

// savedManifest is where step 1 of the upgrade saves the old DaemonSet:
// the docs' working directory, where the roll back's command finds it.
func (s *suite) savedManifest() string {
	return filepath.Join(s.docs.dir, "ip-masq-agent-original.yaml")
}

// saveOriginalManifest runs docs/upgrade.md's
//
//	kubectl -n kube-system get daemonset ip-masq-agent -o yaml \
//	  | sed -e '/^  resourceVersion: /d' -e '/^  uid: /d' > ip-masq-agent-original.yaml
func (s *suite) saveOriginalManifest() error {
	c, err := s.docs.find("docs/upgrade.md", "What the old DaemonSet has", "> ip-masq-agent-original.yaml")
	if err != nil {
		return err
	}
	if r := s.docs.runChecked(c, exit0(), "step 1: the old DaemonSet's manifest, for a roll back"); r.code != 0 || r.err != nil {
		return errors.New("cannot save the old DaemonSet's manifest")
	}
	data, err := os.ReadFile(s.savedManifest())
	if err != nil {
		return err
	}
	text := string(data)
	s.assert(strings.Contains(text, "kind: DaemonSet") && strings.Contains(text, "name: ip-masq-agent\n") &&
		!strings.Contains(text, "\n  resourceVersion: ") && !strings.Contains(text, "\n  uid: "),
		"step 1: ip-masq-agent-original.yaml holds the old DaemonSet, less resourceVersion and uid (%d lines)", strings.Count(text, "\n"))
	return nil
}

// nodeLabels returns the node's labels as kubectl prints them.
func (s *suite) nodeLabels() string {
	out, _ := s.kubectl(15*time.Second, "get", "node", nodeName, "-o", "jsonpath={.metadata.labels}")
	return out
}

// rollback follows docs/upgrade.md "Roll back to the original agent".
func (s *suite) rollback() error {
	s.logf("roll back to the original agent, as docs/upgrade.md says: apply the saved manifest, rollout status, delete this agent's DaemonSet, apply -f bin/manifests/rollback.yaml, rollout status, delete -f")
	// Under the changed config (nonMasqueradeCIDRs: [203.0.113.0/24]), which
	// both agents read.
	want := map[string]string{internetDst: s.podIP, partnerDst: nodeIP, privateDst: nodeIP}
	// The conntrack entries of earlier phases' flows (other configs, still
	// in TIME_WAIT) would confuse the double-NAT check: gone first.
	run(s.ctx, time.Minute, "nsenter", "--net="+s.n.nodeNS, "--", "conntrack", "-D", "-p", "tcp", "-s", s.podIP, "--dport", fmt.Sprint(echoPort))
	fs, err := s.startFlows(want, 270*time.Second)
	if err != nil {
		return err
	}
	defer fs.cancel()
	labels0 := s.nodeLabels()

	// Every 100 ms: does the node hold something that masquerades (this
	// agent's table, or the original's chain with its jump)?
	var mu sync.Mutex
	polls, bare := 0, 0
	watchCtx, stopWatch := context.WithCancel(s.ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for watchCtx.Err() == nil {
			_, terr := run(watchCtx, 10*time.Second, "nsenter", "--net="+s.n.nodeNS, "--", "nft", "list", "table", "inet", "ip-masq-agent")
			h, jump := s.originalState(watchCtx)
			if watchCtx.Err() != nil {
				return
			}
			mu.Lock()
			polls++
			if terr != nil && (h == "" || !jump) {
				bare++
			}
			mu.Unlock()
			time.Sleep(100 * time.Millisecond)
		}
	}()
	defer func() { stopWatch(); wg.Wait() }()

	// README "Roll back", as printed (docs/upgrade.md prints the same).
	cmds := s.docs.section("README.md", "Roll back")
	if len(cmds) != 6 {
		return fmt.Errorf("README.md, Roll back: %d commands, want the 6 this step runs: %v", len(cmds), cmds)
	}
	step := func(i int, what string) bool {
		r := s.docs.runChecked(cmds[i], exit0(), "roll back: "+what)
		return r.err == nil && r.code == 0
	}
	t0 := time.Now()
	if !step(0, "the old DaemonSet's manifest saved at the upgrade") {
		return errors.New("cannot apply the saved manifest")
	}
	step(1, "the old agent rolled out")
	err = waitFor(s.ctx, "the original's rules in the kernel", 90*time.Second, 200*time.Millisecond, func() (bool, string, error) {
		h, jump := s.originalState(s.ctx)
		return h != "" && jump, h, nil
	})
	if !s.assert(err == nil, "roll back: the original's chain %s and its jump are in the kernel (%s after the apply)", originalChain, since(t0)) {
		return errors.New("the original did not write its rules")
	}

	tDel := time.Now()
	step(2, "this agent's DaemonSet deleted")
	err = waitFor(s.ctx, "this agent's pod gone", 90*time.Second, 200*time.Millisecond, func() (bool, string, error) {
		pods, err := s.agentPods()
		return err == nil && len(pods) == 0 && len(s.agentPIDs()) == 0, strings.Join(pods, "; "), err
	})
	s.assert(err == nil, "roll back: this agent's pod and process are gone (%s after the delete): %v", since(tDel), err)

	step(3, "bin/manifests/rollback.yaml (e2e/rollback: the local images)")
	step(4, "this agent's table gone from every node")
	logs, _ := s.kubectlAll(30*time.Second, "-n", "kube-system", "logs", "ds/ip-masq-agent-nft-rollback", "--all-containers", "--prefix")
	s.logf("  the rollback pod's log: %s", clip(oneLine(logs, nil), 400))
	step(5, "bin/manifests/rollback.yaml deleted")
	s.timing("roll back: whole sequence", time.Since(t0), "apply the saved manifest .. delete -f bin/manifests/rollback.yaml")

	// The node holds the original's rules only.
	_, err = s.nodeNft("list", "table", "inet", "ip-masq-agent")
	s.assert(err != nil, "roll back: table inet ip-masq-agent is gone (nft list table fails: %v)", err != nil)
	rules, err := s.savedOriginalRules()
	s.assert(err == nil && len(rules) == 4 && strings.Contains(strings.Join(rules, "\n"), "-A "+originalChain+" -d 203.0.113.0/24 "),
		"roll back: the original's rules for the current config are in table ip nat:\n      %s", strings.Join(rules, "\n      "))
	rules6, err := s.savedOriginalRulesOf("ip6tables-nft-save")
	s.assert(err == nil && len(rules6) == 3, "roll back: and in table ip6 nat (%d rules)", len(rules6))
	ruleset, _ := s.nodeNft("list", "ruleset")
	s.assert(!strings.Contains(ruleset, "ip-masq-agent {"), "roll back: no table of this agent is left in the node's ruleset")

	stopWatch()
	wg.Wait()
	mu.Lock()
	p, b := polls, bare
	mu.Unlock()
	s.assert(p > 0 && b == 0, "roll back: at every one of %d polls (100 ms) the node held this agent's table or the original's chain with its jump (%d polls with neither)", p, b)
	r, err := fs.stop()
	if err != nil {
		return err
	}
	sum := r.sum
	s.assert(sum.Flows >= 100 && r.wrong == 0 && r.serverWrong == 0 && r.errs == 0,
		"roll back: every new flow left with the source the config says: %d flows in %.1fs, client saw %d wrong, server %d wrong of %d; %d failed",
		sum.Flows, sum.Seconds, r.wrong, r.serverWrong, r.serverFlows, r.errs)
	checked, badNAT, err := s.conntrackNAT(want)
	s.assert(err == nil && badNAT == 0 && checked > 0, "roll back: no double NAT: of %d conntrack entries to the echo port each was translated once or not at all: %d otherwise (%v)", checked, badNAT, err)
	s.assert(s.nodeLabels() == labels0, "roll back: the node's labels are unchanged: %s", labels0)
	s.expect("rolled back", map[string]bool{internetDst: false, partnerDst: true, privateDst: true})

	// Upgrade again for the rest of the run: the original's DaemonSet
	// deleted, this agent installed (it removes the original's rules later).
	out, err := s.kubectlAll(time.Minute, "-n", "kube-system", "delete", "daemonset", "ip-masq-agent")
	if err != nil {
		return fmt.Errorf("delete the original's DaemonSet: %v: %s", err, out)
	}
	err = waitFor(s.ctx, "the original's pod gone", 90*time.Second, 200*time.Millisecond, func() (bool, string, error) {
		out, err := s.kubectl(15*time.Second, "-n", "kube-system", "get", "pods", "-l", originalLabel, "-o", "name")
		return err == nil && out == "", out, err
	})
	if err != nil {
		return err
	}
	s.logf("install again after the roll back, as README \"Install\" says: make manifests, kubectl apply -f bin/manifests/install.yaml, rollout status")
	return s.install(true)
}
