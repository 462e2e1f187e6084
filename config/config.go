// Package config reads and validates the ip-masq-agent configuration file,
// compatible with the original agent's format plus Baidu CCE's extensions.
package config

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	yamlv2 "go.yaml.in/yaml/v2"
	"sigs.k8s.io/yaml"
)

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

type entry struct {
	key string
	val any // as decoded by encoding/json with UseNumber
}

// Parse parses YAML or JSON. Warnings are one-line strings for things
// accepted with a note; they are returned with an error too. The error, if
// any, is one line; several problems are joined with "; " in file order.
//
// Every file gets the meaning the original agent gave it (its path:
// k8s.io/apimachinery's yaml.ToJSON, then encoding/json into its struct
// pre-filled with the defaults, then its validation), except for the
// deliberate differences listed in README.md ("Differences from the
// original"), each of which comes with a warning. config/parity_test.go
// checks this against a model of the original's decoding.
func Parse(data []byte, f Flags) (Config, []string, error) {
	c, _, warns, err := parseKeys(data, f)
	return c, warns, err
}

// parseKeys is Parse that also returns the known keys set by the file,
// for merging (see Loader).
func parseKeys(data []byte, f Flags) (Config, map[string]bool, []string, error) {
	return parseKeysWith(data, f, true)
}

// parseKeysWith is parseKeys; fast false turns the fast path off (for the
// tests that compare the two paths).
func parseKeysWith(data []byte, f Flags, fast bool) (Config, map[string]bool, []string, error) {
	c, d, err := parseWith(data, f, fast)
	if err != nil {
		return Config{}, nil, nil, err
	}
	warns := capped(d.messages(true), d.dropped[1], "warnings")
	if errs := d.messages(false); len(errs) > 0 {
		return Config{}, nil, warns, errors.New(strings.Join(capped(errs, d.dropped[0], "errors"), "; "))
	}
	return c, d.present, warns, nil
}

// isJSON is the original agent's test (apimachinery's yaml.IsJSONBuffer):
// a file whose first non-space character is "{" is JSON and is given to
// encoding/json unchanged; anything else is YAML.
func isJSON(data []byte) bool {
	return bytes.HasPrefix(bytes.TrimLeftFunc(data, unicode.IsSpace), []byte("{"))
}

// parse is Parse with the decoder's findings and the keys present. The
// error is about the document as a whole (syntax, not a mapping); problems
// with keys are in the decoder, and c is returned even with them.
func parse(data []byte, f Flags) (Config, *decoder, error) {
	return parseWith(data, f, true)
}

// parseWith is parse; with fast, the common shapes of a file are read by
// fastYAML (see fast.go) instead of the YAML library, with the same result.
func parseWith(data []byte, f Flags, fast bool) (Config, *decoder, error) {
	if len(data) == 0 {
		if f.AzureDir {
			return azureEmpty(f), &decoder{f: f, present: map[string]bool{}}, nil
		}
		return Default(f), &decoder{f: f, present: map[string]bool{}}, nil
	}
	var entries []entry
	var err error
	var order map[string]int // the position of each key in the file
	var repeated []string    // YAML: keys written more than once, exactly
	asJSON := isJSON(data)
	simple := false // a document fastYAML read: one document, no repeated keys
	if fast && !asJSON {
		entries, order, simple = fastYAML(data)
	}
	switch {
	case simple:
	case asJSON:
		entries, err = jsonEntries(data)
	default:
		entries, err = yamlEntries(data)
		order, repeated = yamlKeyOrder(data)
	}
	if err != nil {
		return Config{}, nil, err
	}
	// The entries are in the order encoding/json saw them in the original
	// agent: the file's for JSON, sorted by key for YAML (sigs.k8s.io/yaml
	// goes through a map). Where a key is given twice, the later one wins.
	c, d := decode(entries, f, repeated)
	if order == nil {
		order = make(map[string]int, len(entries))
		for i, e := range entries {
			if _, ok := order[e.key]; !ok {
				order[e.key] = i
			}
		}
	}
	// Report in file order rather than in the decoding order.
	n := d.entryFindings
	sort.SliceStable(d.found[:n], func(i, j int) bool {
		a, b := d.found[i], d.found[j]
		if pa, pb := keyPos(order, a.key), keyPos(order, b.key); pa != pb {
			return pa < pb
		}
		return a.index < b.index
	})
	if !asJSON && !simple && moreDocuments(data) {
		d.add(finding{warning: true, index: -1, msg: msgMoreDocuments, text: msgMoreDocuments})
	}
	return c, d, nil
}

