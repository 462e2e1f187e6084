package config

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The keys of the file, as the original agent and CCE spell them; other
// packages name them in their messages with these (nft's explain).
const (
	KeyNonMasq    = "nonMasqueradeCIDRs"
	KeyMasq       = "masqueradeCIDRs"
	KeyLimit      = "cidrLimit"
	KeyLinkLocal  = "masqLinkLocal"
	KeyLinkLocal6 = "masqLinkLocalIPv6"
	KeyOutBound   = "masqOutBound"
	KeyOutBound6  = "masqOutBoundIPv6"
	KeyResync     = "resyncInterval"
	KeyNonMasqSrc = "nonMasqueradeSourceCIDRs"
	KeySNAT       = "snatAddress"
	KeySNAT6      = "snatAddressIPv6"
	KeyCIDRMatch  = "cidrMatch"
	KeyMasqSrc    = "masqueradeSourceCIDRs"
	KeyEgressIf   = "egressInterfaces"
)

// keys is every key of the file, one entry each, in the order String
// writes them. Default, Equal, String, Diff and the decoding of a file are
// derived from it (a directory's files merge as Azure's agent merges them:
// azure.go): a new key is a field
// of Config, an entry here, and its use. TestKeyTable fails when a field
// has no entry or an entry misses a column.
var keys = []key{
	&keyOf[[]netip.Prefix]{name: KeyNonMasq, original: true, field: func(c *Config) *[]netip.Prefix { return &c.NonMasqueradeCIDRs },
		def: defaultNonMasq, decode: (*decoder).cidrList, null: nullNonMasq},
	&keyOf[[]netip.Prefix]{name: KeyMasq, original: false, field: func(c *Config) *[]netip.Prefix { return &c.MasqueradeCIDRs },
		def: zero[[]netip.Prefix], decode: (*decoder).cidrList, null: nullList},
	&keyOf[int]{name: KeyLimit, original: true, field: func(c *Config) *int { return &c.CIDRLimit },
		def: always(defaultCIDRLimit), decode: (*decoder).limit, null: keep[int]},
	&keyOf[bool]{name: KeyLinkLocal, original: true, field: func(c *Config) *bool { return &c.MasqLinkLocal },
		def: zero[bool], decode: (*decoder).boolean, null: keep[bool]},
	&keyOf[bool]{name: KeyLinkLocal6, original: true, field: func(c *Config) *bool { return &c.MasqLinkLocalIPv6 },
		def: zero[bool], decode: (*decoder).boolean, null: keep[bool]},
	&keyOf[bool]{name: KeyOutBound, original: false, field: func(c *Config) *bool { return &c.MasqOutBound },
		def: always(true), decode: (*decoder).boolean, null: keep[bool]},
	&keyOf[bool]{name: KeyOutBound6, original: false, field: func(c *Config) *bool { return &c.MasqOutBoundIPv6 },
		def: always(true), decode: (*decoder).boolean, null: keep[bool]},
	&keyOf[time.Duration]{name: KeyResync, original: true, field: func(c *Config) *time.Duration { return &c.ResyncInterval },
		def: defaultResyncInterval, decode: (*decoder).duration, null: nullDuration},
	&keyOf[[]netip.Prefix]{name: KeyNonMasqSrc, own: true, field: func(c *Config) *[]netip.Prefix { return &c.NonMasqueradeSourceCIDRs },
		def: zero[[]netip.Prefix], decode: (*decoder).cidrList, null: nullList, merge: union},
	&keyOf[netip.Addr]{name: KeySNAT, own: true, field: func(c *Config) *netip.Addr { return &c.SNATAddress },
		def: zero[netip.Addr], decode: snatDecoder(4), null: keep[netip.Addr], merge: lastSet[netip.Addr]},
	&keyOf[netip.Addr]{name: KeySNAT6, own: true, field: func(c *Config) *netip.Addr { return &c.SNATAddressIPv6 },
		def: zero[netip.Addr], decode: snatDecoder(6), null: keep[netip.Addr], merge: lastSet[netip.Addr]},
	&keyOf[CIDRMatch]{name: KeyCIDRMatch, own: true, field: func(c *Config) *CIDRMatch { return &c.CIDRMatch },
		def: zero[CIDRMatch], decode: (*decoder).cidrMatch, null: keep[CIDRMatch], merge: mostSpecificIfAny},
	&keyOf[[]netip.Prefix]{name: KeyMasqSrc, own: true, field: func(c *Config) *[]netip.Prefix { return &c.MasqueradeSourceCIDRs },
		def: zero[[]netip.Prefix], decode: (*decoder).cidrList, null: nullList, merge: union},
	&keyOf[[]string]{name: KeyEgressIf, own: true, field: func(c *Config) *[]string { return &c.EgressInterfaces },
		def: zero[[]string], decode: (*decoder).ifnameList, null: nullNames, merge: unionNames},
}

