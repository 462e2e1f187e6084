package test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	yaml3 "go.yaml.in/yaml/v3"
)

// The release, checked without running it: the workflow's steps and the
// Makefile targets it calls, the version the binaries report, and the
// digest make manifests pins. (Named TestManifests... so that the
// workflow's own unit-test step, go test -run Manifest ./test/, runs them.)

type workflow struct {
	Name string `yaml:"name"`
	On   struct {
		Push struct {
			Tags []string `yaml:"tags"`
		} `yaml:"push"`
	} `yaml:"on"`
	Permissions map[string]string `yaml:"permissions"`
	Env         map[string]string `yaml:"env"`
	Jobs        map[string]struct {
		RunsOn string `yaml:"runs-on"`
		Steps  []struct {
			Name string            `yaml:"name"`
			ID   string            `yaml:"id"`
			Uses string            `yaml:"uses"`
			Run  string            `yaml:"run"`
			With map[string]any    `yaml:"with"`
			Env  map[string]string `yaml:"env"`
		} `yaml:"steps"`
	} `yaml:"jobs"`
}

// makeTargets returns the targets the Makefile defines (lines "name:" or
// "name: prerequisites", not variables).
func makeTargets(t *testing.T) map[string]bool {
	t.Helper()
	data, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	re := regexp.MustCompile(`(?m)^([a-zA-Z0-9][a-zA-Z0-9_./%-]*):([^=]|$)`)
	for _, m := range re.FindAllStringSubmatch(string(data), -1) {
		targets[m[1]] = true
	}
	return targets
}