const msgMoreDocuments = "content after the first YAML document (after a \"---\" or \"...\" line) is ignored, " +
	"as the original agent ignored it: a config is one document"

func keyPos(order map[string]int, key string) int {
	if p, ok := order[key]; ok {
		return p
	}
	return math.MaxInt
}

func capped(msgs []string, dropped int, what string) []string {
	if len(msgs) <= maxReported && dropped == 0 {
		return msgs
	}
	return append(msgs[:maxReported:maxReported], fmt.Sprintf("and %d more %s", len(msgs)+dropped-maxReported, what))
}

// moreDocuments reports whether YAML data holds anything after its first
// document (empty documents aside).
func moreDocuments(data []byte) bool {
	dec := yamlv2.NewDecoder(bytes.NewReader(data))
	var v any
	if err := dec.Decode(&v); err != nil {
		return false // the first document's errors are reported elsewhere
	}
	for {
		v = nil
		err := dec.Decode(&v)
		if err == io.EOF {
			return false
		}
		if err != nil || v != nil {
			return true
		}
	}
}

func parseError(reason string) error {
	return errors.New("cannot parse YAML/JSON: " + reason)
}

// jsonEntries reads the top-level object of JSON in order, repeated keys
// included: encoding/json applies each in turn, so the last one wins.
func jsonEntries(data []byte) ([]entry, error) {
	if !json.Valid(data) {
		var v any
		err := json.Unmarshal(data, &v)
		if se := (*json.SyntaxError)(nil); errors.As(err, &se) {
			line := 1 + bytes.Count(data[:min(int(se.Offset), len(data))], []byte("\n"))
			return nil, parseError(fmt.Sprintf("line %d: %s (a file starting with \"{\" is read as JSON, as the original agent did)", line, se.Error()))
		}
		return nil, parseError(fmt.Sprint(err))
	}
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	if _, err := d.Token(); err != nil {
		return nil, parseError(err.Error())
	}
	var entries []entry
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			return nil, parseError(err.Error())
		}
		key, _ := tok.(string)
		var v any
		if err := d.Decode(&v); err != nil {
			return nil, parseError(err.Error())
		}
		entries = append(entries, entry{key, v})
	}
	return entries, nil
}

// yamlEntries returns the top-level keys sorted by name, as encoding/json
// sees them after sigs.k8s.io/yaml (which keeps the last of repeated keys
// and only the first document); nil for an empty document.
func yamlEntries(data []byte) ([]entry, error) {
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, parseError(oneLine(err.Error()) + tabNote(data))
	}
	d := json.NewDecoder(bytes.NewReader(j))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, parseError(err.Error())
	}
	if v == nil {
		return nil, nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("the document must be a mapping of keys to values, got %s", describe(v))
	}
	entries := make([]entry, 0, len(m))
	for k, v := range m {
		entries = append(entries, entry{k, v})
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].key < entries[j].key })
	return entries, nil
}

// tabNote names the first line indented with a tab, which YAML refuses
// (the parser's own message rarely says so); "" if there is none.
func tabNote(data []byte) string {
	for i, line := range bytes.Split(data, []byte("\n")) {
		indent := line[:len(line)-len(bytes.TrimLeft(line, " \t"))]
		if bytes.IndexByte(indent, '\t') >= 0 && len(bytes.TrimSpace(line)) > 0 {
			return fmt.Sprintf(" (line %d is indented with a tab: YAML indents with spaces only)", i+1)
		}
	}
	return ""
}

