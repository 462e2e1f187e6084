package test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
)

// The container test runs the image the way the DaemonSet runs it: built by
// `make image`, with CAP_NET_ADMIN alone, a read-only root, no privilege
// escalation, the ConfigMap volume laid out as the kubelet lays it out, and
// the node's network namespace (hostNetwork). Packets prove it works.

const (
	// maxImageSize bounds the image as a registry stores it and a node
	// pulls it: its layer compressed with gzip. The iptables agent's image
	// is about 28 MB.
	maxImageSize = 10_000_000
	testImage    = "localhost/ip-masq-agent-nft-test"
	// kubelet's ConfigMap volume: the key's file name and the mount point.
	configFile  = "ip-masq-agent"
	configMount = "/etc/config"
)

// requireContainer skips without root (fails with CI=true), like every
// kernel test; as root it fails unless podman can run containers here:
// podman, an OCI runtime (runc or crun) and make, each named with the package
// that installs it. It returns podman's global flags.
func requireContainer(t *testing.T) []string {
	t.Helper()
	testnet.Require(t, "ip", "nft")
	runtimeName := ""
	for _, r := range []string{"runc", "crun"} {
		if _, err := exec.LookPath(r); err == nil {
			runtimeName = r
			break
		}
	}
	need := []string{"podman", "make"}
	if runtimeName == "" {
		need = append(need, "runc")
	}
	if reason := testnet.MissingReason(need...); reason != "" {
		t.Fatalf("container test: %s", reason)
	}
	// cgroupfs: works with and without systemd as the init.
	return []string{"--runtime", runtimeName, "--cgroup-manager=cgroupfs"}
}

