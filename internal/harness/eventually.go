package harness

import (
	"testing"
	"time"
)

// Eventually polls cond every 20ms for up to limit, and fails the test
// if it never holds: a test waits for a condition; it does not assert how
// fast it became true.
func Eventually(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out (%s) waiting for %s", limit, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
