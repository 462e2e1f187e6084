package main

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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
	// A probe that cannot ask (no socket) is no finding about the kernel.
	probe = func(*kernel.Netlink, nft.Options) error {
		return errors.New("probe the kernel: open netlink socket: too many open files")
	}
	var out, errOut syncBuffer
	if code := run([]string{"--once", "--release-on-exit=false", "--config", cfg}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), `msg="cannot ask the kernel what it can do"`) {
		t.Errorf("a failed probe: exit %d\n%s", code, errOut.String())
	}
}

// TestOnceAsksWhenRefused: --once that writes the table unowned asks the
// probe only after the kernel refused a message of its write, for the
// config's table (snat when it has an address); not after a bad config,
// a failed read, nor when the table is another process's.
func TestOnceAsksWhenRefused(t *testing.T) {
	lacking := &kernel.LacksError{What: "the fib expression", Since: "4.10", Module: "nft_fib_inet", Err: syscall.ENOENT}
	refused := fmt.Errorf("apply: %w", &nft.RefusedError{Op: "add rule inet ip-masq-agent postrouting", Err: syscall.ENOENT})
	snat := config.Config{SNATAddress: netip.MustParseAddr("192.0.2.1")}
	for _, tc := range []struct {
		name     string
		err      error
		cfg      config.Config
		asked    bool
		wantSNAT bool
	}{
		{name: "applied", err: nil},
		{name: "kernel refused the write", err: refused, asked: true},
		{name: "kernel refused the write of a config with snatAddress", err: refused, cfg: snat, asked: true, wantSNAT: true},
		{name: "bad config", err: errors.New(`/etc/config/ip-masq-agent: nonMasqueradeCIDRs[0]: "x" is not a valid CIDR`)},
		{name: "read failed", err: fmt.Errorf("read the table: %w", syscall.ENOBUFS)},
		{name: "table owned by another process", err: fmt.Errorf("apply: %w", nft.ErrOwnedByOther)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var asked []nft.Options
			got := onceRefused(tc.err, tc.cfg, func(o nft.Options) error { asked = append(asked, o); return lacking }, nft.Options{Chain: "C"})
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

// TestAsksFirst: the daemon and --once that owns the table ask the probe
// before they write; --once that writes it unowned (the default) and
// --cleanup do not.
func TestAsksFirst(t *testing.T) {
	for _, tc := range []struct {
		cleanup, once, noOwner, want bool
	}{
		{want: true}, {noOwner: true, want: true}, // the daemon
		{once: true, want: true}, // --once --release-on-exit=false
		{once: true, noOwner: true},
		{cleanup: true}, {cleanup: true, noOwner: true},
	} {
		if got := asksFirst(tc.cleanup, tc.once, tc.noOwner); got != tc.want {
			t.Errorf("cleanup %v once %v noOwner %v: asks first %v, want %v", tc.cleanup, tc.once, tc.noOwner, got, tc.want)
		}
	}
}

// TestOnceRun: --once's steps in order. A refused write: the sync's own
// error line, then what the kernel lacks, then the release, exit 1. A
// write taken: no question, the release, exit 0. A table owned by another
// process: no question, its own line, exit 1.
func TestOnceRun(t *testing.T) {
	lacking := &kernel.LacksError{What: "the fib expression", Since: "4.10", Module: "nft_fib_inet", Err: syscall.ENOENT}
	refused := &nft.RefusedError{Op: "add rule inet ip-masq-agent postrouting", Err: syscall.ENOENT}
	for _, tc := range []struct {
		name      string
		err       error
		want      int
		asked     bool
		wantLines []string // the ERROR lines' messages, in order
	}{
		{name: "applied", want: 0},
		{name: "refused", err: refused, want: 1, asked: true,
			wantLines: []string{"sync failed; the kernel keeps its previous rules", "this kernel cannot run ip-masq-agent"}},
		{name: "owned by another process", err: nft.ErrOwnedByOther, want: 1,
			wantLines: []string{"sync failed; the kernel keeps its previous rules", "not applied: --once does not wait for the owner; run it again after that process exits"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf syncBuffer
			log := slog.New(slog.NewTextHandler(&buf, nil))
			var steps []string
			sync := func() error {
				steps = append(steps, "sync")
				if tc.err != nil {
					log.Error("sync failed; the kernel keeps its previous rules", "err", tc.err) // as the agent logs it
				}
				return tc.err
			}
			late := func(err error) error {
				steps = append(steps, "probe")
				return onceRefused(err, config.Config{}, func(nft.Options) error { return lacking }, nft.Options{})
			}
			code := runOnce(log, sync, late, func() { steps = append(steps, "release") })
			wantSteps := []string{"sync", "probe", "release"}
			if tc.err == nil {
				wantSteps = []string{"sync", "release"}
			}
			var lines []string
			for _, l := range strings.Split(buf.String(), "\n") {
				if _, m, ok := strings.Cut(l, "level=ERROR msg="); ok {
					m, _ = strconv.Unquote(m[:strings.Index(m, `" `)+1])
					lines = append(lines, m)
				}
			}
			if code != tc.want || !slices.Equal(steps, wantSteps) || !slices.Equal(lines, tc.wantLines) {
				t.Errorf("exit %d, steps %v, error lines %q; want exit %d, steps %v, lines %q\n%s", code, steps, lines, tc.want, wantSteps, tc.wantLines, buf.String())
			}
			if tc.asked && !strings.Contains(buf.String(), `err="the kernel lacks the fib expression (Linux 4.10 or later; module nft_fib_inet): no such file or directory"`) {
				t.Errorf("the probe's finding is not logged:\n%s", buf.String())
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
