// Package config reads and validates the ip-masq-agent configuration file,
// compatible with the original agent's format plus Baidu CCE's extensions.
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	yamlv2 "go.yaml.in/yaml/v2"
	"sigs.k8s.io/yaml"
)

// Flags are the command-line flags that change defaults and validation.
type Flags struct {
	NoMasqAllReservedRanges bool // --nomasq-all-reserved-ranges
	EnableIPv6              bool // --enable-ipv6
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

// The keys of the file, as the original agent and CCE spell them.
const (
	keyNonMasq    = "nonMasqueradeCIDRs"
	keyMasq       = "masqueradeCIDRs"
	keyLimit      = "cidrLimit"
	keyLinkLocal  = "masqLinkLocal"
	keyLinkLocal6 = "masqLinkLocalIPv6"
	keyOutBound   = "masqOutBound"
	keyOutBound6  = "masqOutBoundIPv6"
	keyResync     = "resyncInterval"
)

var knownKeys = [...]string{keyNonMasq, keyMasq, keyLimit, keyLinkLocal, keyLinkLocal6, keyOutBound, keyOutBound6, keyResync}

// Default returns the configuration used when there is no file.
func Default(f Flags) Config {
	cidrs := []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"}
	if f.NoMasqAllReservedRanges {
		cidrs = append(cidrs, "100.64.0.0/10", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24",
			"198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "240.0.0.0/4")
	}
	c := Config{
		MasqOutBound:     true,
		MasqOutBoundIPv6: true,
		ResyncInterval:   defaultResync,
		CIDRLimit:        defaultCIDRLimit,
	}
	for _, s := range cidrs {
		c.NonMasqueradeCIDRs = append(c.NonMasqueradeCIDRs, netip.MustParsePrefix(s))
	}
	return c
}

// Equal reports whether two configs are the same (for change detection).
// A nil and an empty list are the same.
func (c Config) Equal(o Config) bool {
	return slices.Equal(c.NonMasqueradeCIDRs, o.NonMasqueradeCIDRs) &&
		slices.Equal(c.MasqueradeCIDRs, o.MasqueradeCIDRs) &&
		c.MasqLinkLocal == o.MasqLinkLocal &&
		c.MasqLinkLocalIPv6 == o.MasqLinkLocalIPv6 &&
		c.MasqOutBound == o.MasqOutBound &&
		c.MasqOutBoundIPv6 == o.MasqOutBoundIPv6 &&
		c.ResyncInterval == o.ResyncInterval &&
		c.CIDRLimit == o.CIDRLimit
}

// String renders c as YAML, one CIDR per line so that two renderings diff well.
// Parsing it with the same Flags gives back c.
func (c Config) String() string {
	var b strings.Builder
	writeList(&b, keyNonMasq, c.NonMasqueradeCIDRs)
	writeList(&b, keyMasq, c.MasqueradeCIDRs)
	fmt.Fprintf(&b, "%s: %d\n", keyLimit, c.CIDRLimit)
	fmt.Fprintf(&b, "%s: %t\n", keyLinkLocal, c.MasqLinkLocal)
	fmt.Fprintf(&b, "%s: %t\n", keyLinkLocal6, c.MasqLinkLocalIPv6)
	fmt.Fprintf(&b, "%s: %t\n", keyOutBound, c.MasqOutBound)
	fmt.Fprintf(&b, "%s: %t\n", keyOutBound6, c.MasqOutBoundIPv6)
	fmt.Fprintf(&b, "%s: %q\n", keyResync, c.ResyncInterval.String())
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

// Load reads path; a missing file (or a path that does not exist) or an
// empty/whitespace-only file gives Default(f) and no error. Errors and
// warnings are prefixed with the path. It follows symlinks, as Kubernetes
// mounts ConfigMap keys as symlinks through "..data".
func Load(path string, f Flags) (Config, []string, error) {
	data, err := readFile(path)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return Default(f), nil, nil
	}
	if err != nil {
		return Config{}, nil, fmt.Errorf("%s: %w", path, err)
	}
	c, warns, err := Parse(data, f)
	for i := range warns {
		warns[i] = path + ": " + warns[i]
	}
	if err != nil {
		return Config{}, warns, fmt.Errorf("%s: %w", path, err)
	}
	return c, warns, nil
}

func readFile(path string) ([]byte, error) {
	// O_NONBLOCK: opening a FIFO must not block the daemon's loop forever.
	file, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, unwrapPath(err)
	}
	defer file.Close()
	fi, err := file.Stat()
	if err != nil {
		return nil, unwrapPath(err)
	}
	if fi.IsDir() {
		return nil, errors.New("is a directory, expected a file")
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("is not a regular file (%s)", fi.Mode().Type())
	}
	tooBig := fmt.Errorf("file is larger than the limit of %d bytes", MaxFileSize)
	if fi.Size() > MaxFileSize {
		return nil, tooBig
	}
	// Size is meaningless for pipes and devices, so bound the read as well.
	data, err := io.ReadAll(io.LimitReader(file, MaxFileSize+1))
	if err != nil {
		return nil, unwrapPath(err)
	}
	if len(data) > MaxFileSize {
		return nil, tooBig
	}
	return data, nil
}

// unwrapPath drops the path from an *fs.PathError, since Load adds it itself.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("cannot %s: %w", pe.Op, pe.Err)
	}
	return err
}

