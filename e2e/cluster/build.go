package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

const kubeVersion = "v1.36.3" // e2e/kube/go.mod

var kubeBinaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl"}

// buildKube returns the directory holding the Kubernetes components and
// etcd, building them unless a directory for the same inputs (e2e/kube's
// go.mod, go.sum and sources, the Go version, the architecture) is already
// in the cache. A cold build takes about 15 minutes on 2 cores; the Go build
// cache makes a rebuild a matter of linking.
func buildKube(ctx context.Context, e2eDir, cacheDir string) (dir string, built bool, err error) {
	kube := filepath.Join(e2eDir, "kube")
	h := sha256.New()
	for _, f := range []string{"go.mod", "go.sum", "etcd/main.go"} {
		b, err := os.ReadFile(filepath.Join(kube, f))
		if err != nil {
			return "", false, err
		}
		fmt.Fprintf(h, "%s %d\n", f, len(b))
		h.Write(b)
	}
	fmt.Fprintf(h, "%s %s/%s %s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH, kubeLDFlags())
	key := hex.EncodeToString(h.Sum(nil))[:12]
	dir = filepath.Join(cacheDir, "bin", "kubernetes-"+kubeVersion+"-"+key)
	complete := true
	for _, b := range kubeBinaries {
		if !exists(filepath.Join(dir, b)) {
			complete = false
		}
	}
	if complete {
		return dir, false, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", false, err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".building-")
	if err != nil {
		return "", false, err
	}
	defer os.RemoveAll(tmp)
	args := []string{"build", "-trimpath", "-ldflags", kubeLDFlags(), "-o", tmp + "/", "./etcd",
		"k8s.io/kubernetes/cmd/kube-apiserver", "k8s.io/kubernetes/cmd/kube-controller-manager",
		"k8s.io/kubernetes/cmd/kube-scheduler", "k8s.io/kubernetes/cmd/kubelet", "k8s.io/kubernetes/cmd/kubectl"}
	ctx, cancel := context.WithTimeout(ctx, 45*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goTool(), args...)
	cmd.Dir = kube
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=-mod=readonly -buildvcs=false")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", false, fmt.Errorf("go build (in e2e/kube): %w", err)
	}
	_ = os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		return "", false, err
	}
	return dir, true, nil
}

// kubeLDFlags stamps the release into the binaries (what `hack/lib/version.sh`
// does), so that the node and `kubectl version` report it.
func kubeLDFlags() string {
	f := []string{"-s", "-w"}
	for _, p := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
		f = append(f, "-X", p+".gitVersion="+kubeVersion, "-X", p+".gitMajor=1", "-X", p+".gitMinor=36",
			"-X", p+".gitTreeState=clean", "-X", p+".buildDate=1970-01-01T00:00:00Z")
	}
	return strings.Join(f, " ")
}

func goTool() string {
	if g := os.Getenv("GO"); g != "" {
		return g
	}
	return "go"
}

// buildHelpers builds the static pause, client and original binaries into dir.
func buildHelpers(ctx context.Context, e2eDir, dir string) error {
	for _, name := range []string{"pause", "client", "original"} {
		cmd := exec.CommandContext(ctx, goTool(), "build", "-trimpath", "-ldflags=-s -w", "-o", filepath.Join(dir, name), "./"+name)
		cmd.Dir = e2eDir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=-mod=readonly -buildvcs=false")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build ./%s: %w: %s", name, err, out)
		}
	}
	return nil
}

// Images, as containerd on the node knows them.
const (
	agentImage  = "localhost/ip-masq-agent-nft-e2e"
	agentTag    = "e2e"
	agentTag2   = "e2e-2" // the same image under a second tag: the rolling update
	pauseImage  = "localhost/ip-masq-agent-nft-e2e-pause:e2e"
	clientImage = "localhost/ip-masq-agent-nft-e2e-client:e2e"
	// The original iptables agent's behaviour (e2e/original) with the
	// machine's iptables-nft: the upgrade starts from it.
	originalImage = "localhost/ip-masq-agent-nft-e2e-original:e2e"
	originalBin   = "/ip-masq-agent-iptables"
	buildahFlags  = "--layers=false"
)

