package config

import (
	"fmt"
	"strings"
	"testing"
)

// configBlocks is the shape of the --once cost test's files: cidrLimit,
// then n /24 blocks as a compact block sequence.
func configBlocks(n int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "cidrLimit: %d\nnonMasqueradeCIDRs:\n", n)
	for i := range n {
		fmt.Fprintf(&b, "- 10.%d.%d.0/24\n", i>>8&255, i&255)
	}
	return []byte(b.String())
}

func benchParse(b *testing.B, data []byte) {
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := Parse(data, v4Only); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParse10k(b *testing.B)        { benchParse(b, configBlocks(10000)) }
func BenchmarkParseBlocks100k(b *testing.B) { benchParse(b, configBlocks(100000)) }