// yamlKeyOrder returns the position of each top-level key and the keys
// written more than once; nil if data is not a mapping.
func yamlKeyOrder(data []byte) (map[string]int, []string) {
	var ms yamlv2.MapSlice
	if yamlv2.Unmarshal(data, &ms) != nil {
		return nil, nil
	}
	pos := make(map[string]int, len(ms))
	var repeated []string
	for i, item := range ms {
		k := keyString(item.Key)
		if _, ok := pos[k]; !ok {
			pos[k] = i
		} else if !slices.Contains(repeated, k) {
			repeated = append(repeated, k)
		}
	}
	return pos, repeated
}

// keyString converts a YAML key to a string as sigs.k8s.io/yaml does.
func keyString(k any) string {
	if f, ok := k.(float64); ok {
		switch s := strconv.FormatFloat(f, 'g', -1, 32); s {
		case "+Inf":
			return ".inf"
		case "-Inf":
			return "-.inf"
		case "NaN":
			return ".nan"
		default:
			return s
		}
	}
	return fmt.Sprint(k)
}

// oneLine joins the lines of a library's multi-line error.
func oneLine(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		if b.Len() > 0 {
			if strings.HasSuffix(b.String(), ":") {
				b.WriteString(" ")
			} else {
				b.WriteString("; ")
			}
		}
		b.WriteString(line)
	}
	return strings.ReplaceAll(b.String(), "\r", " ")
}

type decoder struct {
	f             Flags
	found         []finding         // errors and warnings, in the order found
	dropped       [2]int            // errors, warnings not stored past maxStored
	present       map[string]bool   // known keys (canonical) set to a non-null value (or a null list)
	name          string            // the known key (canonical) being decoded
	written       map[string]string // known keys (canonical) as written (the one that decided)
	badLimit      bool              // cidrLimit is invalid, so the lists cannot be checked against it
	entryFindings int               // found[:entryFindings] are about single keys (sorted into file order)
	lists         map[string]*list  // the CIDR lists as encoding/json leaves them, checked at the end
}

// list is a CIDR list as encoding/json decodes it into a []string that
// already holds a value: items go into the existing backing array in
// place, and a null item leaves the string that was there (a default, or
// an item of an earlier list under the same key). len(items) stands for the
// array's capacity: past it, a null item is "".
type list struct {
	items []item
	n     int // the slice's length
	// A list of strings only (decodeStrings) is kept as it is, with the
	// key that set it: items[:len(strs)] are made only if needed (see
	// materialize). The slice's length is then len(strs).
	strs stringList
	key  string
}

// item returns the i-th item, i < l.n.
func (l *list) item(i int) item {
	if l.strs != nil {
		return item{s: l.strs[i], set: true, key: l.key, index: i}
	}
	return l.items[i]
}

// materialize makes the items of strs.
func (l *list) materialize() {
	if l.strs == nil {
		return
	}
	l.grow(len(l.strs))
	for i := range l.strs {
		l.items[i] = l.item(i)
	}
	l.strs, l.key = nil, ""
}

type item struct {
	s     string
	set   bool   // false: the zero string, never written
	bad   bool   // not a string: reported already
	key   string // the key as written that set it; "" for a default
	index int
}

// finding is one error or warning, with what Check needs to place it.
type finding struct {
	warning bool
	key     string // the key as written
	index   int    // the list item, or -1
	at      string // the key whose line it is reported at, if not key
	msg     string // the message without the key
	text    string // the message as Parse reports it
}

// errorAt and warnAt record "key: msg" or "key[index]: msg".
func (d *decoder) errorAt(key string, index int, format string, a ...any) {
	d.add(finding{key: key, index: index, msg: fmt.Sprintf(format, a...)})
}

func (d *decoder) warnAt(key string, index int, format string, a ...any) {
	d.add(finding{warning: true, key: key, index: index, msg: fmt.Sprintf(format, a...)})
}

// maxStored bounds the findings kept: a 1 MiB list of bad items would
// otherwise hold half a million messages in memory.
const maxStored = 1000

