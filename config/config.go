// Package config reads and validates the ip-masq-agent configuration file,
// compatible with the original agent's format plus Baidu CCE's extensions.
package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// The decoder: a file's entries (parse.go) into a Config by the key table
// (keys.go), with every error and warning named by file, key and index.
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
	if c.CIDRMatch == MostSpecific {
		d.checkTies(c)
	}
	// The extension keys change what the original agent would have done
	// with the same file only when they are not at their defaults (and
	// the file is valid).
	def := Default(f)
	for _, k := range keys {
		if !k.isOriginal() && !k.equal(&c, &def) && len(d.messages(false)) == 0 {
			d.warnAt(d.written[k.Name()], -1, "%s", k.extensionNote())
		}
	}
	// masqueradeSourceCIDRs is a literal guard: a family it has no entry
	// of is never masqueraded (of the families the agent programs).
	if len(d.messages(false)) == 0 {
		for _, gap := range familyGaps(c, f) {
			d.warnAt(d.written[KeyMasqSrc], -1, "%s", gap)
		}
	}
	d.entryFindings = len(d.found)
	if !d.badLimit {
		for _, k := range keys {
			var n int
			what := "CIDRs"
			if ps := k.cidrs(&c); ps != nil {
				n = len(*ps)
			} else if l, ok := k.(interface{ names(*Config) *[]string }); ok && l.names(&c) != nil {
				// egressInterfaces: bounded as the lists of CIDRs are.
				n, what = len(*l.names(&c)), "interface names"
			} else {
				continue // not a list
			}
			if n <= c.CIDRLimit {
				continue
			}
			name := k.Name()
			if key, ok := d.written[name]; ok {
				d.errorAt(key, -1, "%d %s exceed cidrLimit %d", n, what, c.CIDRLimit)
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
	if p, ok := parsePrefix4(s); ok {
		return p // what ParsePrefix gives, aligned, IPv4
	}
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

// parsePrefix4 reads the common case of a list item, an aligned IPv4
// CIDR in netip's canonical form ("10.0.0.0/8": decimal octets and length
// without leading zeros), at a third of ParsePrefix's cost: 100,000 of
// them at every change. Anything else (ok false) is left to ParsePrefix,
// which gives the same for what this reads.
func parsePrefix4(s string) (p netip.Prefix, ok bool) {
	var a [4]byte
	var v uint32 // the address
	i := 0
	for k := 0; k < 5; k++ {
		// A decimal of 1 to 3 digits (the length: 2), no leading zero,
		// then '.' (after the last octet '/'; after the length, the end).
		n, start := 0, i
		for ; i < len(s) && i-start < 3 && s[i] >= '0' && s[i] <= '9'; i++ {
			n = n*10 + int(s[i]-'0')
		}
		digits := i - start
		if digits == 0 || (digits > 1 && s[start] == '0') {
			return netip.Prefix{}, false
		}
		if k == 4 {
			if digits > 2 || n > 32 || i != len(s) || (n < 32 && v<<n != 0) {
				return netip.Prefix{}, false // not a length, more after it, or not aligned
			}
			return netip.PrefixFrom(netip.AddrFrom4(a), n), true
		}
		sep := byte('.')
		if k == 3 {
			sep = '/'
		}
		if n > 255 || i >= len(s) || s[i] != sep {
			return netip.Prefix{}, false
		}
		a[k], v = byte(n), v<<8|uint32(n)
		i++
	}
	return netip.Prefix{}, false
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

// checkTies refuses, under cidrMatch: mostSpecific, a CIDR that both
// masqueradeCIDRs and nonMasqueradeCIDRs list: neither is more specific.
func (d *decoder) checkTies(c Config) {
	non := make(map[netip.Prefix]int, len(c.NonMasqueradeCIDRs))
	for i, p := range c.NonMasqueradeCIDRs {
		if p.IsValid() {
			if _, dup := non[p.Masked()]; !dup {
				non[p.Masked()] = i
			}
		}
	}
	for i, p := range c.MasqueradeCIDRs {
		j, ok := non[p.Masked()]
		if !p.IsValid() || !ok {
			continue
		}
		where := keyPath(orName(d.written[KeyNonMasq], KeyNonMasq), j)
		if _, set := d.written[KeyNonMasq]; !set {
			where += " (the default list)"
		}
		d.errorAt(orName(d.written[KeyMasq], KeyMasq), i, "%s is also %s: under cidrMatch: mostSpecific neither is more specific; remove one of them",
			quote(p.String()), where)
	}
}

func orName(written, name string) string {
	if written == "" {
		return name
	}
	return written
}

// cidrMatch reads cidrMatch: listOrder or mostSpecific, spelled exactly.
func (d *decoder) cidrMatch(key string, v any, old CIDRMatch) CIDRMatch {
	s, ok := v.(string)
	switch {
	case ok && s == ListOrder.String():
		return ListOrder
	case ok && s == MostSpecific.String():
		return MostSpecific
	case ok:
		d.errorAt(key, -1, "%s is not a cidrMatch: write \"listOrder\" (the default) or \"mostSpecific\"", quote(s))
	default:
		d.errorAt(key, -1, "expected \"listOrder\" or \"mostSpecific\", got %s", describe(v))
	}
	return old
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

// familyGaps says, for each family the agent programs that a non-empty
// masqueradeSourceCIDRs has no entry of, that none of its traffic will be
// masqueraded (the guard is literal).
func familyGaps(c Config, f Flags) []string {
	ps := c.MasqueradeSourceCIDRs
	if len(ps) == 0 {
		return nil
	}
	var out []string
	for _, fam := range []struct {
		name string
		v6   bool
		on   bool
	}{{"IPv4", false, true}, {"IPv6", true, f.EnableIPv6}} {
		if fam.on && !slices.ContainsFunc(ps, func(p netip.Prefix) bool { return p.Addr().Unmap().Is6() == fam.v6 }) {
			out = append(out, fmt.Sprintf(msgFamilyGap, fam.name, fam.name))
		}
	}
	return out
}

const msgFamilyGap = "has no %s CIDR: no %s traffic will be masqueraded"
