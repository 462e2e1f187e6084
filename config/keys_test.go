package config

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestKeyTable checks the key table against Config: every field of Config
// is one key's, every key has every column, and what is derived from the
// table (Default, Equal, String, Diff, Parse) sees a
// change of each field. A new field without an entry, or an entry with a
// column missing, fails here.
func TestKeyTable(t *testing.T) {
	// Every column of every entry is set.
	for _, k := range keys {
		v := reflect.ValueOf(k).Elem()
		for i := range v.NumField() {
			f, name := v.Field(i), v.Type().Field(i).Name
			switch f.Kind() {
			case reflect.Func:
				// merge: this agent's own keys only (azure.go merges the rest).
				own := k.extensionNote() == msgOwnExtension
				if f.IsNil() && (name != "merge" || own) || name == "merge" && !f.IsNil() && !own {
					t.Errorf("key %q: %s: set %v", k.Name(), name, !f.IsNil())
				}
			case reflect.String:
				if f.String() == "" {
					t.Errorf("key %v: no %s", v.Type(), name)
				}
			}
		}
	}
	if t.Failed() {
		t.FailNow() // the derived functions would call a missing column
	}
	// Every field of Config is one key's, and each derived function sees it.
	def := Default(Flags{})
	typ := reflect.TypeFor[Config]()
	owners := map[string]string{} // key -> field
	for i := range typ.NumField() {
		field := typ.Field(i).Name
		c := def
		setOther(t, field, reflect.ValueOf(&c).Elem().Field(i))
		var changed []key
		for _, k := range keys {
			if !k.equal(&def, &c) {
				changed = append(changed, k)
			}
		}
		if len(changed) != 1 {
			t.Errorf("field %s: %d keys see its change, want 1 (an entry in keys)", field, len(changed))
			continue
		}
		k := changed[0]
		name := k.Name()
		if other, ok := owners[name]; ok {
			t.Errorf("key %q holds fields %s and %s", name, other, field)
		}
		owners[name] = field
		if c.Equal(def) {
			t.Errorf("field %s: Equal does not see its change", field)
		}
		if c.String() == def.String() || !strings.Contains(c.String(), "\n"+name+":") && !strings.HasPrefix(c.String(), name+":") {
			t.Errorf("field %s: String does not write it as %q:\n%s", field, name, c.String())
		}
		if d := c.Diff(def); len(d) != 1 || !strings.HasPrefix(d[0], name+" ") {
			t.Errorf("field %s: Diff = %q, want one item for %q", field, d, name)
		}
		if back, _, err := Parse([]byte(c.String()), Flags{}); err != nil || !back.Equal(c) {
			t.Errorf("field %s: Parse(String()) = %v, %v; want the same config", field, back.Diff(c), err)
		}
	}
	if len(owners) != len(keys) {
		t.Errorf("%d keys hold a field of Config, want all %d", len(owners), len(keys))
	}
}

// setOther sets a field to a valid value other than its default.
func setOther(t *testing.T, name string, f reflect.Value) {
	switch v := f.Addr().Interface().(type) {
	case *[]netip.Prefix:
		*v = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	case *[]string:
		*v = []string{"eth*"}
	case *bool:
		*v = !*v
	case *int:
		*v += 1000
	case *time.Duration:
		*v += 5 * time.Second
	case *netip.Addr:
		*v = netip.MustParseAddr("192.0.2.10")
		if strings.HasSuffix(name, "IPv6") {
			*v = netip.MustParseAddr("2001:db8::10")
		}
	case *CIDRMatch:
		*v = MostSpecific
	default:
		t.Fatalf("a field of type %s: teach setOther and the key table (keys.go) about it", f.Type())
	}
}

// String leaves out an empty list of this agent's own keys (and an own
// key at its zero value, its default), and only those, so that a config
// without them keeps its text and Hash.
func TestKeyTableOwnEmpty(t *testing.T) {
	def := Default(Flags{})
	for _, k := range keys {
		var b strings.Builder
		k.write(&b, &def)
		empty := false
		if l := k.cidrs(&def); l != nil {
			empty = len(*l) == 0
		}
		if n := any(k).(interface{ names(*Config) *[]string }).names(&def); n != nil {
			empty = len(*n) == 0
		}
		own := k.extensionNote() == msgOwnExtension
		if (b.Len() == 0) != (own && (empty || k.cidrs(&def) == nil && any(k).(interface{ names(*Config) *[]string }).names(&def) == nil)) {
			t.Errorf("key %s: String writes %q", k.Name(), b.String())
		}
	}
}

