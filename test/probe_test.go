package test

import (
	"strings"
	"testing"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft/kernel"
)

// TestKernelProbe: this kernel has what the agent needs (the probe says
// nothing is missing), and the probe changes nothing: no table, no new
// generation.
func TestKernelProbe(t *testing.T) {
	topo := newTopology(t)
	k := &kernel.Netlink{NetNS: int(topo.NodeHandle())}
	defer k.Close()
	_, before, err := k.Read()
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Probe(); err != nil {
		t.Errorf("Probe: %v", err)
	}
	_, after, err := k.Read()
	if err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("the probe moved the generation from %d to %d: a transaction committed", before, after)
	}
	if out, err := topo.NFT("list", "tables"); err != nil || strings.Contains(out, "probe") {
		t.Errorf("nft list tables after the probe: %v\n%s", err, out)
	}
}