func (d *decoder) add(f finding) {
	if len(d.found) >= maxStored {
		if f.warning {
			d.dropped[1]++
		} else {
			d.dropped[0]++
		}
		return
	}
	if f.text == "" {
		f.text = keyPath(f.key, f.index) + ": " + f.msg
	}
	d.found = append(d.found, f)
}

// messages returns the warnings' or the errors' texts; nil if none.
func (d *decoder) messages(warnings bool) []string {
	var out []string
	for _, f := range d.found {
		if f.warning == warnings {
			out = append(out, f.text)
		}
	}
	return out
}

func keyPath(key string, index int) string {
	if index < 0 {
		return key
	}
	return fmt.Sprintf("%s[%d]", key, index)
}

func decode(entries []entry, f Flags, repeated []string) (Config, *decoder) {
	if f.AzureDir {
		return decodeAzure(entries, f, repeated)
	}
	c := Default(f)
	d := &decoder{f: f, present: make(map[string]bool), lists: make(map[string]*list)}
	for _, k := range keys {
		if ps := k.cidrs(&c); ps != nil {
			l := &list{}
			for _, p := range *ps {
				l.items = append(l.items, item{s: p.String(), set: true, index: -1})
			}
			l.n = len(l.items)
			d.lists[k.Name()] = l
		}
	}
	seen := make(map[string][]string) // known key -> keys as written, in decoding order
	for _, e := range entries {
		k := keyNamed(canonical(e.key))
		switch {
		case k == nil:
			d.add(finding{warning: true, key: e.key, index: -1, msg: "unknown key ignored" + suggest(e.key),
				text: fmt.Sprintf("unknown key %s ignored%s", quote(e.key), suggest(e.key))})
		default:
			name := k.Name()
			if name != e.key && !slices.Contains(seen[name], e.key) {
				d.add(finding{warning: true, key: e.key, index: -1, msg: fmt.Sprintf("read as %q; please spell it exactly", name),
					text: fmt.Sprintf("key %s read as %q; please spell it exactly", quote(e.key), name)})
			}
			seen[name] = append(seen[name], e.key)
			if k.decodeInto(d, &c, e.key, e.val) {
				d.present[name] = true
			}
		}
	}
	d.written = make(map[string]string, len(seen))
	for name, keys := range seen {
		d.written[name] = keys[len(keys)-1]
	}
	// Repeated keys: as in the original agent, the last one read decides.
	for _, name := range knownKeys {
		keys := seen[name]
		last := d.written[name]
		if len(keys) > 1 || slices.Contains(repeated, last) {
			d.add(finding{warning: true, key: last, index: -1,
				msg:  fmt.Sprintf("given more than once (keys match case-insensitively); the value of the last one read, %s, is used, as in the original agent", quote(last)),
				text: fmt.Sprintf("key %s given more than once (keys match case-insensitively); the value of the last one read, %s, is used, as in the original agent", quote(name), quote(last))})
		}
	}
	for _, k := range keys {
		if ps := k.cidrs(&c); ps != nil {
			*ps = d.checkList(k.Name())
		}
	}
	// The extension keys change what the original agent would have done
	// with the same file only when they are not at their defaults (and
	// the file is valid).
	def := Default(f)
	for _, k := range keys {
		if !k.isOriginal() && !k.equal(&c, &def) && len(d.messages(false)) == 0 {
			d.warnAt(d.written[k.Name()], -1, "%s", msgExtension)
		}
	}
	d.entryFindings = len(d.found)
	if !d.badLimit {
		for _, k := range keys {
			ps := k.cidrs(&c)
			if ps == nil || len(*ps) <= c.CIDRLimit {
				continue
			}
			name, n := k.Name(), len(*ps)
			if key, ok := d.written[name]; ok {
				d.errorAt(key, -1, "%d CIDRs exceed cidrLimit %d", n, c.CIDRLimit)
			} else if n > 0 { // not written: its defaults exceed the limit
				d.add(finding{key: name, index: -1, at: d.written[KeyLimit],
					msg: fmt.Sprintf("%d CIDRs (the defaults) exceed cidrLimit %d", n, c.CIDRLimit)})
			}
		}
	}
	return c, d
}