// TestManifestsReleaseWorkflow: .github/workflows/release.yml parses, runs
// on a version tag with the permissions keyless signing needs, builds and
// pushes amd64 and arm64 with make, makes an SBOM, signs the image by
// digest with cosign, attests the SBOM, renders the manifests pinned by
// that digest and attaches them and the SBOM; each make target it calls
// exists; SECURITY.md's verification names this workflow's identity.
func TestManifestsReleaseWorkflow(t *testing.T) {
	data, err := os.ReadFile("../.github/workflows/release.yml")
	if err != nil {
		t.Fatal(err)
	}
	// YAML 1.2 as GitHub reads it ("on" is a string, not YAML 1.1's true),
	// every field known.
	var wf workflow
	dec := yaml3.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&wf); err != nil {
		t.Fatalf("release.yml: %v", err)
	}
	if wf.Name == "" || len(wf.Jobs) == 0 {
		t.Fatalf("release.yml: no name or no jobs")
	}
	if !slices.Contains(wf.On.Push.Tags, "v*.*.*") {
		t.Errorf("on.push.tags %v, want v*.*.*", wf.On.Push.Tags)
	}
	for k, v := range map[string]string{"id-token": "write", "packages": "write", "contents": "write"} {
		if wf.Permissions[k] != v {
			t.Errorf("permissions.%s %q, want %q", k, wf.Permissions[k], v)
		}
	}
	if len(wf.Jobs) != 1 {
		t.Fatalf("%d jobs, want 1", len(wf.Jobs))
	}
	var steps []string // each step as one line: uses, then run, for the order checks
	uses := map[string]map[string]any{}
	var run string
	for _, j := range wf.Jobs {
		for _, s := range j.Steps {
			if s.Uses != "" {
				name, _, _ := strings.Cut(s.Uses, "@")
				uses[name] = s.With
				steps = append(steps, "uses "+name)
			}
			if s.Run != "" {
				steps = append(steps, s.Run)
				run += s.Run + "\n"
			}
		}
	}
	for _, action := range []string{"actions/checkout", "actions/setup-go", "docker/setup-buildx-action", "docker/login-action", "anchore/sbom-action", "sigstore/cosign-installer"} {
		if _, ok := uses[action]; !ok {
			t.Errorf("no step uses %s", action)
		}
	}
	if d := uses["actions/checkout"]["fetch-depth"]; d != 0 {
		t.Errorf("checkout fetch-depth %v, want 0 (the tags)", d)
	}
	sbomFile, _ := uses["anchore/sbom-action"]["output-file"].(string)
	if img, _ := uses["anchore/sbom-action"]["image"].(string); !strings.Contains(img, "steps.image.outputs.ref") || sbomFile == "" {
		t.Errorf("anchore/sbom-action with %v: want the pushed image by digest and an output-file", uses["anchore/sbom-action"])
	}
	index := func(what string) int {
		return slices.IndexFunc(steps, func(s string) bool { return strings.Contains(s, what) })
	}
	order := []string{"make image-multiarch", `."containerimage.digest"`, "uses anchore/sbom-action", "uses sigstore/cosign-installer",
		"cosign sign --yes --recursive", "cosign attest --yes --type spdxjson --predicate " + sbomFile, "make manifests IMAGE=", "gh release create"}
	last := -1
	for _, what := range order {
		i := index(what)
		if i < 0 {
			t.Errorf("no step runs %q", what)
			continue
		}
		if i < last {
			t.Errorf("%q comes before the step it needs", what)
		}
		last = i
	}
	build := steps[max(index("make image-multiarch"), 0)]
	for _, want := range []string{`ARCHES="amd64 arm64"`, `TAG="${GITHUB_REF_NAME}"`, "--push", "--sbom=true", "--metadata-file bin/image.json"} {
		if !strings.Contains(build, want) {
			t.Errorf("the build step lacks %s:\n%s", want, build)
		}
	}
	if s := steps[max(index("make manifests"), 0)]; !strings.Contains(s, "IMAGE=\"${{ steps.image.outputs.ref }}\"") || strings.Contains(s, "TAG=") {
		t.Errorf("make manifests must pin the digest, and give no TAG: %s", s)
	}
	if s := steps[max(index("gh release create"), 0)]; !strings.Contains(s, sbomFile) || !strings.Contains(s, "bin/manifests/install.yaml") {
		t.Errorf("the release does not attach the SBOM and the manifests: %s", s)
	}
	targets := makeTargets(t)
	for _, m := range regexp.MustCompile(`\bmake ([a-z][a-z0-9-]*)`).FindAllStringSubmatch(run, -1) {
		if !targets[m[1]] {
			t.Errorf("release.yml runs make %s, which the Makefile does not define", m[1])
		}
	}

	// SECURITY.md's verification matches the identity this workflow signs
	// with: the workflow's path in the repository the image names, at a tag.
	sec, err := os.ReadFile("../SECURITY.md")
	if err != nil {
		t.Fatal(err)
	}
	docker, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	src := regexp.MustCompile(`org\.opencontainers\.image\.source="([^"]+)"`).FindSubmatch(docker)
	if src == nil {
		t.Fatal("the Dockerfile has no org.opencontainers.image.source")
	}
	identity := string(src[1]) + "/.github/workflows/release.yml@refs/tags/v1.2.3"
	ids := regexp.MustCompile(`--certificate-identity-regexp '([^']+)'`).FindAllSubmatch(sec, -1)
	if len(ids) == 0 || !strings.Contains(string(sec), "cosign verify-attestation") || !strings.Contains(string(sec), "--certificate-oidc-issuer https://token.actions.githubusercontent.com") {
		t.Fatal("SECURITY.md does not say how to verify the signature and the SBOM attestation")
	}
	for _, id := range ids {
		re, err := regexp.Compile(string(id[1]))
		if err != nil {
			t.Fatalf("SECURITY.md's identity %s: %v", id[1], err)
		}
		if !re.MatchString(identity) || re.MatchString(strings.Replace(identity, "release.yml", "other.yml", 1)) {
			t.Errorf("SECURITY.md's identity %s does not match exactly the workflow's %s", id[1], identity)
		}
	}
	if _, err := os.Stat(filepath.Join("..", ".github/workflows/release.yml")); err != nil {
		t.Error(err)
	}
}

// makeDryRun is make -n in the repository's root.
func makeDryRun(t *testing.T, args ...string) (string, error) {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatal("make is not installed (Debian: make)")
	}
	out, err := exec.Command("make", append([]string{"-n", "-C", ".."}, args...)...).CombinedOutput()
	return string(out), err
}

