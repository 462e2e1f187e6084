package test

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// layout is what each package may import of this module
// (docs/architecture.md): data flows one way, config -> nft -> the
// kernel, and nothing points back up. cmd/ip-masq-agent wires them all.
var layout = map[string][]string{
	"config":             nil,
	"nft":                {"config"},
	"nft/kernel":         {"nft"},
	"original":           {"config", "nft", "nft/kernel"},
	"windows":            {"config"},
	"conntrack":          nil,
	"internal/agent":     {"config", "nft", "original", "internal/metrics", "internal/filewatch"},
	"internal/metrics":   {"nft"},
	"internal/filewatch": nil,
	"internal/kustomize": nil,
	"internal/testnet":   nil,
	"internal/harness":   {"internal/testnet"},
}

// TestLayout: no production file imports a package of this module that
// its package may not, and every package is in the table.
func TestLayout(t *testing.T) {
	const module = "github.com/ip-masq-agent/ip-masq-agent-nft/"
	seen := map[string]bool{}
	err := filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel("..", path)
		if d.IsDir() {
			switch rel {
			case "e2e", "hack", "bench", "test", "cmd", ".git", "bin", "deploy", "docs", "examples":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		pkg := filepath.ToSlash(filepath.Dir(rel))
		allowed, ok := layout[pkg]
		if !ok {
			t.Errorf("package %s is not in the layout table (test/layout_test.go, docs/architecture.md)", pkg)
			return nil
		}
		seen[pkg] = true
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if own, ok := strings.CutPrefix(p, module); ok && !slices.Contains(allowed, own) {
				t.Errorf("%s imports %s: %s may import only %v", rel, own, pkg, allowed)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for pkg := range layout {
		if !seen[pkg] {
			t.Errorf("package %s in the layout table has no file", pkg)
		}
	}
}
