package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"
)

// The upgrade from the original (iptables) ip-masq-agent, as README.md's
// "Upgrade from the iptables agent" tells an operator to do it.
//
// The cluster starts with the original agent's behaviour: the operator's
// ConfigMap (a non-default list, created as an operator creates it) and a
// DaemonSet named ip-masq-agent shaped like the original's manifest, whose
// container (e2e/original) writes the original's rules through iptables-nft
// every resyncInterval. Then the README's steps run verbatim, while the
// client pod opens a new connection every 20 ms, from before step 2 to after
// step 6.

// operatorConfig is the operator's ConfigMap's key "config": not the
// defaults (10.0.0.0/8 is masqueraded, 198.51.100.0/24 is not), so that an
// agent that used its defaults or the example would send flows with the
// wrong source. resyncInterval is 10s (the default is 60s) only to keep the
// run short: the old rules go away 2 x 10 s + 5 s after the old agent's
// last resync instead of 125 s.
const operatorConfig = `# The partner's network and the VPN are reached with pod addresses;
# everything else, 10.0.0.0/8 included, leaves with the node's address.
nonMasqueradeCIDRs:
  - 198.51.100.0/24
  - 172.16.0.0/12
masqLinkLocal: true
resyncInterval: 10s
`

const (
	operatorResync = 10 * time.Second
	// originalChain is the old DaemonSet's --masq-chain, as in the
	// Kubernetes addon manifest and on GKE: not this agent's default, and
	// not copied into this agent's flags (README step 1 leaves it out here),
	// so that the agent has to find the chain by what it is.
	originalChain = "IP-MASQ"
	originalLabel = "k8s-app=ip-masq-agent"
)

// originalArgs are the old DaemonSet's args: a custom chain, and IPv6 (its
// rules in table ip6 nat too).
var originalArgs = []string{"--masq-chain=" + originalChain, "--enable-ipv6"}

// quietBound is how long the agent must see the original's chain
// unchanged before it removes it: 2 x resyncInterval + 5 s.
func quietBound(resync time.Duration) time.Duration { return 2*resync + 5*time.Second }

// removalBound is how long after the original agent's last resync the
// README says its rules are gone (Upgrade, step 5): while they are there the
// agent looks at the chain every quarter resyncInterval, so it sees the last
// rewrite up to that late, then waits quietBound.
func removalBound(resync time.Duration) time.Duration { return resync/4 + quietBound(resync) }

// originalRules is what iptables-nft-save prints of the rules the original
// writes for operatorConfig (in the order iptables-save prints matches).
var originalRules = []string{
	`-A POSTROUTING -m comment --comment "ip-masq-agent: ensure nat POSTROUTING directs all non-LOCAL destination traffic to our custom IP-MASQ chain" -m addrtype ! --dst-type LOCAL -j IP-MASQ`,
	`-A IP-MASQ -d 198.51.100.0/24 -m comment --comment "ip-masq-agent: local traffic is not subject to MASQUERADE" -j RETURN`,
	`-A IP-MASQ -d 172.16.0.0/12 -m comment --comment "ip-masq-agent: local traffic is not subject to MASQUERADE" -j RETURN`,
	`-A IP-MASQ -m comment --comment "ip-masq-agent: outbound traffic is subject to MASQUERADE (must be last in chain)" -j MASQUERADE --random-fully`,
}

// originalDaemonSet is the original's manifest (ip-masq-agent.yaml of
// kubernetes-sigs/ip-masq-agent: hostNetwork, NET_ADMIN and NET_RAW, the
// ConfigMap at /etc/config), with the stand-in's local image and the
// addon manifest's --masq-chain=IP-MASQ, and --enable-ipv6.
func originalDaemonSet() string {
	return fmt.Sprintf(`apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: ip-masq-agent
  namespace: kube-system
spec:
  selector:
    matchLabels:
      k8s-app: ip-masq-agent
  template:
    metadata:
      labels:
        k8s-app: ip-masq-agent
    spec:
      hostNetwork: true
      terminationGracePeriodSeconds: 5
      containers:
      - name: ip-masq-agent
        image: %s
        imagePullPolicy: Never
        args: ["%s"]
        securityContext:
          privileged: false
          capabilities:
            add: ["NET_ADMIN", "NET_RAW"]
        volumeMounts:
          - name: config
            mountPath: /etc/config
      volumes:
        - name: config
          configMap:
            name: ip-masq-agent
            optional: true
            items:
              - key: config
                path: ip-masq-agent
`, originalImage, strings.Join(originalArgs, `", "`))
}