// knownKeys are the keys' names, in the table's order.
var knownKeys = func() []string {
	names := make([]string, len(keys))
	for i, k := range keys {
		names[i] = k.Name()
	}
	return names
}()

// keyOf is a key whose value is a T, with every column of the table.
// Equal, String and Diff follow from T: a CIDR list is compared in order,
// written one CIDR a line and diffed as sets (linear: 100,000 CIDRs);
// one value is compared with ==, written as YAML and diffed as old->new.
type keyOf[T any] struct {
	name string
	// original: the original agent knows the key. false: an extension of
	// this agent (from Baidu CCE), which the original ignores; a file that
	// sets it to other than its default is warned about.
	original bool
	// own: an extension of this agent's own (not Baidu CCE's). String
	// leaves it out while it is empty, so that a config without it keeps
	// its text and Hash.
	own   bool
	field func(*Config) *T // where Config holds the value
	def   func(Flags) T    // the default, for these flags
	// decode reads a value (not null) of the key as written (key), as
	// encoding/json read it into the original agent's struct: old is what
	// was there (the default, or an earlier value of a repeated key).
	decode func(d *decoder, key string, v any, old T) T
	// null is a null value: what it leaves, and whether the key counts as
	// set by the file (for --strict's checks).
	null func(d *decoder, key string, old T) (T, bool)
	// merge combines the values of the files of a config directory that
	// set the key: for this agent's own keys only (the rest merge as
	// Azure's agent merges them, or are not read there: azure.go).
	merge func([]T) T
}

// key is a keyOf of any type: what the package does with one key.
type key interface {
	Name() string
	isOriginal() bool
	// extensionNote is the warning for a file that sets an extension
	// (not isOriginal) to other than its default.
	extensionNote() string
	// cidrs is the key's CIDR list, or nil for a key of one value.
	cidrs(c *Config) *[]netip.Prefix
	list() bool // a CIDR list
	setDefault(c *Config, f Flags)
	decodeInto(d *decoder, c *Config, key string, v any) (set bool)
	equal(a, b *Config) bool
	write(b textWriter, c *Config)
	diff(old, c *Config) string // "" when the same
	mergeInto(c *Config, set []*Config)
}

func (k *keyOf[T]) Name() string     { return k.name }
func (k *keyOf[T]) isOriginal() bool { return k.original }

func (k *keyOf[T]) extensionNote() string {
	if k.own {
		return msgOwnExtension
	}
	return msgExtension
}

const msgOwnExtension = "an extension of this agent: the original agent ignores this key, so with it the same file means something else there"

func (k *keyOf[T]) cidrs(c *Config) *[]netip.Prefix {
	p, _ := any(k.field(c)).(*[]netip.Prefix)
	return p
}

func (k *keyOf[T]) list() bool { return k.cidrs(&Config{}) != nil }

func (k *keyOf[T]) setDefault(c *Config, f Flags) { *k.field(c) = k.def(f) }

func (k *keyOf[T]) decodeInto(d *decoder, c *Config, key string, v any) bool {
	p := k.field(c)
	d.name = k.name
	if v == nil {
		var set bool
		*p, set = k.null(d, key, *p)
		return set
	}
	*p = k.decode(d, key, v, *p)
	return true
}

func (k *keyOf[T]) mergeInto(c *Config, set []*Config) {
	vals := make([]T, len(set))
	for i, s := range set {
		vals[i] = *k.field(s)
	}
	*k.field(c) = k.merge(vals)
}

// names is the key's list of names, or nil for a key of another type.
func (k *keyOf[T]) names(c *Config) *[]string {
	p, _ := any(k.field(c)).(*[]string)
	return p
}

