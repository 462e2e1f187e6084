package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode"

	yamlv2 "go.yaml.in/yaml/v2"
	"sigs.k8s.io/yaml"
)

// A file's bytes, YAML or JSON, become its entries (key, value) in file
// order; the decoder (config.go) checks and decodes them by the key table
// (keys.go).
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