// savedOriginalRules returns the lines of iptables-nft-save -t nat in the
// node that belong to the original (its chain, the jump to it).
func (s *suite) savedOriginalRules() ([]string, error) {
	return s.savedOriginalRulesOf("iptables-nft-save")
}

// savedOriginalRulesOf is savedOriginalRules with ip6tables-nft-save too.
func (s *suite) savedOriginalRulesOf(save string) ([]string, error) {
	out, err := run(s.ctx, 30*time.Second, "nsenter", "--net="+s.n.nodeNS, "--", save, "-t", "nat")
	if err != nil {
		return nil, err
	}
	var rules []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "-A ") && strings.Contains(l, "-j "+originalChain) || strings.HasPrefix(l, "-A "+originalChain+" ") {
			rules = append(rules, l)
		}
	}
	return rules, nil
}

var handleRE = regexp.MustCompile(`# handle (\d+)`)

// originalState returns the handles of the original's chain's rules ("" if
// the chain is not there) and whether POSTROUTING jumps to it.
func (s *suite) originalState(ctx context.Context) (handles string, jump bool) {
	if out, err := run(ctx, 10*time.Second, "nsenter", "--net="+s.n.nodeNS, "--", "nft", "-a", "list", "chain", "ip", "nat", originalChain); err == nil {
		var hs []string
		for _, l := range strings.Split(out, "\n") {
			if m := handleRE.FindStringSubmatch(l); m != nil && !strings.Contains(l, "chain ") {
				hs = append(hs, m[1])
			}
		}
		handles = strings.Join(hs, ",")
		if handles == "" {
			handles = "(empty)"
		}
	}
	if out, err := run(ctx, 10*time.Second, "nsenter", "--net="+s.n.nodeNS, "--", "nft", "list", "chain", "ip", "nat", "POSTROUTING"); err == nil {
		jump = strings.Contains(out, "jump "+originalChain)
	}
	return handles, jump
}

// configMapState is the operator's ConfigMap as the API server has it.
type configMapState struct {
	UID, ResourceVersion string
	Data                 map[string]string
}