func (k *keyOf[T]) equal(a, b *Config) bool {
	if l := k.names(a); l != nil {
		return slices.Equal(*l, *k.names(b))
	}
	if l := k.cidrs(a); l != nil {
		if o := *k.cidrs(b); len(o) == len(*l) && len(o) > 0 && &o[0] == &(*l)[0] {
			return true // one list: the Loader's config of unchanged bytes, at every resync
		}
		return slices.Equal(*l, *k.cidrs(b)) // a nil and an empty list are the same
	}
	return any(*k.field(a)) == any(*k.field(b))
}

func (k *keyOf[T]) write(b textWriter, c *Config) {
	if l := k.cidrs(c); l != nil {
		if k.own && len(*l) == 0 {
			return
		}
		writeList(b, k.name, *l)
		return
	}
	if l := k.names(c); l != nil {
		if k.own && len(*l) == 0 {
			return
		}
		q := make([]string, len(*l))
		for i, s := range *l {
			q[i] = strconv.Quote(s)
		}
		fmt.Fprintf(b, "%s: [%s]\n", k.name, strings.Join(q, ", "))
		return
	}
	var zero T
	if k.own && any(*k.field(c)) == any(zero) {
		return // an own key at its zero value, the default: old configs keep their text
	}
	fmt.Fprintf(b, "%s: %s\n", k.name, scalar(*k.field(c)))
}

func (k *keyOf[T]) diff(old, c *Config) string {
	if l := k.cidrs(c); l != nil {
		return diffList(k.name, *k.cidrs(old), *l)
	}
	if l := k.names(c); l != nil {
		// As a CIDR list's: the names added, then the names removed.
		var parts []string
		for _, n := range *l {
			if !slices.Contains(*k.names(old), n) {
				parts = append(parts, "+"+n)
			}
		}
		for _, n := range *k.names(old) {
			if !slices.Contains(*l, n) {
				parts = append(parts, "-"+n)
			}
		}
		if len(parts) == 0 {
			return ""
		}
		return k.name + " " + strings.Join(parts, " ")
	}
	if o, n := any(*k.field(old)), any(*k.field(c)); o != n {
		return fmt.Sprintf("%s %s->%s", k.name, shown(o), shown(n))
	}
	return ""
}

// scalar writes a value of one key as YAML: a duration quoted ("1m0s"),
// an address quoted ("2001:db8::1" is not a plain YAML scalar everywhere).
func scalar(v any) string {
	switch v := v.(type) {
	case time.Duration:
		return strconv.Quote(v.String())
	case netip.Addr:
		return strconv.Quote(v.String())
	}
	return fmt.Sprint(v)
}

// shown is a value in Diff: an unset address as "none".
func shown(v any) string {
	if a, ok := v.(netip.Addr); ok && !a.IsValid() {
		return "none"
	}
	return fmt.Sprint(v)
}

// The defaults.

func zero[T any](Flags) (v T) { return v }

func always[T any](v T) func(Flags) T { return func(Flags) T { return v } }

