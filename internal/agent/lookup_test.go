package agent

import (
	"errors"
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
// array's (array) or the tree's; until it answers (unknownFor: that many
// asks fail), it cannot say.
type lookupKernel struct {
	*nft.Fake
	array      bool
	unknownFor int
	asked      int
}

func (k *lookupKernel) IntervalLookup() (bool, error) {
	k.asked++
	if k.asked <= k.unknownFor {
		return false, errors.New("no answer")
	}
	return k.array, nil
}

// On a kernel whose lookup is the array's the agent joins adjacent CIDRs
// from its first build; on the tree's it keeps them apart. A resync then
// sends nothing, and a restart takes the table over unchanged. A kernel
// that could not say at first is asked again at the next sync, which then
// joins (logged as such, no decision changed).
func TestJoinsAdjacentOnArrayLookup(t *testing.T) {
	const yaml = "nonMasqueradeCIDRs: [10.0.0.0/24, 10.0.1.0/24, 192.0.2.0/24]\n"
	for _, tc := range []struct {
		name       string
		array      bool
		unknownFor int
	}{{"array", true, 0}, {"tree", false, 0}, {"array, said late", true, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			k := &lookupKernel{Fake: h.fake, array: tc.array, unknownFor: tc.unknownFor}
			h.a.kernel = k
			h.write(yaml)
			cfg, _, err := config.Parse([]byte(yaml), h.a.opts.Flags)
			if err != nil {
				t.Fatal(err)
			}
			o := h.a.opts.NFT
			o.MergeAdjacent = tc.array
			want := nft.Build(cfg, o)
			want.Owner, want.Persist = nft.OwnedByUs, true
			if n := len(want.Set(nft.SetNonMasqV4).Elements); tc.array && n != 3 || !tc.array && n != 4 {
				t.Fatalf("%d elements in %s", n, nft.SetNonMasqV4)
			}
			if err := h.a.Sync(time.Now()); err != nil {
				t.Fatal(err)
			}
			if tc.unknownFor > 0 {
				if err := h.a.Sync(time.Now()); err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(h.logs.String(), "joined adjacent CIDRs into one set element each; no decision changed") {
					t.Errorf("the late join was not logged:\n%s", h.logs)
				}
				if len(h.applied) != 1 {
					t.Errorf("the conntrack cleanup ran %d times; want once (the first apply; a join changes no decision)", len(h.applied))
				}
			}
			h.holds(want, "after the first syncs")
			sent := h.sent()
			if err := h.a.Sync(time.Now()); err != nil {
				t.Fatal(err)
			}
			if h.sent() != sent {
				t.Errorf("a resync sent %v", h.fake.Sent()[sent:])
			}
			if k.asked != tc.unknownFor+1 {
				t.Errorf("the kernel was asked %d times, want %d", k.asked, tc.unknownFor+1)
			}
			// A restart builds as the kernel allows before its first write.
			k2 := &lookupKernel{Fake: h.fake, array: tc.array}
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

// A config with no adjacent CIDRs has nothing to join: the kernel is not
// asked (its question commits a table of its own twice).
func TestNoLookupWithoutAdjacent(t *testing.T) {
	h := newHarness(t, nil)
	k := &lookupKernel{Fake: h.fake, array: true}
	h.a.kernel = k
	h.write("nonMasqueradeCIDRs: [10.0.0.0/24, 10.0.2.0/24]\n")
	for range 2 {
		if err := h.a.Sync(time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if k.asked != 0 {
		t.Errorf("the kernel was asked %d times", k.asked)
	}
	// Then a config with some: asked once, and joined from its first write.
	h.write("nonMasqueradeCIDRs: [10.0.0.0/24, 10.0.1.0/24]\n")
	if err := h.a.Sync(time.Now()); err != nil {
		t.Fatal(err)
	}
	if k.asked != 1 || len(h.fake.Table().Set(nft.SetNonMasqV4).Elements) != 2 {
		t.Errorf("asked %d times; %s holds %v", k.asked, nft.SetNonMasqV4, h.fake.Table().Set(nft.SetNonMasqV4).Elements)
	}
}