func (s *suite) configMap() (configMapState, error) {
	var c configMapState
	out, err := s.kubectl(30*time.Second, "-n", "kube-system", "get", "configmap", "ip-masq-agent", "-o", "json")
	if err != nil {
		return c, err
	}
	var obj struct {
		Metadata struct {
			UID             string `json:"uid"`
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
		Data map[string]string `json:"data"`
	}
	if err := json.Unmarshal([]byte(out), &obj); err != nil {
		return c, err
	}
	return configMapState{obj.Metadata.UID, obj.Metadata.ResourceVersion, obj.Data}, nil
}

// originalAgent sets the cluster up as the operator has it: the ConfigMap,
// then the original's DaemonSet; checks the original's rules in the kernel
// and its decisions with real packets.
func (s *suite) originalAgent() error {
	s.logf("original agent: the operator's ConfigMap (kubectl create configmap --from-file=config) and the original's DaemonSet ip-masq-agent (e2e/original: its rules through iptables-nft every resyncInterval: 10s)")
	dir := s.n.path("operator")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, p := range []string{s.n.path("operator", "config"), filepath.Join(s.docs.dir, "config")} {
		if err := os.WriteFile(p, []byte(operatorConfig), 0o644); err != nil {
			return err
		}
	}
	// README "Configure": the file config in the working directory.
	c, err := s.docs.find("README.md", "Configure", "create configmap")
	if err != nil {
		return err
	}
	if r := s.docs.runChecked(c, exit0("configmap/ip-masq-agent created"), "the operator's ConfigMap, from the file config"); r.code != 0 || r.err != nil {
		return errors.New("cannot create the operator's ConfigMap")
	}
	if s.operatorCM, err = s.configMap(); err != nil {
		return err
	}
	if err := os.WriteFile(s.n.path("manifests", "original.yaml"), []byte(originalDaemonSet()), 0o644); err != nil {
		return err
	}
	t := time.Now()
	if out, err := s.kubectlAll(time.Minute, "apply", "-f", s.n.path("manifests", "original.yaml")); err != nil {
		return err
	} else {
		s.logf("  kubectl apply -f (the original's manifest): %s", oneLine(out, nil))
	}
	var rules []string
	err = waitFor(s.ctx, "the original's rules in the kernel", 90*time.Second, 200*time.Millisecond, func() (bool, string, error) {
		r, err := s.savedOriginalRules()
		rules = r
		return err == nil && len(r) == len(originalRules), strings.Join(r, "; "), err
	})
	if err != nil {
		return err
	}
	s.timing("original agent: its rules in the kernel", time.Since(t), "after kubectl apply of its DaemonSet")
	s.assert(strings.Join(rules, "\n") == strings.Join(originalRules, "\n"),
		"the original agent's rules, as iptables-nft-save shows them, are exactly the original's for the operator's config:\n      %s", strings.Join(rules, "\n      "))
	h0, _ := s.originalState(s.ctx)
	t = time.Now()
	var h1 string
	err = waitFor(s.ctx, "the original to rewrite its chain", 3*operatorResync, 200*time.Millisecond, func() (bool, string, error) {
		h, _ := s.originalState(s.ctx)
		h1 = h
		return h != "" && h != h0, h, nil
	})
	s.assert(err == nil, "the original agent rewrites its chain every resyncInterval (10s): rule handles %s -> %s after %s", h0, h1, since(t))
	if s.podIP == "" {
		if err := s.startClient(); err != nil {
			return err
		}
	}
	s.expect("original agent", map[string]bool{internetDst: true, partnerDst: false, privateDst: true})
	return nil
}

// oldRulesWatch polls the original's chain and jump every 200 ms.
type oldRulesWatch struct {
	mu         sync.Mutex
	handles    string
	lastChange time.Time // when the harness last saw the handles change (a resync of the original)
	goneAt     time.Time // when chain and jump were first both absent
	absentSeen int       // polls that found the chain or the jump missing before goneAt
	polls      int
}

func (s *suite) watchOldRules(ctx context.Context) (*oldRulesWatch, func()) {
	w := &oldRulesWatch{}
	w.handles, _ = s.originalState(ctx)
	w.lastChange = time.Now()
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			h, jump := s.originalState(ctx)
			now := time.Now()
			if ctx.Err() != nil {
				return
			}
			w.mu.Lock()
			w.polls++
			if w.goneAt.IsZero() {
				switch {
				case h == "" && !jump:
					w.goneAt = now
				case h == "" || !jump:
					w.absentSeen++
				case h != w.handles:
					w.handles, w.lastChange = h, now
				}
			}
			w.mu.Unlock()
			time.Sleep(200 * time.Millisecond)
		}
	}()
	return w, func() { cancel(); wg.Wait() }
}

func (w *oldRulesWatch) get() (lastChange, goneAt time.Time, absent, polls int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastChange, w.goneAt, w.absentSeen, w.polls
}

// agentLogs returns the agent's logs (all its pods).
func (s *suite) agentLogs() string {
	out, _ := s.kubectlAll(30*time.Second, "-n", "kube-system", "logs", "-l", agentSelector, "--tail=-1")
	return out
}

