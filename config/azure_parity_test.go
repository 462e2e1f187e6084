package config

import (
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// azureRecord is expected.json: what Azure's ip-masq-agent-v2 binary did
// with a directory: exited, or wrote these rules (iptables-save's -d of
// its RETURN rules); testdata/azure-parity/README.md says how it was
// recorded. ("merged", Azure's merged config, is for reading.)
type azureRecord struct {
	Exits      bool     `json:"exits"`
	Error      string   `json:"error"`
	IPv4Return []string `json:"ipv4Return"`
	IPv6Return []string `json:"ipv6Return"`
	IPv6Rules  bool     `json:"ipv6Rules"`
}

// Where Azure exits, this agent goes on: each case's deliberate
// difference (docs/configuration.md, "Differences from Azure's ip-masq-agent-v2").
var azureExits = map[string]string{
	"bad-file":          "refused", // the bad file is named; nothing applied without a last good content
	"bad-bool":          "refused",
	"null-item":         "refused",
	"ipv6-not-enabled":  "refused",
	"cidrlimit-100-65":  "refused",
	"dangling-link":     "skipped", // warned about, the other files applied
	"subdirectory":      "skipped",
	"missing-directory": "missing",  // the defaults, with a warning naming the path
	"ipv4-mapped":       "unmapped", // iptables-restore refuses it there; here the IPv4 CIDR, with a warning
}

// TestAzureParity: every directory of testdata/azure-parity that Azure's
// agent accepts decides here as there; every one it exits on is a listed
// difference, named in an error or a warning.
func TestAzureParity(t *testing.T) {
	cases, err := filepath.Glob("testdata/azure-parity/*/expected.json")
	if err != nil || len(cases) < 40 {
		t.Fatalf("the corpus: %d cases, %v", len(cases), err)
	}
	for _, exp := range cases {
		dir := filepath.Dir(exp)
		name := filepath.Base(dir)
		t.Run(name, func(t *testing.T) {
			var rec azureRecord
			data, err := os.ReadFile(exp)
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(data, &rec); err != nil {
				t.Fatal(err)
			}
			var f Flags
			if flags, err := os.ReadFile(filepath.Join(dir, "flags")); err == nil {
				for _, fl := range strings.Fields(string(flags)) {
					switch fl {
					case "--enable-ipv6":
						f.EnableIPv6 = true
					case "--nomasq-all-reserved-ranges":
						f.NoMasqAllReservedRanges = true
					default:
						t.Fatalf("flag %q: teach the test", fl)
					}
				}
			}
			cdir := filepath.Join(dir, "config")
			var l Loader
			c, warns, err := l.Load(cdir, f)
			if rec.Exits {
				checkAzureExit(t, name, cdir, rec, c, warns, err)
				return
			}
			if _, listed := azureExits[name]; listed {
				t.Errorf("listed as a case where Azure exits, but Azure accepts it")
			}
			if err != nil {
				t.Fatalf("Azure applies it (%v); Load refused it: %v", rec.IPv4Return, err)
			}
			if got, want := ourReturns(c, false), azureReturns(t, rec.IPv4Return); !slices.Equal(got, want) {
				t.Errorf("IPv4 not masqueraded: here %q, Azure %q", got, want)
			}
			if rec.IPv6Rules != f.EnableIPv6 {
				t.Errorf("Azure programs IPv6: %v; here: %v", rec.IPv6Rules, f.EnableIPv6)
			}
			if rec.IPv6Rules {
				if got, want := ourReturns(c, true), azureReturns(t, rec.IPv6Return); !slices.Equal(got, want) {
					t.Errorf("IPv6 not masqueraded: here %q, Azure %q", got, want)
				}
			}
			// Azure's agent masquerades from every source: this agent's
			// extension, exempting sources, is a listed difference, warned
			// about by name.
			if len(c.NonMasqueradeSourceCIDRs) > 0 && !slices.ContainsFunc(warns, func(w string) bool {
				return strings.HasPrefix(w, cdir+"/ip-masq") && strings.Contains(w, KeyNonMasqSrc+": "+msgAzureExtension)
			}) {
				t.Errorf("nonMasqueradeSourceCIDRs applied without the extension's warning: %q", warns)
			}
			if len(c.MasqueradeCIDRs) > 0 || !c.MasqOutBound || !c.MasqOutBoundIPv6 {
				t.Errorf("Azure masquerades everything else; here: masqueradeCIDRs %v, masqOutBound %v, masqOutBoundIPv6 %v",
					c.MasqueradeCIDRs, c.MasqOutBound, c.MasqOutBoundIPv6)
			}
		})
	}
}

func checkAzureExit(t *testing.T, name, dir string, rec azureRecord, c Config, warns []string, err error) {
	t.Helper()
	how, ok := azureExits[name]
	if !ok {
		t.Fatalf("Azure exits (%s), and the case is not a listed difference", rec.Error)
	}
	named := func(s string) bool { return strings.Contains(s, dir+"/ip-masq") || strings.Contains(s, dir+":") }
	switch how {
	case "refused":
		var de *DirError
		if !errors.As(err, &de) || IsPartial(err) || !named(err.Error()) {
			t.Errorf("Azure exits (%s); want the file refused by name, nothing applied: %v", rec.Error, err)
		}
	case "skipped":
		if err != nil || !slices.ContainsFunc(warns, named) || len(c.NonMasqueradeCIDRs) == 0 {
			t.Errorf("Azure exits (%s); want the entry warned about by name and the other files applied: %s, %q, %v", rec.Error, c, warns, err)
		}
	case "unmapped":
		if err != nil || !slices.Contains(c.NonMasqueradeCIDRs, netip.MustParsePrefix("10.0.0.0/8")) ||
			!slices.ContainsFunc(warns, func(w string) bool { return named(w) && strings.Contains(w, "IPv4-mapped") }) {
			t.Errorf("Azure exits (%s); want the IPv4 CIDR applied, with a warning naming the file: %s, %q, %v", rec.Error, c, warns, err)
		}
	case "missing":
		if err != nil || !c.Equal(Default(Flags{})) || !slices.ContainsFunc(warns, func(w string) bool { return strings.HasPrefix(w, dir+": ") }) {
			t.Errorf("Azure exits (%s); want the defaults with a warning naming the path: %s, %q, %v", rec.Error, c, warns, err)
		}
	}
}

// ourReturns is what the config exempts from masquerading in a family:
// its CIDRs and link-local unless masqueraded, as sorted unique strings.
func ourReturns(c Config, v6 bool) []string {
	var out []string
	for _, p := range c.NonMasqueradeCIDRs {
		if p.Addr().Is6() == v6 {
			out = append(out, p.String())
		}
	}
	switch {
	case !v6 && !c.MasqLinkLocal:
		out = append(out, LinkLocalIPv4.String())
	case v6 && !c.MasqLinkLocalIPv6:
		out = append(out, LinkLocalIPv6.String())
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// azureReturns reads the -d arguments of Azure's rules (as iptables-save
// wrote them; a prefix length with a leading zero, as Azure hands it to
// iptables-restore, would be octal).
func azureReturns(t *testing.T, ss []string) []string {
	t.Helper()
	out := []string{}
	for _, s := range ss {
		addr, bits, _ := strings.Cut(s, "/")
		base := 10
		if len(bits) > 1 && bits[0] == '0' {
			base = 8
		}
		n, err := strconv.ParseUint(bits, base, 8)
		a, aerr := netip.ParseAddr(addr)
		if err != nil || aerr != nil {
			t.Fatalf("Azure's rule -d %q: %v %v", s, err, aerr)
		}
		p := netip.PrefixFrom(a, int(n)).Masked()
		out = append(out, p.String())
	}
	slices.Sort(out)
	return slices.Compact(out)
}