// buildImages builds the agent image with `make image BASE_IMAGE=scratch`,
// and the pause and client images FROM scratch, with buildah; each is
// exported as a docker archive under its node name into outDir and removed
// from buildah's storage again (their build tags carry the run's id).
func buildImages(ctx context.Context, repo, binDir, outDir, runID string) (map[string]string, error) {
	archives := map[string]string{}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, err
	}
	buildTag := "run-" + runID
	// The agent: exactly the operator's `make image`, on the base that needs no registry.
	out, err := run(ctx, 10*time.Minute, "make", "-C", repo, "image", "CONTAINER_TOOL=buildah", "BASE_IMAGE=scratch",
		"IMAGE="+agentImage, "TAG="+buildTag, "ARCH="+runtime.GOARCH, "IMAGE_BUILD_FLAGS="+buildahFlags)
	if err != nil {
		return nil, fmt.Errorf("make image: %w\n%s", err, out)
	}
	if err := exportImage(ctx, agentImage+":"+buildTag, filepath.Join(outDir, "agent.tar"), agentImage+":"+agentTag); err != nil {
		return nil, err
	}
	archives["agent"] = filepath.Join(outDir, "agent.tar")
	for _, img := range []struct{ name, bin, ref string }{{"pause", "pause", pauseImage}, {"client", "client", clientImage}} {
		ctxDir := filepath.Join(outDir, img.name)
		if err := os.MkdirAll(ctxDir, 0o755); err != nil {
			return nil, err
		}
		b, err := os.ReadFile(filepath.Join(binDir, img.bin))
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(ctxDir, img.bin), b, 0o755); err != nil {
			return nil, err
		}
		cf := fmt.Sprintf("FROM scratch\nCOPY %s /%s\nENTRYPOINT [\"/%s\"]\n", img.bin, img.bin, img.bin)
		if err := os.WriteFile(filepath.Join(ctxDir, "Containerfile"), []byte(cf), 0o644); err != nil {
			return nil, err
		}
		local := "localhost/ip-masq-agent-nft-e2e-" + img.name + ":" + buildTag
		if out, err := run(ctx, 5*time.Minute, "buildah", "bud", buildahFlags, "--quiet", "-t", local, "-f", filepath.Join(ctxDir, "Containerfile"), ctxDir); err != nil {
			return nil, fmt.Errorf("buildah bud %s: %w\n%s", img.name, err, out)
		}
		if err := exportImage(ctx, local, filepath.Join(outDir, img.name+".tar"), img.ref); err != nil {
			return nil, err
		}
		archives[img.name] = filepath.Join(outDir, img.name+".tar")
	}
	if err := buildOriginalImage(ctx, binDir, outDir, buildTag); err != nil {
		return nil, err
	}
	archives["original"] = filepath.Join(outDir, "original.tar")
	return archives, nil
}

