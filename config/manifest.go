package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// embeddedConfig is the config held by a data key of a ConfigMap manifest.
type embeddedConfig struct {
	key      string // the data key: "config", or a name starting with ip-masq
	value    string
	line     int  // the value's line (of its "|" for a block literal); of the problem if any
	literal  bool // a block literal: line l of value is line+l of the manifest
	problem  string
	warning  bool // the problem is a warning
	advisory bool // the problem does not stop the manifest's config from being read
}

// manifestConfigs finds the configs in a Kubernetes manifest (one or
// several YAML documents, or JSON): the ConfigMaps' data keys "config"
// (the original agent's) and ip-masq... (Azure's ip-masq-agent-v2's). ok
// is false when data is not a manifest, that is when no document is a
// mapping with apiVersion and kind. Objects other than ConfigMaps are
// passed over, a List's items are looked into; a ConfigMap with no such
// key gives a warning, and so does one without the key "config" (the one
// the shipped DaemonSet mounts).
func manifestConfigs(data []byte) (docs []embeddedConfig, ok bool) {
	docs, _, ok = manifest(data)
	return docs, ok
}

// Kinds returns the kinds of the Kubernetes objects in a manifest (YAML
// documents or JSON with apiVersion and kind), or nil if data is not one.
func Kinds(data []byte) []string {
	_, kinds, _ := manifest(data)
	return kinds
}

func manifest(data []byte) (docs []embeddedConfig, kinds []string, ok bool) {
	if !bytes.Contains(data, []byte("apiVersion")) || !bytes.Contains(data, []byte("kind")) {
		return nil, nil, false // the cheap test
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc yaml.Node
		if err := dec.Decode(&doc); err == io.EOF {
			break
		} else if err != nil {
			return nil, nil, false
		}
		if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
			continue
		}
		if object(doc.Content[0], &docs, &kinds, 0) {
			ok = true
		}
	}
	return docs, kinds, ok
}

