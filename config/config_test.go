package config

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

var (
	v4Only = Flags{}
	v6     = Flags{EnableIPv6: true}
)

func prefixes(ss ...string) []netip.Prefix {
	out := []netip.Prefix{}
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// with returns Default(f) changed by edit.
func with(f Flags, edit func(*Config)) Config {
	c := Default(f)
	edit(&c)
	return c
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// check parses in and compares the result with want, wantErr and wantWarns.
func check(t *testing.T, in string, f Flags, want Config, wantErr string, wantWarns ...string) {
	t.Helper()
	samePaths(t, []byte(in), f)
	c, warns, err := Parse([]byte(in), f)
	// The note on extension keys (see TestParseExtensionNote) is checked
	// only where a test asks for it.
	if !slices.ContainsFunc(wantWarns, func(w string) bool { return strings.Contains(w, msgExtension) }) {
		warns = slices.DeleteFunc(warns, func(w string) bool { return strings.Contains(w, msgExtension) })
	}
	if got := errString(err); got != wantErr {
		t.Errorf("Parse(%q) error\n got: %s\nwant: %s", in, got, wantErr)
	}
	if !slices.Equal(warns, wantWarns) {
		t.Errorf("Parse(%q) warnings\n got: %q\nwant: %q", in, warns, wantWarns)
	}
	if err == nil && !c.Equal(want) {
		t.Errorf("Parse(%q) config\n got: %s\nwant: %s", in, c, want)
	}
	if err != nil && !c.Equal(Config{}) {
		t.Errorf("Parse(%q) returned a config with an error: %s", in, c)
	}
}

func TestDefault(t *testing.T) {
	tests := []struct {
		f     Flags
		cidrs []netip.Prefix
	}{
		{Flags{}, prefixes("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")},
		{Flags{EnableIPv6: true}, prefixes("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")},
		{Flags{NoMasqAllReservedRanges: true}, prefixes("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
			"100.64.0.0/10", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24",
			"198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "240.0.0.0/4")},
	}
	for _, tt := range tests {
		want := Config{
			NonMasqueradeCIDRs: tt.cidrs,
			MasqOutBound:       true,
			MasqOutBoundIPv6:   true,
			ResyncInterval:     60 * time.Second,
			CIDRLimit:          64,
		}
		c := Default(tt.f)
		if !c.Equal(want) || len(c.MasqueradeCIDRs) != 0 {
			t.Errorf("Default(%+v) = %s, want %s", tt.f, c, want)
		}
		// Each call returns fresh slices: a caller cannot change the defaults.
		c.NonMasqueradeCIDRs[0] = netip.MustParsePrefix("1.0.0.0/8")
		if !Default(tt.f).Equal(want) {
			t.Errorf("Default(%+v) changed after its result was modified", tt.f)
		}
	}
}

func TestParseExamples(t *testing.T) {
	cce := with(v6, func(c *Config) {
		c.MasqueradeCIDRs = prefixes("10.10.10.10/32")
		c.NonMasqueradeCIDRs = prefixes("10.0.0.0/8", "172.16.0.0/12", "100.64.230.0/24", "192.168.0.0/16", "fc00::/7")
		c.MasqOutBound = false
	})
	tests := []struct {
		name string
		in   string
		f    Flags
		want Config
	}{
		{"kubernetes docs", `
nonMasqueradeCIDRs:
  - 10.0.0.0/8
resyncInterval: 60s
`, v4Only, with(v4Only, func(c *Config) { c.NonMasqueradeCIDRs = prefixes("10.0.0.0/8") })},
		{"kubernetes docs with link-local", `
nonMasqueradeCIDRs:
  - 10.0.0.0/8
resyncInterval: 60s
masqLinkLocal: true
`, v4Only, with(v4Only, func(c *Config) {
			c.NonMasqueradeCIDRs = prefixes("10.0.0.0/8")
			c.MasqLinkLocal = true
		})},
		{"original agent, all keys", `
nonMasqueradeCIDRs: [10.0.0.0/8, 192.168.0.0/16]
cidrLimit: 10
masqLinkLocal: true
masqLinkLocalIPv6: true
resyncInterval: 5m
`, v6, with(v6, func(c *Config) {
			c.NonMasqueradeCIDRs = prefixes("10.0.0.0/8", "192.168.0.0/16")
			c.CIDRLimit = 10
			c.MasqLinkLocal = true
			c.MasqLinkLocalIPv6 = true
			c.ResyncInterval = 5 * time.Minute
		})},
		{"CCE YAML", `
masqueradeCIDRs:
  - 10.10.10.10/32
nonMasqueradeCIDRs:
  - 10.0.0.0/8
  - 172.16.0.0/12
  - 100.64.230.0/24
  - 192.168.0.0/16
  - fc00::/7
masqOutBound: false
masqOutBoundIPv6: true
masqLinkLocal: false
masqLinkLocalIPv6: false
resyncInterval: 60s
`, v6, cce},
		{"CCE JSON", `{
  "masqueradeCIDRs": ["10.10.10.10/32"],
  "nonMasqueradeCIDRs": ["10.0.0.0/8", "172.16.0.0/12", "100.64.230.0/24", "192.168.0.0/16", "fc00::/7"],
  "masqOutBound": false,
  "masqOutBoundIPv6": true,
  "masqLinkLocal": false,
  "masqLinkLocalIPv6": false,
  "resyncInterval": "60s"
}`, v6, cce},
		{"JSON with tabs and an escaped slash", "{\n\t\"nonMasqueradeCIDRs\": [\"10.0.0.0\\/8\"]\n}\n", v4Only,
			with(v4Only, func(c *Config) { c.NonMasqueradeCIDRs = prefixes("10.0.0.0/8") })},
		{"YAML flow mapping after a comment", "# a YAML flow mapping\n{nonMasqueradeCIDRs: [10.0.0.0/8], masqLinkLocal: yes}", v4Only,
			with(v4Only, func(c *Config) {
				c.NonMasqueradeCIDRs = prefixes("10.0.0.0/8")
				c.MasqLinkLocal = true
			})},
		{"byte order mark", "\xef\xbb\xbfmasqLinkLocal: true\n", v4Only,
			with(v4Only, func(c *Config) { c.MasqLinkLocal = true })},
		{"CRLF line ends", "nonMasqueradeCIDRs:\r\n  - 10.0.0.0/8\r\nmasqOutBound: false\r\n", v4Only,
			with(v4Only, func(c *Config) {
				c.NonMasqueradeCIDRs = prefixes("10.0.0.0/8")
				c.MasqOutBound = false
			})},
		{"a document start marker and one document", "---\nmasqLinkLocal: true\n", v4Only,
			with(v4Only, func(c *Config) { c.MasqLinkLocal = true })},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { check(t, tt.in, tt.f, tt.want, "") })
	}
}

func TestParseDefaults(t *testing.T) {
	reserved := Flags{NoMasqAllReservedRanges: true}
	empty := func(f Flags) Config {
		return with(f, func(c *Config) { c.NonMasqueradeCIDRs = []netip.Prefix{} })
	}
	tests := []struct {
		name string
		in   string
		f    Flags
		want Config
	}{
		{"empty", "", v4Only, Default(v4Only)},
		{"empty, reserved ranges", "", reserved, Default(reserved)},
		{"whitespace", " \n\r\n  ", v4Only, Default(v4Only)},
		{"comments only", "# ip-masq-agent\n  # nothing here\n", reserved, Default(reserved)},
		{"document marker", "---\n", v4Only, Default(v4Only)},
		{"YAML null", "~", v4Only, Default(v4Only)},
		{"JSON null", "null", reserved, Default(reserved)},
		{"empty mapping", "{}", reserved, Default(reserved)},
		{"list absent", "masqLinkLocal: false\n", reserved, Default(reserved)},

		{"empty list replaces defaults", "nonMasqueradeCIDRs: []\n", v4Only, empty(v4Only)},
		{"empty list replaces reserved defaults", "nonMasqueradeCIDRs: []\n", reserved, empty(reserved)},
		{"empty JSON list", `{"nonMasqueradeCIDRs": []}`, reserved, empty(reserved)},
		{"list replaces reserved defaults", "nonMasqueradeCIDRs: [192.168.0.0/16]\n", reserved,
			with(reserved, func(c *Config) { c.NonMasqueradeCIDRs = prefixes("192.168.0.0/16") })},
		{"null keeps every default", `{"masqueradeCIDRs": null, "cidrLimit": null, "masqLinkLocal": null,
			"masqLinkLocalIPv6": null, "masqOutBound": null, "masqOutBoundIPv6": null}`,
			v4Only, Default(v4Only)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { check(t, tt.in, tt.f, tt.want, "") })
	}
}

func TestParseCIDRs(t *testing.T) {
	tests := []struct {
		item     string // one YAML list item
		f        Flags
		want     string // the parsed prefix, if no error
		wantErr  string // %[1]s is the key
		wantWarn string
		masqOnly bool // nonMasqueradeCIDRs differs (see TestParseNullItems)
	}{
		{item: "10.0.0.0/8", want: "10.0.0.0/8"},
		{item: "0.0.0.0/0", want: "0.0.0.0/0"},
		{item: "10.1.2.3/32", want: "10.1.2.3/32"},
		{item: `"169.254.0.0/16"`, want: "169.254.0.0/16"},
		{item: "fc00::/7", f: v6, want: "fc00::/7"},
		{item: `"::/0"`, f: v6, want: "::/0"},
		{item: "2001:db8::1/128", f: v6, want: "2001:db8::1/128"},
		{item: "10.0.0.1/8", wantErr: `%[1]s[0]: "10.0.0.1/8" is not aligned to its prefix length (did you mean "10.0.0.0/8"?)`},
		{item: "2001:db8::1/32", f: v6, wantErr: `%[1]s[0]: "2001:db8::1/32" is not aligned to its prefix length (did you mean "2001:db8::/32"?)`},
		{item: `" 10.0.0.0/8"`, wantErr: `%[1]s[0]: " 10.0.0.0/8" is not a valid CIDR: remove the surrounding spaces`},
		{item: `"10.0.0.0/8 "`, wantErr: `%[1]s[0]: "10.0.0.0/8 " is not a valid CIDR: remove the surrounding spaces`},
		{item: "fe80::1%eth0/64", f: v6, wantErr: `%[1]s[0]: "fe80::1%%eth0/64" is not a valid CIDR: IPv6 zones ("%%...") are not allowed`},
		{item: "010.0.0.0/8", wantErr: `%[1]s[0]: "010.0.0.0/8" is not a valid CIDR: IPv4 field has octet with leading zero`},
		// A leading zero in the prefix length: net.ParseCIDR (the original's
		// validation) reads it in decimal, then iptables-restore in octal.
		{item: "10.0.0.0/08", wantErr: `%[1]s[0]: "10.0.0.0/08" has a leading zero in its prefix length, which iptables reads as an octal number, and "08" is none: ` +
			`the original agent's iptables-restore refused it at every sync, and its rules stayed as they were; write "10.0.0.0/8"`},
		{item: "10.0.0.0/010", want: "10.0.0.0/8",
			wantWarn: `%[1]s[0]: "10.0.0.0/010" has a leading zero in its prefix length, which the original agent's iptables-restore read as octal: ` +
				`"10.0.0.0/8", not "10.0.0.0/10"; this agent reads it so too; write "10.0.0.0/8" to keep that, or "10.0.0.0/10" if you meant /10`},
		{item: "10.64.0.0/010", want: "10.0.0.0/8", // iptables masks the address to the octal length
			wantWarn: `%[1]s[0]: "10.64.0.0/010" has a leading zero in its prefix length, which the original agent's iptables-restore read as octal: ` +
				`"10.0.0.0/8", not "10.64.0.0/10"; this agent reads it so too; write "10.0.0.0/8" to keep that, or "10.64.0.0/10" if you meant /10`},
		{item: "10.0.0.1/032", want: "10.0.0.0/26",
			wantWarn: `%[1]s[0]: "10.0.0.1/032" has a leading zero in its prefix length, which the original agent's iptables-restore read as octal: ` +
				`"10.0.0.0/26", not "10.0.0.1/32"; this agent reads it so too; write "10.0.0.0/26" to keep that, or "10.0.0.1/32" if you meant /32`},
		{item: "10.0.0.0/07", want: "10.0.0.0/7", // the same in octal
			wantWarn: `%[1]s[0]: "10.0.0.0/07" has leading zeros in its prefix length; read as "10.0.0.0/7"`},
		{item: "10.0.0.1/026", wantErr: `%[1]s[0]: "10.0.0.1/026" is not aligned to its prefix length (did you mean "10.0.0.0/26"?)`}, // net.ParseCIDR's check, in decimal
		{item: `"fd00::/010"`, f: v6, want: "fd00::/8",
			wantWarn: `%[1]s[0]: "fd00::/010" has a leading zero in its prefix length, which the original agent's iptables-restore read as octal: ` +
				`"fd00::/8", not "fd00::/10"; this agent reads it so too; write "fd00::/8" to keep that, or "fd00::/10" if you meant /10`},
		{item: `"fd00::/0128"`, f: v6, wantErr: `%[1]s[0]: "fd00::/0128" has a leading zero in its prefix length, which iptables reads as an octal number, and "0128" is none: ` +
			`the original agent's iptables-restore refused it at every sync, and its rules stayed as they were; write "fd00::/128"`},
		{item: "10.0.0.0/", wantErr: `%[1]s[0]: "10.0.0.0/" is not a valid CIDR: bad bits after slash: ""`},
		{item: "10.0.0.0/33", wantErr: `%[1]s[0]: "10.0.0.0/33" is not a valid CIDR: prefix length out of range`},
		{item: "10.0.0.1", wantErr: `%[1]s[0]: "10.0.0.1" is not a valid CIDR: missing the prefix length (did you mean "10.0.0.1/32"?)`},
		{item: `"fd00::1"`, f: v6, wantErr: `%[1]s[0]: "fd00::1" is not a valid CIDR: missing the prefix length (did you mean "fd00::1/128"?)`},
		{item: "example.com", wantErr: `%[1]s[0]: "example.com" is not a valid CIDR: missing the prefix length ("/N")`},
		{item: `""`, wantErr: `%[1]s[0]: "" is not a valid CIDR: missing the prefix length ("/N")`},
		{item: "10.0.0/8", wantErr: `%[1]s[0]: "10.0.0/8" is not a valid CIDR: IPv4 address too short`},
		{item: "fc00::/7", wantErr: `%[1]s[0]: "fc00::/7" is an IPv6 CIDR; pass --enable-ipv6 to use IPv6`},
		{item: `"::/0"`, wantErr: `%[1]s[0]: "::/0" is an IPv6 CIDR; pass --enable-ipv6 to use IPv6`},
		{item: "::ffff:10.0.0.0/104", want: "10.0.0.0/8",
			wantWarn: `%[1]s[0]: "::ffff:10.0.0.0/104" is an IPv4-mapped IPv6 CIDR; read as "10.0.0.0/8"`},
		{item: "::ffff:a01:203/128", f: v6, want: "10.1.2.3/32",
			wantWarn: `%[1]s[0]: "::ffff:a01:203/128" is an IPv4-mapped IPv6 CIDR; read as "10.1.2.3/32"`},
		{item: "::ffff:0.0.0.0/96", want: "0.0.0.0/0",
			wantWarn: `%[1]s[0]: "::ffff:0.0.0.0/96" is an IPv4-mapped IPv6 CIDR; read as "0.0.0.0/0"`},
		{item: "::ffff:10.0.0.1/104", wantErr: `%[1]s[0]: "::ffff:10.0.0.1/104" is not aligned to its prefix length (did you mean "::ffff:10.0.0.0/104"?)`},
		{item: "::ffff:0.0.0.0/80", wantErr: `%[1]s[0]: "::ffff:0.0.0.0/80" is not aligned to its prefix length (did you mean "::/80"?)`},
		{item: "10", wantErr: `%[1]s[0]: expected a CIDR string such as "10.0.0.0/8", got number 10`},
		{item: "yes", wantErr: `%[1]s[0]: expected a CIDR string such as "10.0.0.0/8", got boolean true`},
		{item: "null", wantErr: `%[1]s[0]: expected a CIDR string such as "10.0.0.0/8", got null`, masqOnly: true},
		{item: "[10.0.0.0/8]", wantErr: `%[1]s[0]: expected a CIDR string such as "10.0.0.0/8", got list ["10.0.0.0/8"]`},
		{item: "{cidr: 10.0.0.0/8}", wantErr: `%[1]s[0]: expected a CIDR string such as "10.0.0.0/8", got mapping {"cidr":"10.0.0.0/8"}`},
	}
	for _, key := range []string{"nonMasqueradeCIDRs", "masqueradeCIDRs"} {
		for _, tt := range tests {
			if tt.masqOnly && key == "nonMasqueradeCIDRs" {
				continue
			}
			t.Run(key+"/"+tt.item, func(t *testing.T) {
				want := Default(tt.f)
				if tt.want != "" {
					p := prefixes(tt.want)
					if key == "nonMasqueradeCIDRs" {
						want.NonMasqueradeCIDRs = p
					} else {
						want.MasqueradeCIDRs = p
					}
				}
				var warns []string
				if tt.wantWarn != "" {
					warns = append(warns, fmt.Sprintf(tt.wantWarn, key))
				}
				wantErr := ""
				if tt.wantErr != "" {
					wantErr = fmt.Sprintf(tt.wantErr, key)
				}
				check(t, key+":\n  - "+tt.item+"\n", tt.f, want, wantErr, warns...)
			})
		}
	}
}

func TestParseCIDRLists(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    Config
		wantErr string
	}{
		{"order and duplicates kept", "nonMasqueradeCIDRs: [192.168.0.0/16, 10.0.0.0/8, 192.168.0.0/16]\nmasqueradeCIDRs: [10.1.0.0/16, 10.1.0.0/16]",
			with(v4Only, func(c *Config) {
				c.NonMasqueradeCIDRs = prefixes("192.168.0.0/16", "10.0.0.0/8", "192.168.0.0/16")
				c.MasqueradeCIDRs = prefixes("10.1.0.0/16", "10.1.0.0/16")
			}), ""},
		{"every bad item reported", "masqueradeCIDRs:\n  - 10.0.0.0/8\n  - 10.0.0.1/8\n  - 10.0.0.0/8\n  - 1\n",
			Config{}, `masqueradeCIDRs[1]: "10.0.0.1/8" is not aligned to its prefix length (did you mean "10.0.0.0/8"?); masqueradeCIDRs[3]: expected a CIDR string such as "10.0.0.0/8", got number 1`},
		{"string instead of list", "nonMasqueradeCIDRs: 10.0.0.0/8", Config{},
			`nonMasqueradeCIDRs: expected a list of CIDRs, got string "10.0.0.0/8"`},
		{"mapping instead of list", "masqueradeCIDRs: {a: 10.0.0.0/8}", Config{},
			`masqueradeCIDRs: expected a list of CIDRs, got mapping {"a":"10.0.0.0/8"}`},
		{"number instead of list", `{"masqueradeCIDRs": 10}`, Config{},
			`masqueradeCIDRs: expected a list of CIDRs, got number 10`},
		{"empty masquerade list", "masqueradeCIDRs: []", Default(v4Only), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { check(t, tt.in, v4Only, tt.want, tt.wantErr) })
	}
}

// hosts returns n distinct /32s.
func hosts(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.%d.%d.%d/32", i>>16&255, i>>8&255, i&255)
	}
	return out
}

// cidrList returns key with a YAML list of hosts(n).
func cidrList(key string, n int) string {
	return key + ":\n  - " + strings.Join(hosts(n), "\n  - ") + "\n"
}

func TestParseCIDRLimit(t *testing.T) {
	limited := func(n int) Config { return with(v4Only, func(c *Config) { c.CIDRLimit = n }) }
	tests := []struct {
		name    string
		in      string
		f       Flags
		want    Config
		wantErr string
	}{
		{"default", "masqLinkLocal: false", v4Only, limited(64), ""},
		{"large", "cidrLimit: 100000", v4Only, limited(100000), ""},
		{"exactly the defaults", "cidrLimit: 3", v4Only, limited(3), ""},
		{"whole float in YAML", "cidrLimit: 64.0", v4Only, limited(64), ""},
		// encoding/json reads an int from an integer literal only; YAML's
		// floats reach it as integers.
		{"whole float in JSON", `{"cidrLimit": 64.0}`, v4Only, Config{}, "cidrLimit: 64.0 is not an integer"},
		{"exponent in JSON", `{"cidrLimit": 1e2}`, v4Only, Config{}, "cidrLimit: 1e2 is not an integer"},
		{"exponent in YAML", "cidrLimit: 1e2", v4Only, limited(100), ""},
		{"hexadecimal YAML", "cidrLimit: 0x40", v4Only, limited(64), ""},
		{"null", "cidrLimit: null", v4Only, limited(64), ""},
		// As in the original agent, any limit the lists fit is accepted.
		{"zero", "cidrLimit: 0", v4Only, Config{}, "nonMasqueradeCIDRs: 3 CIDRs (the defaults) exceed cidrLimit 0"},
		{"zero with an empty list", "cidrLimit: 0\nnonMasqueradeCIDRs: []", v4Only,
			with(v4Only, func(c *Config) { c.CIDRLimit = 0; c.NonMasqueradeCIDRs = []netip.Prefix{} }), ""},
		{"negative", "cidrLimit: -5", v4Only, Config{}, "nonMasqueradeCIDRs: 3 CIDRs (the defaults) exceed cidrLimit -5"},
		{"negative with an empty list", "cidrLimit: -1\nnonMasqueradeCIDRs: []", v4Only, Config{},
			"nonMasqueradeCIDRs: 0 CIDRs exceed cidrLimit -1"},
		{"fraction", "cidrLimit: 1.5", v4Only, Config{}, "cidrLimit: 1.5 is not an integer"},
		{"fraction in JSON", `{"cidrLimit": 64.5}`, v4Only, Config{}, "cidrLimit: 64.5 is not an integer"},
		{"too large", "cidrLimit: 99999999999999999999", v4Only, Config{}, "cidrLimit: 100000000000000000000 is out of range"},
		{"too large in JSON", `{"cidrLimit": 1e300}`, v4Only, Config{}, "cidrLimit: 1e300 is not an integer"},
		{"too large integer in JSON", `{"cidrLimit": 100000000000000000000}`, v4Only, Config{}, "cidrLimit: 100000000000000000000 is out of range"},
		{"string", `cidrLimit: "64"`, v4Only, Config{}, `cidrLimit: expected an integer, got string "64"`},
		{"boolean", "cidrLimit: true", v4Only, Config{}, "cidrLimit: expected an integer, got boolean true"},
		{"list", "cidrLimit: [64]", v4Only, Config{}, "cidrLimit: expected an integer, got list [64]"},
		{"defaults exceed it", "cidrLimit: 2", v4Only, Config{},
			"nonMasqueradeCIDRs: 3 CIDRs (the defaults) exceed cidrLimit 2"},
		{"reserved defaults exceed it", "cidrLimit: 10", Flags{NoMasqAllReservedRanges: true}, Config{},
			"nonMasqueradeCIDRs: 11 CIDRs (the defaults) exceed cidrLimit 10"},
		{"70 CIDRs", cidrList("nonMasqueradeCIDRs", 70), v4Only, Config{},
			"nonMasqueradeCIDRs: 70 CIDRs exceed cidrLimit 64"},
		{"64 CIDRs", cidrList("nonMasqueradeCIDRs", 64), v4Only,
			with(v4Only, func(c *Config) { c.NonMasqueradeCIDRs = prefixes(hosts(64)...) }), ""},
		{"masquerade list", "cidrLimit: 3\n" + cidrList("masqueradeCIDRs", 4), v4Only, Config{},
			"masqueradeCIDRs: 4 CIDRs exceed cidrLimit 3"},
		{"both lists, case-insensitive key", "cidrlimit: 1\nnonMasqueradeCIDRs: [1.0.0.0/8, 2.0.0.0/8]\nMasqueradeCIDRs: [1.0.0.0/8, 2.0.0.0/8]", v4Only, Config{},
			"nonMasqueradeCIDRs: 2 CIDRs exceed cidrLimit 1; MasqueradeCIDRs: 2 CIDRs exceed cidrLimit 1"},
		{"lists counted separately", "cidrLimit: 2\nnonMasqueradeCIDRs: [1.0.0.0/8, 2.0.0.0/8]\nmasqueradeCIDRs: [3.0.0.0/8, 4.0.0.0/8]", v4Only,
			with(v4Only, func(c *Config) {
				c.CIDRLimit = 2
				c.NonMasqueradeCIDRs = prefixes("1.0.0.0/8", "2.0.0.0/8")
				c.MasqueradeCIDRs = prefixes("3.0.0.0/8", "4.0.0.0/8")
			}), ""},
		{"link-local not counted", "cidrLimit: 1\nmasqLinkLocal: true\nmasqLinkLocalIPv6: true\nnonMasqueradeCIDRs: [10.0.0.0/8]", v4Only,
			with(v4Only, func(c *Config) {
				c.CIDRLimit = 1
				c.MasqLinkLocal = true
				c.MasqLinkLocalIPv6 = true
				c.NonMasqueradeCIDRs = prefixes("10.0.0.0/8")
			}), ""},
		{"invalid items still counted", "cidrLimit: 1\nnonMasqueradeCIDRs: [10.0.0.0/8, x]", v4Only, Config{},
			`nonMasqueradeCIDRs[1]: "x" is not a valid CIDR: missing the prefix length ("/N"); nonMasqueradeCIDRs: 2 CIDRs exceed cidrLimit 1`},
		{"no count check with a bad limit", "cidrLimit: x\n" + cidrList("nonMasqueradeCIDRs", 70), v4Only, Config{},
			`cidrLimit: expected an integer, got string "x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var warns []string
			if strings.HasPrefix(tt.in, "cidrlimit") {
				warns = []string{`key "cidrlimit" read as "cidrLimit"; please spell it exactly`,
					`key "MasqueradeCIDRs" read as "masqueradeCIDRs"; please spell it exactly`}
			}
			check(t, tt.in, tt.f, tt.want, tt.wantErr, warns...)
		})
	}
}

func TestParseResyncInterval(t *testing.T) {
	every := func(d time.Duration) Config { return with(v4Only, func(c *Config) { c.ResyncInterval = d }) }
	tests := []struct {
		in       string
		want     Config
		wantErr  string
		wantWarn string
	}{
		{in: "60s", want: every(time.Minute)},
		{in: "5m", want: every(5 * time.Minute)},
		{in: "1h30m", want: every(90 * time.Minute)},
		{in: "1s", want: every(time.Second)},
		{in: "10000h", want: every(10000 * time.Hour)},
		{in: "null", wantErr: `resyncInterval: expected a duration string such as "60s", got null`},
		{in: "999ms", want: every(time.Second), wantWarn: `resyncInterval: "999ms" is below the minimum of 1s; using 1s`},
		{in: "1ns", want: every(time.Second), wantWarn: `resyncInterval: "1ns" is below the minimum of 1s; using 1s`},
		// The original agent slept for it: a busy loop.
		{in: "0s", want: every(time.Second), wantWarn: `resyncInterval: "0s" is not positive; using 1s (the original agent re-synced without pause)`},
		{in: `"0"`, want: every(time.Second), wantWarn: `resyncInterval: "0" is not positive; using 1s (the original agent re-synced without pause)`},
		{in: "-1s", want: every(time.Second), wantWarn: `resyncInterval: "-1s" is not positive; using 1s (the original agent re-synced without pause)`},
		{in: "60", wantErr: `resyncInterval: expected a duration string such as "60s", got number 60`},
		{in: "1.5", wantErr: `resyncInterval: expected a duration string such as "60s", got number 1.5`},
		{in: `"60"`, wantErr: `resyncInterval: "60" is not a valid duration (use a number with a unit, such as "60s" or "5m")`},
		{in: "1 minute", wantErr: `resyncInterval: "1 minute" is not a valid duration (use a number with a unit, such as "60s" or "5m")`},
		{in: "9999999999999h", wantErr: `resyncInterval: "9999999999999h" is not a valid duration (use a number with a unit, such as "60s" or "5m")`},
		{in: "true", wantErr: `resyncInterval: expected a duration string such as "60s", got boolean true`},
		{in: "[60s]", wantErr: `resyncInterval: expected a duration string such as "60s", got list ["60s"]`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			var warns []string
			if tt.wantWarn != "" {
				warns = []string{tt.wantWarn}
			}
			check(t, "resyncInterval: "+tt.in, v4Only, tt.want, tt.wantErr, warns...)
		})
	}
}

func TestParseBooleans(t *testing.T) {
	fields := map[string]func(*Config) *bool{
		"masqLinkLocal":     func(c *Config) *bool { return &c.MasqLinkLocal },
		"masqLinkLocalIPv6": func(c *Config) *bool { return &c.MasqLinkLocalIPv6 },
		"masqOutBound":      func(c *Config) *bool { return &c.MasqOutBound },
		"masqOutBoundIPv6":  func(c *Config) *bool { return &c.MasqOutBoundIPv6 },
	}
	tests := []struct {
		value   string
		want    *bool // nil: the default
		wantErr string
	}{
		{value: "true", want: new(true)},
		{value: "false", want: new(false)},
		{value: "True", want: new(true)}, // YAML 1.1, as with the original agent
		{value: "no", want: new(false)},
		{value: "null"},
		{value: `"true"`, wantErr: `%s: expected true or false, got string "true"`},
		{value: "1", wantErr: `%s: expected true or false, got number 1`},
		{value: "[]", wantErr: `%s: expected true or false, got list []`},
		{value: "{}", wantErr: `%s: expected true or false, got mapping {}`},
	}
	for key, field := range fields {
		for _, tt := range tests {
			t.Run(key+"="+tt.value, func(t *testing.T) {
				want := Default(v6)
				if tt.want != nil {
					*field(&want) = *tt.want
				}
				wantErr := ""
				if tt.wantErr != "" {
					wantErr = fmt.Sprintf(tt.wantErr, key)
				}
				check(t, key+": "+tt.value, v6, want, wantErr)
			})
		}
	}
}

func TestParseKeys(t *testing.T) {
	long := strings.Repeat("x", 200)
	tests := []struct {
		name      string
		in        string
		want      Config
		wantErr   string
		wantWarns []string
	}{
		{"unknown key", "foo: 1", Default(v4Only), "", []string{`unknown key "foo" ignored`}},
		{"unknown key with a suggestion", "nonMasqueradeCidr: [10.0.0.0/8]", Default(v4Only), "",
			[]string{`unknown key "nonMasqueradeCidr" ignored (did you mean "nonMasqueradeCIDRs"?)`}},
		{"typo", "masqLinkLocl: true", Default(v4Only), "",
			[]string{`unknown key "masqLinkLocl" ignored (did you mean "masqLinkLocal"?)`}},
		{"typo in JSON", `{"resyncIntreval": "1s"}`, Default(v4Only), "",
			[]string{`unknown key "resyncIntreval" ignored (did you mean "resyncInterval"?)`}},
		{"numeric key", "1: x", Default(v4Only), "", []string{`unknown key "1" ignored`}},
		{"empty key", `{"": 1}`, Default(v4Only), "", []string{`unknown key "" ignored`}},
		{"long key is shortened", long + ": 1", Default(v4Only), "",
			[]string{`unknown key "` + long[:80] + `"... ignored`}},
		{"key with a newline", `{"a\nb": 1}`, Default(v4Only), "", []string{`unknown key "a\nb" ignored`}},
		{"case-insensitive key", "nonMasqueradeCidrs: [10.0.0.0/8]",
			with(v4Only, func(c *Config) { c.NonMasqueradeCIDRs = prefixes("10.0.0.0/8") }), "",
			[]string{`key "nonMasqueradeCidrs" read as "nonMasqueradeCIDRs"; please spell it exactly`}},
		{"case-insensitive key in JSON", `{"MASQOUTBOUND": false}`,
			with(v4Only, func(c *Config) { c.MasqOutBound = false }), "",
			[]string{`key "MASQOUTBOUND" read as "masqOutBound"; please spell it exactly`}},
		{"Kelvin sign folds like encoding/json", "masqLin\u212aLocal: true",
			with(v4Only, func(c *Config) { c.MasqLinkLocal = true }), "",
			[]string{"key \"masqLin\u212aLocal\" read as \"masqLinkLocal\"; please spell it exactly"}},
		{"errors name the key as written", `masqlinklocal: "yes"`, Config{},
			`masqlinklocal: expected true or false, got string "yes"`,
			[]string{`key "masqlinklocal" read as "masqLinkLocal"; please spell it exactly`}},
		// Repeated keys: the original agent's YAML converter keeps the
		// last of exact repeats and sorts the keys (so of two spellings the
		// one that sorts last wins); encoding/json then applies each key in
		// turn. For JSON, the last in the file wins.
		{"two spellings", "nonMasqueradeCIDRs: [10.0.0.0/8]\nnonMasqueradeCidrs: [192.168.0.0/16]",
			with(v4Only, func(c *Config) { c.NonMasqueradeCIDRs = prefixes("192.168.0.0/16") }), "",
			[]string{`key "nonMasqueradeCidrs" read as "nonMasqueradeCIDRs"; please spell it exactly`,
				`key "nonMasqueradeCIDRs" given more than once (keys match case-insensitively); the value of the last one read, "nonMasqueradeCidrs", is used, as in the original agent`}},
		{"two spellings, odd one first", "nonMasqueradeCidrs: [192.168.0.0/16]\nnonMasqueradeCIDRs: [10.0.0.0/8]",
			with(v4Only, func(c *Config) { c.NonMasqueradeCIDRs = prefixes("192.168.0.0/16") }), "",
			[]string{`key "nonMasqueradeCidrs" read as "nonMasqueradeCIDRs"; please spell it exactly`,
				`key "nonMasqueradeCIDRs" given more than once (keys match case-insensitively); the value of the last one read, "nonMasqueradeCidrs", is used, as in the original agent`}},
		{"two spellings in JSON", `{"cidrLimit": 5, "CidrLimit": 6}`, limitedTo(6), "",
			[]string{`key "CidrLimit" read as "cidrLimit"; please spell it exactly`,
				`key "cidrLimit" given more than once (keys match case-insensitively); the value of the last one read, "CidrLimit", is used, as in the original agent`}},
		{"duplicate key", "masqLinkLocal: true\nmasqLinkLocal: false", Default(v4Only), "",
			[]string{`key "masqLinkLocal" given more than once (keys match case-insensitively); the value of the last one read, "masqLinkLocal", is used, as in the original agent`}},
		{"duplicate unknown keys", "a: 1\nb: 2\na: 3\nb: 4", Default(v4Only), "",
			[]string{`unknown key "a" ignored`, `unknown key "b" ignored`}},
		{"duplicate key in JSON", "\n{\n  \"cidrLimit\": 5,\n  \"cidrLimit\": 6\n}", limitedTo(6), "",
			[]string{`key "cidrLimit" given more than once (keys match case-insensitively); the value of the last one read, "cidrLimit", is used, as in the original agent`}},
		{"null after a value in JSON keeps the value", `{"masqLinkLocal": true, "masqLinkLocal": null}`,
			with(v4Only, func(c *Config) { c.MasqLinkLocal = true }), "",
			[]string{`key "masqLinkLocal" given more than once (keys match case-insensitively); the value of the last one read, "masqLinkLocal", is used, as in the original agent`}},
		{"only the last list is checked", `{"nonMasqueradeCIDRs": ["bad"], "nonMasqueradeCIDRs": ["10.0.0.0/8"]}`,
			with(v4Only, func(c *Config) { c.NonMasqueradeCIDRs = prefixes("10.0.0.0/8") }), "",
			[]string{`key "nonMasqueradeCIDRs" given more than once (keys match case-insensitively); the value of the last one read, "nonMasqueradeCIDRs", is used, as in the original agent`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { check(t, tt.in, v4Only, tt.want, tt.wantErr, tt.wantWarns...) })
	}
}

func limitedTo(n int) Config { return with(v4Only, func(c *Config) { c.CIDRLimit = n }) }

func TestParseDocument(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr string // a prefix of the error
	}{
		{"list", "- 10.0.0.0/8", `the document must be a mapping of keys to values, got list ["10.0.0.0/8"]`},
		{"JSON list", `["10.0.0.0/8"]`, `the document must be a mapping of keys to values, got list ["10.0.0.0/8"]`},
		{"string", "10.0.0.0/8", `the document must be a mapping of keys to values, got string "10.0.0.0/8"`},
		{"number", "42", `the document must be a mapping of keys to values, got number 42`},
		{"boolean", "true", `the document must be a mapping of keys to values, got boolean true`},
		{"control characters", "\x00\x01\x02", "cannot parse YAML/JSON: yaml: control characters are not allowed"},
		{"invalid UTF-8", "a: \x80\x81", "cannot parse YAML/JSON: yaml: invalid leading UTF-8 octet"},
		{"unclosed list", "nonMasqueradeCIDRs: [10.0.0.0/8\n", "cannot parse YAML/JSON: yaml: line 1:"},
		{"bad indentation", "masqLinkLocal: true\n  masqOutBound: false\n", "cannot parse YAML/JSON: yaml: line 2:"},
		{"JSON missing comma", "{\"masqLinkLocal\": true\n \"masqOutBound\": true}", "cannot parse YAML/JSON: line 2: invalid character '\"' after object key:value pair"},
		{"YAML flow mapping", "{masqLinkLocal: true}", "cannot parse YAML/JSON: line 1: invalid character 'm' looking for beginning of object key string (a file starting with \"{\" is read as JSON, as the original agent did)"},
		{"whitespace with a tab", " \n\t\r\n  ", "cannot parse YAML/JSON: yaml: line 2: found character that cannot start any token"},
		{"non-string key", "? [a, b]\n: c\n", "cannot parse YAML/JSON: "},
		{"infinity", "masqLinkLocal: .inf", "cannot parse YAML/JSON: json: unsupported value: +Inf"},
		{"deep nesting", "a: " + strings.Repeat("[", 100000), "cannot parse YAML/JSON: yaml: "},
		{"deep JSON nesting", `{"a": ` + strings.Repeat("[", 100000), "cannot parse YAML/JSON: line 1: invalid character '[' exceeded max depth"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _, err := Parse([]byte(tt.in), v4Only)
			got := errString(err)
			if !strings.HasPrefix(got, tt.wantErr) || strings.ContainsAny(got, "\r\n") {
				t.Errorf("Parse(%.40q) error\n got: %s\nwant: %s...", tt.in, got, tt.wantErr)
			}
			if !c.Equal(Config{}) {
				t.Errorf("Parse(%.40q) returned a config with an error: %s", tt.in, c)
			}
		})
	}
}

// The same problems give the same one-line message, in file order, whether
// written as YAML (whose keys the converter sorts) or JSON.
func TestParseProblemsInFileOrder(t *testing.T) {
	const wantErr = `resyncInterval: expected a duration string such as "60s", got number 1; ` +
		`nonMasqueradeCIDRs[1]: "10.0.0.1/8" is not aligned to its prefix length (did you mean "10.0.0.0/8"?); ` +
		`nonMasqueradeCIDRs[2]: "fc00::/7" is an IPv6 CIDR; pass --enable-ipv6 to use IPv6; ` +
		`masqLinkLocal: expected true or false, got string "x"; ` +
		`cidrLimit: expected an integer, got string "64"`
	wantWarns := []string{
		`unknown key "zzz" ignored`,
		`nonMasqueradeCIDRs[0]: "::ffff:10.0.0.0/104" is an IPv4-mapped IPv6 CIDR; read as "10.0.0.0/8"`,
		`key "MasqOutBound" read as "masqOutBound"; please spell it exactly`,
		`unknown key "aaa" ignored`,
	}
	yamlDoc := `zzz: 1
resyncInterval: 1
nonMasqueradeCIDRs:
  - ::ffff:10.0.0.0/104
  - 10.0.0.1/8
  - fc00::/7
MasqOutBound: true
masqLinkLocal: "x"
aaa: 2
cidrLimit: "64"
`
	jsonDoc := `{"zzz": 1, "resyncInterval": 1,
  "nonMasqueradeCIDRs": ["::ffff:10.0.0.0/104", "10.0.0.1/8", "fc00::/7"],
  "MasqOutBound": true, "masqLinkLocal": "x", "aaa": 2, "cidrLimit": "64"}`
	for name, doc := range map[string]string{"YAML": yamlDoc, "JSON": jsonDoc} {
		t.Run(name, func(t *testing.T) { check(t, doc, v4Only, Config{}, wantErr, wantWarns...) })
	}
}

func TestParseManyProblems(t *testing.T) {
	tests := []struct {
		name      string
		in        string
		wantErrs  int // parts of the error, including the summary
		wantLast  string
		wantWarns int
	}{
		{"errors", "nonMasqueradeCIDRs: [" + strings.Repeat("x, ", 30) + "]", 21, "and 10 more errors", 0},
		{"exactly the cap", "nonMasqueradeCIDRs: [" + strings.Repeat("x, ", 20) + "]", 20, `nonMasqueradeCIDRs[19]: "x" is not a valid CIDR: missing the prefix length ("/N")`, 0},
		{"warnings", "cidrLimit: 100\nnonMasqueradeCIDRs: [" + strings.Repeat("'::ffff:1.0.0.0/104', ", 25) + "1]", 1,
			`nonMasqueradeCIDRs[25]: expected a CIDR string such as "10.0.0.0/8", got number 1`, 21},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, warns, err := Parse([]byte(tt.in), v4Only)
			parts := strings.Split(errString(err), "; ")
			if len(parts) != tt.wantErrs || parts[len(parts)-1] != tt.wantLast {
				t.Errorf("got %d errors ending in %q, want %d ending in %q", len(parts), parts[len(parts)-1], tt.wantErrs, tt.wantLast)
			}
			if len(warns) != tt.wantWarns {
				t.Errorf("got %d warnings, want %d", len(warns), tt.wantWarns)
			}
			if tt.wantWarns > 0 && warns[len(warns)-1] != "and 5 more warnings" {
				t.Errorf("last warning = %q, want a summary", warns[len(warns)-1])
			}
		})
	}
}

// A "billion laughs" document must fail fast instead of expanding.
func TestParseAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString(`a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]` + "\n")
	for c := 'b'; c <= 'i'; c++ {
		p := string(c - 1)
		fmt.Fprintf(&b, "%c: &%c [*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s]\n", c, c, p, p, p, p, p, p, p, p, p)
	}
	b.WriteString("nonMasqueradeCIDRs: *i\n")
	_, _, err := Parse([]byte(b.String()), v4Only)
	if want := "cannot parse YAML/JSON: yaml: document contains excessive aliasing"; errString(err) != want {
		t.Errorf("error = %v, want %s", err, want)
	}
}

// Small alias use is ordinary YAML and works.
func TestParseAliases(t *testing.T) {
	in := "nonMasqueradeCIDRs: &nets [10.0.0.0/8]\nmasqueradeCIDRs: *nets\n"
	want := with(v4Only, func(c *Config) {
		c.NonMasqueradeCIDRs = prefixes("10.0.0.0/8")
		c.MasqueradeCIDRs = prefixes("10.0.0.0/8")
	})
	check(t, in, v4Only, want, "")
}

func TestEqual(t *testing.T) {
	base := Default(v6)
	tests := []struct {
		name string
		edit func(*Config)
		want bool
	}{
		{"same", func(*Config) {}, true},
		{"nil and empty masquerade list", func(c *Config) { c.MasqueradeCIDRs = []netip.Prefix{} }, true},
		{"fresh copy of the list", func(c *Config) { c.NonMasqueradeCIDRs = slices.Clone(c.NonMasqueradeCIDRs) }, true},
		{"list order", func(c *Config) { slices.Reverse(c.NonMasqueradeCIDRs) }, false},
		{"extra CIDR", func(c *Config) { c.NonMasqueradeCIDRs = append(c.NonMasqueradeCIDRs, prefixes("fc00::/7")...) }, false},
		{"duplicate CIDR", func(c *Config) { c.NonMasqueradeCIDRs = append(c.NonMasqueradeCIDRs, c.NonMasqueradeCIDRs[0]) }, false},
		{"masquerade CIDR", func(c *Config) { c.MasqueradeCIDRs = prefixes("10.0.0.0/8") }, false},
		{"masqLinkLocal", func(c *Config) { c.MasqLinkLocal = true }, false},
		{"masqLinkLocalIPv6", func(c *Config) { c.MasqLinkLocalIPv6 = true }, false},
		{"masqOutBound", func(c *Config) { c.MasqOutBound = false }, false},
		{"masqOutBoundIPv6", func(c *Config) { c.MasqOutBoundIPv6 = false }, false},
		{"resyncInterval", func(c *Config) { c.ResyncInterval = time.Second }, false},
		{"cidrLimit", func(c *Config) { c.CIDRLimit = 65 }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := Default(v6)
			tt.edit(&o)
			if got := base.Equal(o); got != tt.want {
				t.Errorf("Equal = %v, want %v", got, tt.want)
			}
			if got := o.Equal(base); got != tt.want {
				t.Errorf("Equal (swapped) = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestStringRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		c    Config
		f    Flags
	}{
		{"defaults", Default(v4Only), v4Only},
		{"reserved defaults", Default(Flags{NoMasqAllReservedRanges: true}), Flags{NoMasqAllReservedRanges: true}},
		{"everything set", Config{
			NonMasqueradeCIDRs: prefixes("::/0", "10.0.0.0/8", "10.0.0.0/8", "fc00::/7"),
			MasqueradeCIDRs:    prefixes("0.0.0.0/0", "2001:db8::1/128"),
			MasqLinkLocal:      true,
			MasqLinkLocalIPv6:  true,
			ResyncInterval:     90*time.Minute + time.Millisecond,
			CIDRLimit:          4,
		}, v6},
		{"empty lists", Config{NonMasqueradeCIDRs: []netip.Prefix{}, ResyncInterval: time.Second, CIDRLimit: 1}, v4Only},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { check(t, tt.c.String(), tt.f, tt.c, "") })
	}
	want := `nonMasqueradeCIDRs:
  - "10.0.0.0/8"
  - "172.16.0.0/12"
  - "192.168.0.0/16"
masqueradeCIDRs: []
cidrLimit: 64
masqLinkLocal: false
masqLinkLocalIPv6: false
masqOutBound: true
masqOutBoundIPv6: true
resyncInterval: "1m0s"
`
	if got := Default(v4Only).String(); got != want {
		t.Errorf("Default().String() =\n%s\nwant\n%s", got, want)
	}
}

func TestLevenshtein(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"", "abc", 3},
		{"abc", "", 3},
		{"abc", "abc", 0},
		{"kitten", "sitting", 3},
		{"flaw", "lawn", 2},
		{"masqlinklocl", "masqlinklocal", 1},
		{"héllo", "hello", 1},
	}
	for _, tt := range tests {
		if got := levenshtein(tt.a, tt.b); got != tt.want {
			t.Errorf("levenshtein(%q, %q) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	symlink := func(target, name string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		return p
	}

	// The layout of a Kubernetes ConfigMap volume.
	write("cm/..2024_01_01_00_00_00.1/ip-masq-agent", "masqLinkLocal: true\n")
	symlink("..2024_01_01_00_00_00.1", "cm/..data")
	configMap := symlink("..data/ip-masq-agent", "cm/ip-masq-agent")

	sparse := filepath.Join(dir, "sparse")
	if f, err := os.Create(sparse); err != nil {
		t.Fatal(err)
	} else if err := f.Truncate(MaxFileSize + 1); err != nil {
		t.Fatal(err)
	} else {
		f.Close()
	}

	bad := write("bad", "bogus: 1\nnonMasqueradeCIDRs: [10.0.0.1/8, fc00::/7]\n")
	warn := write("warn", "nonmasqueradecidrs: [10.0.0.0/8]\n")
	file := write("file", "")
	linkLocal := with(v4Only, func(c *Config) { c.MasqLinkLocal = true })
	tests := []struct {
		name      string
		path      string
		f         Flags
		want      Config
		wantErr   string
		wantWarns []string
	}{
		{"missing file", filepath.Join(dir, "none"), v4Only, Default(v4Only), "", missing(filepath.Join(dir, "none"))},
		{"missing directory", filepath.Join(dir, "none/ip-masq-agent"), Flags{NoMasqAllReservedRanges: true},
			Default(Flags{NoMasqAllReservedRanges: true}), "", missing(filepath.Join(dir, "none/ip-masq-agent"))},
		{"file in the way", filepath.Join(file, "ip-masq-agent"), v4Only, Default(v4Only), "", missing(filepath.Join(file, "ip-masq-agent"))},
		{"dangling symlink", symlink("nowhere", "dangling"), v4Only, Default(v4Only), "", missing(filepath.Join(dir, "dangling"))},
		{"a ConfigMap manifest", write("cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ip-masq-agent\ndata:\n  config: |\n    masqLinkLocal: true\n"),
			v4Only, with(v4Only, func(c *Config) { c.MasqLinkLocal = true }), "", nil},
		{"a tab in the indentation", write("tab", "nonMasqueradeCIDRs:\n\t- 10.0.0.0/8\n"), v4Only, Config{},
			filepath.Join(dir, "tab") + ": cannot parse YAML/JSON: yaml: line 2: found character that cannot start any token (line 2 is indented with a tab: YAML indents with spaces only)", nil},
		{"empty file", file, v4Only, Default(v4Only), "", nil},
		{"whitespace", write("space", "\n  \n  \n"), v4Only, Default(v4Only), "", nil},
		{"plain file", write("plain", "masqLinkLocal: true\n"), v4Only, linkLocal, "", nil},
		{"ConfigMap symlinks", configMap, v4Only, linkLocal, "", nil},
		{"errors and warnings name the path", bad, v4Only, Config{},
			bad + `: nonMasqueradeCIDRs[0]: "10.0.0.1/8" is not aligned to its prefix length (did you mean "10.0.0.0/8"?); nonMasqueradeCIDRs[1]: "fc00::/7" is an IPv6 CIDR; pass --enable-ipv6 to use IPv6`,
			[]string{bad + `: unknown key "bogus" ignored`}},
		{"warnings name the path", warn, v4Only,
			with(v4Only, func(c *Config) { c.NonMasqueradeCIDRs = prefixes("10.0.0.0/8") }), "",
			[]string{warn + `: key "nonmasqueradecidrs" read as "nonMasqueradeCIDRs"; please spell it exactly`}},
		{"parse error names the path", write("list", "- a\n"), v4Only, Config{},
			filepath.Join(dir, "list") + `: the document must be a mapping of keys to values, got list ["a"]`, nil},
		{"directory", dir, v4Only, Config{}, dir + ": is a directory, expected a file", nil},
		{"too large", sparse, v4Only, Config{}, sparse + ": file is larger than the limit of 4194304 bytes", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, warns, err := Load(tt.path, tt.f)
			if got := errString(err); got != tt.wantErr {
				t.Errorf("error\n got: %s\nwant: %s", got, tt.wantErr)
			}
			if !slices.Equal(warns, tt.wantWarns) {
				t.Errorf("warnings\n got: %q\nwant: %q", warns, tt.wantWarns)
			}
			if !c.Equal(tt.want) {
				t.Errorf("config\n got: %s\nwant: %s", c, tt.want)
			}
		})
	}
}

// missing is Load's warning about a path that does not exist.
func missing(path string) []string { return []string{path + ": " + MsgMissing} }

// An unreadable file: one line naming it and the reason. As root (make
// test, CI) the load runs on a thread without CAP_DAC_OVERRIDE and
// CAP_DAC_READ_SEARCH, so that file modes bind root as they bind a user.
func TestLoadUnreadable(t *testing.T) {
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte("masqLinkLocal: true\n"), 0o000); err != nil {
		t.Fatal(err)
	}
	var err error
	if dropErr := withoutDACOverride(func() { _, _, err = Load(p, v4Only) }); dropErr != nil {
		t.Fatal(dropErr)
	}
	if want := p + ": cannot open: permission denied"; errString(err) != want {
		t.Errorf("error = %v, want %s", err, want)
	}
}

// withoutDACOverride runs f as the process's user, but as root on an OS
// thread that has dropped CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from its
// effective capabilities (capabilities are per thread; the thread stays
// locked, so the Go runtime discards it when f returns).
func withoutDACOverride(f func()) error {
	if os.Geteuid() != 0 {
		f()
		return nil
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			done <- fmt.Errorf("capget: %w", err)
			return
		}
		for _, c := range []uint{unix.CAP_DAC_OVERRIDE, unix.CAP_DAC_READ_SEARCH} {
			data[c/32].Effective &^= 1 << (c % 32)
		}
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			done <- fmt.Errorf("capset without CAP_DAC_OVERRIDE: %w", err)
			return
		}
		f()
		done <- nil
	}()
	return <-done
}

// A FIFO (or a device) at the path is refused at once: opening it must not
// block the daemon's loop, and reading it could never end.
func TestLoadFIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skip("no FIFOs:", err)
	}
	_, _, err := Load(fifo, v4Only)
	if want := fifo + ": is not a regular file (p---------)"; errString(err) != want {
		t.Errorf("error = %v, want %s", err, want)
	}
}

func config100k() []byte {
	return []byte("cidrLimit: 100000\n" + cidrList("nonMasqueradeCIDRs", 100000))
}

func TestParse100k(t *testing.T) {
	if testing.Short() {
		t.Skip("slow")
	}
	c, warns, err := Parse(config100k(), v4Only)
	if err != nil || len(warns) != 0 || len(c.NonMasqueradeCIDRs) != 100000 {
		t.Fatalf("got %d CIDRs, warnings %q, error %v", len(c.NonMasqueradeCIDRs), warns, err)
	}
	if got, want := c.NonMasqueradeCIDRs[99999], netip.MustParsePrefix("10.1.134.159/32"); got != want {
		t.Errorf("last CIDR = %s, want %s", got, want)
	}
}

// checkValid checks, independently of the parser, what a parsed Config promises.
func checkValid(t *testing.T, c Config, f Flags) {
	t.Helper()
	if len(c.NonMasqueradeCIDRs) > c.CIDRLimit || len(c.MasqueradeCIDRs) > c.CIDRLimit {
		t.Errorf("lists of %d and %d CIDRs with cidrLimit %d", len(c.NonMasqueradeCIDRs), len(c.MasqueradeCIDRs), c.CIDRLimit)
	}
	if c.ResyncInterval < time.Second {
		t.Errorf("resyncInterval %s below 1s", c.ResyncInterval)
	}
	for _, p := range slices.Concat(c.NonMasqueradeCIDRs, c.MasqueradeCIDRs) {
		if !p.IsValid() || p.Masked() != p || p.Addr().Is4In6() || p.Addr().Zone() != "" || (p.Addr().Is6() && !f.EnableIPv6) {
			t.Errorf("bad CIDR %s with %+v", p, f)
		}
	}
}

func FuzzParse(f *testing.F) {
	seeds := []string{
		"",
		"nonMasqueradeCIDRs:\n  - 10.0.0.0/8\nresyncInterval: 60s\nmasqLinkLocal: true\n",
		"masqueradeCIDRs: [10.10.10.10/32]\nnonMasqueradeCIDRs: [10.0.0.0/8, fc00::/7]\nmasqOutBound: false\nresyncInterval: 100ms\n",
		`{"nonMasqueradeCIDRs": ["::ffff:10.0.0.0/104"], "cidrLimit": 1, "masqLinkLocalIPv6": true}`,
		`{"a": 1, "a": 2}`,
		"nonMasqueradeCidrs: []\nNonMasqueradeCIDRs: [1.2.3.4/32]\ncidrLimit: 0\n",
		"a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]\n",
		"- 1\n- 2\n",
		"resyncInterval: 60\ncidrLimit: 64.5\nmasqOutBoundIPv6: \"true\"\n",
		"? [a]\n: b\n",
		"{\"masqLinkLocal\": tr",
	}
	for _, s := range seeds {
		f.Add([]byte(s), false, false)
		f.Add([]byte(s), true, true)
	}
	f.Fuzz(func(t *testing.T, data []byte, ipv6, reserved bool) {
		flags := Flags{EnableIPv6: ipv6, NoMasqAllReservedRanges: reserved}
		samePaths(t, data, flags) // the fast path (fast.go) against the library path
		c, warns, err := Parse(data, flags)
		for _, w := range warns {
			if strings.ContainsAny(w, "\r\n") {
				t.Fatalf("warning with a line break: %q", w)
			}
		}
		if err != nil {
			if strings.ContainsAny(err.Error(), "\r\n") {
				t.Fatalf("error with a line break: %q", err)
			}
			return
		}
		checkValid(t, c, flags)
		again, warns, err := Parse([]byte(c.String()), flags)
		warns = slices.DeleteFunc(warns, func(w string) bool { return strings.Contains(w, msgExtension) })
		if err != nil || len(warns) != 0 || !again.Equal(c) {
			t.Fatalf("round trip of\n%s\ngave\n%s\nwarnings %q, error %v", c, again, warns, err)
		}
	})
}

// A null list is an empty list; a null item keeps what the list held at
// that place (a default, or an item of an earlier list under a repeated
// key), because encoding/json decodes into the existing array.
func TestParseNullItems(t *testing.T) {
	reserved := Flags{NoMasqAllReservedRanges: true}
	const emptyWarn = `nonMasqueradeCIDRs: null means an empty list, as in the original agent: every destination but link-local is masqueraded (write [] to say so)`
	list := func(f Flags, s ...string) Config {
		return with(f, func(c *Config) { c.NonMasqueradeCIDRs = prefixes(s...) })
	}
	empty := with(reserved, func(c *Config) { c.NonMasqueradeCIDRs = nil })
	check(t, "nonMasqueradeCIDRs:\n", reserved, empty, "", emptyWarn)
	check(t, `{"nonMasqueradeCIDRs": null}`, reserved, empty, "", emptyWarn)
	check(t, "nonMasqueradeCIDRs: [null, 1.0.0.0/8]", v4Only, list(v4Only, "10.0.0.0/8", "1.0.0.0/8"), "",
		`nonMasqueradeCIDRs[0]: null keeps "10.0.0.0/8", the item there before (from the defaults), as in the original agent`)
	check(t, "nonMasqueradeCIDRs: [null, null, null, null]", v4Only, Config{},
		`nonMasqueradeCIDRs[3]: expected a CIDR string such as "10.0.0.0/8", got null`,
		`nonMasqueradeCIDRs[0]: null keeps "10.0.0.0/8", the item there before (from the defaults), as in the original agent`,
		`nonMasqueradeCIDRs[1]: null keeps "172.16.0.0/12", the item there before (from the defaults), as in the original agent`,
		`nonMasqueradeCIDRs[2]: null keeps "192.168.0.0/16", the item there before (from the defaults), as in the original agent`)
	check(t, `{"nonMasqueradeCIDRs": ["1.0.0.0/8", "2.0.0.0/8"], "nonMasqueradeCIDRs": ["3.0.0.0/8"], "nonMasqueradeCIDRs": [null, null]}`,
		v4Only, list(v4Only, "3.0.0.0/8", "2.0.0.0/8"), "",
		`key "nonMasqueradeCIDRs" given more than once (keys match case-insensitively); the value of the last one read, "nonMasqueradeCIDRs", is used, as in the original agent`,
		`nonMasqueradeCIDRs[0]: null keeps "3.0.0.0/8", the item there before (from nonMasqueradeCIDRs[0]), as in the original agent`,
		`nonMasqueradeCIDRs[1]: null keeps "2.0.0.0/8", the item there before (from nonMasqueradeCIDRs[1]), as in the original agent`)
}

// The extension keys get a note when they change what the original agent
// would do with the same file.
func TestParseExtensionNote(t *testing.T) {
	const note = msgExtension
	check(t, "masqOutBound: false", v4Only, with(v4Only, func(c *Config) { c.MasqOutBound = false }), "", "masqOutBound: "+note)
	check(t, "masqueradeCIDRs: [10.1.0.0/16]", v4Only, with(v4Only, func(c *Config) { c.MasqueradeCIDRs = prefixes("10.1.0.0/16") }), "",
		"masqueradeCIDRs: "+note)
	check(t, "masqueradeCIDRs: []\nmasqOutBound: true\nmasqOutBoundIPv6: true", v4Only, Default(v4Only), "")
}

// Content after the first YAML document is ignored with a warning, as the
// original agent ignored it (silently).
func TestParseMoreDocuments(t *testing.T) {
	for _, in := range []string{"cidrLimit: 5\n---\ncidrLimit: 7\n", "cidrLimit: 5\n---\n: : bad [\n", "cidrLimit: 5\n...\ngarbage: [\n"} {
		check(t, in, v4Only, with(v4Only, func(c *Config) { c.CIDRLimit = 5 }), "", msgMoreDocuments)
	}
}

// parsePrefix4, the list items' shortcut, reads what netip.ParsePrefix
// reads, aligned, and leaves everything else to it: random strings of
// the characters of CIDRs, and the edges.
func TestParsePrefix4AsParsePrefix(t *testing.T) {
	check := func(s string) {
		t.Helper()
		got, ok := parsePrefix4(s)
		want, err := netip.ParsePrefix(s)
		if ok && (err != nil || got != want || want.Masked() != want) {
			t.Fatalf("parsePrefix4(%q) = %v; ParsePrefix: %v, %v", s, got, want, err)
		}
	}
	for _, s := range []string{"10.0.0.0/8", "0.0.0.0/0", "255.255.255.255/32", "10.0.0.1/8", "010.0.0.0/8",
		"10.0.0.0/08", "10.0.0.0/33", "256.0.0.0/8", "1.2.3/24", "1.2.3.4.5/32", "1.2.3.4/", "1.2.3.4", "/8",
		"1.2.3.4/32 ", " 1.2.3.4/32", "1.2.3.4/320", "1.2.3.0004/32", "1..2.3/8", "::ffff:1.2.3.4/128", "1.2.3.4/1a"} {
		check(s)
	}
	for _, s := range []string{"10.0.0.0/8", "0.0.0.0/0", "255.255.255.255/32", "192.168.1.0/24", "100.64.0.8/29"} {
		if _, ok := parsePrefix4(s); !ok {
			t.Errorf("parsePrefix4(%q) left it to ParsePrefix", s)
		}
	}
	r := rand.New(rand.NewPCG(7, 8))
	const chars = "0123456789./"
	for range 200000 {
		b := make([]byte, 1+r.IntN(18))
		for i := range b {
			b[i] = chars[r.IntN(len(chars))]
		}
		check(string(b))
		// And near-valid ones: four octets and a length, some with zeros.
		check(fmt.Sprintf("%d.%d.%d.%d/%d", r.IntN(300), r.IntN(3)*r.IntN(256), r.IntN(2)*r.IntN(256), r.IntN(4)*r.IntN(256), r.IntN(35)))
	}
}