type entry struct {
	key string
	val any // as decoded by encoding/json with UseNumber
}

// Parse parses YAML or JSON. Warnings are one-line strings for things
// accepted with a note; they are returned with an error too. The error, if
// any, is one line; several problems are joined with "; " in file order.
func Parse(data []byte, f Flags) (Config, []string, error) {
	c, _, warns, err := parseKeys(data, f)
	return c, warns, err
}

// parseKeys is Parse that also returns the known keys set to a non-null
// value, for merging (see Loader).
func parseKeys(data []byte, f Flags) (Config, map[string]bool, []string, error) {
	c, d, err := parse(data, f)
	if err != nil {
		return Config{}, nil, nil, err
	}
	warns := capped(d.messages(true), d.dropped[1], "warnings")
	if errs := d.messages(false); len(errs) > 0 {
		return Config{}, nil, warns, errors.New(strings.Join(capped(errs, d.dropped[0], "errors"), "; "))
	}
	return c, d.present, warns, nil
}

// parse is Parse with the decoder's findings and the keys present. The
// error is about the document as a whole (syntax, not a mapping); problems
// with keys are in the decoder, and c is returned even with them.
func parse(data []byte, f Flags) (Config, *decoder, error) {
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return Default(f), &decoder{f: f, present: map[string]bool{}}, nil
	}
	var entries []entry
	var err error
	ordered := true
	// Like the original agent, read JSON as JSON: YAML 1.1 rejects some
	// valid JSON, such as the escape "\/".
	if trimmed[0] == '{' && json.Valid(data) {
		entries, err = jsonEntries(data)
	} else {
		entries, err = yamlEntries(data)
		ordered = false
	}
	if err != nil {
		return Config{}, nil, err
	}
	if !ordered && moreDocuments(data) {
		// The original agent read only the first document; content after
		// it was silently lost. Say so instead.
		return Config{}, nil, parseError("content after the first YAML document (a second \"---\" document or trailing text): a config is one document")
	}
	c, d := decode(entries, f)
	// YAMLToJSON sorts keys. Only when the order shows in the messages is
	// it worth parsing the YAML again to learn it.
	if !ordered && d.needsOrder {
		if pos := yamlKeyOrder(data); pos != nil {
			sort.SliceStable(entries, func(i, j int) bool { return pos[entries[i].key] < pos[entries[j].key] })
			c, d = decode(entries, f)
		}
	}
	return c, d, nil
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

// jsonEntries reads the top-level object of valid JSON in order, refusing
// duplicate keys, which encoding/json would silently accept.
func jsonEntries(data []byte) ([]entry, error) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	if _, err := d.Token(); err != nil {
		return nil, parseError(err.Error())
	}
	var entries []entry
	seen := make(map[string]bool)
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			return nil, parseError(err.Error())
		}
		key, _ := tok.(string)
		if seen[key] {
			line := 1 + bytes.Count(data[:d.InputOffset()], []byte("\n"))
			return nil, parseError(fmt.Sprintf("line %d: key %s already set in map", line, quote(key)))
		}
		seen[key] = true
		var v any
		if err := d.Decode(&v); err != nil {
			return nil, parseError(err.Error())
		}
		entries = append(entries, entry{key, v})
	}
	return entries, nil
}

