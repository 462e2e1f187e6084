// Command manifests renders the install, uninstall and rollback manifests
// for one image (make manifests): OUT/install.yaml is deploy/,
// OUT/uninstall.yaml is deploy/uninstall/ and OUT/rollback.yaml is
// deploy/rollback/, each with the agent's image set to -image, as plain
// YAML for kubectl apply -f (a release attaches them).
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/kustomize"
)

func main() {
	repo := flag.String("repo", ".", "the repository's root")
	image := flag.String("image", "", "the agent's image, NAME:TAG or NAME@sha256:DIGEST (default: deploy/image/'s)")
	out := flag.String("out", "bin/manifests", "where to write install.yaml, uninstall.yaml and rollback.yaml")
	flag.Parse()
	if err := run(*repo, *image, *out); err != nil {
		fmt.Fprintln(os.Stderr, "manifests:", err)
		os.Exit(1)
	}
}

func run(repo, image, out string) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for _, m := range []struct{ file, base string }{
		{"install.yaml", "deploy"},
		{"uninstall.yaml", "deploy/uninstall"},
		{"rollback.yaml", "deploy/rollback"},
	} {
		var data []byte
		var err error
		if image == "" {
			data, err = kustomize.Render(filepath.Join(repo, m.base))
		} else {
			var overlay string
			if overlay, err = kustomize.ImageOverlay("../"+m.base, image); err != nil {
				return err
			}
			data, err = kustomize.RenderOverlay(repo, ".manifests-overlay", overlay)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", m.base, err)
		}
		head := fmt.Sprintf("# Rendered from %s/ by make manifests; do not edit.\n", m.base)
		path := filepath.Join(out, m.file)
		if err := os.WriteFile(path, append([]byte(head), data...), 0o644); err != nil {
			return err
		}
		fmt.Println("wrote", path)
	}
	return nil
}
