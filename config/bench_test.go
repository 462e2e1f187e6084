package config

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// configBlocks is the shape of the --once cost test's files (issue 11;
// /tmp/cfg10000.yaml, /tmp/cfg100000.yaml): cidrLimit, then n /24 blocks
// as a block sequence at column 0.
func configBlocks(n int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "cidrLimit: %d\nnonMasqueradeCIDRs:\n", n)
	for i := range n {
		fmt.Fprintf(&b, "- 10.%d.%d.0/24\n", i>>8&255, i&255)
	}
	return []byte(b.String())
}

// configJSON is configBlocks as JSON.
func configJSON(n int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "{\"cidrLimit\": %d, \"nonMasqueradeCIDRs\": [\n", n)
	for i := range n {
		if i > 0 {
			b.WriteString(",\n")
		}
		fmt.Fprintf(&b, "  \"10.%d.%d.0/24\"", i>>8&255, i&255)
	}
	b.WriteString("\n]}\n")
	return []byte(b.String())
}

// benchParse parses data as Parse does, through the fast path or not.
func benchParse(b *testing.B, data []byte, fast bool) {
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, _, err := parseKeysWith(data, v4Only, fast); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParse10k(b *testing.B)  { benchParse(b, configBlocks(10000), true) }
func BenchmarkParse100k(b *testing.B) { benchParse(b, configBlocks(100000), true) }

// The same through the library path, as Parse read them before the fast path.
func BenchmarkParse10kLibrary(b *testing.B)  { benchParse(b, configBlocks(10000), false) }
func BenchmarkParse100kLibrary(b *testing.B) { benchParse(b, configBlocks(100000), false) }

// An indented list of /32s (TestParse100k's config).
func BenchmarkParse100kIndented(b *testing.B) { benchParse(b, config100k(), true) }

// JSON has no fast path.
func BenchmarkParseJSON100k(b *testing.B) { benchParse(b, configJSON(100000), true) }

// BenchmarkDiff100k: a one-CIDR change out of 100,000 (the log line of
// every reload); a quadratic Diff took 12 s here.
func BenchmarkDiff100k(b *testing.B) {
	old := Default(Flags{})
	for i := range 100_000 {
		old.NonMasqueradeCIDRs = append(old.NonMasqueradeCIDRs, netip.PrefixFrom(netip.AddrFrom4([4]byte{100, byte(64 + i/8192), byte(i / 32 % 256), byte(i % 32 * 8)}), 29))
	}
	c := old
	c.NonMasqueradeCIDRs = append(slices.Clone(old.NonMasqueradeCIDRs), netip.MustParsePrefix("203.0.113.0/24"))
	for b.Loop() {
		if d := c.Diff(old); len(d) != 1 {
			b.Fatal(d)
		}
	}
}

// BenchmarkHash100k: the config's hash for /metrics, at every change.
func BenchmarkHash100k(b *testing.B) {
	c, _, err := Parse(configBlocks(100_000), v4Only)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = c.Hash()
	}
}