const msgExtension = "an extension of this agent (from Baidu CCE): the original agent ignores this key, so with it the same file means something else there"

// keyNamed returns the key of that (canonical) name, or nil.
func keyNamed(name string) key {
	for _, k := range keys {
		if k.Name() == name {
			return k
		}
	}
	return nil
}

func canonical(key string) string {
	for _, k := range knownKeys {
		if k == key {
			return k
		}
	}
	// encoding/json, which the original agent used, matches keys this way
	// (its fold is bytes.EqualFold's).
	for _, k := range knownKeys {
		if strings.EqualFold(k, key) {
			return k
		}
	}
	return ""
}

// cidrList decodes a list of the key being decoded into its list (see
// list), which checkList makes the key's CIDRs at the end: old stays.
func (d *decoder) cidrList(key string, v any, old []netip.Prefix) []netip.Prefix {
	d.decodeList(d.name, key, v)
	return old
}

// decodeList decodes a list into the list of name as encoding/json decodes
// a JSON array into a non-empty []string (see list).
func (d *decoder) decodeList(name, key string, v any) {
	if ss, ok := v.(stringList); ok {
		d.decodeStrings(name, key, ss)
		return
	}
	vals, ok := v.([]any)
	if !ok {
		d.errorAt(key, -1, "expected a list of CIDRs, got %s", describe(v))
		return
	}
	l := d.lists[name]
	if len(vals) == 0 {
		d.lists[name] = &list{}
		return
	}
	l.materialize()
	l.grow(len(vals))
	for i, val := range vals {
		switch val := val.(type) {
		case nil:
			if old := l.items[i]; old.set {
				d.warnAt(key, i, "null keeps %s, the item there before (from %s), as in the original agent", quote(old.s), from(old))
			}
		case string:
			l.items[i] = item{s: val, set: true, key: key, index: i}
		default:
			d.errorAt(key, i, "expected a CIDR string such as \"10.0.0.0/8\", got %s", describe(val))
			l.items[i] = item{set: true, bad: true, key: key, index: i}
		}
	}
	l.n = len(vals)
}

// decodeStrings is decodeList for a list of strings only (from fastYAML),
// without an interface value or an item per string.
func (d *decoder) decodeStrings(name, key string, ss stringList) {
	l := d.lists[name]
	if len(ss) == 0 {
		d.lists[name] = &list{}
		return
	}
	l.materialize()
	l.strs, l.key, l.n = ss, key, len(ss)
}

// grow makes room for n items, as encoding/json grows the array: the
// items past the old ones are unset.
func (l *list) grow(n int) {
	if n > len(l.items) {
		l.items = append(l.items, make([]item, n-len(l.items))...)
	}
}

func from(it item) string {
	if it.key == "" {
		return "the defaults"
	}
	return keyPath(it.key, it.index)
}

// checkList validates the list of name as decoded; the original agent
// validated only the final list, not the lists that a repeated key replaced.
func (d *decoder) checkList(name string) []netip.Prefix {
	l := d.lists[name]
	if l.n == 0 {
		return nil
	}
	// One slot per item, valid or not, so that the cidrLimit check counts all.
	out := make([]netip.Prefix, l.n)
	for i := range l.n {
		it := l.item(i)
		key, index := it.key, it.index
		if key == "" {
			key, index = d.written[name], i
		}
		switch {
		case it.bad:
			continue
		case !it.set:
			d.errorAt(key, index, "expected a CIDR string such as \"10.0.0.0/8\", got null")
			continue
		}
		out[i] = d.cidr(key, index, it.s)
	}
	return out
}

