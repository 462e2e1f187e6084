package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"regexp"
	"sort"
	"strconv"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// Problem is one thing wrong with a config file, placed at a line.
type Problem struct {
	Line    int    // 1-based line in the file given to Check
	Key     string // e.g. "nonMasqueradeCIDRs[2]"; "" for the document as a whole
	Message string
	Warning bool // accepted by the agent with a warning (never with strict)
}

func (p Problem) String() string {
	if p.Key == "" {
		return fmt.Sprintf("%d: %s", p.Line, p.Message)
	}
	return fmt.Sprintf("%d: %s: %s", p.Line, p.Key, p.Message)
}

// Check validates a config file exactly as the agent parses it and returns
// every problem with its line, sorted by line; nil means the agent accepts
// the file without a warning. Errors are what makes the agent refuse the
// file; warnings (Warning true) are accepted with a note.
//
// With strict, warnings are errors (unknown keys, keys spelled in another
// case, IPv4-mapped CIDRs, a resyncInterval below the minimum), and so are
// CIDRs that have no effect: one contained in (or equal to) another of the
// same list, and a nonMasqueradeCIDRs entry inside a masqueradeCIDRs entry,
// which wins.
//
// A Kubernetes manifest (YAML documents or JSON with apiVersion and kind)
// is recognised: the value of each ConfigMap's data key "config" (or named
// ip-masq...) is checked, with lines pointing into the manifest; a
// ConfigMap without such a key gives a warning, and other objects are not
// configs and give nothing (see Kinds).
func Check(data []byte, f Flags, strict bool) []Problem {
	if docs, ok := manifestConfigs(data); ok {
		var out []Problem
		for _, d := range docs {
			if d.problem != "" {
				out = append(out, Problem{Line: d.line, Key: d.key, Message: d.problem, Warning: d.warning && !strict})
				continue
			}
			for _, p := range checkText([]byte(d.value), f, strict) {
				if d.literal {
					p.Line += d.line
				} else {
					p.Line = d.line
				}
				out = append(out, p)
			}
		}
		sort.SliceStable(out, func(i, j int) bool { return out[i].Line < out[j].Line })
		return out
	}
	return checkText(data, f, strict)
}

var lineRE = regexp.MustCompile(`\bline (\d+)\b`)

func checkText(data []byte, f Flags, strict bool) []Problem {
	c, d, err := parse(data, f)
	if err != nil {
		line := 1
		if m := lineRE.FindStringSubmatch(err.Error()); m != nil {
			line, _ = strconv.Atoi(m[1])
		}
		return []Problem{{Line: line, Message: err.Error()}}
	}
	var pos *positions
	lineOf := func(key string, index int) int {
		if pos == nil {
			pos = findPositions(data)
		}
		return pos.line(key, index)
	}
	var out []Problem
	for _, fd := range d.found {
		at := fd.at
		if at == "" {
			at = fd.key
		}
		msg := fd.msg
		if strict && fd.warning {
			msg = strings.Replace(msg, "unknown key ignored", "unknown key", 1)
		}
		// The keys are the file's bytes (fastYAML's substrings): copied.
		out = append(out, Problem{Line: lineOf(at, fd.index), Key: strings.Clone(keyPath(fd.key, fd.index)), Message: msg,
			Warning: fd.warning && !strict})
	}
	if strict {
		for _, s := range shadowed(c, d.present) {
			key := d.written[s.list]
			out = append(out, Problem{Line: lineOf(key, s.index), Key: strings.Clone(keyPath(key, s.index)), Message: s.msg})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Line < out[j].Line })
	return out
}

type shadow struct {
	list  string // canonical key
	index int
	msg   string
}

