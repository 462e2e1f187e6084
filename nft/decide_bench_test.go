package nft

import (
	"net/netip"
	"testing"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
)

// BenchmarkDecide: one decision of the conntrack cleanup, evaluated
// (Decide; Evaluate: with the expressions encoded once, as Decider does for
// each new destination) or remembered (Decider, asked again).
func BenchmarkDecide(b *testing.B) {
	cfg := config.Default(config.Flags{})
	bit := uint8(DefaultConntrackLabel)
	want := Build(cfg, Options{Chain: DefaultChain, RandomFully: true, CtLabel: &bit})
	addr := netip.MustParseAddr("203.0.113.10")
	b.Run("Decide", func(b *testing.B) {
		for range b.N {
			want.Decide(Packet{Dst: addr})
		}
	})
	b.Run("Evaluate", func(b *testing.B) {
		d := newDecider(want)
		p := Packet{Src: netip.MustParseAddr("10.244.1.5"), Dst: addr}
		for range b.N {
			d.t.decide(p)
		}
	})
	b.Run("Decider", func(b *testing.B) {
		d := want.Decider()
		for range b.N {
			d(Packet{Dst: addr})
		}
	})
}