func (d *decoder) cidr(key string, i int, s string) netip.Prefix {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		// net.ParseCIDR, which the original agent validated with, also
		// takes leading zeros in the prefix length ("10.0.0.0/010"); then
		// its iptables-restore read such a length as octal.
		if dec, ok := parseCIDRLength(s); ok {
			return d.octalCIDR(key, i, s, dec)
		}
		d.errorAt(key, i, "%s is not a valid CIDR: %s", quote(s), prefixReason(s, err))
		return netip.Prefix{}
	}
	if m := p.Masked(); m != p {
		d.errorAt(key, i, "%s is not aligned to its prefix length (did you mean %q?)", quote(s), m.String())
		return netip.Prefix{}
	}
	return d.family(key, i, s, p)
}

// family unmaps an IPv4-mapped CIDR and refuses an IPv6 one without
// --enable-ipv6.
func (d *decoder) family(key string, i int, s string, p netip.Prefix) netip.Prefix {
	if q, mapped := UnmapPrefix(p); mapped {
		p = q
		d.warnAt(key, i, "%s is an IPv4-mapped IPv6 CIDR; read as %q", quote(s), p.String())
	} else if p.Addr().Is6() && !d.f.EnableIPv6 {
		d.errorAt(key, i, "%s is an IPv6 CIDR; pass --enable-ipv6 to use IPv6", quote(s))
	}
	return p
}

// octalCIDR reads s, whose prefix length has a leading zero, as the
// original agent did: net.ParseCIDR validated it in decimal (dec, which
// must be aligned), then iptables-restore installed the length read in
// octal (xtables_strtoui, base 0: "010" is 8, "032" is 26), masking the
// address to it. A length with an 8 or a 9 is no octal number: the
// original's iptables-restore refused it at every sync and its rules
// stayed as they were; here the config is refused the same way.
func (d *decoder) octalCIDR(key string, i int, s string, dec netip.Prefix) netip.Prefix {
	if m := dec.Masked(); m != dec {
		d.errorAt(key, i, "%s is not aligned to its prefix length (did you mean %q?)", quote(s), m.String())
		return netip.Prefix{}
	}
	_, bits, _ := strings.Cut(s, "/")
	n, err := strconv.ParseUint(bits, 8, 8)
	if err != nil {
		d.errorAt(key, i, "%s has a leading zero in its prefix length, which iptables reads as an octal number, and %q is none: "+
			"the original agent's iptables-restore refused it at every sync, and its rules stayed as they were; write %q",
			quote(s), bits, dec.String())
		return netip.Prefix{}
	}
	p := netip.PrefixFrom(dec.Addr(), int(n)).Masked()
	if int(n) == dec.Bits() {
		d.warnAt(key, i, "%s has leading zeros in its prefix length; read as %q", quote(s), p.String())
	} else {
		d.warnAt(key, i, "%s has a leading zero in its prefix length, which the original agent's iptables-restore read as octal: "+
			"%q, not %q; this agent reads it so too; write %q to keep that, or %q if you meant /%d",
			quote(s), p.String(), dec.String(), p.String(), dec.String(), dec.Bits())
	}
	return d.family(key, i, s, p)
}

// parseCIDRLength parses "ADDR/LEN" where LEN has leading zeros, as
// net.ParseCIDR does (and netip.ParsePrefix does not): LEN in decimal.
func parseCIDRLength(s string) (netip.Prefix, bool) {
	addr, bits, ok := strings.Cut(s, "/")
	if !ok || len(bits) < 2 || bits[0] != '0' {
		return netip.Prefix{}, false
	}
	a, err := netip.ParseAddr(addr)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, false
	}
	n := 0
	for _, r := range bits {
		if r < '0' || r > '9' {
			return netip.Prefix{}, false
		}
		n = n*10 + int(r-'0')
		if n > a.BitLen() {
			return netip.Prefix{}, false
		}
	}
	return netip.PrefixFrom(a, n), true
}

