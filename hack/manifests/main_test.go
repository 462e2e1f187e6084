package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestManifestsByDigest: make manifests IMAGE=NAME@sha256:... writes the
// three manifests with every container that runs the agent pinned by that
// digest, and nothing after it (it once wrote NAME@sha256:...:8b97c4a).
func TestManifestsByDigest(t *testing.T) {
	const image = "registry.example.com/ip-masq-agent-nft@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	out := t.TempDir()
	if err := run("../..", image, out); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"install.yaml", "uninstall.yaml", "rollback.yaml"} {
		data, err := os.ReadFile(filepath.Join(out, f))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, line := range strings.Split(string(data), "\n") {
			line = strings.TrimSpace(line)
			if !strings.HasPrefix(line, "image: ") || strings.Contains(line, "/pause:") {
				continue
			}
			n++
			if line != "image: "+image {
				t.Errorf("%s: %s, want image: %s", f, line, image)
			}
		}
		if n == 0 {
			t.Errorf("%s: no container runs the agent", f)
		}
	}
	// A digest with a tag glued on (what TAG's default once added) is refused.
	if err := run("../..", image+":8b97c4a", t.TempDir()); err == nil {
		t.Error("an image NAME@sha256:...:TAG was accepted")
	}
}