// podman runs podman with the global flags, bounded by timeout, and returns
// its trimmed standard output; standard error goes into the error.
func podman(global []string, timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "podman", append(append([]string{}, global...), args...)...)
	cmd.WaitDelay = 5 * time.Second
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("podman %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

// rlimit returns "cur:max" for a podman --ulimit, at most 1024 and at most
// this process's hard limit: the runtime cannot raise a hard limit without
// CAP_SYS_RESOURCE, and podman's defaults may be above it.
func rlimit(t *testing.T, resource int) string {
	var l unix.Rlimit
	if err := unix.Getrlimit(resource, &l); err != nil {
		t.Fatal(err)
	}
	n := min(l.Max, 1024)
	return fmt.Sprintf("%d:%d", n, n)
}

func TestContainer(t *testing.T) {
	global := requireContainer(t)
	topo := newTopology(t)
	addDestinations(t, topo, internet1, internet2, private1)
	suffix := fmt.Sprintf("%d-%d", os.Getpid(), time.Now().UnixNano())

	// The image, built as an operator builds it, on the base that needs no
	// registry.
	tag := "t" + suffix
	image := testImage + ":" + tag
	start := time.Now()
	build := exec.Command("make", "-C", "..", "image", "CONTAINER_TOOL=podman", "BASE_IMAGE=scratch",
		"IMAGE="+testImage, "TAG="+tag, "IMAGE_BUILD_FLAGS=--layers=false", "ARCH="+runtime.GOARCH)
	t.Cleanup(func() {
		if out, err := podman(global, time.Minute, "rmi", "-f", image); err != nil && !strings.Contains(err.Error(), "not known") {
			t.Errorf("remove the image: %v %s", err, out)
		}
	})
	if err := runBounded(build, 5*time.Minute); err != nil {
		t.Fatalf("make image: %v", err)
	}
	t.Logf("make image: %s", time.Since(start).Round(time.Millisecond))
	sizeText, err := podman(global, time.Minute, "image", "inspect", "--format", "{{.Size}}", image)
	if err != nil {
		t.Fatal(err)
	}
	size, err := strconv.ParseInt(sizeText, 10, 64)
	if err != nil {
		t.Fatalf("image size %q: %v", sizeText, err)
	}
	t.Logf("image %s: %d bytes (%.2f MB) uncompressed on BASE_IMAGE=scratch", image, size, float64(size)/1e6)

	checkImage(t, global, image)

	// The first config: only 10/8 is not masqueraded. resyncInterval 1s
	// bounds how long the agent takes to see a change, with or without
	// file events.
	vol := newConfigMapDir(t, "nonMasqueradeCIDRs: [10.0.0.0/8]\nresyncInterval: 1s\n")
	if err := os.Chmod(vol.Dir, 0o755); err != nil { // for the agent's user in the container
		t.Fatal(err)
	}

	httpAddr := "127.0.0.1:9753" // as in deploy/daemonset.yaml
	args := []string{"--v=2", "--http-address=" + httpAddr}
	name := "ip-masq-agent-test-" + suffix
	// What the DaemonSet asks of the kubelet, in podman's words.
	restricted := func(name string) []string {
		return []string{"--name", name,
			"--network", "ns:" + filepath.Join("/run/netns", topo.NodeNS), // hostNetwork
			"--cap-drop=ALL", "--cap-add=NET_ADMIN",
			"--read-only", "--read-only-tmpfs=false", // as readOnlyRootFilesystem: no writable /tmp or /run either
			"--security-opt", "no-new-privileges", // allowPrivilegeEscalation: false
			"--ulimit", "nofile=" + rlimit(t, unix.RLIMIT_NOFILE),
			"--ulimit", "nproc=" + rlimit(t, unix.RLIMIT_NPROC),
			"--volume", vol.Dir + ":" + configMount + ":ro",
			image}
	}
	removeContainer := func(name string) {
		if out, err := podman(global, time.Minute, "rm", "--force", "--time", "0", name); err != nil && !strings.Contains(err.Error(), "no such container") {
			t.Errorf("remove the container: %v %s", err, out)
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			if logs, err := podmanLogs(global, name); err == nil {
				t.Logf("container logs:\n%s", logs)
			}
		}
		removeContainer(name)
	})
	if out, err := podman(global, time.Minute, append(append([]string{"run", "--detach"}, restricted(name)...), args...)...); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	alive := func() error {
		state, err := podman(global, 30*time.Second, "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", name)
		if err != nil {
			return err
		}
		if !strings.HasPrefix(state, "running") {
			return fmt.Errorf("the container is not running: %s", state)
		}
		return nil
	}

	checkConfined(t, global, name)

	took := waitSources(t, topo, alive, 30*time.Second,
		map[string]bool{internet1: true, internet2: true, private1: false})
	t.Logf("first config in force %s after podman run", took.Round(time.Millisecond))

	// The probes' endpoints, where the kubelet reaches them (hostNetwork).
	for _, path := range []string{"/readyz", "/healthz", "/metrics"} {
		code, err := httpGetInNode(topo, "http://"+httpAddr+path, 10*time.Second)
		if err != nil || code != http.StatusOK {
			t.Errorf("GET %s in the node's network namespace: %d %v, want 200", path, code, err)
		}
	}

	// The kubelet's update: a new timestamped directory, ..data swapped.
	vol.update("nonMasqueradeCIDRs: [203.0.113.0/24]\nresyncInterval: 1s\n")
	took = waitSources(t, topo, alive, 90*time.Second,
		map[string]bool{internet1: false, internet2: true, private1: true})
	t.Logf("updated config in force %s after the kubelet-style update", took.Round(time.Millisecond))

	// SIGTERM (what the kubelet sends): the agent exits 0 and leaves its
	// rules, so masquerade holds while a new pod starts.
	if out, err := podman(global, time.Minute, "stop", "--time", "10", name); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	if code, err := podman(global, 30*time.Second, "inspect", "--format", "{{.State.ExitCode}}", name); err != nil || code != "0" {
		t.Errorf("after SIGTERM the agent exited with %q (%v), want 0 (137 means it was killed)", code, err)
	}
	expectSources(t, topo, map[string]bool{internet1: false, private1: true})

	// --cleanup from the same image with the same rights removes the table.
	t.Cleanup(func() { removeContainer(name + "-cleanup") })
	if out, err := podman(global, time.Minute, append(append([]string{"run", "--rm"}, restricted(name+"-cleanup")...), "--cleanup")...); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	if out, err := topo.NFT("list", "table", "inet", "ip-masq-agent"); err == nil {
		t.Errorf("the table is still there after --cleanup:\n%s", out)
	}
	expectSources(t, topo, map[string]bool{internet1: false, private1: false})
}

// checkImage checks the image's configuration and contents: the agent as
// entrypoint, numeric uid 0, the OCI labels, and no file but the agent (no
// shell, no iptables, no nft).
func checkImage(t *testing.T, global []string, image string) {
	t.Helper()
	out, err := podman(global, time.Minute, "image", "inspect", "--format", "{{json .Config}}", image)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		User       string
		Entrypoint []string
		Cmd        []string
		Labels     map[string]string
	}
	if err := json.Unmarshal([]byte(out), &cfg); err != nil {
		t.Fatalf("image config %s: %v", out, err)
	}
	if !slices.Equal(cfg.Entrypoint, []string{"/ip-masq-agent"}) || len(cfg.Cmd) > 0 {
		t.Errorf("entrypoint %q cmd %q, want the agent alone", cfg.Entrypoint, cfg.Cmd)
	}
	if cfg.User != "0:0" {
		t.Errorf("user %q, want 0:0", cfg.User)
	}
	for _, l := range []string{"title", "description", "source", "version", "revision"} {
		if cfg.Labels["org.opencontainers.image."+l] == "" {
			t.Errorf("no label org.opencontainers.image.%s: %v", l, cfg.Labels)
		}
	}

	name := "ip-masq-agent-test-files-" + strconv.Itoa(os.Getpid())
	if out, err := podman(global, time.Minute, "create", "--name", name, image); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	defer podman(global, time.Minute, "rm", "--force", name)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	export := exec.CommandContext(ctx, "podman", append(append([]string{}, global...), "export", name)...)
	tarball, err := export.Output()
	if err != nil {
		t.Fatalf("podman export: %v", err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(tarball)
	zw.Close()
	t.Logf("image %s: %d bytes (%.2f MB) compressed, as pulled", image, gz.Len(), float64(gz.Len())/1e6)
	if gz.Len() >= maxImageSize {
		t.Errorf("the image is %d bytes compressed, want under %d", gz.Len(), maxImageSize)
	}
	var files []string
	tr := tar.NewReader(bytes.NewReader(tarball))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("podman export: %v", err)
		}
		// podman adds empty mount points (etc/hosts, etc/resolv.conf, ...)
		// to every container; only regular files with content count.
		if h.Typeflag == tar.TypeReg && h.Size > 0 || h.Typeflag == tar.TypeSymlink {
			files = append(files, strings.TrimPrefix(h.Name, "./"))
		}
	}
	if !slices.Equal(files, []string{"ip-masq-agent"}) {
		t.Errorf("the image holds %q, want the agent alone", files)
	}
}

