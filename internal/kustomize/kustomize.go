// Package kustomize renders the project's kustomizations (deploy/ and
// deploy/uninstall/) in-process with the kustomize library that kubectl
// embeds, so that `make manifests` and the manifest tests need no kubectl.
package kustomize

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// ImageName is the agent's image as deploy/image/ names it: the name an
// overlay's images: entry matches.
const ImageName = "ghcr.io/ip-masq-agent/ip-masq-agent-nft"

// Render renders the kustomization in dir (on disk) as `kubectl kustomize
// dir` does: the YAML documents, separated by "---".
func Render(dir string) ([]byte, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, err
	}
	return m.AsYaml()
}

// RenderOverlay renders overlay, a kustomization.yaml, as if it were the
// file at repo/rel/kustomization.yaml, with the repository's files under
// repo (read into memory: the repository is not written). rel must not be
// inside the directories it refers to (kustomize refuses the cycle).
func RenderOverlay(repo, rel, overlay string) ([]byte, error) {
	mem := filesys.MakeFsInMemory()
	root := "/repo"
	err := filepath.WalkDir(repo, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		r, _ := filepath.Rel(repo, p)
		if d.IsDir() {
			if name := d.Name(); r != "." && (strings.HasPrefix(name, ".") || name == "bin" || name == "e2e" && r == "e2e") {
				return filepath.SkipDir
			}
			return nil
		}
		if ext := filepath.Ext(p); ext != ".yaml" && ext != ".yml" {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return mem.WriteFile(path.Join(root, filepath.ToSlash(r)), data)
	})
	if err != nil {
		return nil, err
	}
	dir := path.Join(root, filepath.ToSlash(rel))
	if err := mem.MkdirAll(dir); err != nil {
		return nil, err
	}
	if err := mem.WriteFile(path.Join(dir, "kustomization.yaml"), []byte(overlay)); err != nil {
		return nil, err
	}
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(mem, dir)
	if err != nil {
		return nil, err
	}
	return m.AsYaml()
}

// ImageOverlay is a kustomization of base (a path relative to the overlay)
// that sets the agent's image to image (NAME:TAG or NAME@DIGEST).
func ImageOverlay(base, image string) (string, error) {
	name, tag, digest, err := SplitImage(image)
	if err != nil {
		return "", err
	}
	s := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s\nimages:\n  - name: %s\n    newName: %s\n",
		base, ImageName, name)
	if tag != "" {
		s += fmt.Sprintf("    newTag: %q\n", tag)
	}
	if digest != "" {
		s += fmt.Sprintf("    digest: %s\n", digest)
	}
	return s, nil
}

// SplitImage splits NAME[:TAG][@DIGEST]; one of TAG and DIGEST is required,
// and a DIGEST is sha256: and 64 lower-case hex digits (make manifests
// IMAGE=NAME@sha256:... TAG=v1 once made "sha256:...:v1").
func SplitImage(image string) (name, tag, digest string, err error) {
	name, digest, hasDigest := strings.Cut(image, "@")
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		name, tag = name[:i], name[i+1:]
	}
	bad := name == "" || tag == "" && digest == "" || strings.ContainsAny(image, " \t\n\"'") ||
		hasDigest && !digestRE.MatchString(digest) || strings.Contains(name[strings.LastIndex(name, "/")+1:], ":")
	if bad {
		return "", "", "", fmt.Errorf("image %q: want NAME:TAG or NAME@sha256:DIGEST (64 hex digits)", image)
	}
	return name, tag, digest, nil
}

var digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
