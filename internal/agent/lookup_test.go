package agent

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/metrics"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// lookupKernel is the fake kernel with an interval-set lookup: the
// array's (array) or the tree's. Like kernel.Netlink it can say only
// about a table with an element.
type lookupKernel struct {
	*nft.Fake
	array bool
	asked int
}

func (k *lookupKernel) IntervalLookup(t *nft.Table) (bool, bool) {
	k.asked++
	if t == nil {
		return false, false
	}
	for _, s := range t.Sets {
		if len(s.Elements) > 0 {
			return k.array, true
		}
	}
	return false, false
}

// On a kernel whose lookup is the array's the agent joins adjacent CIDRs
// in its first sync, right after its first apply (one more transaction,
// which changes no decision; the sync's one log line says
// adjacent-cidrs=joined); on the tree's it keeps them apart. A resync
// then sends nothing, and a restart takes the table over unchanged.
func TestJoinsAdjacentOnArrayLookup(t *testing.T) {
	const yaml = "nonMasqueradeCIDRs: [10.0.0.0/24, 10.0.1.0/24, 192.0.2.0/24]\n"
	for _, array := range []bool{true, false} {
		t.Run(map[bool]string{true: "array", false: "tree"}[array], func(t *testing.T) {
			h := newHarness(t, nil)
			k := &lookupKernel{Fake: h.fake, array: array}
			h.a.kernel = k
			h.write(yaml)
			if err := h.a.Sync(time.Now()); err != nil {
				t.Fatal(err)
			}
			cfg, _, err := config.Parse([]byte(yaml), h.a.opts.Flags)
			if err != nil {
				t.Fatal(err)
			}
			o := h.a.opts.NFT
			o.MergeAdjacent = array
			want := nft.Build(cfg, o)
			want.Owner, want.Persist = nft.OwnedByUs, true
			h.holds(want, "after the first sync")
			if n := len(want.Set(nft.SetNonMasqV4).Elements); array && n != 3 || !array && n != 4 {
				t.Fatalf("%d elements in %s", n, nft.SetNonMasqV4)
			}
			if joined := strings.Contains(h.logs.String(), "adjacent-cidrs=joined"); joined != array {
				t.Errorf("joined logged: %v; want %v:\n%s", joined, array, h.logs)
			}
			sent := h.sent()
			if err := h.a.Sync(time.Now()); err != nil {
				t.Fatal(err)
			}
			if h.sent() != sent {
				t.Errorf("a resync sent %v", h.fake.Sent()[sent:])
			}
			// A restart: the table there says which lookup, before the build.
			k2 := &lookupKernel{Fake: h.fake, array: array}
			a2 := New(h.a.opts, k2, slog.New(slog.NewTextHandler(io.Discard, nil)), metrics.New("test", nil))
			if err := a2.Sync(time.Now()); err != nil {
				t.Fatal(err)
			}
			for _, p := range h.fake.Sent()[sent:] {
				for _, op := range p.Ops {
					if op.Kind == nft.KindElements {
						t.Errorf("the restart changed elements: %v", p)
					}
				}
			}
			h.holds(want, "after a restart")
		})
	}
}
