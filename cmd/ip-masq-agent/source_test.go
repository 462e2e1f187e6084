package main

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// nonMasqueradeSourceCIDRs end to end without a kernel: validate names a
// bad value by file, key, index and value; render shows its set and rule;
// explain --from decides by the source, and without it says it cannot.
func TestNonMasqueradeSourceCIDRs(t *testing.T) {
	bad := writeFile(t, "ip-masq-agent", "nonMasqueradeSourceCIDRs: [10.244.1.0/24, 10.244.2.1/24]\n")
	if code, out, _ := runCmd(t, "validate", bad); code != 1 ||
		!strings.Contains(out, bad+":1: nonMasqueradeSourceCIDRs[1]: \"10.244.2.1/24\" is not aligned") {
		t.Errorf("validate: %d %q", code, out)
	}
	path := writeFile(t, "ip-masq-agent", "nonMasqueradeSourceCIDRs: [10.244.1.0/24]\n")
	code, out, errOut := runCmd(t, "render", "--config", path)
	if code != 0 || !strings.Contains(out, "ip saddr @nonmasq-src-v4 counter return") || !strings.Contains(out, "elements = { 10.244.1.0/24 }") {
		t.Errorf("render: %d %q\n%s", code, errOut, out)
	}
	code, out, _ = runCmd(t, "explain", "--config", path, "--from", "10.244.1.5", "203.0.113.1")
	if want := "203.0.113.1  not masqueraded  nonMasqueradeSourceCIDRs[0] 10.244.1.0/24\n"; code != 0 || out != want {
		t.Errorf("explain --from inside: %d %q, want %q", code, out, want)
	}
	code, out, _ = runCmd(t, "explain", "--config", path, "--from", "10.244.3.5", "203.0.113.1")
	if want := "203.0.113.1  masquerade       masqOutBound: true (no other rule matched)\n"; code != 0 || out != want {
		t.Errorf("explain --from outside: %d %q, want %q", code, out, want)
	}
	code, out, _ = runCmd(t, "explain", "--config", path, "203.0.113.1")
	if code != 0 || !strings.Contains(out, "undetermined") || !strings.Contains(out, "depends on the source (nonMasqueradeSourceCIDRs)") {
		t.Errorf("explain without --from: %d %q", code, out)
	}
	if code, _, errOut := runCmd(t, "explain", "--config", path, "--from", "pod", "203.0.113.1"); code != 2 || !strings.Contains(errOut, `--from "pod" is not an IP address`) {
		t.Errorf("explain --from pod: %d %q", code, errOut)
	}
}