// TestManifestsReleaseVersion: an image built for TAG=v0.1.0 (make image,
// push, image-multiarch) carries a binary that reports v0.1.0 (it once
// reported the commit, build_info{version="8b97c4a"}); the version comes
// from the same -X main.version that --version and build_info read.
func TestManifestsReleaseVersion(t *testing.T) {
	var ldflags string
	for _, target := range []string{"image", "push", "image-multiarch"} {
		out, err := makeDryRun(t, target, "TAG=v0.1.0", "CONTAINER_TOOL=podman")
		if err != nil {
			t.Fatalf("make -n %s: %v\n%s", target, err, out)
		}
		builds := regexp.MustCompile(`go build .*-ldflags '([^']*)'`).FindAllStringSubmatch(out, -1)
		if len(builds) == 0 || !strings.Contains(out, "--build-arg VERSION=v0.1.0") {
			t.Errorf("make %s TAG=v0.1.0: no binary built, or no VERSION build-arg:\n%s", target, out)
		}
		for _, b := range builds {
			if !strings.Contains(b[1], "-X main.version=v0.1.0") {
				t.Errorf("make %s TAG=v0.1.0 builds with -ldflags %q", target, b[1])
			}
			ldflags = b[1]
		}
	}
	// VERSION given wins over TAG.
	if out, err := makeDryRun(t, "image", "TAG=v0.1.0", "VERSION=v0.1.0-rc1", "CONTAINER_TOOL=podman"); err != nil || !strings.Contains(out, "-X main.version=v0.1.0-rc1") {
		t.Errorf("make image VERSION=v0.1.0-rc1 TAG=v0.1.0: %v\n%s", err, out)
	}
	if ldflags == "" {
		return
	}
	bin := buildWith(t, ldflags)
	if out, err := exec.Command(bin, "--version").Output(); err != nil || string(out) != "ip-masq-agent v0.1.0\n" {
		t.Errorf("--version of the binary make image TAG=v0.1.0 builds: %q %v", out, err)
	}
}

// buildWith builds the agent with the given -ldflags into a temporary
// directory, as make does.
func buildWith(t *testing.T, ldflags string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "ip-masq-agent")
	build := exec.Command("go", "build", "-trimpath", "-ldflags", ldflags, "-o", bin, "../cmd/ip-masq-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestReleaseBuildInfo: the daemon built as make image TAG=v0.1.0 builds
// it exports build_info{version="v0.1.0"} (a self-built v0.1.0 image once
// reported the commit) and says the version on its start line.
func TestReleaseBuildInfo(t *testing.T) {
	topo := newTopology(t)
	out, err := makeDryRun(t, "bin/linux-"+runtime.GOARCH+"/ip-masq-agent", "TAG=v0.1.0")
	m := regexp.MustCompile(`-ldflags '([^']*)'`).FindStringSubmatch(out)
	if err != nil || m == nil {
		t.Fatalf("make -n: %v\n%s", err, out)
	}
	bin := buildWith(t, m[1])
	d := startCommand(t, exec.Command("ip", "netns", "exec", topo.NodeNS, bin, "--config", writeConfig(t, "")), false)
	eventually(t, "/readyz", func() bool { code, _ := httpGet(topo, "/readyz"); return code == 200 })
	if _, body := httpGet(topo, "/metrics"); !strings.Contains(body, `ip_masq_agent_build_info{version="v0.1.0"} 1`) {
		t.Errorf("/metrics has no build_info for v0.1.0:\n%s", body)
	}
	if !strings.Contains(d.output(), "version=v0.1.0") {
		t.Errorf("the start line does not say v0.1.0:\n%s", d.output())
	}
}

// TestManifestsReleaseDigest: make manifests takes IMAGE=NAME@sha256:...
// with no TAG or an empty one (it once failed with "invalid Kustomization"
// or wrote NAME@sha256:...:8b97c4a), and refuses a digest with a TAG.
func TestManifestsReleaseDigest(t *testing.T) {
	const image = "registry.example.com/ip-masq-agent-nft@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, args := range [][]string{{"IMAGE=" + image}, {"IMAGE=" + image, "TAG="}} {
		out, err := makeDryRun(t, append([]string{"manifests"}, args...)...)
		if err != nil || !strings.Contains(out, "-image "+image+"\n") {
			t.Errorf("make manifests %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	if out, err := makeDryRun(t, "manifests", "IMAGE="+image, "TAG=v0.1.0"); err == nil || !strings.Contains(out, "holds a digest") {
		t.Errorf("make manifests with a digest and a TAG: %v\n%s", err, out)
	}
	if out, err := makeDryRun(t, "manifests", "IMAGE=registry.example.com/x", "TAG=v0.1.0"); err != nil || !strings.Contains(out, "-image registry.example.com/x:v0.1.0\n") {
		t.Errorf("make manifests IMAGE TAG: %v\n%s", err, out)
	}
}
