package testnet

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

var (
	kernelOnce   sync.Once
	kernelReason string
)

// packages names the Debian package that installs each binary the tests,
// the demo and the container test run (checked against dpkg by
// TestPackagesAreDebians, and against hack/deps.sh, which installs them
// all, by TestPackagesInDeps). A binary that is not here cannot be
// required, nor run through Exec or RunInNode: add it here first.
var packages = map[string]string{
	"ip":                       "iproute2",
	"nft":                      "nftables",
	"iptables-nft":             "iptables",
	"iptables-nft-restore":     "iptables",
	"iptables-nft-save":        "iptables",
	"ip6tables-nft":            "iptables",
	"ip6tables-nft-restore":    "iptables",
	"iptables-legacy":          "iptables",
	"iptables-legacy-restore":  "iptables",
	"ip6tables-legacy":         "iptables",
	"ip6tables-legacy-restore": "iptables",
	"sysctl":                   "procps",
	"conntrack":                "conntrack",
	"setpriv":                  "util-linux",
	"unshare":                  "util-linux",
	"grep":                     "grep",
	"sed":                      "sed",
	"cat":                      "coreutils",
	"sleep":                    "coreutils",
	"false":                    "coreutils",
	"sh":                       "dash",
	"make":                     "make",
	"podman":                   "podman",
	"buildah":                  "buildah",
	"runc":                     "runc",
	"promtool":                 "prometheus",
}

// Package returns the Debian package that installs binary, and false when
// the tests do not know the binary (it is not in packages).
func Package(binary string) (string, bool) {
	p, ok := packages[binary]
	return p, ok
}

// undeclared says that binary is not in packages ("" when it is, or when it
// is a path, such as the agent built by the tests).
func undeclared(binary string) string {
	if _, ok := packages[binary]; ok || strings.Contains(binary, "/") {
		return ""
	}
	return fmt.Sprintf("the binary %s is not declared: add it and its Debian package to packages in internal/testnet/require.go", binary)
}

// declaredAndPresent says why binary cannot be run by a test: it is not
// declared in packages, or it is missing (with its package); "" when it can.
func declaredAndPresent(binary string) string {
	if reason := undeclared(binary); reason != "" || strings.Contains(binary, "/") {
		return reason
	}
	return MissingReason(binary)
}

// Missing returns the binaries that are not in PATH, in the order given.
func Missing(binaries ...string) []string {
	var missing []string
	for _, b := range binaries {
		if _, err := exec.LookPath(b); err != nil && !slices.Contains(missing, b) {
			missing = append(missing, b)
		}
	}
	return missing
}

// MissingReason says which binaries are missing and how to install them, as
// "needs the nft binary: apt-get install nftables (or make deps)"; "" when
// none is missing.
func MissingReason(binaries ...string) string {
	missing := Missing(binaries...)
	if len(missing) == 0 {
		return ""
	}
	var pkgs []string
	for _, b := range missing {
		if reason := undeclared(b); reason != "" {
			return reason
		}
		if p, _ := Package(b); !slices.Contains(pkgs, p) {
			pkgs = append(pkgs, p)
		}
	}
	slices.Sort(pkgs)
	what := "the " + missing[0] + " binary"
	if len(missing) > 1 {
		what = "the binaries " + strings.Join(missing, ", ")
	}
	return fmt.Sprintf("needs %s: apt-get install %s (or make deps)", what, strings.Join(pkgs, " "))
}

// Require decides whether a kernel test can run here; it needs root, the
// `ip` and `nft` binaries (and binaries), network namespaces and a usable
// nf_tables.
//
// Without root the test skips with the reason "needs root": `make test` run
// as a user runs the pure tests and says how many kernel tests it skipped.
// With CI=true it fails instead (a CI that skipped the kernel tests must be
// red).
//
// As root nothing is skipped: a missing binary fails the test with the
// package to install ("needs the nft binary: apt-get install nftables (or
// make deps)"), and so does a kernel without network namespaces or
// nf_tables.
func Require(t testing.TB, binaries ...string) {
	t.Helper()
	for _, b := range binaries {
		if reason := undeclared(b); reason != "" {
			t.Fatalf("testnet: %s", reason)
			return
		}
	}
	if os.Geteuid() != 0 {
		reason := fmt.Sprintf("testnet: %s", notRootReason())
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s (CI=true: kernel tests must not be skipped)", reason)
			return
		}
		t.Skipf("%s", reason)
		return
	}
	if reason := requireReason(binaries); reason != "" {
		t.Fatalf("testnet: %s", reason)
	}
}

func notRootReason() string {
	return fmt.Sprintf("needs root for the kernel tests (euid is %d)", os.Geteuid())
}

// requireReason says why the kernel tests cannot run as root here ("" when
// they can).
func requireReason(binaries []string) string {
	if reason := MissingReason(append([]string{"ip", "nft"}, binaries...)...); reason != "" {
		return reason
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
	var reason string
	if err := onThread(func() error { reason = probeInFreshNS(); return nil }); err != nil && reason == "" {
		return fmt.Sprintf("cannot open the current network namespace: %v", err)
	}
	return reason
}

// probeInFreshNS moves the calling (locked) thread to a new network namespace
// and lists the nf_tables ruleset there.
func probeInFreshNS() string {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return fmt.Sprintf("cannot create a network namespace: unshare(CLONE_NEWNET): %v (kernel tests need root with CAP_SYS_ADMIN; `make test-unit` runs the tests that need no privileges)", err)
	}
	// A child started from this locked thread inherits its namespace.
	out, err := exec.Command("nft", "list", "ruleset").CombinedOutput()
	if err != nil {
		return fmt.Sprintf("nf_tables not usable (nft list ruleset in a fresh netns: %v: %s)", err, strings.TrimSpace(string(out)))
	}
	return ""
}
