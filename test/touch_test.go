package test

import (
	"strings"
	"testing"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// The agent's debug lines (--v=2) that say what a read of a table it does
// not own read (nft/kernel.Netlink.Log).
const (
	readTouched = "read again what other processes' transactions touched"
	readWhole   = "read the table whole"
)

// TestForeignTouchOfLargeSetReadInParts: not owned, beside a large set
// (20,000 CIDRs; 100,000 under `make soak`), another process deletes one
// of the agent's elements, then adds one of its own. Each is repaired, as
// packets show, by asking the kernel for the elements the notifications
// name: neither the set nor the table is read whole (a dump of the set
// costs about 1.2 s of kernel CPU at 100,000).
func TestForeignTouchOfLargeSetReadInParts(t *testing.T) {
	n := pick(20_000, 100_000)
	topo := newTopology(t)
	addDestinations(t, topo, internet1, private1)
	cm := newConfigMapDir(t, "resyncInterval: 1h\n"+manyCIDRs(n, "10.250.0.0/16"))
	d := startDaemon(t, topo, "--config", cm.path(), "--http-address=127.0.0.1:0", "--own-table=false")
	eventually(t, "the rules", sourcesAre(topo, map[string]bool{internet1: true, private1: false}))
	waitStarted(t, d)
	for _, step := range []struct {
		name, verb, element string
	}{
		{"one of the agent's elements deleted", "delete", "10.250.0.0/16"},
		{"an element added", "add", "203.0.113.0/24"},
	} {
		mark := len(d.output())
		if out, err := topo.NFT(step.verb, "element", "inet", nft.TableName, nft.SetNonMasqV4, "{ "+step.element+" }"); err != nil {
			t.Fatalf("%s: %v\n%s", step.name, err, out)
		}
		eventually(t, step.name+": the repair", func() bool { return strings.Contains(d.output()[mark:], repairLine) })
		expectSources(t, topo, map[string]bool{internet1: true, private1: false})
		logs := d.output()[mark:]
		if !strings.Contains(logs, readTouched) || !strings.Contains(logs, "elements=2") || !strings.Contains(logs, "whole=false") {
			t.Errorf("%s: the agent did not say it read the two elements touched:\n%s", step.name, logs)
		}
		if strings.Contains(logs, readWhole) || strings.Contains(logs, "sets=["+nft.SetNonMasqV4) {
			t.Errorf("%s: the agent read more than what was touched:\n%s", step.name, logs)
		}
	}
}
