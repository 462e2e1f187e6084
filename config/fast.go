package config

import (
	"encoding/binary"
	"slices"
	"strings"
	"unsafe"
)

// The fast path. Decoding a large list through the YAML library (and
// sigs.k8s.io/yaml's conversion to JSON, and encoding/json) costs about
// 3 µs and 30 allocations per item: 0.3 s of CPU for 100k CIDRs. fastYAML
// reads the shape that such files have, without the library:
//
//	# comment lines and blank lines anywhere
//	cidrLimit: 100000                # a key at column 0, a value on its line
//	nonMasqueradeCIDRs:              # a list key, empty value
//	  - 10.0.0.0/24                  # items, all at one indentation (0 too)
//	  - "10.1.0.0/16"                # plain, or quoted without escapes
//
// and gives what the library path gives (parse: the same entries and key
// order, a single document, no repeated key). It decides only the document's
// structure and the list items, which are strings by construction (see
// fastItem). The few other values (cidrLimit: 5, resyncInterval: 1m, and so
// on) are resolved by the library path itself: their lines, copied
// verbatim, make a small document for yamlEntries. Anything else (flow
// collections other than "[]", anchors, aliases, tags, block or multi-line
// scalars, escapes, tabs, CR, non-ASCII bytes, a BOM, "---", directives,
// keys that are not known keys spelled exactly, repeated keys, a list under
// a key that is not a list key, unusual indentation) makes fastYAML give up,
// and the library path reads the file. fast_test.go checks the two paths
// against each other on every corpus of the package's tests and by fuzzing.

// stringList is a list value whose items are all strings (from fastYAML).
type stringList []string

// fastYAML reads data if it has the shape above; ok false means it does
// not, and nothing else is to be made of the result.
func fastYAML(data []byte) (entries []entry, order map[string]int, ok bool) {
	if !printable(data) {
		return nil, nil, false // tabs, CR, control and non-ASCII bytes (a BOM too)
	}
	// No copy (2 MB at 100,000 CIDRs, and its share of the garbage
	// collector's work at every change): the keys and items are substrings
	// of data, which Parse's callers do not change while it runs, and
	// what outlives Parse is copied (ifnameList; CIDRs become prefixes).
	s := unsafe.String(unsafe.SliceData(data), len(data))
	order = make(map[string]int, len(knownKeys))
	var (
		scalars strings.Builder // the lines of the keys with a value on their line
		nScalar int
		open    = -1 // entries[open] is a key with an empty value, whose items may follow
		indent  = -1 // the items' indentation, once known
		items   stringList
	)
	closeList := func() bool {
		if open >= 0 && len(items) > 0 {
			if k := keyNamed(entries[open].key); k == nil || !k.list() {
				return false // a list under a key that takes no list: let the library say so
			}
			entries[open].val = items
		}
		open, indent, items = -1, -1, nil
		return true
	}
	for len(s) > 0 {
		var line string
		line, s, _ = strings.Cut(s, "\n")
		body := strings.TrimLeft(line, " ")
		if body == "" || body[0] == '#' {
			continue // blank or a comment
		}
		at := len(line) - len(body)
		if len(body) >= 2 && body[0] == '-' && body[1] == ' ' {
			// An item of the list of entries[open].
			if open < 0 || (indent >= 0 && at != indent) {
				return nil, nil, false
			}
			indent = at
			it, ok := fastItem(body[2:])
			if !ok {
				return nil, nil, false
			}
			if items == nil {
				items = make(stringList, 0, 1+strings.Count(s, "\n")) // at most the lines left
			}
			items = append(items, it)
			continue
		}
		if at != 0 || !closeList() {
			return nil, nil, false
		}
		key, rest, found := strings.Cut(line, ":")
		if !found || !slices.Contains(knownKeys, key) {
			return nil, nil, false
		}
		if _, dup := order[key]; dup {
			return nil, nil, false
		}
		if rest != "" && rest[0] != ' ' {
			return nil, nil, false
		}
		order[key] = len(entries)
		entries = append(entries, entry{key: key})
		v := strings.TrimLeft(rest, " ")
		if v == "" || v[0] == '#' {
			open = len(entries) - 1 // null, unless items follow
			continue
		}
		if !fastScalar(v) {
			return nil, nil, false
		}
		entries[len(entries)-1].val = pending{}
		scalars.WriteString(line)
		scalars.WriteByte('\n')
		nScalar++
	}
	if !closeList() || len(entries) == 0 {
		return nil, nil, false
	}
	if nScalar > 0 {
		resolved, err := yamlEntries([]byte(scalars.String()))
		if err != nil || len(resolved) != nScalar {
			return nil, nil, false
		}
		for _, r := range resolved {
			i, ok := order[r.key]
			if !ok {
				return nil, nil, false
			}
			if _, ok := entries[i].val.(pending); !ok {
				return nil, nil, false
			}
			entries[i].val = r.val
		}
	}
	// As yamlEntries: sorted by key (the keys are distinct).
	slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.key, b.key) })
	return entries, order, true
}

