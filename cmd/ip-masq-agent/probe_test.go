package main

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft/kernel"
)

// TestKernelLackingRefused: when the start probe finds the kernel lacking
// something the table needs, the daemon and --once that owns the table
// exit 1 with one error line that names what is missing (the kernel's
// answer only: no version is read), before anything is written; --cleanup
// does not probe, nor does --once that writes the table unowned (the
// default) before it writes (TestOnceAsksWhenRefused).
func TestKernelLackingRefused(t *testing.T) {
	lacking := &kernel.LacksError{What: "nat chains in the inet family", Since: "5.2", Module: "nft_chain_nat", Err: syscall.EOPNOTSUPP}
	probed := 0
	defer func(p func(*kernel.Netlink, nft.Options) error) { probe = p }(probe)
	probe = func(*kernel.Netlink, nft.Options) error { probed++; return lacking }
	// A bad config: should the probe not stop the agent, it reads the
	// config before the kernel, and stops there (this test must never
	// program the test machine's own namespace).
	cfg := filepath.Join(t.TempDir(), "ip-masq-agent")
	if err := os.WriteFile(cfg, []byte("nonMasqueradeCIDRs: [not-a-cidr]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"--once", "--release-on-exit=false"}, {"--http-address=127.0.0.1:0"}} {
		var out, errOut syncBuffer
		probed = 0
		exited := make(chan int, 1)
		go func() { exited <- run(append(args, "--config", cfg), &out, &errOut) }()
		var code int
		select {
		case code = <-exited:
		case <-time.After(20 * time.Second): // the daemon runs on
			t.Fatalf("%v: still running after the probe's refusal:\n%s", args, errOut.String())
		}
		var errs []string
		for _, l := range strings.Split(errOut.String(), "\n") {
			if strings.Contains(l, "level=ERROR") {
				errs = append(errs, l)
			}
		}
		if code != 1 || probed != 1 || len(errs) != 1 ||
			!strings.Contains(errs[0], `msg="this kernel cannot run ip-masq-agent" err="the kernel lacks nat chains in the inet family (Linux 5.2 or later; module nft_chain_nat): operation not supported"`) {
			t.Errorf("%v: exit %d, probed %d times, error lines %q; stderr:\n%s", args, code, probed, errs, errOut.String())
		}
		if strings.Contains(errOut.String(), `msg="applied`) {
			t.Errorf("%v: applied after the probe's refusal:\n%s", args, errOut.String())
		}
	}
	// --once of an unowned table asks nothing before its write: here the
	// bad config stops it, and the probe is never asked.
	var out, errOut syncBuffer
	probed = 0
	if code := run([]string{"--once", "--config", cfg}, &out, &errOut); code != 1 || probed != 0 ||
		!strings.Contains(errOut.String(), `msg="config not applied; the rules in the kernel are unchanged"`) {
		t.Errorf("--once: exit %d, probed %d times; stderr:\n%s", code, probed, errOut.String())
	}
	// A probe that cannot ask (no socket) is no finding about the kernel.
	probe = func(*kernel.Netlink, nft.Options) error {
		return errors.New("probe the kernel: open netlink socket: too many open files")
	}
	errOut = syncBuffer{}
	if code := run([]string{"--once", "--release-on-exit=false", "--config", cfg}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), `msg="cannot ask the kernel what it can do"`) {
		t.Errorf("a failed probe: exit %d\n%s", code, errOut.String())
	}
}

// TestOnceAsksWhenRefused: --once that writes the table unowned asks the
// probe only after the kernel refused its write of a good config, for
// that config's table (snat when it has an address); not after a bad
// config, nor when the table is another process's.
func TestOnceAsksWhenRefused(t *testing.T) {
	lacking := &kernel.LacksError{What: "the fib expression", Since: "4.10", Module: "nft_fib_inet", Err: syscall.ENOENT}
	refused := fmt.Errorf("apply: %w", syscall.ENOENT)
	snat := config.Config{SNATAddress: netip.MustParseAddr("192.0.2.1")}
	for _, tc := range []struct {
		name     string
		err      error
		cfg      config.Config
		cerr     error
		asked    bool
		wantSNAT bool
	}{
		{name: "applied", err: nil},
		{name: "kernel refused the write", err: refused, asked: true},
		{name: "kernel refused the write of a config with snatAddress", err: refused, cfg: snat, asked: true, wantSNAT: true},
		{name: "bad config", err: errors.New("bad"), cerr: errors.New("bad")},
		{name: "table owned by another process", err: fmt.Errorf("apply: %w", nft.ErrOwnedByOther)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var asked []nft.Options
			got := onceRefused(tc.err, tc.cfg, tc.cerr, func(o nft.Options) error { asked = append(asked, o); return lacking }, nft.Options{Chain: "C"})
			if !tc.asked {
				if len(asked) != 0 || got != nil {
					t.Errorf("asked %v, answer %v; want not asked", asked, got)
				}
				return
			}
			if len(asked) != 1 || got != lacking || asked[0].SNAT != tc.wantSNAT || asked[0].Chain != "C" {
				t.Errorf("asked %+v, answer %v; want asked once with snat %v", asked, got, tc.wantSNAT)
			}
		})
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
