package kernel

import (
	"errors"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
)

// TestProbeAnswers: the first refused message of the probe names the
// feature it asks for and the oldest kernel with it; the sentinel's
// refusal alone, or a transaction refused whole, is no finding.
func TestProbeAnswers(t *testing.T) {
	b, err := probeBatch(true)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(b.op); n != len(b.msgs) || b.op[n-1] != probeSentinel || b.op[n-2] != probeOwned {
		t.Fatalf("%d messages, features %v: want the owned table, then the sentinel last", len(b.msgs), b.op)
	}
	if err := lacks(b.op, len(b.op)-2, syscall.EINVAL); err != nil {
		t.Errorf("the owned table refused: %v, want nil (not essential)", err)
	}
	if nb, _ := probeBatch(false); len(nb.op) != len(b.op)-1 || nb.op[len(nb.op)-2] == probeOwned {
		t.Errorf("without ownership the probe asks for it: %v", nb.op)
	}
	first := map[int]int{} // feature: its first message
	for i, f := range b.op {
		if _, ok := first[f]; !ok {
			first[f] = i
		}
	}
	for i, f := range features {
		m, ok := first[i]
		if !ok {
			t.Errorf("feature %q has no message", f.what)
			continue
		}
		err := lacks(b.op, m, syscall.EOPNOTSUPP)
		if err == nil || !strings.Contains(err.Error(), f.what+" (Linux "+f.since+" or later; module "+f.module+")") ||
			!strings.HasSuffix(err.Error(), "operation not supported") {
			t.Errorf("message %d refused: %v", m, err)
		}
	}
	if err := lacks(b.op, len(b.op)-1, syscall.ENOENT); err != nil {
		t.Errorf("the sentinel refused: %v, want nil", err)
	}
	if err := lacks(b.op, -1, syscall.EPERM); err != nil {
		t.Errorf("the transaction refused whole: %v, want nil", err)
	}
	nat := lacks(b.op, first[2], syscall.EOPNOTSUPP)
	if nat == nil || nat.Error() != "the kernel lacks nat chains in the inet family (Linux 5.2 or later; module nft_chain_nat): operation not supported" {
		t.Errorf("nat chain refused: %v", nat)
	}
}

// TestProbeNamesTheKernelsRefusal: a part of the probe that the kernel
// refuses (here a chain of a type that no kernel has, asked right after
// the nat chain) is named from the kernel's answer, and nothing is left
// behind: no table, no generation.
func TestProbeNamesTheKernelsRefusal(t *testing.T) {
	n, topo := kernelNetlink(t)
	defer func(f []feature) { features = f }(features)
	missing := feature{what: "chains of a type that no kernel has", since: "never", module: "none",
		add: func(cc *nftables.Conn, t *nftables.Table) {
			cc.AddChain(&nftables.Chain{Table: t, Name: "x", Type: "no-such-type",
				Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
		}}
	features = append(append(slices.Clone(features[:3]), missing), features[3:]...)
	before, err := generation(mustReader(t, n))
	if err != nil {
		t.Fatal(err)
	}
	err = n.Probe()
	var lacks *LacksError
	if !errors.As(err, &lacks) || lacks.What != missing.what ||
		!strings.HasPrefix(err.Error(), "the kernel lacks chains of a type that no kernel has (Linux never or later; module none): ") {
		t.Fatalf("Probe: %v, want the refused chain type named", err)
	}
	t.Logf("the kernel's answer: %v", err)
	if after, err := generation(mustReader(t, n)); err != nil || after != before {
		t.Errorf("generation %d -> %d (%v): the probe committed", before, after, err)
	}
	if out, err := topo.NFT("list", "tables"); err != nil || strings.Contains(out, "probe") {
		t.Errorf("nft list tables after the probe: %v\n%s", err, out)
	}
}

func mustReader(t *testing.T, n *Netlink) *netlink.Conn {
	t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	c, err := n.reader()
	if err != nil {
		t.Fatal(err)
	}
	return c
}