// A key's decoding sees it: a file that sets each key (as String writes it)
// marks it present.
func TestKeyTablePresent(t *testing.T) {
	for _, k := range keys {
		var b strings.Builder
		c := Default(Flags{})
		if l := k.cidrs(&c); l != nil && len(*l) == 0 {
			*l = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")} // String leaves out an empty list of this agent's own
		}
		c.SNATAddress, c.SNATAddressIPv6 = netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8::10") // and an unset address
		c.CIDRMatch = MostSpecific                                                                                // and an own key at its default
		if n := any(k).(interface{ names(*Config) *[]string }).names(&c); n != nil && len(*n) == 0 {
			*n = []string{"eth0", "eth*"}
		}
		k.write(&b, &c)
		if _, d, err := parse([]byte(b.String()), Flags{}); err != nil || !d.present[k.Name()] {
			t.Errorf("%q: not read as setting %q (%v)", b.String(), k.Name(), err)
		}
	}
}

// snatAddress and snatAddressIPv6 take one address of their family; a bad
// value is named by key and value.
func TestSNATAddress(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"snatAddress: 192.0.2.10\n", ""},
		{"snatAddressIPv6: \"2001:db8::10\"\n", ""},
		{"snatAddress: fd00::1\n", `snatAddress: "fd00::1" is an IPv6 address: want an IPv4 one (IPv6 goes in snatAddressIPv6)`},
		{"snatAddressIPv6: 192.0.2.10\n", `snatAddressIPv6: "192.0.2.10" is an IPv4 address: want an IPv6 one (IPv4 goes in snatAddress)`},
		{"snatAddressIPv6: \"::ffff:192.0.2.10\"\n", `is an IPv4 address`},
		{"snatAddress: node\n", `snatAddress: "node" is not an IP address`},
		{"snatAddress: 192.0.2.0/24\n", `snatAddress: "192.0.2.0/24" is a prefix: want one address, such as "192.0.2.10"`},
		{"snatAddress: 0.0.0.0\n", `cannot be a packet's source address`},
		{"snatAddress: [192.0.2.10]\n", `snatAddress: expected an IP address string`},
	} {
		c, _, err := Parse([]byte(tc.in), Flags{EnableIPv6: true})
		if tc.want == "" {
			if err != nil || (!c.SNATAddress.IsValid() && !c.SNATAddressIPv6.IsValid()) {
				t.Errorf("%q: %v %v", tc.in, c, err)
			}
			if back, _, err := Parse([]byte(c.String()), Flags{EnableIPv6: true}); err != nil || !back.Equal(c) {
				t.Errorf("%q: String %q does not parse back: %v", tc.in, c.String(), err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.in, err, tc.want)
		}
	}
	def := Default(Flags{})
	c := def
	c.SNATAddress = netip.MustParseAddr("192.0.2.10")
	if d := c.Diff(def); len(d) != 1 || d[0] != "snatAddress none->192.0.2.10" {
		t.Errorf("Diff = %q", d)
	}
}

// TestWriteListAsFmt: writeList, which String (and so Hash) writes every
// CIDR with, writes what fmt's %q of each prefix's String does.
func TestWriteListAsFmt(t *testing.T) {
	ps := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::/0"),
		netip.MustParsePrefix("::ffff:10.0.0.0/104"), netip.MustParsePrefix("2001:db8::/32"),
		netip.MustParsePrefix("255.255.255.255/32"), {}}
	// Every octet and length, over many chunks of writeList's buffer.
	for i := range 3000 {
		ps = append(ps, netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(i), byte(i * 7), byte(i >> 8), byte(255 - i)}), i%33))
	}
	var want strings.Builder
	fmt.Fprintf(&want, "k:\n")
	for _, p := range ps {
		fmt.Fprintf(&want, "  - %q\n", p.String())
	}
	var got strings.Builder
	writeList(&got, "k", ps)
	if got.String() != want.String() {
		t.Errorf("writeList wrote\n%s\nfmt writes\n%s", got.String(), want.String())
	}
}

// TestHashOfString: Hash, which writes c's text into the hash without
// keeping it, is still the SHA-256 of String.
func TestHashOfString(t *testing.T) {
	c := Default(Flags{EnableIPv6: true})
	for i := range 5000 {
		c.NonMasqueradeCIDRs = append(c.NonMasqueradeCIDRs, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24))
	}
	c.MasqueradeCIDRs = []netip.Prefix{netip.MustParsePrefix("fd00::/8")}
	c.EgressInterfaces = []string{"eth0", "ens*"}
	for _, c := range []Config{Default(Flags{}), c} {
		sum := sha256.Sum256([]byte(c.String()))
		if got, want := c.Hash(), hex.EncodeToString(sum[:8]); got != want {
			t.Errorf("Hash = %s, the SHA-256 of String %s", got, want)
		}
	}
}