// buildOriginalImage builds the image of the original agent's stand-in FROM
// scratch: e2e/original as /ip-masq-agent-iptables, plus the machine's
// iptables-nft (xtables-nft-multi, its iptables-nft, iptables-nft-restore,
// ip6tables-nft and ip6tables-nft-restore names), its xtables extensions
// (dlopened) and every shared library these need (ldd), at their paths.
func buildOriginalImage(ctx context.Context, binDir, outDir, buildTag string) error {
	multi, err := exec.LookPath("xtables-nft-multi")
	if err != nil {
		return fmt.Errorf("the original agent's image needs the machine's iptables-nft (Debian: apt-get install iptables): %w", err)
	}
	if multi, err = filepath.EvalSymlinks(multi); err != nil {
		return err
	}
	var extDir string
	for _, pat := range []string{"/usr/lib/*/xtables", "/usr/lib64/xtables", "/usr/lib/xtables"} {
		if m, _ := filepath.Glob(pat); len(m) > 0 && exists(filepath.Join(m[0], "libxt_comment.so")) {
			extDir = m[0]
			break
		}
	}
	if extDir == "" {
		return errors.New("the original agent's image: no xtables extension directory (libxt_comment.so) found")
	}
	ctxDir := filepath.Join(outDir, "original")
	root := filepath.Join(ctxDir, "rootfs")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	put := func(src, dst string, mode os.FileMode) error {
		b, err := os.ReadFile(src) // follows symlinks: the library itself
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, dst)), 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(root, dst), b, mode)
	}
	if err := put(filepath.Join(binDir, "original"), originalBin, 0o755); err != nil {
		return err
	}
	sbin := "/usr/sbin/xtables-nft-multi"
	if err := put(multi, sbin, 0o755); err != nil {
		return err
	}
	for _, name := range []string{"iptables-nft", "iptables-nft-restore", "ip6tables-nft", "ip6tables-nft-restore"} {
		if err := os.Symlink("xtables-nft-multi", filepath.Join(root, "usr/sbin", name)); err != nil {
			return err
		}
	}
	exts, _ := filepath.Glob(filepath.Join(extDir, "*.so"))
	libs := map[string]bool{}
	for _, f := range append([]string{multi}, exts...) {
		if strings.HasPrefix(f, extDir) {
			if err := put(f, f, 0o644); err != nil {
				return err
			}
		}
		out, err := run(ctx, time.Minute, "ldd", f)
		if err != nil {
			return fmt.Errorf("ldd %s: %w", f, err)
		}
		for _, w := range strings.Fields(out) {
			if strings.HasPrefix(w, "/") {
				libs[w] = true
			}
		}
	}
	for l := range libs {
		if err := put(l, l, 0o755); err != nil {
			return err
		}
	}
	cf := "FROM scratch\nCOPY rootfs/ /\nENV PATH=/usr/sbin:/usr/bin:/sbin:/bin\nENTRYPOINT [\"" + originalBin + "\"]\n"
	if err := os.WriteFile(filepath.Join(ctxDir, "Containerfile"), []byte(cf), 0o644); err != nil {
		return err
	}
	local := "localhost/ip-masq-agent-nft-e2e-original:" + buildTag
	if out, err := run(ctx, 5*time.Minute, "buildah", "bud", buildahFlags, "--quiet", "-t", local, "-f", filepath.Join(ctxDir, "Containerfile"), ctxDir); err != nil {
		return fmt.Errorf("buildah bud original: %w\n%s", err, out)
	}
	return exportImage(ctx, local, filepath.Join(outDir, "original.tar"), originalImage)
}

// exportImage writes image local to file as a docker archive naming it ref,
// and removes local from buildah's storage.
func exportImage(ctx context.Context, local, file, ref string) error {
	_, err := run(ctx, 5*time.Minute, "buildah", "push", "--quiet", local, "docker-archive:"+file+":"+ref)
	if _, rmErr := run(ctx, time.Minute, "buildah", "rmi", local); rmErr != nil && err == nil {
		err = rmErr
	}
	return err
}

// removeBuildTags removes the run's build tags from buildah's storage, if a
// failed step left any (buildImages removes each once it is exported).
func removeBuildTags(runID string) []string {
	var problems []string
	for _, img := range []string{agentImage, "localhost/ip-masq-agent-nft-e2e-pause", "localhost/ip-masq-agent-nft-e2e-client", "localhost/ip-masq-agent-nft-e2e-original"} {
		ref := img + ":run-" + runID
		if _, err := run(context.Background(), time.Minute, "buildah", "inspect", "--type", "image", ref); err != nil {
			continue // not there
		}
		if _, err := run(context.Background(), time.Minute, "buildah", "rmi", ref); err != nil {
			problems = append(problems, err.Error())
		}
	}
	return problems
}