func defaultNonMasq(f Flags) []netip.Prefix {
	cidrs := []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"}
	if f.NoMasqAllReservedRanges {
		cidrs = append(cidrs, "100.64.0.0/10", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24",
			"198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "240.0.0.0/4")
	}
	out := make([]netip.Prefix, 0, len(cidrs))
	for _, s := range cidrs {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func defaultResyncInterval(f Flags) time.Duration {
	if f.ResyncInterval > 0 {
		return f.ResyncInterval
	}
	return defaultResync
}

// What null means, as encoding/json read it.

// keep: null leaves a boolean or a number as it was, and does not set it.
func keep[T any](_ *decoder, _ string, old T) (T, bool) { return old, false }

// nullList: null empties a list.
func nullList(d *decoder, _ string, old []netip.Prefix) ([]netip.Prefix, bool) {
	d.lists[d.name] = &list{}
	return old, true
}

func nullNonMasq(d *decoder, key string, old []netip.Prefix) ([]netip.Prefix, bool) {
	d.warnAt(key, -1, "null means an empty list, as in the original agent: every destination but link-local is masqueraded (write [] to say so)")
	return nullList(d, key, old)
}

// nullDuration: metav1.Duration reads null as "", which is not a duration.
func nullDuration(d *decoder, key string, old time.Duration) (time.Duration, bool) {
	d.errorAt(key, -1, "expected a duration string such as \"60s\", got null")
	return old, false
}

// The merge rules of this agent's own keys in a directory (azure.go).

// union: the prefixes of each file that no earlier file has (a file's own
// duplicates are kept, as Parse keeps them).
func union(set [][]netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	seen := make(map[netip.Prefix]bool)
	for _, ps := range set {
		for _, p := range ps {
			if !seen[p] {
				out = append(out, p)
			}
		}
		for _, p := range ps {
			seen[p] = true
		}
	}
	return out
}

// lastSet: the value of the last file (in name order) that sets it, as a
// repeated key within one file.
func lastSet[T any](set []T) T { return set[len(set)-1] }

// mostSpecificIfAny: mostSpecific if any file sets it. A file's lists
// mean, under mostSpecific, what they meant under listOrder unless a
// listed CIDR holds a more specific one of the other list, which is what
// a file written for mostSpecific says; the loader warns when files
// disagree (Loader.Load), and the agent logs and diffs the ranges whose
// decision changes, as for any change.
func mostSpecificIfAny(set []CIDRMatch) CIDRMatch {
	if slices.Contains(set, MostSpecific) {
		return MostSpecific
	}
	return ListOrder
}

// nullNames: null empties a list of names.
func nullNames(*decoder, string, []string) ([]string, bool) { return nil, true }

// unionNames: the names of each file that no earlier file has.
func unionNames(set [][]string) []string {
	var out []string
	for _, ns := range set {
		for _, n := range ns {
			if !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
	}
	return out
}

// ifnameList decodes a list of interface names, each a name nft matches
// in an ifname set: at most 15 bytes (IFNAMSIZ - 1), "*" only at the end
// (nft's wildcard), and none of what Linux refuses in a name (white
// space, "/", ":") or nft reads otherwise (a quote, a backslash, which
// escapes "*"); printable ASCII only.
func (d *decoder) ifnameList(key string, v any, _ []string) []string {
	vals, ok := v.([]any)
	if ss, isStrings := v.(stringList); isStrings {
		vals, ok = make([]any, len(ss)), true
		for i, s := range ss {
			vals[i] = s
		}
	}
	if !ok {
		d.errorAt(key, -1, "expected a list of interface names, got %s", describe(v))
		return nil
	}
	out := make([]string, 0, len(vals))
	for i, val := range vals {
		s, ok := val.(string)
		if !ok {
			d.errorAt(key, i, "expected an interface name such as \"eth0\" or \"eth*\", got %s", describe(val))
			continue
		}
		if why := badIfname(s); why != "" {
			d.errorAt(key, i, "%s is not an interface name nft can match: %s", quote(s), why)
			continue
		}
		out = append(out, strings.Clone(s)) // fastYAML's items alias the file's bytes
	}
	return out
}

func badIfname(s string) string {
	base, _ := strings.CutSuffix(s, "*")
	switch {
	case s == "":
		return "empty"
	case s == "*":
		return "a bare \"*\" matches every interface: leave the key out instead"
	case len(s) > 15:
		return fmt.Sprintf("%d characters, more than the kernel's 15 (IFNAMSIZ - 1)", len(s))
	case strings.Contains(base, "*"):
		return "\"*\" is a wildcard only at the end"
	case base == "." || base == "..":
		return "not a name Linux gives an interface"
	}
	for _, c := range base {
		if c <= ' ' || c > '~' || strings.ContainsRune("/:\"\\", c) {
			return fmt.Sprintf("holds %q, which Linux or nft does not take in a name", c)
		}
	}
	return ""
}

// Flags are the command-line flags that change defaults and validation.
type Flags struct {
	NoMasqAllReservedRanges bool // --nomasq-all-reserved-ranges
	EnableIPv6              bool // --enable-ipv6
	// ResyncInterval, when not zero, is the resync interval of a config
	// that sets none (Azure's ip-masq-agent-v2: --resync-interval=SECONDS;
	// its config files have no resyncInterval key).
	ResyncInterval time.Duration
	// AzureDir: the file is one of a config directory's, read with the
	// meaning Azure's ip-masq-agent-v2 gives it (azure.go), not the
	// original agent's. Set by Loader and validate, not by a flag.
	AzureDir bool
}

// Config is a validated configuration.
type Config struct {
	NonMasqueradeCIDRs []netip.Prefix // as written (after unmapping 4in6), order kept, duplicates kept
	MasqueradeCIDRs    []netip.Prefix
	MasqLinkLocal      bool
	MasqLinkLocalIPv6  bool
	MasqOutBound       bool
	MasqOutBoundIPv6   bool
	ResyncInterval     time.Duration
	CIDRLimit          int
	// NonMasqueradeSourceCIDRs: traffic from these sources is never
	// masqueraded (this agent's extension).
	NonMasqueradeSourceCIDRs []netip.Prefix
	// SNATAddress and SNATAddressIPv6: source-NAT masqueraded traffic of
	// that family to this address rather than to the outgoing
	// interface's (this agent's extension); the zero Addr: masquerade.
	SNATAddress     netip.Addr
	SNATAddressIPv6 netip.Addr
	// CIDRMatch: how masqueradeCIDRs and nonMasqueradeCIDRs decide
	// together (this agent's extension).
	CIDRMatch CIDRMatch
	// MasqueradeSourceCIDRs: when not empty, only traffic from these
	// sources may be masqueraded, of either family (this agent's
	// extension; the "pods only" guard).
	MasqueradeSourceCIDRs []netip.Prefix
	// EgressInterfaces: when not empty, only traffic leaving through
	// these interfaces may be masqueraded; a name may end in nft's "*"
	// (this agent's extension).
	EgressInterfaces []string
}

// CIDRMatch says which CIDR of masqueradeCIDRs and nonMasqueradeCIDRs
// decides for a destination both hold.
type CIDRMatch uint8

const (
	// ListOrder (the default, the original's and CCE's meaning): any CIDR
	// of masqueradeCIDRs wins over every one of nonMasqueradeCIDRs.
	ListOrder CIDRMatch = iota
	// MostSpecific: the longest prefix of both lists (and link-local's)
	// that holds the destination decides, to any depth.
	MostSpecific
)

func (m CIDRMatch) String() string {
	if m == MostSpecific {
		return "mostSpecific"
	}
	return "listOrder"
}

// DestinationOnly is c without the keys that select traffic by anything
// but its destination (the source keys): how c decides for traffic that
// none of them singles out. The original agent decides by destination
// alone; this is what its decisions are compared with.
func (c Config) DestinationOnly() Config {
	c.NonMasqueradeSourceCIDRs, c.MasqueradeSourceCIDRs, c.EgressInterfaces = nil, nil, nil
	return c
}

// DefaultPath is where Kubernetes mounts the ConfigMap key.
const DefaultPath = "/etc/config/ip-masq-agent"

// MaxFileSize bounds the file size; larger files are refused before parsing.
const MaxFileSize = 4 << 20

const (
	defaultCIDRLimit = 64
	defaultResync    = 60 * time.Second
	minResync        = time.Second // shorter intervals would spin the CPU
	maxReported      = 20          // more errors or warnings are summarised
	maxShown         = 80          // runes of a value shown in a message
	ipv4MappedBits   = 96          // ::ffff:0:0/96 holds the IPv4 space
)

// Default returns the configuration used when there is no file.
func Default(f Flags) Config {
	var c Config
	for _, k := range keys {
		k.setDefault(&c, f)
	}
	return c
}

// Equal reports whether two configs are the same (for change detection).
// A nil and an empty list are the same.
func (c Config) Equal(o Config) bool {
	for _, k := range keys {
		if !k.equal(&c, &o) {
			return false
		}
	}
	return true
}

// Hash identifies c: the first 16 hex digits of the SHA-256 of c.String().
// Equal configs have equal hashes (comments, key order and spelling of the
// file do not matter; the flags' defaults do).
func (c Config) Hash() string {
	// Written into the hash as String writes it, not kept: 100,000 CIDRs
	// are 2.3 MB of text at every change.
	h := sha256.New()
	c.write(hashText{h})
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// hashText is a hash as a textWriter: writeList sends it chunks, the
// other keys a few lines.
type hashText struct{ hash.Hash }

func (h hashText) WriteString(s string) (int, error) { return h.Write([]byte(s)) }

// textWriter is what String and Hash write c's text to.
type textWriter interface {
	io.Writer
	io.StringWriter
}

// String renders c as YAML, one CIDR per line so that two renderings diff well.
// Parsing it with the same Flags gives back c.
func (c Config) String() string {
	var b strings.Builder
	c.write(&b)
	return b.String()
}

func (c *Config) write(b textWriter) {
	for _, k := range keys {
		k.write(b, c)
	}
}

func writeList(b textWriter, key string, ps []netip.Prefix) {
	if len(ps) == 0 {
		fmt.Fprintf(b, "%s: []\n", key)
		return
	}
	fmt.Fprintf(b, "%s:\n", key)
	// Hash writes 100,000 CIDRs at every change: no fmt, and the text goes
	// out in chunks, not a Write per CIDR. A prefix's text needs no
	// escapes, so %q of it is it in quotes.
	if sb, ok := b.(*strings.Builder); ok {
		sb.Grow(len(ps) * len(`  - "255.255.255.255/32"`+"\n"))
	}
	buf := make([]byte, 0, 16<<10)
	for _, p := range ps {
		if len(buf) > cap(buf)-64 {
			b.Write(buf)
			buf = buf[:0]
		}
		buf = append(buf, `  - "`...)
		buf = appendPrefix(buf, p)
		buf = append(buf, "\"\n"...) // quoted: "::/0" is not a plain YAML scalar
	}
	b.Write(buf)
}

// appendPrefix appends p.String(): IPv4 by a table of the decimals 0 to
// 255 (Hash writes 100,000 CIDRs at every change), anything else as
// netip writes it.
func appendPrefix(buf []byte, p netip.Prefix) []byte {
	if !p.IsValid() {
		return append(buf, p.String()...)
	}
	if !p.Addr().Is4() {
		return p.AppendTo(buf)
	}
	a := p.Addr().As4()
	buf = append(buf, decimals[a[0]]...)
	buf = append(buf, '.')
	buf = append(buf, decimals[a[1]]...)
	buf = append(buf, '.')
	buf = append(buf, decimals[a[2]]...)
	buf = append(buf, '.')
	buf = append(buf, decimals[a[3]]...)
	buf = append(buf, '/')
	return append(buf, decimals[p.Bits()]...)
}

// decimals[i] is strconv.Itoa(i).
var decimals = func() (d [256]string) {
	for i := range d {
		d[i] = strconv.Itoa(i)
	}
	return d
}()

// snatDecoder reads snatAddress (f 4) or snatAddressIPv6 (f 6): one
// address of that family, as a string; not a prefix, not a zone, not an
// address that cannot be a packet's source.
func snatDecoder(f int) func(d *decoder, key string, v any, old netip.Addr) netip.Addr {
	return func(d *decoder, key string, v any, old netip.Addr) netip.Addr {
		s, ok := v.(string)
		if !ok {
			d.errorAt(key, -1, "expected an IP address string such as %q, got %s", example(f), describe(v))
			return old
		}
		a, err := netip.ParseAddr(strings.TrimSpace(s))
		switch {
		case err != nil && strings.Contains(s, "/"):
			d.errorAt(key, -1, "%s is a prefix: want one address, such as %q", quote(s), example(f))
			return old
		case err != nil:
			d.errorAt(key, -1, "%s is not an IP address", quote(s))
			return old
		case a.Zone() != "":
			d.errorAt(key, -1, "%s has a zone: want an address without one", quote(s))
			return old
		}
		a4 := a.Unmap()
		switch {
		case f == 4 && !a4.Is4():
			d.errorAt(key, -1, "%s is an IPv6 address: want an IPv4 one (IPv6 goes in %s)", quote(s), KeySNAT6)
			return old
		case f == 6 && (a.Is4() || a.Is4In6()):
			d.errorAt(key, -1, "%s is an IPv4 address: want an IPv6 one (IPv4 goes in %s)", quote(s), KeySNAT)
			return old
		case a4.IsUnspecified() || a4.IsMulticast() || a4.IsLoopback() || a4 == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
			d.errorAt(key, -1, "%s cannot be a packet's source address", quote(s))
			return old
		}
		return a4
	}
}

func example(f int) string {
	if f == 6 {
		return "2001:db8::10"
	}
	return "192.0.2.10"
}