// shadowed finds the CIDRs that have no effect: contained in (or equal to)
// an earlier-or-wider entry of the same list, or, for nonMasqueradeCIDRs,
// contained in a masqueradeCIDRs entry. Only lists written in the file are
// looked at; invalid entries (zero prefixes) are skipped.
func shadowed(c Config, present map[string]bool) []shadow {
	var out []shadow
	type at struct {
		index int
		p     netip.Prefix
	}
	index := func(ps []netip.Prefix) map[netip.Prefix]at {
		m := make(map[netip.Prefix]at, len(ps))
		for i, p := range ps {
			if _, ok := m[p]; !ok && p.IsValid() {
				m[p] = at{i, p}
			}
		}
		return m
	}
	// container returns the widest entry of m containing p, other than
	// entry i itself; for an equal prefix, only an earlier entry counts.
	container := func(m map[netip.Prefix]at, p netip.Prefix, i int) (at, bool) {
		for bits := 0; bits <= p.Bits(); bits++ {
			q, _ := p.Addr().Prefix(bits)
			if e, ok := m[q]; ok && (bits < p.Bits() || e.index < i) {
				return e, true
			}
		}
		return at{}, false
	}
	if c.CIDRMatch == MostSpecific {
		return shadowedMostSpecific(c, present)
	}
	for _, k := range keys {
		ps := k.cidrs(&c)
		if ps == nil || !present[k.Name()] {
			continue
		}
		name := k.Name()
		m := index(*ps)
		for i, p := range *ps {
			if !p.IsValid() {
				continue
			}
			if e, ok := container(m, p, i); ok {
				how := "is contained in"
				if e.p == p {
					how = "duplicates"
				}
				out = append(out, shadow{name, i, fmt.Sprintf("%q %s %s[%d] %q, so it has no effect",
					p.String(), how, name, e.index, e.p.String())})
			}
		}
	}
	if present[KeyEgressIf] {
		out = append(out, shadowedNames(c.EgressInterfaces)...)
	}
	if present[KeyNonMasq] && present[KeyMasq] {
		m := index(c.MasqueradeCIDRs)
		for i, p := range c.NonMasqueradeCIDRs {
			if !p.IsValid() {
				continue
			}
			if e, ok := container(m, p, len(c.MasqueradeCIDRs)); ok {
				out = append(out, shadow{KeyNonMasq, i, fmt.Sprintf("%q is inside %s[%d] %q, which wins, so it has no effect",
					p.String(), KeyMasq, e.index, e.p.String())})
			}
		}
	}
	return out
}

// shadowedNames are the egressInterfaces entries that another entry
// already matches: a duplicate, or a name (or wildcard) that an earlier
// or shorter wildcard covers ("eth0" beside "eth*").
func shadowedNames(names []string) []shadow {
	var out []shadow
	for i, n := range names {
		for j, o := range names {
			if i == j {
				continue
			}
			base, wild := strings.CutSuffix(o, "*")
			nbase, _ := strings.CutSuffix(n, "*")
			var how string
			switch {
			case n == o && j < i:
				how = "duplicates"
			case wild && n != o && strings.HasPrefix(nbase, base):
				how = "is matched by"
			default:
				continue
			}
			out = append(out, shadow{KeyEgressIf, i, fmt.Sprintf("%q %s %s[%d] %q, so it has no effect", n, how, KeyEgressIf, j, o)})
			break
		}
	}
	return out
}