// checkConfined reads the agent's process status from the kernel: uid 0,
// CAP_NET_ADMIN as its only capability (effective, permitted and bounding),
// no_new_privs, and a seccomp filter.
func checkConfined(t *testing.T, global []string, name string) {
	t.Helper()
	pid, err := podman(global, 30*time.Second, "inspect", "--format", "{{.State.Pid}}", name)
	if err != nil {
		t.Fatal(err)
	}
	status, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		t.Fatalf("the agent's status: %v", err)
	}
	const netAdmin = "0000000000001000" // 1 << CAP_NET_ADMIN (12)
	want := map[string]string{
		"CapEff": netAdmin, "CapPrm": netAdmin, "CapBnd": netAdmin, "CapAmb": "0000000000000000",
		"NoNewPrivs": "1", "Seccomp": "2",
	}
	got := map[string]string{}
	for _, line := range strings.Split(string(status), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			got[k] = strings.TrimSpace(v)
		}
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("the agent's %s is %q, want %q", k, got[k], v)
		}
	}
	if uid := strings.Fields(got["Uid"]); len(uid) == 0 || uid[0] != "0" {
		t.Errorf("the agent runs as uid %v, want 0 (the image's USER)", got["Uid"])
	}
}

// waitSources polls, every 200ms and for at most timeout, until each
// destination sees the source the map asks for (masqueraded or not), and
// returns how long that took. It fails the test at once if alive reports
// the agent gone, and at the deadline with expectSources' report.
func waitSources(t *testing.T, topo *testnet.Topology, alive func() error, timeout time.Duration, want map[string]bool) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		if matchSources(topo, want) {
			return time.Since(start)
		}
		if err := alive(); err != nil {
			t.Fatal(err)
		}
		if time.Since(start) > timeout {
			t.Errorf("not in force after %s:", timeout)
			expectSources(t, topo, want)
			t.FailNow()
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func matchSources(topo *testnet.Topology, want map[string]bool) bool {
	for dst, masq := range want {
		addr := netip.MustParseAddr(dst)
		exp := topo.Pod4
		if masq {
			exp = topo.NodeUplink4
		}
		if got, err := topo.SourceSeen(addr); err != nil || got != exp {
			return false
		}
	}
	return true
}

func podmanLogs(global []string, name string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "podman", append(append([]string{}, global...), "logs", name)...).CombinedOutput()
	return string(out), err
}

// runBounded runs cmd with a deadline; the error quotes its output.
func runBounded(cmd *exec.Cmd, timeout time.Duration) error {
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("%w\n%s", err, out.String())
		}
		return nil
	case <-time.After(timeout):
		cmd.Process.Kill()
		<-done
		return fmt.Errorf("still running after %s\n%s", timeout, out.String())
	}
}

// httpGetInNode GETs url from inside the node's network namespace (where
// the agent listens, as on a node with hostNetwork) and returns the status.
func httpGetInNode(topo *testnet.Topology, url string, timeout time.Duration) (int, error) {
	client := &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DisableKeepAlives: true,
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return dialInNS(topo.NodeHandle(), network, addr, timeout)
			},
		},
	}
	deadline := time.Now().Add(timeout)
	for {
		resp, err := client.Get(url)
		code := 0
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			code = resp.StatusCode
		}
		if code == http.StatusOK || time.Now().After(deadline) {
			return code, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// dialInNS connects from a socket created inside namespace h: a socket
// stays in the namespace it was created in, so only the dial needs the
// thread there. The thread is moved back, or left locked (and so discarded
// by the runtime) if that fails.
func dialInNS(h netns.NsHandle, network, addr string, timeout time.Duration) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	res := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			res <- result{nil, err}
			return
		}
		defer orig.Close()
		if err := netns.Set(h); err != nil {
			runtime.UnlockOSThread()
			res <- result{nil, err}
			return
		}
		c, err := net.DialTimeout(network, addr, timeout)
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		res <- result{c, err}
	}()
	r := <-res
	return r.c, r.err
}
