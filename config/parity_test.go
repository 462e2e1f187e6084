package config

// The parity test: every config is decoded by a model of the original
// agent's decoding (kubernetes-sigs/ip-masq-agent, cmd/ip-masq-agent:
// syncConfig and validate) and by Parse, and the outcomes must agree
// except for the deliberate differences named below (docs/configuration.md,
// "Differences from the original").
//
// The model uses the libraries the original uses, not copies of them:
// k8s.io/apimachinery/pkg/util/yaml.ToJSON (a file starting with "{" goes
// to encoding/json unchanged, anything else through sigs.k8s.io/yaml's
// YAMLToJSON, which uses go.yaml.in/yaml/v2), encoding/json into a struct
// shaped like the original's MasqConfig, pre-filled by a copy of its
// NewMasqConfig, with metav1.Duration for the interval; then a copy of its
// validate and validateCIDR.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// origMasqConfig is shaped like the original's MasqConfig.
type origMasqConfig struct {
	NonMasqueradeCIDRs []string        `json:"nonMasqueradeCIDRs"`
	CidrLimit          int             `json:"cidrLimit"`
	MasqLinkLocal      bool            `json:"masqLinkLocal"`
	MasqLinkLocalIPv6  bool            `json:"masqLinkLocalIPv6"`
	ResyncInterval     metav1.Duration `json:"resyncInterval"`
}

