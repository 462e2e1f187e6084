package kustomize

import (
	"strings"
	"testing"
)

const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestSplitImage(t *testing.T) {
	for _, tc := range []struct{ image, name, tag, digest string }{
		{"registry.example.com/x:v1", "registry.example.com/x", "v1", ""},
		{"registry.example.com:5000/x:v1", "registry.example.com:5000/x", "v1", ""},
		{"registry.example.com/x@" + digest, "registry.example.com/x", "", digest},
		{"registry.example.com:5000/x:v1@" + digest, "registry.example.com:5000/x", "v1", digest},
	} {
		name, tag, d, err := SplitImage(tc.image)
		if err != nil || name != tc.name || tag != tc.tag || d != tc.digest {
			t.Errorf("SplitImage(%q) = %q %q %q %v", tc.image, name, tag, d, err)
		}
	}
	for _, bad := range []string{
		"registry.example.com/x",                            // neither tag nor digest
		"registry.example.com/x@" + digest + ":8b97c4a",     // make manifests with IMAGE=...@sha256:... and TAG's default, once
		"registry.example.com/x@" + digest + ":",            // ... and TAG=, once
		"registry.example.com/x@sha256:0123",                // a short digest
		"registry.example.com/x@" + strings.ToUpper(digest), // not lower-case hex
		"registry.example.com/x:v1:v2",
		"registry.example.com/x:v1 ",
	} {
		if _, _, _, err := SplitImage(bad); err == nil {
			t.Errorf("SplitImage(%q): no error", bad)
		}
	}
}

// TestImageOverlayDigest: an overlay with a digest renders every container
// that runs the agent as NAME@sha256:..., pinned, with no tag after it.
func TestImageOverlayDigest(t *testing.T) {
	const name = "registry.example.com/mirror/ip-masq-agent-nft"
	for _, base := range []string{"deploy", "deploy/uninstall", "deploy/rollback"} {
		overlay, err := ImageOverlay("../"+base, name+"@"+digest)
		if err != nil {
			t.Fatal(err)
		}
		data, err := RenderOverlay("../..", "overlay-test", overlay)
		if err != nil {
			t.Fatalf("%s: %v", base, err)
		}
		n := 0
		for _, line := range strings.Split(string(data), "\n") {
			line = strings.TrimSpace(line)
			if !strings.HasPrefix(line, "image: ") || strings.Contains(line, "/pause:") {
				continue
			}
			n++
			if line != "image: "+name+"@"+digest {
				t.Errorf("%s: %s, want image: %s@%s", base, line, name, digest)
			}
		}
		if n == 0 {
			t.Errorf("%s: no container runs the agent:\n%s", base, data)
		}
	}
}