// upgrade follows README.md "Upgrade from the iptables agent", steps 1 to 6.
func (s *suite) upgrade() error {
	s.logf("upgrade: the README's steps while the client pod opens a new connection every 20 ms to %s, %s and %s", internetDst, partnerDst, privateDst)
	t0 := time.Now()
	want := map[string]string{internetDst: nodeIP, partnerDst: s.podIP, privateDst: nodeIP}
	fs, err := s.startFlows(want, 270*time.Second)
	if err != nil {
		return err
	}
	defer fs.cancel()
	w, stopWatch := s.watchOldRules(s.ctx)
	defer stopWatch()

	// Step 1: what the old DaemonSet has. Its manifest is saved as
	// docs/upgrade.md says, for the roll back later. Its flags are NOT
	// copied: the agent must find the IP-MASQ chain by itself.
	c, err := s.docs.find("docs/upgrade.md", "What the old DaemonSet has", "-o jsonpath=")
	if err != nil {
		return err
	}
	s.docs.runChecked(c, exit0(`["`+strings.Join(originalArgs, `","`)+`"]`, `"k8s-app":"ip-masq-agent"`),
		"step 1: the old DaemonSet's args, node selector and pod labels; its args deliberately not copied (the agent finds the old chain whatever its name)")
	if err := s.saveOriginalManifest(); err != nil {
		return err
	}

	// Step 2: make manifests (the local image), kubectl apply -f bin/manifests/install.yaml, rollout status.
	tInstall := time.Now()
	if err := s.install(false); err != nil {
		return err
	}

	// Step 3.
	tbl, err := s.nodeNft("list", "table", "inet", "ip-masq-agent")
	set, _ := s.nonmasqSet()
	s.assert(err == nil && strings.Contains(set, "198.51.100.0/24") && strings.Contains(set, "172.16.0.0/12") && !strings.Contains(set, "10.0.0.0/8"),
		"step 3: nft list table inet ip-masq-agent shows the operator's CIDRs: nonmasq-v4 { %s } (%d lines)", set, strings.Count(tbl, "\n"))
	// README "Verify": the node and its agent pod; README "Upgrade": diff.
	for _, want := range []string{"NODE=", "POD="} {
		c, err := s.docs.find("README.md", "Verify", want)
		if err != nil {
			return err
		}
		s.docs.runChecked(c, nil, "README Verify: the node to look at, and its agent's pod")
	}
	diff, err := s.docs.find("README.md", "Upgrade", "ip-masq-agent diff")
	if err != nil {
		return err
	}
	s.docs.runChecked(diff, func(r docResult) bool {
		return r.err == nil && r.code == 1 && strings.Contains(r.stdout, "original") && strings.Contains(r.stderr, agentFlagsNote)
	}, "exits 1 while the old jump is there, with the running agent's flags")

	// Side by side for longer than a quiet chain needs to be removed: the
	// agent never removes the rules of an original that still runs.
	sideBySide := quietBound(operatorResync) + 5*time.Second
	if d := time.Until(tInstall.Add(sideBySide)); d > 0 {
		s.logf("  both agents side by side for %s after the install (a quiet chain is removed after %s): the original's rules must stay", sideBySide, quietBound(operatorResync))
		select {
		case <-time.After(d):
		case <-s.ctx.Done():
			return s.ctx.Err()
		}
	}
	_, goneAt, absent, polls := w.get()
	logs := s.agentLogs()
	s.assert(goneAt.IsZero() && absent == 0 && !strings.Contains(logs, "removed the original ip-masq-agent's iptables rules") &&
		strings.Contains(logs, "found the original ip-masq-agent's iptables rules") && strings.Contains(logs, "the original ip-masq-agent still runs"),
		"while the original runs, the agent reports its rules (\"found ...\", \"... still runs\") and leaves them: chain and jump present at all %d polls every 200 ms", polls)
	s.assert(strings.Contains(logs, `"original --masq-chain"=`+originalChain), "the agent, run without --masq-chain, names the chain it found and the old agent's --masq-chain (%s)", originalChain)
	rules6, err := s.savedOriginalRulesOf("ip6tables-nft-save")
	s.assert(err == nil && len(rules6) == 3, "the old agent's IPv6 rules are there too (ip6tables-nft-save: %d rules: %s)", len(rules6), strings.Join(rules6, "; "))

	// Step 4.
	tDel := time.Now()
	if c, err = s.docs.find("README.md", "Upgrade", "delete daemonset ip-masq-agent"); err != nil {
		return err
	}
	if r := s.docs.runChecked(c, exit0("deleted"), "step 4"); r.code != 0 || r.err != nil {
		return errors.New("cannot delete the old DaemonSet")
	}
	err = waitFor(s.ctx, "the old agent's pod gone", 90*time.Second, 200*time.Millisecond, func() (bool, string, error) {
		out, err := s.kubectl(15*time.Second, "-n", "kube-system", "get", "pods", "-l", originalLabel, "-o", "name")
		return err == nil && out == "", out, err
	})
	s.assert(err == nil, "the old agent's pod is gone (%s after the delete): %v", since(tDel), err)

	// Step 5: nothing to do on the node; wait for the agent to remove them.
	bound := removalBound(operatorResync)
	err = waitFor(s.ctx, "the original's chain and jump gone", bound+30*time.Second, 200*time.Millisecond, func() (bool, string, error) {
		_, g, _, _ := w.get()
		return !g.IsZero(), "", nil
	})
	lastChange, goneAt, absent, _ := w.get()
	if !s.assert(err == nil && absent == 0, "step 5: with no manual step, the node holds neither chain %s nor the POSTROUTING jump: removed %s after the old DaemonSet's deletion (never half removed: %d polls saw one without the other)",
		originalChain, goneAt.Sub(tDel).Round(100*time.Millisecond), absent) {
		return errors.New("the original's rules were not removed")
	}
	after := goneAt.Sub(lastChange)
	// The old agent ran with --enable-ipv6, this one without (its flags
	// are not copied here): the old agent's IPv6 rules stay, so that IPv6
	// is still masqueraded, and the agent says so.
	rules6, err = s.savedOriginalRulesOf("ip6tables-nft-save")
	s.assert(err == nil && len(rules6) == 3 && strings.Contains(s.agentLogs(), "--enable-ipv6"),
		"step 5: but not from table ip6 nat, which this agent (no --enable-ipv6) does not program: the old IPv6 rules stay (ip6tables-nft-save: %d rules) and the log names --enable-ipv6 and cleanup-iptables --family ipv6 as the ways out", len(rules6))
	s.assert(after <= bound+time.Second, "step 5: removed %s after the old agent's last resync (its last rewrite of the chain), within the README's 2.25 x resyncInterval + 5 s = %s (it saw the last rewrite up to a quarter interval late, then waited 2 x resyncInterval + 5 s)",
		after.Round(100*time.Millisecond), bound)
	var legacyRules string
	err = waitFor(s.ctx, "the removal's log line and metric", 30*time.Second, 500*time.Millisecond, func() (bool, string, error) {
		body, code, err := httpGet(s.ctx, nodeHTTPClient(s.n.nodeNS), "http://127.0.0.1:9753/metrics")
		legacyRules = ""
		for _, l := range strings.Split(body, "\n") {
			if strings.HasPrefix(l, "ip_masq_agent_legacy_rules{") {
				legacyRules += l + "; "
			}
		}
		return err == nil && code == 200 && strings.Contains(legacyRules, `family="ipv4"} 0`) &&
			strings.Count(s.agentLogs(), "removed the original ip-masq-agent's iptables rules") == 1, legacyRules, err
	})
	s.assert(err == nil, "step 5: the agent logged once \"removed the original ip-masq-agent's iptables rules\"; %s", strings.TrimSuffix(legacyRules, "; "))

	// Step 6.
	s.docs.runChecked(diff, func(r docResult) bool {
		return exit0("in sync", agentFlagsNote, "kept ipv6:", "decisions: the switch from the original ip-masq-agent changes none")(r) && !strings.Contains(r.stdout, "decides first")
	}, "step 6: in sync; the old IPv6 rules kept, no decision changed")

	r, err := fs.stop()
	if err != nil {
		return err
	}
	switchTime := time.Since(t0)
	sum := r.sum
	s.assert(sum.StoppedBy == "server" && sum.Flows >= 500, "the stream ran through the whole switch: %d new flows in %.1fs, stopped by %s (want >= 500)", sum.Flows, sum.Seconds, sum.StoppedBy)
	s.assert(r.wrong == 0 && r.serverWrong == 0 && r.errs == 0 && r.serverFlows >= sum.Flows,
		"every new flow during the switch left with the source the operator's config says: client saw %d wrong of %d, server saw %d wrong of %d; %d failed",
		r.wrong, sum.Flows, r.serverWrong, r.serverFlows, r.errs)
	checked, bad, err := s.conntrackNAT(want)
	s.assert(err == nil && bad == 0 && checked >= sum.Flows*9/10,
		"no double NAT: of the pod's %d conntrack entries to the echo port (%d flows in the switch; want >= 90%% still there), each was translated once to the node's address (masqueraded) or not at all (address and port untouched): %d otherwise (%v)",
		checked, sum.Flows, bad, err)

	// The ConfigMap, the node's labels.
	cm, err := s.configMap()
	s.assert(err == nil && cm.UID == s.operatorCM.UID && cm.ResourceVersion == s.operatorCM.ResourceVersion && len(cm.Data) == 1 && cm.Data["config"] == operatorConfig,
		"the operator's ConfigMap is byte-for-byte unchanged (uid %s, resourceVersion %s -> %s, data.config %d bytes equal: %v)",
		cm.UID, s.operatorCM.ResourceVersion, cm.ResourceVersion, len(cm.Data["config"]), cm.Data["config"] == operatorConfig)
	labels, err1 := s.kubectl(15*time.Second, "get", "node", nodeName, "-o", "jsonpath={.metadata.labels}")
	pods, err2 := s.kubectl(15*time.Second, "-n", "kube-system", "get", "pods", "-l", agentSelector, "-o", `jsonpath={range .items[*]}{.spec.nodeName} {.status.conditions[?(@.type=="Ready")].status}{end}`)
	s.assert(err1 == nil && err2 == nil && !strings.Contains(labels, "masq-agent") && pods == nodeName+" True",
		"the agent runs (Ready) on %s, which carries no special label: %s", nodeName, labels)

	s.timing("upgrade: old rules removed", goneAt.Sub(tDel), fmt.Sprintf("after the old DaemonSet's deletion; %s after its last resync (README: within %s)", after.Round(100*time.Millisecond), bound))
	s.timing("upgrade: whole switch", switchTime, fmt.Sprintf("%d new flows, %d with the wrong source, %d failed", sum.Flows, r.wrong, r.errs))
	return nil
}