// prefixReason explains a netip.ParsePrefix error without repeating the input.
func prefixReason(s string, err error) string {
	switch {
	case strings.TrimSpace(s) != s:
		return "remove the surrounding spaces"
	case strings.Contains(s, "%"):
		return "IPv6 zones (\"%...\") are not allowed"
	case !strings.Contains(s, "/"):
		if a, err := netip.ParseAddr(s); err == nil {
			return fmt.Sprintf("missing the prefix length (did you mean %q?)", netip.PrefixFrom(a, a.BitLen()).String())
		}
		return "missing the prefix length (\"/N\")"
	}
	msg := strings.TrimPrefix(err.Error(), "netip.ParsePrefix("+strconv.Quote(s)+"): ")
	msg = strings.TrimPrefix(msg, "ParseAddr("+strconv.Quote(s[:strings.LastIndex(s, "/")])+"): ")
	return truncate(msg)
}

func (d *decoder) boolean(key string, v any, old bool) bool {
	b, ok := v.(bool)
	if !ok {
		d.errorAt(key, -1, "expected true or false, got %s", describe(v))
		return old
	}
	return b
}

// limit reads cidrLimit as encoding/json reads an int: an integer literal
// (YAML's 64.0 and 0x40 reach it as 64), any sign. An invalid limit is 0,
// not the old one, and the lists are not checked against it (badLimit).
func (d *decoder) limit(key string, v any, _ int) int {
	num, ok := v.(json.Number)
	if !ok {
		d.badLimit = true
		d.errorAt(key, -1, "expected an integer, got %s", describe(v))
		return 0
	}
	n, err := strconv.ParseInt(num.String(), 10, strconv.IntSize)
	switch {
	case errors.Is(err, strconv.ErrRange):
		d.errorAt(key, -1, "%s is out of range", truncate(num.String()))
	case err != nil:
		d.errorAt(key, -1, "%s is not an integer", truncate(num.String()))
	default:
		d.badLimit = false
		return int(n)
	}
	d.badLimit = true
	return 0
}

func (d *decoder) duration(key string, v any, old time.Duration) time.Duration {
	s, ok := v.(string)
	if !ok {
		d.errorAt(key, -1, "expected a duration string such as \"60s\", got %s", describe(v))
		return old
	}
	dur, err := time.ParseDuration(s)
	switch {
	case err != nil:
		d.errorAt(key, -1, "%s is not a valid duration (use a number with a unit, such as \"60s\" or \"5m\")", quote(s))
		return old
	case dur <= 0:
		// The original agent slept for it between syncs: a busy loop.
		d.warnAt(key, -1, "%s is not positive; using %s (the original agent re-synced without pause)", quote(s), minResync)
		dur = minResync
	case dur < minResync:
		d.warnAt(key, -1, "%s is below the minimum of %s; using %s", quote(s), minResync, minResync)
		dur = minResync
	}
	return dur
}

// describe names the type of a decoded JSON value and shows it.
func describe(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean " + strconv.FormatBool(v)
	case json.Number:
		return "number " + truncate(v.String())
	case string:
		return "string " + quote(v)
	case []any:
		b, _ := json.Marshal(v)
		return "list " + truncate(string(b))
	default:
		b, _ := json.Marshal(v)
		return "mapping " + truncate(string(b))
	}
}

// quote quotes s for a message, shortening it if long.
func quote(s string) string {
	if short := truncate(s); short != s {
		return strconv.Quote(strings.TrimSuffix(short, "...")) + "..."
	}
	return strconv.Quote(s)
}

func truncate(s string) string {
	if utf8.RuneCountInString(s) <= maxShown {
		return s
	}
	n := 0
	for i := range s {
		if n == maxShown {
			return s[:i] + "..."
		}
		n++
	}
	return s
}

// suggest returns ` (did you mean "key"?)` for a near miss of a known key.
func suggest(key string) string {
	if len(key) > 64 {
		return ""
	}
	best, bestDist := "", math.MaxInt
	for _, k := range knownKeys {
		if dist := levenshtein(strings.ToLower(key), strings.ToLower(k)); dist < bestDist {
			best, bestDist = k, dist
		}
	}
	if bestDist > max(2, len(best)/4) {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// levenshtein returns the edit distance between a and b, in runes.
func levenshtein(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}