// snatMoved: the old snat address when it changes or goes; for a new one,
// the other addresses of its interface; nothing when it stays.
func TestSNATMoved(t *testing.T) {
	tableWith := func(addrs ...string) nft.Table {
		cfg := config.Default(config.Flags{EnableIPv6: true})
		for _, a := range addrs {
			if x := netip.MustParseAddr(a); x.Is4() {
				cfg.SNATAddress = x
			} else {
				cfg.SNATAddressIPv6 = x
			}
		}
		return nft.Build(cfg, nft.Options{Chain: nft.DefaultChain, EnableIPv6: true, Links: func(netip.Addr) []string { return []string{"eth0"} }})
	}
	addrs := func(string) []netip.Addr {
		return []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.11"),
			netip.MustParseAddr("2001:db8:1::1"), netip.MustParseAddr("fe80::1")}
	}
	for _, tc := range []struct {
		name     string
		old, new nft.Table
		want     string
	}{
		{"same", tableWith("192.0.2.10"), tableWith("192.0.2.10"), "[]"},
		{"no table before", nft.Table{}, tableWith("192.0.2.10"), "[]"},
		{"changed", tableWith("192.0.2.10"), tableWith("192.0.2.11"), "[192.0.2.10]"},
		{"gone", tableWith("192.0.2.10", "2001:db8:1::10"), tableWith(), "[192.0.2.10 2001:db8:1::10]"},
		{"new", tableWith(), tableWith("192.0.2.10"), "[192.0.2.1 192.0.2.11]"},
		{"new IPv6", tableWith(), tableWith("2001:db8:1::10"), "[2001:db8:1::1]"},
	} {
		if got := fmt.Sprint(snatMoved(tc.old, tc.new, addrs)); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

// validate names a bad snatAddress by file, line, key and value.
func TestSNATAddressValidate(t *testing.T) {
	for in, want := range map[string]string{
		"snatAddress: fd00::1\n":           `:1: snatAddress: "fd00::1" is an IPv6 address: want an IPv4 one (IPv6 goes in snatAddressIPv6)`,
		"snatAddress: node\n":              `:1: snatAddress: "node" is not an IP address`,
		"snatAddressIPv6: 2001:db8::/64\n": `:1: snatAddressIPv6: "2001:db8::/64" is a prefix: want one address, such as "2001:db8::10"`,
	} {
		bad := writeFile(t, "ip-masq-agent", in)
		if code, out, _ := runCmd(t, "validate", bad); code != 1 || !strings.Contains(out, bad+want) {
			t.Errorf("validate %q: %d %q", in, code, out)
		}
	}
}

// masqueradeSourceCIDRs end to end without a kernel: validate names a bad
// value and warns of a family the guard leaves out; render shows the
// inverted lookup; explain --from names the key for a source outside it.
func TestMasqueradeSourceCIDRs(t *testing.T) {
	bad := writeFile(t, "ip-masq-agent", "masqueradeSourceCIDRs: [10.244.0.0/16, pods]\n")
	if code, out, _ := runCmd(t, "validate", bad); code != 1 ||
		!strings.Contains(out, bad+":1: masqueradeSourceCIDRs[1]: \"pods\" is not a valid CIDR") {
		t.Errorf("validate: %d %q", code, out)
	}
	path := writeFile(t, "ip-masq-agent", "masqueradeSourceCIDRs: [10.244.0.0/16]\n")
	if code, out, _ := runCmd(t, "validate", "--enable-ipv6", path); !strings.Contains(out, "masqueradeSourceCIDRs: has no IPv6 CIDR: no IPv6 traffic will be masqueraded") {
		t.Errorf("validate --enable-ipv6: %d %q", code, out)
	}
	code, out, errOut := runCmd(t, "render", "--config", path)
	if code != 0 || !strings.Contains(out, "ip saddr != @masq-src-v4 counter return") || !strings.Contains(out, "elements = { 10.244.0.0/16 }") {
		t.Errorf("render: %d %q\n%s", code, errOut, out)
	}
	code, out, _ = runCmd(t, "explain", "--config", path, "--from", "198.51.100.7", "203.0.113.1")
	if want := "203.0.113.1  not masqueraded  masqueradeSourceCIDRs: 198.51.100.7 is in none of its 1 entries\n"; code != 0 || out != want {
		t.Errorf("explain --from outside: %d %q, want %q", code, out, want)
	}
	code, out, _ = runCmd(t, "explain", "--config", path, "--from", "10.244.3.5", "203.0.113.1")
	if want := "203.0.113.1  masquerade       masqOutBound: true (no other rule matched)\n"; code != 0 || out != want {
		t.Errorf("explain --from inside: %d %q, want %q", code, out, want)
	}
	code, out, _ = runCmd(t, "explain", "--config", path, "203.0.113.1")
	if code != 0 || !strings.Contains(out, "depends on the source (masqueradeSourceCIDRs)") {
		t.Errorf("explain without --from: %d %q", code, out)
	}
}

// egressInterfaces end to end without a kernel: validate names each bad
// name by file, key, index and value; render shows the ifname set as nft
// writes it; explain --via decides by the out interface.
func TestEgressInterfaces(t *testing.T) {
	bad := writeFile(t, "ip-masq-agent", "egressInterfaces: [eth0, \"\", \"e*th\", abcdefghijklmnop, \"*\", \"eth 0\", 7]\n")
	code, out, _ := runCmd(t, "validate", bad)
	for _, want := range []string{
		bad + `:1: egressInterfaces[1]: "" is not an interface name nft can match: empty`,
		bad + `:1: egressInterfaces[2]: "e*th" is not an interface name nft can match: "*" is a wildcard only at the end`,
		bad + `:1: egressInterfaces[3]: "abcdefghijklmnop" is not an interface name nft can match: 16 characters, more than the kernel's 15 (IFNAMSIZ - 1)`,
		bad + `:1: egressInterfaces[4]: "*" is not an interface name nft can match: a bare "*" matches every interface`,
		bad + `:1: egressInterfaces[5]: "eth 0" is not an interface name nft can match: holds ' '`,
		bad + `:1: egressInterfaces[6]: expected an interface name such as "eth0" or "eth*", got`,
	} {
		if code != 1 || !strings.Contains(out, want) {
			t.Errorf("validate: %d, lacks %q:\n%s", code, want, out)
		}
	}
	path := writeFile(t, "ip-masq-agent", "egressInterfaces: [eth0, \"ens*\"]\n")
	code, out, errOut := runCmd(t, "render", "--config", path)
	if code != 0 || !strings.Contains(out, "meta nfproto ipv4 oifname != @egress-if-v4 counter return") || !strings.Contains(out, `elements = { "ens*", "eth0" }`) {
		t.Errorf("render: %d %q\n%s", code, errOut, out)
	}
	code, out, _ = runCmd(t, "explain", "--config", path, "--via", "wg0", "203.0.113.1")
	if want := "203.0.113.1  not masqueraded  egressInterfaces: wg0 is in none of its 2 entries\n"; code != 0 || out != want {
		t.Errorf("explain --via wg0: %d %q, want %q", code, out, want)
	}
	code, out, _ = runCmd(t, "explain", "--config", path, "--via", "ens5", "203.0.113.1")
	if want := "203.0.113.1  masquerade       masqOutBound: true (no other rule matched)\n"; code != 0 || out != want {
		t.Errorf("explain --via ens5: %d %q, want %q", code, out, want)
	}
	code, out, _ = runCmd(t, "explain", "--config", path, "203.0.113.1")
	if code != 0 || !strings.Contains(out, "depends on the out interface (egressInterfaces)") {
		t.Errorf("explain without --via: %d %q", code, out)
	}
	if code, _, errOut := runCmd(t, "explain", "--config", path, "--via", "eth*", "203.0.113.1"); code != 2 || !strings.Contains(errOut, `--via "eth*" is not an interface name`) {
		t.Errorf("explain --via eth*: %d %q", code, errOut)
	}
}