// object adds what the Kubernetes object m holds: its kind, and a
// ConfigMap's configs. A List (kubectl get -o yaml of several objects,
// kind: List or a kind ending in List) stands for its items. It returns
// false when m is not an object (no apiVersion and kind).
func object(m *yaml.Node, docs *[]embeddedConfig, kinds *[]string, depth int) bool {
	kind, api := mapValue(m, "kind"), mapValue(m, "apiVersion")
	if kind == nil || api == nil || kind.Kind != yaml.ScalarNode || api.Kind != yaml.ScalarNode {
		return false
	}
	if items := mapValue(m, "items"); strings.HasSuffix(kind.Value, "List") && items != nil && items.Kind == yaml.SequenceNode && depth < 4 {
		for _, item := range items.Content {
			object(item, docs, kinds, depth+1)
		}
		return true
	}
	*kinds = append(*kinds, kind.Value)
	if kind.Value != "ConfigMap" {
		return true
	}
	name := "ConfigMap"
	// elsewhere: the name or namespace the shipped DaemonSet does not
	// mount ("" when they are its, or not given).
	elsewhere, metaLine := "", kind.Line
	if metaKey, meta := mapEntry(m, "metadata"); meta != nil {
		metaLine = metaKey.Line
		n, ns := mapValue(meta, "name"), mapValue(meta, "namespace")
		if n != nil && n.Kind == yaml.ScalarNode {
			name = fmt.Sprintf("ConfigMap %q", n.Value)
			if n.Value != mountedName {
				elsewhere = fmt.Sprintf("%q", n.Value)
			}
		}
		if ns != nil && ns.Kind == yaml.ScalarNode && ns.Value != "" && ns.Value != mountedNamespace {
			nm := mountedName
			if n != nil && n.Kind == yaml.ScalarNode {
				nm = n.Value
			}
			elsewhere = fmt.Sprintf("%q", ns.Value+"/"+nm)
		}
	}
	dataKey, dataNode := mapEntry(m, "data")
	found, mounted := false, false
	if dataNode != nil && dataNode.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(dataNode.Content); i += 2 {
			k, v := dataNode.Content[i], dataNode.Content[i+1]
			if k.Value != "config" && !IsConfigName(k.Value) {
				continue
			}
			found = true
			mounted = mounted || k.Value == "config"
			if v.Kind != yaml.ScalarNode || (v.Tag != "!!str" && v.Tag != "!!null") {
				*docs = append(*docs, embeddedConfig{key: "data." + k.Value, line: v.Line,
					problem: "expected the config file's text as a string"})
				continue
			}
			*docs = append(*docs, embeddedConfig{key: k.Value, value: v.Value, line: v.Line,
				literal: v.Style&yaml.LiteralStyle != 0})
		}
	}
	line := kind.Line
	if dataKey != nil {
		line = dataKey.Line
	}
	switch {
	case !found:
		*docs = append(*docs, embeddedConfig{line: line, warning: true,
			problem: name + ` has no data key "config" (or named ip-masq...): not an ip-masq-agent config`})
	case mounted && elsewhere != "":
		*docs = append(*docs, embeddedConfig{line: metaLine, warning: true, advisory: true,
			problem: "ConfigMap " + elsewhere + " is not the one the shipped DaemonSet mounts (deploy/daemonset.yaml: " +
				mountedNamespace + "/" + mountedName + ", optional): with it the agent would run the defaults"})
	case !mounted:
		// Azure ip-masq-agent-v2 mounts the whole ConfigMap as a
		// directory; the shipped DaemonSet mounts only the key config.
		*docs = append(*docs, embeddedConfig{line: line, warning: true, advisory: true,
			problem: name + ` has no data key "config", the only key the shipped DaemonSet mounts (deploy/daemonset.yaml): ` +
				`with it the agent would run the defaults; keys named ip-masq... are read only where the whole ConfigMap is mounted as a directory (Azure ip-masq-agent-v2)`})
	}
	return true
}

// mountedName and mountedNamespace are the ConfigMap the shipped
// DaemonSet mounts (deploy/daemonset.yaml, optional: true).
const (
	mountedName      = "ip-masq-agent"
	mountedNamespace = "kube-system"
)

// mapValue returns the value of key in a mapping node, or nil.
func mapValue(m *yaml.Node, key string) *yaml.Node {
	_, v := mapEntry(m, key)
	return v
}

// mapEntry returns the key's node and its value's in a mapping node, or nils.
func mapEntry(m *yaml.Node, key string) (k, v *yaml.Node) {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil, nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i], m.Content[i+1]
		}
	}
	return nil, nil
}

// FromManifest returns the config held by a ConfigMap manifest: the value
// of its data key "config" (or of the one key named ip-masq...). isManifest
// is false, and data should be parsed as a config file, when data is not a
// ConfigMap manifest.
func FromManifest(data []byte) (config []byte, isManifest bool, err error) {
	docs, ok := manifestConfigs(data)
	if !ok {
		return nil, false, nil
	}
	var good []embeddedConfig
	for _, d := range docs {
		if d.advisory {
			continue
		}
		if d.problem != "" {
			return nil, true, fmt.Errorf("line %d: %s", d.line, strings.TrimPrefix(d.key+": "+d.problem, ": "))
		}
		good = append(good, d)
	}
	switch len(good) {
	case 0:
		return nil, true, errors.New("no ConfigMap in the manifest holds a config")
	case 1:
		return []byte(good[0].value), true, nil
	}
	return nil, true, fmt.Errorf("the manifest holds %d configs (data keys at lines %s); give the agent one", len(good), lines(good))
}

func lines(docs []embeddedConfig) string {
	var s []string
	for _, d := range docs {
		s = append(s, fmt.Sprint(d.line))
	}
	return strings.Join(s, ", ")
}