// shadowedMostSpecific is shadowed under cidrMatch: mostSpecific, for
// masqueradeCIDRs and nonMasqueradeCIDRs: an entry has no effect when the
// most specific other entry that contains it (either list; an equal one
// only if earlier) is of its own list. nonMasqueradeCIDRs 10.0.0.0/8,
// masqueradeCIDRs 10.20.0.0/16, nonMasqueradeCIDRs 10.20.30.0/24: each
// has an effect. The other lists are checked as under listOrder.
func shadowedMostSpecific(c Config, present map[string]bool) []shadow {
	lc := c
	lc.CIDRMatch = ListOrder
	var out []shadow
	for _, s := range shadowed(lc, present) {
		if s.list != KeyNonMasq && s.list != KeyMasq {
			out = append(out, s)
		}
	}
	type at struct {
		list  string
		index int
		p     netip.Prefix
	}
	m := make(map[netip.Prefix]at)
	lists := []struct {
		name string
		ps   []netip.Prefix
	}{{KeyNonMasq, c.NonMasqueradeCIDRs}, {KeyMasq, c.MasqueradeCIDRs}}
	for _, l := range lists {
		for i, p := range l.ps {
			if _, ok := m[p]; !ok && p.IsValid() {
				m[p] = at{l.name, i, p}
			}
		}
	}
	for _, l := range lists {
		if !present[l.name] {
			continue
		}
		for i, p := range l.ps {
			if !p.IsValid() {
				continue
			}
			for bits := p.Bits(); bits >= 0; bits-- {
				q, _ := p.Addr().Prefix(bits)
				e, ok := m[q]
				if !ok || (e.list == l.name && e.index == i) {
					continue
				}
				if e.list == l.name {
					how := "is contained in"
					if e.p == p {
						how = "duplicates"
					}
					out = append(out, shadow{l.name, i, fmt.Sprintf("%q %s %s[%d] %q, with no entry of the other list between them, so it has no effect",
						p.String(), how, l.name, e.index, e.p.String())})
				}
				break
			}
		}
	}
	return out
}

// positions are the lines of a document's top-level keys and of the items
// of its top-level lists.
type positions struct {
	keys  map[string]int   // key as written: line (the first, if repeated)
	items map[string][]int // key as written: the line of each list item
}

// line returns the line of key, or of its index-th item; 1 if unknown.
func (p *positions) line(key string, index int) int {
	if index >= 0 && index < len(p.items[key]) {
		return p.items[key][index]
	}
	if l, ok := p.keys[key]; ok {
		return l
	}
	return 1
}

func findPositions(data []byte) *positions {
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))
	p := &positions{keys: map[string]int{}, items: map[string][]int{}}
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) > 0 && trimmed[0] == '{' && json.Valid(data) {
		jsonPositions(data, p)
		return p
	}
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil || doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return p
	}
	m := doc.Content[0]
	if m.Kind != yaml.MappingNode {
		return p
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		if _, ok := p.keys[k.Value]; ok {
			continue
		}
		p.keys[k.Value] = k.Line
		if v.Kind == yaml.AliasNode && v.Alias != nil {
			v = v.Alias
		}
		if v.Kind == yaml.SequenceNode {
			lines := make([]int, len(v.Content))
			for j, item := range v.Content {
				lines[j] = item.Line
			}
			p.items[k.Value] = lines
		}
	}
	return p
}

// jsonPositions reads the lines of a JSON object's keys and list items.
func jsonPositions(data []byte, p *positions) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	lineAt := func() int { return 1 + bytes.Count(data[:d.InputOffset()], []byte("\n")) }
	if t, err := d.Token(); err != nil || t != json.Delim('{') {
		return
	}
	for d.More() {
		t, err := d.Token()
		if err != nil {
			return
		}
		key, _ := t.(string)
		first := true
		if _, ok := p.keys[key]; ok {
			first = false
		} else {
			p.keys[key] = lineAt()
		}
		if t, err = d.Token(); err != nil {
			return
		}
		if t != json.Delim('[') {
			if skipJSON(d, t) != nil {
				return
			}
			continue
		}
		var lines []int
		for d.More() {
			t, err := d.Token()
			if err != nil {
				return
			}
			lines = append(lines, lineAt())
			if skipJSON(d, t) != nil {
				return
			}
		}
		if _, err := d.Token(); err != nil { // ']'
			return
		}
		if first {
			p.items[key] = lines
		}
	}
}

// skipJSON reads the rest of a value whose first token is t.
func skipJSON(d *json.Decoder, t json.Token) error {
	depth := 0
	for {
		switch t {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
		if depth == 0 {
			return nil
		}
		var err error
		if t, err = d.Token(); err != nil {
			return err
		}
	}
}
