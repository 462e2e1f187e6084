package windows

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func TestWindowsGolden(t *testing.T) {
	for _, tc := range []struct {
		name  string
		yaml  string
		flags config.Flags
		warns []string // substrings, one per warning
	}{
		{name: "defaults"},
		{name: "seed-exception-list", yaml: "nonMasqueradeCIDRs: [192.168.0.0/16, 11.0.0.0/8, 10.137.196.0/23]\nmasqLinkLocal: true\n"},
		{name: "k8s-docs-example", yaml: "nonMasqueradeCIDRs:\n  - 10.0.0.0/8\nresyncInterval: 60s\nmasqLinkLocal: true\n"},
		{name: "as-written", yaml: "nonMasqueradeCIDRs: [10.1.0.0/16, 10.0.0.0/8, 10.1.0.0/16, \"::ffff:172.16.0.0/108\", 169.254.0.0/16]\n"},
		{name: "empty-list", yaml: "nonMasqueradeCIDRs: []\n"},
		{name: "cce-specific-addresses", flags: config.Flags{EnableIPv6: true}, yaml: `
masqueradeCIDRs: [10.10.10.10/32]
nonMasqueradeCIDRs: [10.0.0.0/8, 172.16.0.0/12, 100.64.230.0/24, 192.168.0.0/16, "fc00::/7"]
masqOutBound: false
masqOutBoundIPv6: true
`, warns: []string{"masqueradeCIDRs (1) cannot be expressed", "masqOutBound: false cannot be expressed", "1 IPv6 nonMasqueradeCIDRs left out"}},
		{name: "source-exceptions", yaml: "nonMasqueradeSourceCIDRs: [10.244.1.0/24]\n",
			warns: []string{"nonMasqueradeSourceCIDRs (1) cannot be expressed: the ExceptionList holds destinations only"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _, err := config.Parse([]byte(tc.yaml), tc.flags)
			if err != nil {
				t.Fatal(err)
			}
			p, warns := For(cfg, tc.flags.EnableIPv6)
			if len(warns) != len(tc.warns) {
				t.Errorf("warnings %q, want %d", warns, len(tc.warns))
			}
			for i := range min(len(warns), len(tc.warns)) {
				if !strings.Contains(warns[i], tc.warns[i]) {
					t.Errorf("warning %q lacks %q", warns[i], tc.warns[i])
				}
			}
			got := Render(p)
			path := filepath.Join("testdata", "windows-cni", tc.name+".json")
			if *update {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./nft/ -update to create it)", err)
			}
			if got != string(want) {
				t.Errorf("differs from %s (rerun with -update if intended):\n%s", path, got)
			}
			// It is the seeds' format: an entry of a CNI config's "policies".
			var cni struct {
				Policies []struct {
					Name  string
					Value struct {
						Type          string
						ExceptionList []string
					}
				}
			}
			if err := json.Unmarshal([]byte(`{"policies": [`+got+`]}`), &cni); err != nil || len(cni.Policies) != 1 ||
				cni.Policies[0].Name != "EndpointPolicy" || cni.Policies[0].Value.Type != "OutBoundNAT" ||
				!slices.Equal(cni.Policies[0].Value.ExceptionList, p.Value.ExceptionList) {
				t.Errorf("not an OutBoundNAT policy: %v %+v", err, cni)
			}
		})
	}
}
