package nft

import (
	"net/netip"
	"testing"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
)

// BenchmarkDecide: one decision of the conntrack cleanup (per distinct
// destination; the cleanup memoizes), on the table as built and as read
// back (the kernel's expressions).
func BenchmarkDecide(b *testing.B) {
	cfg := config.Default(config.Flags{})
	bit := uint8(DefaultConntrackLabel)
	want := Build(cfg, Options{Chain: DefaultChain, RandomFully: true, CtLabel: &bit})
	addr := netip.MustParseAddr("203.0.113.10")
	b.Run("Decide", func(b *testing.B) {
		for range b.N {
			want.Decide(addr)
		}
	})
	b.Run("Decider", func(b *testing.B) {
		d := want.Decider()
		for range b.N {
			d(addr)
		}
	})
}
