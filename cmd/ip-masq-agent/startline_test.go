package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft/kernel"
)

// TestStartLine: the agent's first log line, which README "Verify" and
// the runbook read, names the version, the config source (its kind and
// path) and the flags given whose values differ from their defaults,
// nothing else: a flag given at its default, and --config (already
// named), are left out. The start probe refuses (a fake kernel that lacks
// something), so the agent stops right after the line and writes nothing
// (the daemon, and --once that owns the table, ask it before they write).
func TestStartLine(t *testing.T) {
	defer func(p func(*kernel.Netlink, nft.Options) error) { probe = p }(probe)
	probe = func(*kernel.Netlink, nft.Options) error {
		return &kernel.LacksError{What: "nat chains in the inet family", Since: "5.2", Module: "nft_chain_nat", Err: syscall.EOPNOTSUPP}
	}
	defer func(v string) { version = v }(version)
	version = "v9.8.7-test"
	dir := t.TempDir()
	cfg := filepath.Join(dir, "ip-masq-agent")
	if err := os.WriteFile(cfg, []byte("nonMasqueradeCIDRs: [10.0.0.0/8]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		args  []string
		want  string   // the line's attributes after msg
		never []string // flags it must not name
	}{
		{
			name: "defaults",
			args: []string{"--config", cfg},
			want: `version=v9.8.7-test config="file ` + cfg + `"`,
		},
		{
			name:  "non-default flags only",
			args:  []string{"--once", "--release-on-exit=false", "--config", dir, "--masq-chain=IP-MASQ", "--enable-ipv6", "--random-fully=true", "--masq-chain=IP-MASQ"},
			want:  `version=v9.8.7-test config="directory ` + dir + `" once=true release-on-exit=false masq-chain=IP-MASQ enable-ipv6=true`,
			never: []string{"random-fully", "http-address"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut syncBuffer
			if code := run(tc.args, &out, &errOut); code != 1 {
				t.Fatalf("exit %d, want 1 (the probe refuses); stderr:\n%s", code, errOut.String())
			}
			var starts []string
			for _, l := range strings.Split(errOut.String(), "\n") {
				if strings.Contains(l, `msg="starting ip-masq-agent"`) {
					starts = append(starts, l)
				}
			}
			if len(starts) != 1 {
				t.Fatalf("%d start lines, want 1; stderr:\n%s", len(starts), errOut.String())
			}
			_, attrs, _ := strings.Cut(starts[0], `msg="starting ip-masq-agent" `)
			if !sameAttrs(attrs, tc.want) {
				t.Errorf("start line attributes\n  %s\nwant (in any order)\n  %s", attrs, tc.want)
			}
			for _, f := range tc.never {
				if strings.Contains(attrs, f+"=") {
					t.Errorf("the start line names %s, given at its default: %s", f, attrs)
				}
			}
		})
	}
}

// sameAttrs: the same key=value attributes (no value here holds a space
// outside quotes but config's, which is quoted), in any order.
func sameAttrs(got, want string) bool {
	split := func(s string) map[string]int {
		m := map[string]int{}
		var cur strings.Builder
		quoted := false
		for _, r := range strings.TrimSpace(s) + " " {
			switch {
			case r == '"':
				quoted = !quoted
				cur.WriteRune(r)
			case r == ' ' && !quoted:
				if cur.Len() > 0 {
					m[cur.String()]++
				}
				cur.Reset()
			default:
				cur.WriteRune(r)
			}
		}
		return m
	}
	g, w := split(got), split(want)
	if len(g) != len(w) {
		return false
	}
	for k, n := range w {
		if g[k] != n {
			return false
		}
	}
	return true
}
