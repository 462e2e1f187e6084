//go:build !race

package config

import "testing"

// TestFastPathSameAsFullLarge: the fast path reads the 100,000-CIDR configs
// exactly as the library path does, for every set of flags. Each takes
// seconds through the library path under the race detector, so this test
// is built without -race only: `make test` runs it in a `go test` of its
// own, without -race, before the suite with -race.
func TestFastPathSameAsFullLarge(t *testing.T) {
	n := 0
	for _, in := range fastPathInputs(t) {
		if !largeInput(in.data) {
			continue
		}
		n++
		samePaths(t, []byte(in.data), allFlags[0]) // the flags change only the checks of the values, after either path
	}
	if n < 3 {
		t.Errorf("%d inputs of more than 200,000 bytes, want the 3 100,000-CIDR configs of fastShaped at least", n)
	}
	t.Logf("%d configs of 100,000 CIDRs read alike by both paths", n)
}