// origNewMasqConfig is the original's NewMasqConfig. The slice is built the
// same way (a literal, then append), as its capacity shows: encoding/json
// decodes a list into the existing array, and a null item keeps what was
// there.
func origNewMasqConfig(masqAllReservedRanges bool) *origMasqConfig {
	nonMasq := []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"}
	if masqAllReservedRanges {
		nonMasq = append(nonMasq,
			"100.64.0.0/10", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24",
			"198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "240.0.0.0/4")
	}
	return &origMasqConfig{
		NonMasqueradeCIDRs: nonMasq,
		CidrLimit:          64,
		ResyncInterval:     metav1.Duration{Duration: 60 * time.Second},
	}
}

// origParse is the original's syncConfig for a file that exists.
func origParse(data []byte, f Flags) (*origMasqConfig, error) {
	c := origNewMasqConfig(f.NoMasqAllReservedRanges)
	j, err := utilyaml.ToJSON(data)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(j, c); err != nil {
		return nil, err
	}
	if err := c.validate(f.EnableIPv6); err != nil {
		return nil, err
	}
	// Then iptables-restore read each CIDR's prefix length with
	// xtables_strtoui, base 0: a leading zero is octal, and "08" is no
	// number, so that the restore failed at every sync.
	for _, cidr := range c.NonMasqueradeCIDRs {
		if _, err := iptablesMask(cidr); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// iptablesMask reads a CIDR's prefix length as iptables does (strtoumax
// with base 0; net.ParseCIDR let through only decimal digits).
func iptablesMask(cidr string) (int, error) {
	_, bits, _ := strings.Cut(cidr, "/")
	base := 10
	if len(bits) > 1 && bits[0] == '0' {
		base = 8
	}
	n, err := strconv.ParseUint(bits, base, 8)
	if err != nil {
		return 0, fmt.Errorf("iptables-restore: invalid mask `%s' specified", bits)
	}
	return int(n), nil
}

// validate is the original's, with --enable-ipv6 as a parameter.
func (c *origMasqConfig) validate(enableIPv6 bool) error {
	if n, l := len(c.NonMasqueradeCIDRs), c.CidrLimit; n > l {
		return fmt.Errorf("the daemon can only accept up to %d CIDRs (excluding link-local), but got %d CIDRs", l, n)
	}
	for _, cidr := range c.NonMasqueradeCIDRs {
		ip, ipnet, err := net.ParseCIDR(cidr)
		if err != nil {
			return fmt.Errorf("CIDR %q could not be parsed, %v", cidr, err)
		}
		if !ip.Equal(ipnet.IP) {
			return fmt.Errorf("CIDR %q is not aligned to a CIDR block", cidr)
		}
		if !enableIPv6 && origIsIPv6CIDR(cidr) {
			return fmt.Errorf("ipv6 is not enabled, but ipv6 cidr %s provided", cidr)
		}
	}
	return nil
}

func origIsIPv6CIDR(cidr string) bool {
	ip, _, _ := net.ParseCIDR(cidr)
	return net.ParseIP(ip.String()).To4() == nil
}

// The deliberate differences, by name. Each has a row in docs/configuration.md,
// "Differences from the original", and a warning (or, for a refusal, an
// error) from Parse that contains the marker.
const (
	// masqueradeCIDRs, masqOutBound and masqOutBoundIPv6 (Baidu CCE's keys)
	// mean something here; the original ignores them.
	diffExtensionKeys = "extension-keys"
	// An interval below 1s (zero and negative included: a busy loop in
	// the original) is raised to 1s.
	diffResyncMinimum = "resync-minimum"
	// An IPv4-mapped IPv6 CIDR (::ffff:a.b.c.d/N): the original took it as
	// IPv4 and wrote it into an iptables rule that iptables rejects at
	// every sync; here it is unmapped (N >= 96), or it is IPv6 (N < 96).
	diffIPv4Mapped = "ipv4-mapped"
)

var diffMarkers = map[string]string{
	diffExtensionKeys: "the original agent ignores this key",
	diffResyncMinimum: "resyncInterval",
	diffIPv4Mapped:    "IPv4-mapped",
}

type parityCase struct {
	name string
	data string
}

func TestParityWithOriginal(t *testing.T) {
	cases := append(handWrittenCases(), generatedCases(400)...)
	if len(cases) < 150 {
		t.Fatalf("only %d cases", len(cases))
	}
	flagSets := []Flags{{}, {EnableIPv6: true}, {NoMasqAllReservedRanges: true}, {EnableIPv6: true, NoMasqAllReservedRanges: true}}
	stats := map[string]int{}
	for _, tc := range cases {
		for _, f := range flagSets {
			diffs, outcome := compareWithOriginal(t, tc, f)
			stats[outcome]++
			for _, d := range diffs {
				stats["difference "+d]++
			}
		}
	}
	t.Logf("%d configs x %d flag sets: %v", len(cases), len(flagSets), stats)
	// The corpus must exercise both outcomes and every named difference.
	for _, want := range []string{"both accept", "both refuse", "difference " + diffExtensionKeys,
		"difference " + diffResyncMinimum, "difference " + diffIPv4Mapped} {
		if stats[want] == 0 {
			t.Errorf("the corpus has no case of %q", want)
		}
	}
}

// compareWithOriginal checks one config and returns the deliberate
// differences it relied on and the outcome.
func compareWithOriginal(t *testing.T, tc parityCase, f Flags) (diffs []string, outcome string) {
	t.Helper()
	data := []byte(tc.data)
	orig, origErr := origParse(data, f)
	ours, warns, ourErr := Parse(data, f)
	name := fmt.Sprintf("%s %+v %q", tc.name, f, tc.data)
	extension := hasExtensionKey(data)
	report := func(format string, a ...any) {
		t.Errorf("%s: "+format+"\n  original: %v\n  ours: err=%v warnings=%q", append(append([]any{name}, a...), origErr, ourErr, warns)...)
	}
	// need records a deliberate difference and checks that Parse said so.
	need := func(d string, msgs ...string) {
		diffs = append(diffs, d)
		for _, m := range msgs {
			if strings.Contains(m, diffMarkers[d]) {
				return
			}
		}
		report("difference %s without a message containing %q", d, diffMarkers[d])
	}
	switch {
	case origErr != nil && ourErr != nil:
		return nil, "both refuse"
	case origErr != nil:
		report("the original refuses, Parse accepts: %s", ours)
		return nil, "mismatch"
	case ourErr != nil:
		// Allowed only where an extension key or an IPv4-mapped CIDR
		// (N < 96, taken as IPv6) is the reason.
		switch {
		case extension && mentionsExtensionKey(ourErr.Error()):
			// The error names the extension key: that is the message.
			diffs = append(diffs, diffExtensionKeys)
		case hasMappedCIDR(orig.NonMasqueradeCIDRs) && !f.EnableIPv6:
			diffs = append(diffs, diffIPv4Mapped)
		default:
			report("the original accepts, Parse refuses")
		}
		return diffs, "ours refuses (deliberate)"
	}

	// Both accept: the same effective values.
	want := make([]netip.Prefix, 0, len(orig.NonMasqueradeCIDRs))
	mapped := false
	for _, s := range orig.NonMasqueradeCIDRs {
		p, m := origPrefix(s)
		mapped = mapped || m
		want = append(want, p)
	}
	if mapped {
		need(diffIPv4Mapped, warns...)
	}
	if !slices.Equal(want, ours.NonMasqueradeCIDRs) && !(len(want) == 0 && len(ours.NonMasqueradeCIDRs) == 0) {
		report("nonMasqueradeCIDRs: original %v, ours %v", want, ours.NonMasqueradeCIDRs)
	}
	if orig.MasqLinkLocal != ours.MasqLinkLocal || orig.MasqLinkLocalIPv6 != ours.MasqLinkLocalIPv6 {
		report("masqLinkLocal/IPv6: original %v/%v, ours %v/%v", orig.MasqLinkLocal, orig.MasqLinkLocalIPv6, ours.MasqLinkLocal, ours.MasqLinkLocalIPv6)
	}
	if orig.CidrLimit != ours.CIDRLimit {
		report("cidrLimit: original %d, ours %d", orig.CidrLimit, ours.CIDRLimit)
	}
	switch d := orig.ResyncInterval.Duration; {
	case d < time.Second:
		need(diffResyncMinimum, warns...)
		if ours.ResyncInterval != time.Second {
			report("resyncInterval: original %s, ours %s (want 1s)", d, ours.ResyncInterval)
		}
	case d != ours.ResyncInterval:
		report("resyncInterval: original %s, ours %s", d, ours.ResyncInterval)
	}
	if len(ours.MasqueradeCIDRs) > 0 || !ours.MasqOutBound || !ours.MasqOutBoundIPv6 {
		if !extension {
			report("extension values without an extension key: %s", ours)
		}
		need(diffExtensionKeys, warns...)
	}
	return diffs, "both accept"
}

// origPrefix converts a CIDR the original accepted to what it means; m
// reports an IPv4-mapped one, which is compared as this agent reads it.
func origPrefix(s string) (p netip.Prefix, m bool) {
	_, ipnet, _ := net.ParseCIDR(s)
	ones, _ := iptablesMask(s) // as iptables installed it: octal with a leading zero
	a, _ := netip.AddrFromSlice(ipnet.IP)
	if a.Is4In6() {
		if ones >= 96 {
			return netip.PrefixFrom(a.Unmap(), ones-96).Masked(), true
		}
		return netip.PrefixFrom(a, ones).Masked(), true
	}
	return netip.PrefixFrom(a, ones).Masked(), false
}

func hasMappedCIDR(list []string) bool {
	for _, s := range list {
		if addr, _, ok := strings.Cut(s, "/"); ok {
			if a, err := netip.ParseAddr(addr); err == nil && a.Is4In6() {
				return true
			}
		}
	}
	return false
}

var extensionKeys = []string{KeyMasq, KeyOutBound, KeyOutBound6}

// hasExtensionKey reports whether the original's JSON has a key that
// matches an extension key as encoding/json matches keys.
func hasExtensionKey(data []byte) bool {
	j, err := utilyaml.ToJSON(data)
	if err != nil {
		return false
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(j, &m) != nil {
		return false
	}
	for k := range m {
		for _, e := range extensionKeys {
			if strings.EqualFold(k, e) {
				return true
			}
		}
	}
	return false
}

var errorKeyRE = regexp.MustCompile(`(?:^|; )([A-Za-z0-9]+)(?:\[\d+\])?: `)

// mentionsExtensionKey reports whether every problem in msg is about an
// extension key.
func mentionsExtensionKey(msg string) bool {
	ms := errorKeyRE.FindAllStringSubmatch(msg, -1)
	for _, m := range ms {
		ok := false
		for _, e := range extensionKeys {
			ok = ok || strings.EqualFold(m[1], e)
		}
		if !ok {
			return false
		}
	}
	return len(ms) > 0
}

// handWrittenCases are the edge cases, one idea each.
func handWrittenCases() []parityCase {
	list := func(n int) string {
		var b strings.Builder
		b.WriteString("nonMasqueradeCIDRs:\n")
		for i := range n {
			fmt.Fprintf(&b, "  - 10.%d.0.0/16\n", i)
		}
		return b.String()
	}
	raw := []string{
		// empty, null and comments
		"", " \n\t\n", "# only a comment\n", "~", "null", "---\n", "---\n...\n", "\xef\xbb\xbf",
		"{}", "  {}  ", "[]", "- 10.0.0.0/8", "10.0.0.0/8", "42", "true", "\"x\"",
		// the upstream example and the docs' example
		"nonMasqueradeCIDRs:\n  - 10.0.0.0/8\n  - 172.16.0.0/12\n  - 192.168.0.0/16\ncidrLimit: 64\nmasqLinkLocal: false\nmasqLinkLocalIPv6: false\nresyncInterval: 60s\n",
		"nonMasqueradeCIDRs:\n  - 10.0.0.0/8\nresyncInterval: 60s\nmasqLinkLocal: true\n",
		// null for each key, and empty lists
		"nonMasqueradeCIDRs:\n", "nonMasqueradeCIDRs: ~\n", "nonMasqueradeCIDRs: null\ncidrLimit: 0\n",
		"nonMasqueradeCIDRs: []\ncidrLimit: 0\n", "nonMasqueradeCIDRs: []\ncidrLimit: -1\n", "cidrLimit: 0\n",
		"cidrLimit: null\n", "masqLinkLocal: null\n", "masqLinkLocalIPv6: ~\n", "resyncInterval: null\n",
		`{"nonMasqueradeCIDRs": null}`, `{"resyncInterval": null}`, `{"cidrLimit": null, "masqLinkLocal": null}`,
		// null items: encoding/json keeps what the array held there
		"nonMasqueradeCIDRs: [null]\n", "nonMasqueradeCIDRs: [null, null, null]\n", "nonMasqueradeCIDRs: [null, null, null, null]\n",
		"nonMasqueradeCIDRs: [null, 1.0.0.0/8]\n", "nonMasqueradeCIDRs: [~, ~, ~, ~, ~, ~, ~, ~, ~, ~, ~]\n",
		`{"nonMasqueradeCIDRs": ["1.0.0.0/8", "2.0.0.0/8", "3.0.0.0/8"], "nonMasqueradeCIDRs": ["4.0.0.0/8"], "nonMasqueradeCIDRs": [null, null]}`,
		`{"nonMasqueradeCIDRs": ["1.0.0.0/8"], "nonMasqueradeCIDRs": null, "nonMasqueradeCIDRs": [null]}`,
		`{"nonMasqueradeCIDRs": ["1.0.0.0/8"], "nonMasqueradeCIDRs": [], "nonMasqueradeCIDRs": [null]}`,
		// intervals
		"resyncInterval: 0s\n", "resyncInterval: \"0\"\n", "resyncInterval: -1s\n", "resyncInterval: 500ms\n",
		"resyncInterval: 1s\n", "resyncInterval: 1h\n", "resyncInterval: 60\n", "resyncInterval: \"60\"\n",
		"resyncInterval: 1.5\n", "resyncInterval: 9999999999h\n", "resyncInterval: 1m30s\n", "resyncInterval: 1ns\n",
		"nonMasqueradeCIDRs: []\ncidrLimit: 0\nresyncInterval: 0s\n",
		// limits
		"cidrLimit: 2\n", "cidrLimit: 3\n", "cidrLimit: 64.0\n", `{"cidrLimit": 64.0}`, "cidrLimit: 1e3\n", `{"cidrLimit": 1e3}`,
		"cidrLimit: 0x40\n", "cidrLimit: 0100\n", "cidrLimit: 6.5\n", "cidrLimit: \"64\"\n", "cidrLimit: 99999999999999999999\n",
		"cidrLimit: -9223372036854775808\n", "cidrLimit: 9223372036854775807\n", "cidrLimit: true\n",
		list(64), list(65), list(65) + "cidrLimit: 65\n", list(2) + "cidrLimit: 1\n",
		// booleans, YAML 1.1 spellings
		"masqLinkLocal: yes\n", "masqLinkLocal: on\n", "masqLinkLocal: y\n", "masqLinkLocal: Off\n", "masqLinkLocal: \"true\"\n",
		"masqLinkLocal: 1\n", "masqLinkLocalIPv6: TRUE\n", `{"masqLinkLocal": "yes"}`, `{"masqLinkLocal": 1}`,
		// CIDRs
		"nonMasqueradeCIDRs: [10.0.0.0/08]\n", "nonMasqueradeCIDRs: [10.0.0.0/0008]\n",
		"nonMasqueradeCIDRs: [10.0.0.0/010]\n", "nonMasqueradeCIDRs: [10.64.0.0/010, 10.0.0.1/032, 10.0.0.0/016]\n", "nonMasqueradeCIDRs: [10.0.0.0/07]\n",
		"nonMasqueradeCIDRs: [\"fd00::/010\"]\n", "nonMasqueradeCIDRs: [\"fd00::/0128\"]\n", "nonMasqueradeCIDRs: [10.0.0.0/]\n",
		"nonMasqueradeCIDRs: [10.0.0.1/8]\n", "nonMasqueradeCIDRs: [010.0.0.0/8]\n", "nonMasqueradeCIDRs: [\" 10.0.0.0/8\"]\n",
		"nonMasqueradeCIDRs: [10.0.0.0]\n", "nonMasqueradeCIDRs: [10.0.0.0/33]\n", "nonMasqueradeCIDRs: [10.0.0.0/8/8]\n",
		"nonMasqueradeCIDRs: [fd00::/8]\n", "nonMasqueradeCIDRs: [\"fe80::%eth0/64\"]\n", "nonMasqueradeCIDRs: [\"::/0\"]\n",
		"nonMasqueradeCIDRs: [\"::ffff:10.0.0.0/104\"]\n", "nonMasqueradeCIDRs: [\"::ffff:0:0/80\"]\n", "nonMasqueradeCIDRs: [\"::ffff:10.0.0.0/8\"]\n",
		"nonMasqueradeCIDRs: [\"::ffff:a01:203/128\"]\n", "nonMasqueradeCIDRs: [0.0.0.0/0]\n", "nonMasqueradeCIDRs: [1]\n",
		"nonMasqueradeCIDRs: 10.0.0.0/8\n", "nonMasqueradeCIDRs: {a: b}\n", "nonMasqueradeCIDRs: [[10.0.0.0/8]]\n",
		"nonMasqueradeCIDRs: [10.0.0.0/8, 10.0.0.0/8]\n", "nonMasqueradeCIDRs: [\"\"]\n",
		// keys: case, duplicates, unknown
		"nonmasqueradecidrs: [10.0.0.0/8]\n", "NONMASQUERADECIDRS: [10.0.0.0/8]\n", "nonMasqueradeCidrs: [10.0.0.0/8]\n",
		"nonMasqueradeCIDRs: [10.0.0.0/8]\nnonMasqueradeCidrs: [192.168.0.0/16]\n",
		"nonMasqueradeCidrs: [192.168.0.0/16]\nnonMasqueradeCIDRs: [10.0.0.0/8]\n",
		"cidrLimit: 5\ncidrLimit: 7\n", "CidrLimit: 5\ncidrLimit: 7\n", "cidrLimit: 5\nCidrLimit: 7\n", "cidrLimit: 5\nCIDRLIMIT: 7\ncidrlimit: 9\n",
		"masqLinkLocal: true\nmasqLinkLocal: false\n",
		`{"masqLinkLocal": true, "MASQLINKLOCAL": false}`, `{"MASQLINKLOCAL": false, "masqLinkLocal": true}`,
		`{"masqLinkLocal": true, "masqLinkLocal": null}`, `{"cidrLimit": 5, "cidrLimit": 6}`,
		`{"resyncInterval": "bad", "resyncInterval": "5s"}`, `{"nonMasqueradeCIDRs": ["x"], "nonMasqueradeCIDRs": ["10.0.0.0/8"]}`,
		"nonMasqueradeCIDRs: [x]\nNonMasqueradeCIDRs: [10.0.0.0/8]\n", "NonMasqueradeCIDRs: [x]\nnonMasqueradeCIDRs: [10.0.0.0/8]\n",
		"masqLinkLocl: true\n", "foo: bar\n", "1: 2\n", "true: false\n", "nonMasqueradeCIDR: [10.0.0.0/8]\n",
		"nonMa\u017fqueradeCIDRs: [10.0.0.0/8]\n", "cidrLimit\u212a: 1\n", "\u212aey: 1\n",
		// extension keys
		"masqueradeCIDRs: [10.1.0.0/16]\n", "masqOutBound: false\n", "masqOutBoundIPv6: false\n", "MasqOutBound: false\n",
		"masqueradeCIDRs: []\nmasqOutBound: true\n", "masqueradeCIDRs: [bad]\n", "masqueradeCIDRs: [null]\n", "masqueradeCIDRs: null\n",
		"masqOutBound: nope\n", "masqueradeCIDRs: [10.1.0.0/16, 10.2.0.0/16, 10.3.0.0/16]\ncidrLimit: 2\nnonMasqueradeCIDRs: []\n",
		// formats: JSON, YAML flow, documents, BOM, CRLF, tabs, anchors
		`{"nonMasqueradeCIDRs": ["10.0.0.0/8"], "masqLinkLocal": true, "resyncInterval": "30s", "cidrLimit": 10}`,
		"{nonMasqueradeCIDRs: [10.0.0.0/8], masqLinkLocal: yes}", "  \n{\"cidrLimit\": 5}\n", "{\"cidrLimit\": 5} trailing",
		"{\"cidrLimit\": 5}\n---\ncidrLimit: 6\n", `{"nonMasqueradeCIDRs": ["10.0.0.0\/8"]}`, "\xef\xbb\xbf{\"cidrLimit\": 5}",
		"\xef\xbb\xbf{\"nonMasqueradeCIDRs\": [\"10.0.0.0\\/8\"]}", "\xef\xbb\xbfcidrLimit: 5\n", "{\"cidrLimit\": 5,}",
		"cidrLimit: 5\n---\ncidrLimit: 7\n", "cidrLimit: 5\n---\n: : bad [\n", "cidrLimit: 5\n...\ngarbage: [\n",
		"---\ncidrLimit: 5\n---\n", "--- {cidrLimit: 5}\n", "---\n---\ncidrLimit: 5\n",
		"cidrLimit: 5\r\nmasqLinkLocal: true\r\n", "cidrLimit:\t5\n", "\tcidrLimit: 5\n", "cidrLimit: 5\n  bad indent: x\n",
		"a: &a [10.0.0.0/8]\nnonMasqueradeCIDRs: *a\n", "nonMasqueradeCIDRs: !!str 10.0.0.0/8\n", "cidrLimit: !!str 5\n",
		"nonMasqueradeCIDRs: [10.0.0.0/8\n", "? nonMasqueradeCIDRs\n: [10.0.0.0/8]\n", "<<: {cidrLimit: 5}\n",
		"resyncInterval: !!float 1\n", "cidrLimit: .inf\n", "cidrLimit: 1_000\n", "cidrLimit: 0b11\n", "masqLinkLocal: !!bool yes\n",
		"\"nonMasqueradeCIDRs\": [\"10.0.0.0/8\"]\n", "'cidrLimit': 5\n",
		"a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]\ng: [*f, *f, *f, *f, *f, *f, *f, *f, *f]\n",
	}
	out := make([]parityCase, len(raw))
	for i, s := range raw {
		out[i] = parityCase{name: fmt.Sprintf("hand-written %d", i), data: s}
	}
	return out
}

// generatedCases makes n configs from a seeded generator over keys (as
// spelled, in other cases, extension and unknown ones), values (valid,
// invalid, null, YAML 1.1 spellings), formats (YAML block and flow, JSON),
// repeated keys, and content after "---".
func generatedCases(n int) []parityCase {
	r := rand.New(rand.NewPCG(12, 2024))
	pick := func(s []string) string { return s[r.IntN(len(s))] }
	cidrs := []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "198.51.100.0/24", "0.0.0.0/0", "10.0.0.1/8",
		"10.0.0.0/08", "10.0.0.0/010", "10.64.0.0/010", "fd00::/010", "fd00::/8", "fe80::/10", "::ffff:10.0.0.0/104", "::ffff:0:0/96", "bad", "", "10.0.0.0",
		"100.64.0.0/10", "2001:db8::/32", "2001:db8::1/32", "192.168.1.0/24", "1.2.3.4/32", "10.0.0.0/8 "}
	bools := []string{"true", "false", "yes", "no", "on", "off", "True", "\"true\"", "1", "0", "null", "~", "y", "n"}
	limits := []string{"0", "1", "2", "3", "4", "64", "-1", "64.0", "1e2", "0x10", "null", "\"5\"", "2.5", "100000000000"}
	intervals := []string{"60s", "0s", "0", "-5s", "500ms", "1s", "1m", "2h", "60", "\"60s\"", "null", "1.5s", "bogus", "1h2m3s", "\"0\""}
	keys := map[string][]string{
		KeyNonMasq:    {"nonMasqueradeCIDRs", "nonmasqueradecidrs", "NonMasqueradeCIDRs", "nonMasqueradeCidrs"},
		KeyMasq:       {"masqueradeCIDRs", "MasqueradeCIDRs"},
		KeyLimit:      {"cidrLimit", "CidrLimit", "cidrlimit", "CIDRLIMIT"},
		KeyLinkLocal:  {"masqLinkLocal", "MasqLinkLocal", "masqlinklocal"},
		KeyLinkLocal6: {"masqLinkLocalIPv6", "masqLinkLocalIpv6"},
		KeyOutBound:   {"masqOutBound", "masqOutbound"},
		KeyOutBound6:  {"masqOutBoundIPv6"},
		KeyResync:     {"resyncInterval", "ResyncInterval", "resyncinterval"},
		"unknown":     {"foo", "nonMasqueradeCIDR", "masqLinkLocl", "resync"},
	}
	names := []string{KeyNonMasq, KeyNonMasq, KeyNonMasq, KeyMasq, KeyLimit, KeyLimit, KeyLinkLocal, KeyLinkLocal6,
		KeyOutBound, KeyOutBound6, KeyResync, KeyResync, "unknown"}
	value := func(name string) (yamlVal, jsonVal string) {
		switch name {
		case KeyNonMasq, KeyMasq:
			if r.IntN(8) == 0 {
				v := pick([]string{"null", "[]", "10.0.0.0/8", "{}"})
				return v, map[string]string{"null": "null", "[]": "[]", "10.0.0.0/8": `"10.0.0.0/8"`, "{}": "{}"}[v]
			}
			k := r.IntN(5)
			ys, js := make([]string, k), make([]string, k)
			for i := range k {
				if r.IntN(7) == 0 {
					ys[i], js[i] = "null", "null"
					continue
				}
				c := pick(cidrs)
				ys[i], js[i] = fmt.Sprintf("%q", c), fmt.Sprintf("%q", c)
				if r.IntN(2) == 0 && c != "" && !strings.ContainsAny(c, ": ") {
					ys[i] = c
				}
			}
			return "[" + strings.Join(ys, ", ") + "]", "[" + strings.Join(js, ", ") + "]"
		case KeyLimit:
			v := pick(limits)
			return v, jsonOf(v)
		case KeyResync:
			v := pick(intervals)
			if !strings.HasPrefix(v, "\"") && r.IntN(2) == 0 && v != "null" {
				return fmt.Sprintf("%q", v), fmt.Sprintf("%q", v)
			}
			return v, jsonOf(v)
		case "unknown":
			return "1", "1"
		default:
			v := pick(bools)
			return v, jsonOf(v)
		}
	}
	var out []parityCase
	for i := range n {
		type kv struct{ k, y, j string }
		var kvs []kv
		for range 1 + r.IntN(5) {
			name := pick(names)
			k := keys[name][0]
			if r.IntN(4) == 0 {
				k = pick(keys[name])
			}
			y, j := value(name)
			kvs = append(kvs, kv{k, y, j})
		}
		if r.IntN(5) == 0 { // repeat a key, maybe in another case
			d := kvs[r.IntN(len(kvs))]
			d.y, d.j = value(canonicalOr(d.k))
			if r.IntN(2) == 0 {
				d.k = strings.ToUpper(d.k[:1]) + d.k[1:]
			}
			kvs = append(kvs, d)
		}
		var b bytes.Buffer
		format := r.IntN(10)
		switch {
		case format < 6: // YAML block, lists block or flow
			for _, e := range kvs {
				if strings.HasPrefix(e.y, "[") && e.y != "[]" && r.IntN(2) == 0 {
					fmt.Fprintf(&b, "%s:\n", e.k)
					for _, it := range splitFlow(e.y) {
						fmt.Fprintf(&b, "  - %s\n", it)
					}
					continue
				}
				fmt.Fprintf(&b, "%s: %s\n", e.k, e.y)
			}
		case format < 8: // JSON
			parts := make([]string, len(kvs))
			for i, e := range kvs {
				parts[i] = fmt.Sprintf("%q: %s", e.k, e.j)
			}
			b.WriteString("{" + strings.Join(parts, ", ") + "}")
		default: // YAML flow mapping (which the original reads as JSON, and refuses)
			parts := make([]string, len(kvs))
			for i, e := range kvs {
				parts[i] = e.k + ": " + e.y
			}
			b.WriteString("{" + strings.Join(parts, ", ") + "}")
		}
		switch r.IntN(12) {
		case 0:
			b.WriteString("\n---\ncidrLimit: 1\n")
		case 1:
			b.WriteString("\n---\n")
		case 2:
			b.WriteString("\n# trailing comment\n")
		case 3:
			b = *bytes.NewBuffer(append([]byte("\xef\xbb\xbf"), b.Bytes()...))
		}
		out = append(out, parityCase{name: fmt.Sprintf("generated %d", i), data: b.String()})
	}
	return out
}

func canonicalOr(k string) string {
	if c := canonical(k); c != "" {
		return c
	}
	return "unknown"
}

// jsonOf turns a YAML scalar into the nearest JSON token.
func jsonOf(v string) string {
	switch v {
	case "~", "null":
		return "null"
	case "true", "false", "\"true\"":
		return v
	}
	if json.Valid([]byte(v)) {
		return v
	}
	return fmt.Sprintf("%q", v)
}

func splitFlow(s string) []string {
	s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	if s == "" {
		return nil
	}
	return strings.Split(s, ", ")
}
