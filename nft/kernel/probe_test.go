package kernel

import (
	"strings"
	"syscall"
	"testing"
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