// pending marks a value that the library path resolves.
type pending struct{}

// fastItem reads a list item (after "- "): a plain scalar that YAML can
// only read as a string, or a quoted one without escapes, then optionally
// spaces and a comment.
func fastItem(v string) (string, bool) {
	v = strings.TrimLeft(v, " ")
	if v == "" {
		return "", false
	}
	if v[0] == '"' || v[0] == '\'' {
		return fastQuoted(v)
	}
	// A plain scalar: letters, digits, '.', ':' and '/', starting with a
	// letter or a digit, with a '/' in it (which no YAML 1.1 null, boolean,
	// number, timestamp or merge key has), not ending in ':' (a mapping).
	end, slash := 0, false
	for end < len(v) && v[end] != ' ' {
		c := v[end]
		switch {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case c == '.' || c == ':':
			if end == 0 {
				return "", false
			}
		case c == '/':
			if end == 0 {
				return "", false
			}
			slash = true
		default:
			return "", false
		}
		end++
	}
	if !slash || v[end-1] == ':' || !fastTail(v[end:]) {
		return "", false
	}
	return v[:end], true
}

// fastQuoted reads a quoted scalar that ends on its line, has no escapes
// (no '\\' in double quotes, no ” in single ones) and is followed only by
// spaces and a comment; the content is the string.
func fastQuoted(v string) (string, bool) {
	q := v[0]
	end := strings.IndexByte(v[1:], q)
	if end < 0 {
		return "", false
	}
	s := v[1 : 1+end]
	if q == '"' && strings.IndexByte(s, '\\') >= 0 {
		return "", false
	}
	if !fastTail(v[2+end:]) {
		return "", false // '' (an escaped quote in single quotes) ends up here too
	}
	return s, true
}

// fastTail reports whether what follows a value on its line is nothing,
// spaces, or spaces and a comment.
func fastTail(s string) bool {
	t := strings.TrimLeft(s, " ")
	return t == "" || (t[0] == '#' && len(t) < len(s))
}

// fastScalar reports whether v (a key's value and what follows it on the
// line) is a value that ends on its line and means the same alone: a plain
// scalar of letters, digits and ".+-_/", a quoted one without escapes, or
// "[]". What it means (string, number, boolean, null) is left to the library.
func fastScalar(v string) bool {
	switch v[0] {
	case '"', '\'':
		_, ok := fastQuoted(v)
		return ok
	case '[':
		return strings.HasPrefix(v, "[]") && fastTail(v[2:])
	}
	end := 0
	for end < len(v) && v[end] != ' ' {
		c := v[end]
		switch {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case c == '.' || c == '+' || c == '-' || c == '_' || c == '/':
		default:
			return false
		}
		end++
	}
	if v[0] == '-' && end == 1 {
		return false // "- ": a sequence entry, not a scalar
	}
	return fastTail(v[end:])
}

// printable reports whether every byte of data is '\n' or printable ASCII
// (' ' to '~'), eight bytes at a time: a byte at a time was a sixth of
// parsing 100,000 CIDRs.
func printable(data []byte) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	for len(data) >= 8 {
		w := binary.LittleEndian.Uint64(data)
		v := w &^ highs // each byte 0 to 0x7f: adding below 0x81 carries into no other byte
		atLeastSpace := (v + 0x60*ones) & highs
		del := (v + ones) & highs // 0x7f
		notNewline := ((v ^ '\n'*ones) + 0x7f*ones) & highs
		if w&highs != 0 || del != 0 || (^atLeastSpace&notNewline)&highs != 0 {
			return false
		}
		data = data[8:]
	}
	for _, c := range data {
		if c != '\n' && (c < ' ' || c > '~') {
			return false
		}
	}
	return true
}
