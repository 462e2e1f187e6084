package config

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
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
		def: zero[[]netip.Prefix], decode: (*decoder).cidrList, null: nullList},
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
	write(b *strings.Builder, c *Config)
	diff(old, c *Config) string // "" when the same
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

func (k *keyOf[T]) equal(a, b *Config) bool {
	if l := k.cidrs(a); l != nil {
		return slices.Equal(*l, *k.cidrs(b)) // a nil and an empty list are the same
	}
	return any(*k.field(a)) == any(*k.field(b))
}

func (k *keyOf[T]) write(b *strings.Builder, c *Config) {
	if l := k.cidrs(c); l != nil {
		if k.own && len(*l) == 0 {
			return
		}
		writeList(b, k.name, *l)
		return
	}
	fmt.Fprintf(b, "%s: %s\n", k.name, scalar(*k.field(c)))
}

func (k *keyOf[T]) diff(old, c *Config) string {
	if l := k.cidrs(c); l != nil {
		return diffList(k.name, *k.cidrs(old), *l)
	}
	if o, n := any(*k.field(old)), any(*k.field(c)); o != n {
		return fmt.Sprintf("%s %v->%v", k.name, o, n)
	}
	return ""
}

// scalar writes a value of one key as YAML: a duration quoted ("1m0s").
func scalar(v any) string {
	if d, ok := v.(time.Duration); ok {
		return strconv.Quote(d.String())
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
}

// DestinationOnly is c without the keys that select traffic by anything
// but its destination (the source keys): how c decides for traffic that
// none of them singles out. The original agent decides by destination
// alone; this is what its decisions are compared with.
func (c Config) DestinationOnly() Config {
	c.NonMasqueradeSourceCIDRs = nil
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
	sum := sha256.Sum256([]byte(c.String()))
	return hex.EncodeToString(sum[:8])
}

// String renders c as YAML, one CIDR per line so that two renderings diff well.
// Parsing it with the same Flags gives back c.
func (c Config) String() string {
	var b strings.Builder
	for _, k := range keys {
		k.write(&b, &c)
	}
	return b.String()
}

func writeList(b *strings.Builder, key string, ps []netip.Prefix) {
	if len(ps) == 0 {
		fmt.Fprintf(b, "%s: []\n", key)
		return
	}
	fmt.Fprintf(b, "%s:\n", key)
	for _, p := range ps {
		fmt.Fprintf(b, "  - %q\n", p.String()) // quoted: "::/0" is not a plain YAML scalar
	}
}
