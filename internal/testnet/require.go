package testnet

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

var (
	kernelOnce   sync.Once
	kernelReason string
)

// Require skips the test with a clear reason when the process is not root, or
// cannot create network namespaces, or nf_tables is not usable, or the `ip`
// or `nft` binary (or one of binaries) is not in PATH — EXCEPT when the
// environment variable CI=true, where it calls t.Fatalf with the same reason
// (a CI that skipped the kernel tests must be red).
func Require(t testing.TB, binaries ...string) {
	t.Helper()
	if reason := requireReason(binaries); reason != "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("testnet: %s (CI=true: kernel tests must not be skipped)", reason)
			return
		}
		t.Skipf("testnet: %s", reason)
	}
}

func requireReason(binaries []string) string {
	if os.Geteuid() != 0 {
		return fmt.Sprintf("needs root (euid is %d)", os.Geteuid())
	}
	for _, b := range append([]string{"ip", "nft"}, binaries...) {
		if _, err := exec.LookPath(b); err != nil {
			return fmt.Sprintf("needs the %q binary: %v", b, err)
		}
	}
	kernelOnce.Do(func() { kernelReason = probeKernel() })
	return kernelReason
}

// probeKernel creates a throwaway network namespace (on a locked thread that is
// moved back afterwards) and lists the nf_tables ruleset inside it.
func probeKernel() string {
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		return fmt.Sprintf("no network namespace support: %v", err)
	}
	res := make(chan string, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			res <- fmt.Sprintf("cannot open the current network namespace: %v", err)
			return
		}
		defer orig.Close()
		reason := probeInFreshNS()
		// Move back and unlock; if that fails stay locked, so that the
		// thread is discarded (or wedged, if it is the main thread).
		if err := netns.Set(orig); err == nil {
			runtime.UnlockOSThread()
		}
		res <- reason
	}()
	return <-res
}

// probeInFreshNS moves the calling (locked) thread to a new network namespace
// and lists the nf_tables ruleset there.
func probeInFreshNS() string {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return fmt.Sprintf("cannot create a network namespace: unshare(CLONE_NEWNET): %v", err)
	}
	// A child started from this locked thread inherits its namespace.
	out, err := exec.Command("nft", "list", "ruleset").CombinedOutput()
	if err != nil {
		return fmt.Sprintf("nf_tables not usable (nft list ruleset in a fresh netns: %v: %s)", err, strings.TrimSpace(string(out)))
	}
	return ""
}
