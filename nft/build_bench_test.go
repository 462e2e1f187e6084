package nft

import (
	"net/netip"
	"testing"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
)

// BenchmarkBuild100k is Build of 100,000 non-adjacent /29s (the bench's
// lists), whose merge changes nothing: what merging costs the apply path.
// Mostspecific adds 1,000 masqueradeCIDRs inside them.
func BenchmarkBuild100k(b *testing.B) {
	c := config.Default(config.Flags{})
	for i := range 100_000 {
		v := uint32(100<<24|64<<16) + uint32(i)*32
		c.NonMasqueradeCIDRs = append(c.NonMasqueradeCIDRs, netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), 29))
	}
	o := Options{Chain: DefaultChain}
	b.Run("listOrder", func(b *testing.B) {
		for b.Loop() {
			Build(c, o)
		}
	})
	ms := c
	for i := range 1000 {
		v := uint32(100<<24|64<<16) + uint32(i)*3200
		ms.MasqueradeCIDRs = append(ms.MasqueradeCIDRs, netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), 32))
	}
	ms.CIDRMatch = config.MostSpecific
	b.Run("mostSpecific", func(b *testing.B) {
		for b.Loop() {
			Build(ms, o)
		}
	})
}