// yamlEntries returns the top-level keys sorted by name; nil for an empty document.
func yamlEntries(data []byte) ([]entry, error) {
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, parseError(oneLine(err.Error()))
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

// yamlKeyOrder returns the position of each top-level key, or nil.
func yamlKeyOrder(data []byte) map[string]int {
	var ms yamlv2.MapSlice
	if yamlv2.Unmarshal(data, &ms) != nil {
		return nil
	}
	pos := make(map[string]int, len(ms))
	for i, item := range ms {
		k := keyString(item.Key)
		if _, ok := pos[k]; !ok {
			pos[k] = i
		}
	}
	return pos
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
	f          Flags
	found      []finding         // errors and warnings, in the order found
	dropped    [2]int            // errors, warnings not stored past maxStored
	present    map[string]bool   // known keys (canonical) set to a non-null value
	written    map[string]string // known keys (canonical) as written
	badLimit   bool              // cidrLimit is invalid, so the lists cannot be checked against it
	needsOrder bool              // messages depend on the order of keys
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

func decode(entries []entry, f Flags) (Config, *decoder) {
	c := Default(f)
	d := &decoder{f: f, present: make(map[string]bool)}
	seen := make(map[string]string) // known key -> key as written
	keysWithProblems := 0
	for _, e := range entries {
		before := len(d.found)
		name := canonical(e.key)
		switch {
		case name == "":
			d.add(finding{warning: true, key: e.key, index: -1, msg: "unknown key ignored" + suggest(e.key),
				text: fmt.Sprintf("unknown key %s ignored%s", quote(e.key), suggest(e.key))})
		case seen[name] != "":
			d.add(finding{key: e.key, index: -1, msg: fmt.Sprintf("duplicates %s (keys match case-insensitively)", quote(seen[name])),
				text: fmt.Sprintf("key %s duplicates %s (keys match case-insensitively)", quote(e.key), quote(seen[name]))})
			d.needsOrder = true
		default:
			seen[name] = e.key
			if name != e.key {
				d.add(finding{warning: true, key: e.key, index: -1, msg: fmt.Sprintf("read as %q; please spell it exactly", name),
					text: fmt.Sprintf("key %s read as %q; please spell it exactly", quote(e.key), name)})
			}
			d.field(&c, name, e.key, e.val)
		}
		if len(d.found) > before {
			keysWithProblems++
		}
	}
	d.needsOrder = d.needsOrder || keysWithProblems > 1
	d.written = seen
	if !d.badLimit {
		for _, l := range []struct {
			name string
			n    int
		}{{keyNonMasq, len(c.NonMasqueradeCIDRs)}, {keyMasq, len(c.MasqueradeCIDRs)}} {
			if l.n <= c.CIDRLimit {
				continue
			}
			if key, ok := seen[l.name]; ok {
				d.errorAt(key, -1, "%d CIDRs exceed cidrLimit %d", l.n, c.CIDRLimit)
			} else {
				d.add(finding{key: l.name, index: -1, at: seen[keyLimit],
					msg: fmt.Sprintf("%d CIDRs (the defaults) exceed cidrLimit %d", l.n, c.CIDRLimit)})
			}
		}
	}
	return c, d
}

func canonical(key string) string {
	for _, k := range knownKeys {
		if k == key {
			return k
		}
	}
	// encoding/json, which the original agent used, matches keys this way.
	for _, k := range knownKeys {
		if strings.EqualFold(k, key) {
			return k
		}
	}
	return ""
}

// field decodes the value of a known key into c.
func (d *decoder) field(c *Config, name, key string, v any) {
	if v == nil {
		return // null keeps the default, as it did with encoding/json
	}
	d.present[name] = true
	switch name {
	case keyNonMasq:
		c.NonMasqueradeCIDRs = d.cidrs(key, v)
	case keyMasq:
		c.MasqueradeCIDRs = d.cidrs(key, v)
	case keyLimit:
		c.CIDRLimit = d.limit(key, v)
	case keyLinkLocal:
		c.MasqLinkLocal = d.boolean(key, v)
	case keyLinkLocal6:
		c.MasqLinkLocalIPv6 = d.boolean(key, v)
	case keyOutBound:
		c.MasqOutBound = d.boolean(key, v)
	case keyOutBound6:
		c.MasqOutBoundIPv6 = d.boolean(key, v)
	case keyResync:
		c.ResyncInterval = d.duration(key, v)
	}
}

func (d *decoder) cidrs(key string, v any) []netip.Prefix {
	list, ok := v.([]any)
	if !ok {
		d.errorAt(key, -1, "expected a list of CIDRs, got %s", describe(v))
		return nil
	}
	// One slot per item, valid or not, so that the cidrLimit check counts all.
	out := make([]netip.Prefix, len(list))
	for i, item := range list {
		out[i] = d.cidr(key, i, item)
	}
	return out
}

func (d *decoder) cidr(key string, i int, v any) netip.Prefix {
	s, ok := v.(string)
	if !ok {
		d.errorAt(key, i, "expected a CIDR string such as \"10.0.0.0/8\", got %s", describe(v))
		return netip.Prefix{}
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		d.errorAt(key, i, "%s is not a valid CIDR: %s", quote(s), prefixReason(s, err))
		return netip.Prefix{}
	}
	if m := p.Masked(); m != p {
		d.errorAt(key, i, "%s is not aligned to its prefix length (did you mean %q?)", quote(s), m.String())
		return netip.Prefix{}
	}
	if p.Addr().Is4In6() && p.Bits() >= ipv4MappedBits {
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-ipv4MappedBits)
		d.warnAt(key, i, "%s is an IPv4-mapped IPv6 CIDR; read as %q", quote(s), p.String())
	} else if p.Addr().Is6() && !d.f.EnableIPv6 {
		d.errorAt(key, i, "%s is an IPv6 CIDR; pass --enable-ipv6 to use IPv6", quote(s))
	}
	return p
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

func (d *decoder) boolean(key string, v any) bool {
	b, ok := v.(bool)
	if !ok {
		d.errorAt(key, -1, "expected true or false, got %s", describe(v))
	}
	return b
}

func (d *decoder) limit(key string, v any) int {
	num, ok := v.(json.Number)
	if !ok {
		d.badLimit = true
		d.errorAt(key, -1, "expected an integer, got %s", describe(v))
		return 0
	}
	n, err := strconv.ParseInt(num.String(), 10, strconv.IntSize)
	if errors.Is(err, strconv.ErrSyntax) {
		// JSON may spell a whole number as 64.0 or 6.4e1.
		f, ferr := strconv.ParseFloat(num.String(), 64)
		switch {
		case ferr == nil && f == math.Trunc(f) && math.Abs(f) <= math.MaxInt32:
			n, err = int64(f), nil
		case errors.Is(ferr, strconv.ErrRange) || (ferr == nil && f == math.Trunc(f)):
			err = strconv.ErrRange
		}
	}
	switch {
	case errors.Is(err, strconv.ErrRange):
		d.errorAt(key, -1, "%s is out of range", truncate(num.String()))
	case err != nil:
		d.errorAt(key, -1, "%s is not an integer", truncate(num.String()))
	case n < 1:
		d.errorAt(key, -1, "%s must be at least 1", num.String())
	default:
		return int(n)
	}
	d.badLimit = true
	return 0
}

func (d *decoder) duration(key string, v any) time.Duration {
	s, ok := v.(string)
	if !ok {
		d.errorAt(key, -1, "expected a duration string such as \"60s\", got %s", describe(v))
		return 0
	}
	dur, err := time.ParseDuration(s)
	switch {
	case err != nil:
		d.errorAt(key, -1, "%s is not a valid duration (use a number with a unit, such as \"60s\" or \"5m\")", quote(s))
	case dur <= 0:
		d.errorAt(key, -1, "%s must be positive", quote(s))
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