var ctEntryRE = regexp.MustCompile(`src=(\S+) dst=(\S+) sport=(\d+) dport=(\d+) .*src=(\S+) dst=(\S+) sport=(\d+) dport=(\d+)`)

// conntrackNAT checks every conntrack entry of the pod's connections to the
// echo port: a masqueraded destination's reply goes to the node's address,
// any other's to the pod's own address and port (no translation at all).
func (s *suite) conntrackNAT(want map[string]string) (checked, bad int, err error) {
	out, err := run(s.ctx, time.Minute, "nsenter", "--net="+s.n.nodeNS, "--", "conntrack", "-L", "-p", "tcp", "-s", s.podIP, "--dport", fmt.Sprint(echoPort))
	if err != nil {
		return 0, 0, err
	}
	var first []string
	for _, l := range strings.Split(out, "\n") {
		m := ctEntryRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		w, ok := want[m[2]]
		if !ok {
			continue
		}
		checked++
		okEntry := m[6] == w
		if w == s.podIP {
			okEntry = okEntry && m[8] == m[3] // the port untouched too
		}
		if !okEntry {
			bad++
			if len(first) < 3 {
				first = append(first, strings.Join(strings.Fields(l), " "))
			}
		}
	}
	if bad > 0 {
		return checked, bad, fmt.Errorf("first: %s", strings.Join(first, " | "))
	}
	return checked, bad, nil
}
