package agent

import (
	"errors"
	"strings"
	"testing"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// TestOnceDoesNotSayItWaits: --once (Options.Once) meets a table owned by
// another process: Sync fails with ErrOwnedByOther, which the caller
// reports before it exits, and nothing says the agent waits for the owner.
func TestOnceDoesNotSayItWaits(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Once = true })
	want := h.want("")
	other := want.Clone()
	other.Owner = nft.OwnedByOther
	h.fake.Tamper("other agent", func(t **nft.Table) { *t = other.Clone() })
	if err := h.a.Sync(t0); !errors.Is(err, nft.ErrOwnedByOther) {
		t.Fatalf("Sync: %v, want ErrOwnedByOther", err)
	}
	if strings.Contains(h.logs.String(), "waiting for it to exit") {
		t.Errorf("--once said it waits for the owner:\n%s", h.logs.String())
	}
}
