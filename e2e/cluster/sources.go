package main

import (
	"errors"
	"os"
	"strings"
	"time"
)

// sourceSelection: issue 33's keys that select traffic by its source, on a
// real node: the changed ConfigMap (configChange) with
// nonMasqueradeSourceCIDRs holding the client pod, then with
// masqueradeSourceCIDRs (the "pods only" guard) holding another range and
// then the pod's; packets from the client pod show each decision. It ends
// with the changed ConfigMap again, as docCommandsOnNode expects.
func (s *suite) sourceSelection() error {
	pod := s.podIP + "/32"
	steps := []struct {
		what  string
		extra string // lines added to the changed config
		set   string // the set that must hold want before packets are sent
		want  string
		masq  map[string]bool
	}{
		{"nonMasqueradeSourceCIDRs holds the client pod: none of its traffic is masqueraded",
			"    nonMasqueradeSourceCIDRs: [" + pod + "]\n", "nonmasq-src-v4", s.podIP,
			map[string]bool{internetDst: false, partnerDst: false, privateDst: false}},
		{"masqueradeSourceCIDRs holds another range only: the client pod's traffic is never masqueraded",
			"    masqueradeSourceCIDRs: [10.99.0.0/16]\n", "masq-src-v4", "10.99.0.0/16",
			map[string]bool{internetDst: false, partnerDst: false, privateDst: false}},
		{"masqueradeSourceCIDRs holds the client pod: its traffic is decided by destination, as under the changed config",
			"    masqueradeSourceCIDRs: [" + pod + "]\n", "masq-src-v4", s.podIP,
			map[string]bool{internetDst: false, partnerDst: true, privateDst: true}},
	}
	for i, st := range steps {
		cm := strings.Replace(changedConfigMap(), "    resyncInterval: 60s\n", "    resyncInterval: 60s\n"+st.extra, 1)
		path := s.n.path("manifests", "sources.yaml")
		if err := os.WriteFile(path, []byte(cm), 0o644); err != nil {
			return err
		}
		s.logf("source selection %d: kubectl apply of the changed ConfigMap with %s", i+1, strings.TrimSpace(st.extra))
		if out, err := s.kubectlAll(time.Minute, "apply", "-f", path); err != nil {
			return errors.New("apply: " + err.Error() + ": " + out)
		}
		var got string
		err := waitFor(s.ctx, "set "+st.set+" in the kernel", 150*time.Second, 200*time.Millisecond, func() (bool, string, error) {
			out, err := s.nodeNft("list", "set", "inet", "ip-masq-agent", st.set)
			got = out
			return err == nil && strings.Contains(out, st.want), out, nil
		})
		if !s.assert(err == nil, "source selection %d: set %s holds %s (%s)", i+1, st.set, st.want, oneLine(got, nil)) {
			return errors.New("the source selection config did not reach the kernel")
		}
		s.expect("source selection: "+st.what, st.masq)
	}
	// Back to the changed config: the source sets go.
	if out, err := s.kubectlAll(time.Minute, "apply", "-f", s.n.path("manifests", "changed.yaml")); err != nil {
		return errors.New("apply: " + err.Error() + ": " + out)
	}
	err := waitFor(s.ctx, "the source sets gone", 150*time.Second, 200*time.Millisecond, func() (bool, string, error) {
		out, err := s.nodeNft("list", "table", "inet", "ip-masq-agent")
		return err == nil && !strings.Contains(out, "masq-src-v4"), "", nil
	})
	s.assert(err == nil, "source selection: back to the changed config, no source set left in the table")
	return nil
}
