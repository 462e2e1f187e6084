// Command cluster is `make e2e-cluster`: the agent on a real single-node
// Kubernetes, installed as the README tells users to, proved with real
// packets from a normal pod to an external host.
//
// It builds (or reuses) etcd and the Kubernetes components, runs them with
// containerd and the bridge CNI inside a node network namespace and a
// private mount namespace, and a dead-end "external" namespace holds the
// destinations. Nothing touches the machine's own network namespace, its
// rules or its global sysctls; everything started is stopped and everything
// created is removed, also when a step fails or the run is interrupted.
// Needs root. See docs/development.md, "End-to-end on a real node".
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

type suite struct {
	ctx     context.Context
	n       *node
	repo    string
	e2eDir  string
	cache   string
	kubeBin string // directory of the Kubernetes binaries
	admin   string // admin kubeconfig
	echo    *echoServer
	podIP   string // the client pod's address
	start   time.Time

	operatorCM configMapState // the operator's ConfigMap as created
	docs       *docShell      // the docs' commands, run as printed

	passed, failed int
	failures       []string
	timings        []string
}

func main() {
	repo := flag.String("repo", "..", "the project's root directory")
	cache := flag.String("cache", "", "where built Kubernetes binaries are kept (default: E2E_CACHE_DIR or <repo>/e2e/.cache)")
	flag.Parse()
	os.Exit(mainCode(*repo, *cache))
}

func mainCode(repo, cache string) int {
	start := time.Now()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "e2e-cluster: needs root: it creates network and mount namespaces, cgroups and runs a kubelet and containerd (run `sudo make e2e-cluster`)")
		return 1
	}
	repo, err := filepath.Abs(repo)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e-cluster:", err)
		return 1
	}
	if cache == "" {
		cache = os.Getenv("E2E_CACHE_DIR")
	}
	if cache == "" {
		cache = filepath.Join(repo, "e2e", ".cache")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	// A bound on the whole run, a cold build included (CI allows 90 minutes).
	ctx, cancel := context.WithTimeout(ctx, 60*time.Minute)
	defer cancel()
	s := &suite{ctx: ctx, repo: repo, e2eDir: filepath.Join(repo, "e2e"), cache: cache, start: start}
	if err := preflight(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e-cluster:", err)
		return 1
	}

	err = s.run()
	if err != nil {
		s.failed++
		s.failures = append(s.failures, err.Error())
		s.logf("FAIL: %v", err)
	}
	if s.failed > 0 && !errors.Is(ctx.Err(), context.Canceled) && s.n != nil && s.n.holder != nil {
		s.ctx = context.Background() // also after the run's deadline
		s.diagnose()
	}
	if s.echo != nil {
		s.echo.close()
	}
	if s.n != nil {
		s.logf("cleanup: stopping every process of the run, removing its namespaces, cgroups, mounts and files")
		t := time.Now()
		problems := append(s.n.cleanup(), removeBuildTags(strconv.Itoa(os.Getpid()))...)
		for _, p := range problems {
			s.failed++
			s.failures = append(s.failures, "cleanup: "+p)
			s.logf("FAIL cleanup: %s", p)
		}
		if len(problems) == 0 {
			s.passed++
			s.logf("ok   cleanup: nothing of the run is left (%s)", since(t))
		}
	}
	s.printReport()
	if errors.Is(ctx.Err(), context.Canceled) {
		fmt.Println("e2e-cluster: interrupted")
		return 130
	}
	if s.failed > 0 {
		return 1
	}
	return 0
}

func preflight() error {
	var missing []string
	// iptables-nft, ldd: the original agent's image; conntrack: the no-double-NAT check.
	for _, b := range []string{"containerd", "containerd-shim-runc-v2", "ctr", "runc", "buildah", "nsenter", "unshare", "mount", "ip", "nft", "make",
		"xtables-nft-multi", "iptables-nft-save", "ldd", "conntrack"} {
		if _, err := exec.LookPath(b); err != nil {
			missing = append(missing, b)
		}
	}
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		if !exists("/usr/lib/cni/" + p) {
			missing = append(missing, "/usr/lib/cni/"+p)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing %s (make deps-e2e installs them; Debian: apt-get install --no-install-recommends containerd runc containernetworking-plugins buildah nftables iproute2 make iptables conntrack libc-bin)", strings.Join(missing, ", "))
	}
	return nil
}

func since(t time.Time) string { return time.Since(t).Round(100 * time.Millisecond).String() }

func (s *suite) logf(format string, args ...any) {
	fmt.Printf("[%7.1fs] %s\n", time.Since(s.start).Seconds(), fmt.Sprintf(format, args...))
}

func (s *suite) timing(what string, d time.Duration, extra string) {
	line := fmt.Sprintf("%-44s %8s", what, d.Round(100*time.Millisecond))
	if extra != "" {
		line += "  " + extra
	}
	s.timings = append(s.timings, line)
}

// assert records one assertion.
func (s *suite) assert(ok bool, format string, args ...any) bool {
	msg := fmt.Sprintf(format, args...)
	if ok {
		s.passed++
		s.logf("ok   %s", msg)
	} else {
		s.failed++
		s.failures = append(s.failures, msg)
		s.logf("FAIL %s", msg)
	}
	return ok
}

// waitFor polls cond every interval until it is true, ctx ends, or timeout
// passes; the error then says what was awaited and the last state seen.
func waitFor(ctx context.Context, what string, timeout, interval time.Duration, cond func() (bool, string, error)) error {
	deadline := time.Now().Add(timeout)
	var last string
	var lastErr error
	for {
		ok, state, err := cond()
		if ok && err == nil {
			return nil
		}
		last, lastErr = state, err
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s (last: %s, %v)", timeout, what, last, lastErr)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(interval):
		}
	}
}

func (s *suite) kubectl(timeout time.Duration, args ...string) (string, error) {
	argv := append([]string{filepath.Join(s.kubeBin, "kubectl"), "--kubeconfig=" + s.admin, "--cache-dir=" + s.n.path("kubectl-cache")}, args...)
	out, err := s.n.exec(s.ctx, timeout, argv...)
	return strings.TrimSpace(out), err
}

// kubectlAll is kubectl returning standard output and standard error together.
func (s *suite) kubectlAll(timeout time.Duration, args ...string) (string, error) {
	argv := append([]string{filepath.Join(s.kubeBin, "kubectl"), "--kubeconfig=" + s.admin, "--cache-dir=" + s.n.path("kubectl-cache")}, args...)
	stdout, stderr, err := runEnv(s.ctx, timeout, baseEnv(s.n), s.n.inNode(argv...))
	return strings.TrimSpace(stdout + stderr), err
}

// nodeNft runs nft in the node's network namespace.
func (s *suite) nodeNft(args ...string) (string, error) {
	return run(s.ctx, 30*time.Second, "nsenter", append([]string{"--net=" + s.n.nodeNS, "--", "nft"}, args...)...)
}

func (s *suite) run() error {
	// Build.
	t := time.Now()
	s.logf("build: Kubernetes %s components and etcd (cold: 13 to 15 minutes on 2 cores; cached in %s)", kubeVersion, filepath.Join(s.cache, "bin"))
	dir, built, err := buildKube(s.ctx, s.e2eDir, s.cache)
	if err != nil {
		return err
	}
	s.kubeBin = dir
	s.timing("build: Kubernetes components", time.Since(t), map[bool]string{true: "built", false: "reused " + dir}[built])

	s.n, err = newNode()
	if err != nil {
		return err
	}
	s.logf("run %s: work directory %s", s.n.id, s.n.work)
	t = time.Now()
	if err := buildHelpers(s.ctx, s.e2eDir, s.n.path("bin")); err != nil {
		return err
	}
	archives, err := buildImages(s.ctx, s.repo, s.n.path("bin"), s.n.path("images"), strconv.Itoa(os.Getpid()))
	if err != nil {
		return err
	}
	s.timing("build: images", time.Since(t), "make image BASE_IMAGE=scratch; pause, client, original FROM scratch")

	if err := s.startNode(archives); err != nil {
		return err
	}
	if s.docs, err = s.newDocShell(); err != nil {
		return err
	}
	if err := s.dryRun(); err != nil {
		return err
	}
	// The check before the switch, on a node as the Kubernetes addon
	// leaves it (docs/upgrade.md "Before the switch").
	if err := s.preSwitchCheck(); err != nil {
		return err
	}
	// The cluster as an operator of the original agent has it, then the
	// README's upgrade (which installs this agent: README "Install").
	if err := s.originalAgent(); err != nil {
		return err
	}
	if err := s.upgrade(); err != nil {
		return err
	}
	if err := s.defaultConfig(); err != nil {
		return err
	}
	if err := s.configChange(); err != nil {
		return err
	}
	// Issue 33's source keys on the node, with packets.
	if err := s.sourceSelection(); err != nil {
		return err
	}
	// README's Verify, Configure and Troubleshoot, and docs/runbook.md, as
	// printed, on the agent's pod on the node.
	if err := s.docCommandsOnNode(); err != nil {
		return err
	}
	if err := s.rollingUpdate(); err != nil {
		return err
	}
	// docs/upgrade.md's roll back to the original, then the upgrade again.
	if err := s.rollback(); err != nil {
		return err
	}
	if err := s.uninstall(); err != nil {
		return err
	}
	s.docs.coverage()
	return nil
}

// startNode brings up the network, the mounts, the control plane,
// containerd and the kubelet, and waits for the node to be Ready.
func (s *suite) startNode(archives map[string]string) error {
	n := s.n
	t0 := time.Now()
	if err := n.setupNetwork(s.ctx); err != nil {
		return err
	}
	if err := n.setupMounts(s.ctx); err != nil {
		return err
	}
	cgroupRoot, err := n.setupCgroups()
	if err != nil {
		return err
	}
	s.echo, err = startEcho(n.extNS, echoPort)
	if err != nil {
		return err
	}
	p, err := newPKI(n.path("pki"))
	if err != nil {
		return err
	}
	server := "https://" + nodeIP + ":6443"
	steps := []error{
		p.issue("apiserver", "kube-apiserver", nil, ipList(nodeIP, "127.0.0.1", "10.96.0.1"),
			[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}),
		p.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, nil, nil),
		p.issue("admin", "e2e-admin", []string{"system:masters"}, nil, nil),
		p.issue("kubelet", "system:node:"+nodeName, []string{"system:nodes"}, nil, nil),
		p.issue("controller-manager", "system:kube-controller-manager", nil, nil, nil),
		p.issue("scheduler", "system:kube-scheduler", nil, nil, nil),
	}
	if err := errors.Join(steps...); err != nil {
		return err
	}
	kc := map[string]string{}
	for _, name := range []string{"admin", "kubelet", "controller-manager", "scheduler"} {
		if kc[name], err = p.kubeconfig(name, server); err != nil {
			return err
		}
	}
	s.admin = kc["admin"]
	bin := func(b string) string { return filepath.Join(s.kubeBin, b) }
	for _, d := range []string{"etcd", "kubectl-cache"} {
		if err := os.MkdirAll(n.path(d), 0o700); err != nil {
			return err
		}
	}
	files := map[string]string{
		"containerd/config.toml": containerdConfig(n.path("cni"), pauseImage),
		"cni/10-e2e.conflist":    cniConfig(),
		"kubelet/config.yaml":    kubeletConfig(p.path("ca.crt"), cgroupRoot),
		"manifests/client.yaml":  clientPod(),
		"manifests/changed.yaml": changedConfigMap(),
	}
	for name, text := range files {
		if err := os.MkdirAll(filepath.Dir(n.path(name)), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(n.path(name), []byte(text), 0o644); err != nil {
			return err
		}
	}

	// etcd, on the node's loopback.
	t := time.Now()
	if _, err := n.start("etcd", nil, bin("etcd"), "--name=e2e", "--data-dir="+n.path("etcd", "data"),
		"--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://127.0.0.1:2379",
		"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=e2e=http://127.0.0.1:2380", "--unsafe-no-fsync", "--log-level=warn"); err != nil {
		return err
	}
	if err := s.waitHTTP("etcd", "http://127.0.0.1:2379/health", `"health":"true"`, 60*time.Second); err != nil {
		return err
	}
	s.timing("start-up: etcd healthy", time.Since(t), "")

	t = time.Now()
	if _, err := n.start("kube-apiserver", nil, bin("kube-apiserver"),
		"--etcd-servers=http://127.0.0.1:2379",
		"--advertise-address="+nodeIP, "--bind-address=0.0.0.0", "--secure-port=6443",
		"--tls-cert-file="+p.path("apiserver.crt"), "--tls-private-key-file="+p.path("apiserver.key"),
		"--client-ca-file="+p.path("ca.crt"),
		"--kubelet-client-certificate="+p.path("apiserver-kubelet-client.crt"),
		"--kubelet-client-key="+p.path("apiserver-kubelet-client.key"),
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+p.path("sa.pub"), "--service-account-signing-key-file="+p.path("sa.key"),
		"--service-cluster-ip-range="+serviceNet,
		"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true", "--profiling=false", "--cert-dir="+n.path("pki", "apiserver-certs")); err != nil {
		return err
	}
	if err := waitFor(s.ctx, "kube-apiserver /readyz", 120*time.Second, 250*time.Millisecond, func() (bool, string, error) {
		if err := s.componentAlive("kube-apiserver"); err != nil {
			return false, "", err
		}
		out, err := s.kubectl(10*time.Second, "get", "--raw=/readyz")
		return out == "ok", out, err
	}); err != nil {
		return err
	}
	s.timing("start-up: kube-apiserver ready", time.Since(t), "")

	if _, err := n.start("kube-controller-manager", nil, bin("kube-controller-manager"),
		"--kubeconfig="+kc["controller-manager"], "--leader-elect=false", "--bind-address=127.0.0.1",
		"--service-account-private-key-file="+p.path("sa.key"), "--root-ca-file="+p.path("ca.crt"),
		// Each controller with its own service account, as kubeadm runs it:
		// the controller-manager's own identity has only the rights to do that.
		"--use-service-account-credentials=true", "--cert-dir="+n.path("pki", "cm-certs"),
		// Its default, /usr/libexec/kubernetes/..., would be created on the machine.
		"--flex-volume-plugin-dir=/var/lib/kube-controller-manager/volume-plugins"); err != nil {
		return err
	}
	if _, err := n.start("kube-scheduler", nil, bin("kube-scheduler"),
		"--kubeconfig="+kc["scheduler"], "--leader-elect=false", "--bind-address=127.0.0.1",
		"--cert-dir="+n.path("pki", "scheduler-certs")); err != nil {
		return err
	}

	// containerd, and the images.
	t = time.Now()
	if _, err := n.start("containerd", nil, "containerd", "--config="+n.path("containerd", "config.toml")); err != nil {
		return err
	}
	ctr := []string{"ctr", "--address=/run/containerd/containerd.sock", "--namespace=k8s.io"}
	if err := waitFor(s.ctx, "containerd", 60*time.Second, 100*time.Millisecond, func() (bool, string, error) {
		if err := s.componentAlive("containerd"); err != nil {
			return false, "", err
		}
		out, err := n.exec(s.ctx, 10*time.Second, append(ctr, "version")...)
		return err == nil, out, err
	}); err != nil {
		return err
	}
	for _, name := range []string{"pause", "client", "agent", "original"} {
		if _, err := n.exec(s.ctx, 2*time.Minute, append(ctr, "images", "import", archives[name])...); err != nil {
			return err
		}
	}
	if _, err := n.exec(s.ctx, time.Minute, append(ctr, "images", "tag", agentImage+":"+agentTag, agentImage+":"+agentTag2)...); err != nil {
		return err
	}
	imgs, err := n.exec(s.ctx, time.Minute, append(ctr, "images", "ls", "-q")...)
	if err != nil {
		return err
	}
	for _, want := range []string{pauseImage, clientImage, originalImage, agentImage + ":" + agentTag, agentImage + ":" + agentTag2} {
		if !slices.Contains(strings.Fields(imgs), want) {
			return fmt.Errorf("image %s not in containerd after import: %s", want, imgs)
		}
	}
	s.timing("start-up: containerd, images imported", time.Since(t), "")

	// The kubelet.
	t = time.Now()
	if _, err := n.start("kubelet", nil, bin("kubelet"), "--config="+n.path("kubelet", "config.yaml"),
		"--kubeconfig="+kc["kubelet"], "--hostname-override="+nodeName, "--node-ip="+nodeIP, "--v=2"); err != nil {
		return err
	}
	if err := waitFor(s.ctx, "node "+nodeName+" Ready", 120*time.Second, 250*time.Millisecond, func() (bool, string, error) {
		for _, c := range []string{"kubelet", "containerd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
			if err := s.componentAlive(c); err != nil {
				return false, "", err
			}
		}
		out, err := s.kubectl(10*time.Second, "get", "node", nodeName, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		return out == "True", out, err
	}); err != nil {
		return err
	}
	s.timing("start-up: node Ready", time.Since(t), "after kubelet start")
	// The service account controller creates "default" in each namespace;
	// pods cannot be created before.
	if err := waitFor(s.ctx, "service account default/default", 60*time.Second, 250*time.Millisecond, func() (bool, string, error) {
		out, err := s.kubectl(10*time.Second, "-n", "default", "get", "serviceaccount", "default", "-o", "name")
		return err == nil && out != "", out, nil
	}); err != nil {
		return err
	}
	version, _ := s.kubectl(10*time.Second, "get", "node", nodeName, "-o", "jsonpath={.status.nodeInfo.kubeletVersion} {.status.nodeInfo.containerRuntimeVersion}")
	s.timing("start-up: total", time.Since(t0), "node "+version)
	s.logf("node %s Ready (%s)", nodeName, version)
	return nil
}

func ipList(ips ...string) []net.IP {
	var out []net.IP
	for _, ip := range ips {
		out = append(out, net.ParseIP(ip))
	}
	return out
}

// componentAlive returns an error if the named component has exited.
func (s *suite) componentAlive(name string) error {
	for _, p := range s.n.procs {
		if p.name == name {
			if ok, err := p.exited(); ok {
				return fmt.Errorf("%s exited: %v", name, err)
			}
		}
	}
	return nil
}

// waitHTTP waits until url, fetched from inside the node, answers 200 with
// a body containing want.
func (s *suite) waitHTTP(what, url, want string, timeout time.Duration) error {
	client := nodeHTTPClient(s.n.nodeNS)
	return waitFor(s.ctx, what, timeout, 100*time.Millisecond, func() (bool, string, error) {
		if err := s.componentAlive(what); err != nil {
			return false, "", err
		}
		body, code, err := httpGet(s.ctx, client, url)
		return err == nil && code == 200 && strings.Contains(body, want), fmt.Sprintf("%d %s", code, body), err
	})
}

func (s *suite) dryRun() error {
	// Server-side dry-run rejects what client-side validation lets through
	// (e.g. maxUnavailable: 0 with maxSurge: 0).
	for _, target := range [][]string{
		{"-f", filepath.Join(s.repo, "deploy", "examples", "configmap.yaml")},
		{"-f", filepath.Join(s.repo, "deploy", "daemonset.yaml")},
		{"-k", filepath.Join(s.repo, "deploy")},
		{"-k", filepath.Join(s.e2eDir, "overlay")},
		{"-k", filepath.Join(s.repo, "deploy", "examples")},
		{"-k", filepath.Join(s.repo, "deploy", "uninstall")},
		{"-k", filepath.Join(s.e2eDir, "uninstall")},
	} {
		out, err := s.kubectlAll(time.Minute, append([]string{"apply", "--dry-run=server"}, target...)...)
		s.assert(err == nil, "kubectl apply --dry-run=server %s %s: %s", target[0], s.rel(target[1]), oneLine(out, err))
	}
	if s.failed > 0 {
		return errors.New("the manifests do not pass a server-side dry-run")
	}
	return nil
}

func (s *suite) rel(p string) string {
	if r, err := filepath.Rel(s.repo, p); err == nil {
		return r
	}
	return p
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + " ..."
	}
	return s
}

func lastLine(out string, err error) string {
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[len(lines)-1]
}

func oneLine(out string, err error) string {
	if err != nil {
		return err.Error()
	}
	return strings.ReplaceAll(strings.TrimSpace(out), "\n", "; ")
}

const agentSelector = "k8s-app=ip-masq-agent-nft"

// agentPods returns the agent's pods: name, Ready status, image, deletion
// timestamp, one line each.
func (s *suite) agentPods() ([]string, error) {
	out, err := s.kubectl(15*time.Second, "-n", "kube-system", "get", "pods", "-l", agentSelector, "-o",
		`jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].status} {.spec.containers[0].image} {.metadata.deletionTimestamp}{"\n"}{end}`)
	if err != nil {
		return nil, err
	}
	var pods []string
	for _, l := range strings.Split(out, "\n") {
		if strings.TrimSpace(l) != "" {
			pods = append(pods, strings.TrimSpace(l))
		}
	}
	return pods, nil
}

// install installs this agent with the manifest that README "Install"
// makes (make manifests for the image, here the local one; the image,
// present in containerd, is not pulled with the default imagePullPolicy
// IfNotPresent). The first time as the README's Upgrade, step 2, says
// (kubectl apply -f bin/manifests/install.yaml, rollout status, after
// Install's make manifests); with readmeInstall as its Install says.
func (s *suite) install(readmeInstall bool) error {
	t := time.Now()
	section, apply := "Install", exit0()
	if readmeInstall {
		s.logf("install: as README \"Install\" says (make manifests, kubectl apply -f bin/manifests/install.yaml, rollout status), with the local image")
	} else {
		s.logf("step 2 = install: as the README's Upgrade says (make manifests as in Install, kubectl apply -f bin/manifests/install.yaml, rollout status; no node label), with the local image")
		section, apply = "Upgrade", exit0("daemonset.apps/ip-masq-agent-nft")
	}
	c, err := s.docs.find("README.md", "Install", "make manifests")
	if err != nil {
		return err
	}
	if r := s.docs.runChecked(c, exit0("bin/manifests/install.yaml"), "README Install: the manifests for the image"); r.err != nil || r.code != 0 {
		return errors.New("the README's make manifests failed")
	}
	if c, err = s.docs.find("README.md", section, "apply -f bin/manifests/install.yaml"); err != nil {
		return err
	}
	if r := s.docs.runChecked(c, apply, "README "+section); r.err != nil || r.code != 0 {
		return errors.New("the README's kubectl apply failed")
	}
	rollout, err := s.docs.find("README.md", section, "rollout status daemonset/ip-masq-agent-nft")
	if err != nil {
		return err
	}
	var ready string
	err = waitFor(s.ctx, "the agent pod Ready", 120*time.Second, 100*time.Millisecond, func() (bool, string, error) {
		pods, err := s.agentPods()
		if err != nil {
			return false, "", err
		}
		if len(pods) == 1 && strings.Fields(pods[0])[1] == "True" {
			ready = pods[0]
			return true, "", nil
		}
		return false, strings.Join(pods, "; "), nil
	})
	if !s.assert(err == nil, "the agent pod becomes Ready (its readiness probe passes): %s", oneLine(ready, err)) {
		return errors.New("the agent pod did not become Ready")
	}
	s.timing("install: agent pod Ready", time.Since(t), "after make manifests, kubectl apply -f")
	if r := s.docs.runChecked(rollout, exit0("successfully rolled out"), "the agent rolled out"); r.code != 0 || r.err != nil {
		return errors.New("rollout status failed")
	}
	s.timing("install: rollout status done", time.Since(t), "(minReadySeconds: 5)")
	return s.checkAgentProcess("IfNotPresent")
}

// checkAgentProcess finds the agent's process in the node namespace and
// checks, from the kernel's view, what the DaemonSet asks for.
func (s *suite) checkAgentProcess(pullPolicy string) error {
	pids := s.agentPIDs()
	if !s.assert(len(pids) == 1, "one ip-masq-agent process runs in the node network namespace (hostNetwork): %v", pids) {
		return errors.New("agent process not found")
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pids[0]))
	if err != nil {
		return err
	}
	field := func(name string) string {
		for _, l := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(l, name+":"); ok {
				return strings.TrimSpace(v)
			}
		}
		return "?"
	}
	const netAdmin = "0000000000001000" // 1 << CAP_NET_ADMIN (12)
	s.assert(field("CapEff") == netAdmin && field("CapPrm") == netAdmin && field("CapBnd") == netAdmin && field("CapAmb") == "0000000000000000",
		"the agent's capabilities are NET_ADMIN only: CapEff %s CapPrm %s CapBnd %s CapAmb %s", field("CapEff"), field("CapPrm"), field("CapBnd"), field("CapAmb"))
	s.assert(field("NoNewPrivs") == "1" && field("Seccomp") == "2",
		"no privilege escalation and a seccomp filter (RuntimeDefault): NoNewPrivs %s Seccomp %s", field("NoNewPrivs"), field("Seccomp"))
	mi, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pids[0]))
	if err != nil {
		return err
	}
	rootOpts := "?"
	for _, l := range strings.Split(string(mi), "\n") {
		f := strings.Fields(l)
		if len(f) > 5 && f[4] == "/" {
			rootOpts = f[5]
		}
	}
	s.assert(slices.Contains(strings.Split(rootOpts, ","), "ro"), "the agent's root filesystem is read-only: mount options %s", rootOpts)
	out, err := s.kubectl(15*time.Second, "-n", "kube-system", "get", "daemonset", "ip-masq-agent-nft", "-o",
		"jsonpath={.spec.template.spec.hostNetwork} {.spec.template.spec.containers[0].securityContext.privileged} {.spec.template.spec.containers[0].imagePullPolicy}")
	s.assert(err == nil && out == "true false "+pullPolicy, "DaemonSet: hostNetwork true, privileged false, imagePullPolicy %s: %s", pullPolicy, oneLine(out, err))
	return nil
}

// agentPIDs lists the ip-masq-agent processes in the node network namespace.
func (s *suite) agentPIDs() []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, _ := os.ReadFile("/proc/" + e.Name() + "/comm")
		if strings.TrimSpace(string(comm)) == "ip-masq-agent" && sameNS("/proc/"+e.Name()+"/ns/net", s.n.nodeNS) {
			pids = append(pids, pid)
		}
	}
	sort.Ints(pids)
	return pids
}

func clientPod() string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: e2e-client
  namespace: default
spec:
  nodeName: %s
  automountServiceAccountToken: false
  enableServiceLinks: false
  terminationGracePeriodSeconds: 1
  tolerations:
    - operator: Exists
  containers:
    - name: client
      image: %s
      imagePullPolicy: Never
      args: ["wait"]
`, nodeName, clientImage)
}

// changedConfigMap flips both decisions of the example config: 203.0.113.0/24
// is no longer masqueraded, 10.250.0.10 (no longer in a non-masquerade
// range) is.
func changedConfigMap() string {
	return `apiVersion: v1
kind: ConfigMap
metadata:
  name: ip-masq-agent
  namespace: kube-system
  labels:
    app.kubernetes.io/name: ip-masq-agent
data:
  config: |
    nonMasqueradeCIDRs:
      - 203.0.113.0/24
    resyncInterval: 60s
`
}

func (s *suite) startClient() error {
	if _, err := s.kubectlAll(time.Minute, "apply", "-f", s.n.path("manifests", "client.yaml")); err != nil {
		return err
	}
	if err := waitFor(s.ctx, "the client pod Ready", 120*time.Second, 200*time.Millisecond, func() (bool, string, error) {
		out, err := s.kubectl(15*time.Second, "-n", "default", "get", "pod", "e2e-client", "-o",
			`jsonpath={.status.conditions[?(@.type=="Ready")].status} {.status.podIP} {.spec.hostNetwork}`)
		f := strings.Fields(out)
		if err == nil && len(f) >= 2 && f[0] == "True" {
			s.podIP = f[1]
			return true, out, nil
		}
		return false, out, err
	}); err != nil {
		return err
	}
	s.logf("client pod e2e-client Ready at %s (bridge network, not hostNetwork)", s.podIP)
	return nil
}

// probe makes one new connection from the client pod to each destination and
// returns the source address each saw.
func (s *suite) probe(dsts ...string) (map[string]string, error) {
	args := []string{"-n", "default", "exec", "e2e-client", "--", "/client", "probe"}
	for _, d := range dsts {
		args = append(args, fmt.Sprintf("%s:%d", d, echoPort))
	}
	out, err := s.kubectl(time.Minute, args...)
	seen := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) == 3 && strings.HasPrefix(f[2], "seen=") {
			seen[strings.Split(f[0], ":")[0]] = strings.TrimPrefix(f[2], "seen=")
		}
	}
	if err != nil {
		return seen, fmt.Errorf("%w: %s", err, out)
	}
	return seen, nil
}

// expect probes the destinations and asserts whether each is masqueraded.
func (s *suite) expect(phase string, masq map[string]bool) {
	var dsts []string
	for d := range masq {
		dsts = append(dsts, d)
	}
	sort.Strings(dsts)
	seen, err := s.probe(dsts...)
	if err != nil {
		s.assert(false, "%s: connections from the client pod: %v", phase, err)
		return
	}
	for _, d := range dsts {
		want, what := s.podIP, "not masqueraded: the pod's address"
		if masq[d] {
			want, what = nodeIP, "masqueraded to the node's address"
		}
		s.assert(seen[d] == want, "%s: %-13s saw %-12s want %s (%s)", phase, d, seen[d], want, what)
	}
}

func (s *suite) defaultConfig() error {
	s.logf("kubectl apply -k deploy/examples/ (nonMasqueradeCIDRs: [10.0.0.0/8]), replacing the operator's ConfigMap as README \"Install\" warns")
	t := time.Now()
	out, err := s.kubectlAll(time.Minute, "apply", "-k", filepath.Join(s.repo, "deploy", "examples"))
	if err != nil {
		return err
	}
	s.logf("  %s", oneLine(out, nil))
	var now string
	err = waitFor(s.ctx, "the example config in the kernel", 150*time.Second, 100*time.Millisecond, func() (bool, string, error) {
		set, err := s.nonmasqSet()
		now = set
		return err == nil && strings.Contains(set, "10.0.0.0/8") && !strings.Contains(set, "198.51.100.0/24"), set, err
	})
	if !s.assert(err == nil, "the example ConfigMap reaches the kernel: nonmasq-v4 { %s } after %s", now, since(t)) {
		return errors.New("the example config did not reach the kernel")
	}
	s.expect("installed config", map[string]bool{internetDst: true, partnerDst: true, privateDst: false})
	return nil
}

// nonmasqSet returns the elements of the agent's nonmasq-v4 set in the node.
func (s *suite) nonmasqSet() (string, error) {
	out, err := s.nodeNft("list", "set", "inet", "ip-masq-agent", "nonmasq-v4")
	if err != nil {
		return "", err
	}
	i := strings.Index(out, "elements = {")
	if i < 0 {
		return "", nil
	}
	j := strings.Index(out[i:], "}")
	return strings.Join(strings.Fields(out[i+len("elements = {"):i+j]), " "), nil
}

func (s *suite) configChange() error {
	before, err := s.nonmasqSet()
	if err != nil {
		return err
	}
	s.logf("config change: kubectl apply of a ConfigMap with nonMasqueradeCIDRs: [203.0.113.0/24] (nonmasq-v4 now: %s)", before)
	t := time.Now()
	out, err := s.kubectlAll(time.Minute, "apply", "-f", s.n.path("manifests", "changed.yaml"))
	if err != nil {
		return err
	}
	applied := time.Since(t)
	s.logf("  %s", oneLine(out, nil))
	var now string
	err = waitFor(s.ctx, "the new config in the kernel", 150*time.Second, 100*time.Millisecond, func() (bool, string, error) {
		set, err := s.nonmasqSet()
		now = set
		return err == nil && strings.Contains(set, "203.0.113.0/24") && !strings.Contains(set, "10.0.0.0/8"), set, err
	})
	d := time.Since(t)
	if !s.assert(err == nil, "the changed ConfigMap reaches the kernel: nonmasq-v4 { %s } after %s (kubectl apply took %s)", now, d.Round(100*time.Millisecond), applied.Round(time.Millisecond)) {
		return errors.New("the config change did not reach the kernel")
	}
	s.timing("config change: apply -> kernel", d, "kubelet projection (syncFrequency 10s) + agent reload")
	s.expect("changed config", map[string]bool{internetDst: false, partnerDst: true, privateDst: true})
	return nil
}

func (s *suite) rollingUpdate() error {
	oldPIDs := s.agentPIDs()
	s.logf("rolling update: new image tag %s while the client pod opens a new connection every 20 ms (alternately to %s and %s)", agentTag2, internetDst, privateDst)
	// Expected under the changed config.
	fs, err := s.startFlows(map[string]string{internetDst: s.podIP, privateDst: nodeIP}, 270*time.Second)
	if err != nil {
		return err
	}
	// Watch throughout, every 100 ms: the table in the kernel, and the
	// window in which no agent process runs at all (the old pod gone, the new
	// one not started: maxSurge 0).
	var polls, missing atomic.Int64
	var gapStart, gapEnd time.Time
	var gapFlows0, gapFlows1 int64
	watchCtx, stopWatch := context.WithCancel(s.ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for watchCtx.Err() == nil {
			if _, err := run(watchCtx, 10*time.Second, "nsenter", "--net="+s.n.nodeNS, "--", "nft", "list", "table", "inet", "ip-masq-agent"); err != nil && watchCtx.Err() == nil {
				missing.Add(1)
			}
			polls.Add(1)
			running := len(s.agentPIDs()) > 0
			switch {
			case !running && gapStart.IsZero():
				gapStart, gapFlows0 = time.Now(), s.echo.total.Load()
			case running && !gapStart.IsZero() && gapEnd.IsZero():
				gapEnd, gapFlows1 = time.Now(), s.echo.total.Load()
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()

	t := time.Now()
	image := agentImage + ":" + agentTag2
	out, err := s.kubectlAll(time.Minute, "-n", "kube-system", "set", "image", "daemonset/ip-masq-agent-nft", "ip-masq-agent="+image)
	if err != nil {
		stopWatch()
		fs.cancel()
		return err
	}
	s.logf("  kubectl set image: %s", oneLine(out, nil))
	out, err = s.kubectlAll(4*time.Minute, "-n", "kube-system", "rollout", "status", "daemonset/ip-masq-agent-nft", "--timeout=180s")
	rollout := time.Since(t)
	s.assert(err == nil, "the rolling update completes: %s (%s)", lastLine(out, err), rollout.Round(100*time.Millisecond))
	// A little more of the stream with the new pod in charge, then stop it.
	r, err := fs.stop()
	stopWatch()
	wg.Wait()
	if err != nil {
		return err
	}
	sum := r.sum
	s.assert(sum.StoppedBy == "server", "the stream ran through the whole rollout (%d flows in %.1fs, stopped by %s)", sum.Flows, sum.Seconds, sum.StoppedBy)
	s.assert(sum.Flows >= 100, "a steady stream: %d new flows during the update (want >= 100)", sum.Flows)
	s.assert(r.wrong == 0 && r.serverWrong == 0, "no flow left with the wrong source during the rolling update: client saw %d wrong of %d, server saw %d wrong of %d", r.wrong, sum.Flows, r.serverWrong, r.serverFlows)
	s.assert(r.errs == 0, "no connection failed during the rolling update: %d errors", r.errs)
	s.assert(missing.Load() == 0, "table inet ip-masq-agent stayed in the kernel: present in %d of %d polls every 100 ms", polls.Load()-missing.Load(), polls.Load())
	gap := "no window without an agent process was seen"
	if !gapStart.IsZero() && !gapEnd.IsZero() {
		gap = fmt.Sprintf("no agent process ran for %s: %d new flows then", gapEnd.Sub(gapStart).Round(100*time.Millisecond), gapFlows1-gapFlows0)
	}
	s.logf("  %s", gap)
	pods, _ := s.agentPods()
	newPIDs := s.agentPIDs()
	s.assert(len(pods) == 1 && strings.Contains(pods[0], " True "+image) && len(newPIDs) == 1 && !slices.Equal(newPIDs, oldPIDs),
		"a new agent pod with %s is Ready (pods: %v; process %v -> %v)", image, pods, oldPIDs, newPIDs)
	s.timing("rolling update: rollout status", rollout, fmt.Sprintf("%d new flows during it, %d with the wrong source, %d failed; %s", sum.Flows, r.wrong, r.errs, gap))
	return nil
}

func (s *suite) uninstall() error {
	s.logf("uninstall, as the README says: delete the DaemonSet, apply -f bin/manifests/uninstall.yaml, rollout status, delete -f, delete the ConfigMap")
	c, err := s.docs.find("README.md", "Uninstall", "delete daemonset ip-masq-agent-nft")
	if err != nil {
		return err
	}
	if r := s.docs.runChecked(c, exit0("deleted"), "README Uninstall"); r.code != 0 || r.err != nil {
		return errors.New("cannot delete the DaemonSet")
	}
	err = waitFor(s.ctx, "the agent pod gone", 90*time.Second, 200*time.Millisecond, func() (bool, string, error) {
		pods, err := s.agentPods()
		return err == nil && len(pods) == 0 && len(s.agentPIDs()) == 0, strings.Join(pods, "; "), err
	})
	s.assert(err == nil, "the DaemonSet's pod and process are gone: %v", err)
	_, err = s.nodeNft("list", "table", "inet", "ip-masq-agent")
	s.assert(err == nil, "deleting the DaemonSet leaves table inet ip-masq-agent in the kernel (documented): %v", err)
	s.expect("DaemonSet deleted, rules left", map[string]bool{internetDst: false, privateDst: true})

	// A node that still holds the original's rules too (as one does whose
	// old agent stopped less than 2 x resyncInterval + 5 s before): written
	// once now by the original's stand-in, with the machine's iptables-nft.
	if _, err := run(s.ctx, time.Minute, "nsenter", "--net="+s.n.nodeNS, "--", s.n.path("bin", "original"), "-once", "-masq-chain="+originalChain, "-config="+s.n.path("operator", "config")); err != nil {
		return err
	}
	h, jump := s.originalState(s.ctx)
	s.assert(h != "" && jump, "before the uninstall the node also holds the original's chain %s (rules %s) and its jump: %v", originalChain, h, jump)

	t := time.Now()
	if c, err = s.docs.find("README.md", "Uninstall", "apply -f bin/manifests/uninstall.yaml"); err != nil {
		return err
	}
	s.docs.runChecked(c, exit0("daemonset.apps/ip-masq-agent-nft-uninstall"), "README Uninstall (e2e/uninstall: the local images)")
	if c, err = s.docs.find("README.md", "Uninstall", "rollout status daemonset/ip-masq-agent-nft-uninstall"); err != nil {
		return err
	}
	s.docs.runChecked(c, exit0("successfully rolled out"), "README Uninstall: every node clean")
	s.timing("uninstall: deploy/uninstall rollout done", time.Since(t), "both cleanups ran on the node")
	_, err = s.nodeNft("list", "table", "inet", "ip-masq-agent")
	s.assert(err != nil, "the documented uninstall removes table inet ip-masq-agent (nft list table fails: %v)", err != nil)
	h, jump = s.originalState(s.ctx)
	s.assert(h == "" && !jump, "the documented uninstall removes the original's chain %s and its jump (chain rules %q, jump %v)", originalChain, h, jump)
	logs, _ := s.kubectlAll(30*time.Second, "-n", "kube-system", "logs", "ds/ip-masq-agent-nft-uninstall", "--all-containers", "--prefix")
	s.logf("  the uninstall pod's log: %s", clip(oneLine(logs, nil), 600))
	if c, err = s.docs.find("README.md", "Uninstall", "delete -f bin/manifests/uninstall.yaml"); err != nil {
		return err
	}
	s.docs.runChecked(c, exit0("deleted"), "README Uninstall")
	if c, err = s.docs.find("docs/upgrade.md", "Uninstall", "delete configmap ip-masq-agent"); err != nil {
		return err
	}
	s.docs.runChecked(c, exit0(`configmap "ip-masq-agent" deleted`), "docs/upgrade.md Uninstall")
	s.expect("uninstalled", map[string]bool{internetDst: false, privateDst: false})
	return nil
}

// diagnose prints what explains a failure: the cluster's state, the agent's
// logs, the node's ruleset and the component logs.
func (s *suite) diagnose() {
	fmt.Println("\n===== diagnostics =====")
	if s.admin != "" && s.kubeBin != "" {
		for _, args := range [][]string{
			{"get", "nodes", "-o", "wide"},
			{"get", "pods", "-A", "-o", "wide"},
			{"get", "daemonsets", "-A"},
			{"get", "events", "-A", "--sort-by=.lastTimestamp"},
			{"-n", "kube-system", "describe", "pods", "-l", agentSelector},
			{"-n", "kube-system", "logs", "-l", agentSelector, "--tail=100", "--prefix"},
		} {
			out, err := s.kubectlAll(30*time.Second, args...)
			fmt.Printf("--- kubectl %s\n%s\n", strings.Join(args, " "), tailString(out, 80))
			if err != nil {
				fmt.Println("   ", err)
			}
		}
	}
	if s.n.nodeNS != "" {
		out, err := s.nodeNft("list", "ruleset")
		fmt.Printf("--- nft list ruleset (node namespace)\n%s %v\n", out, err)
	}
	// The containers' logs as the kubelet keeps them (the agent's too, after
	// its pod is gone).
	logs, _ := filepath.Glob(s.n.path("var-log", "pods", "*", "*", "*.log"))
	for _, l := range logs {
		fmt.Printf("--- container log %s\n%s\n", strings.TrimPrefix(l, s.n.path("var-log")+"/"), tail(l, 40))
	}
	for _, p := range s.n.procs {
		state := "running"
		if ok, err := p.exited(); ok {
			state = fmt.Sprintf("exited: %v", err)
		}
		fmt.Printf("--- %s (%s): last lines of its log\n%s\n", p.name, state, tail(p.log, 80))
	}
	fmt.Println("===== end of diagnostics =====")
}

func tailString(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (s *suite) printReport() {
	fmt.Println()
	fmt.Println("===== e2e-cluster report =====")
	fmt.Printf("Kubernetes %s, containerd, runc and the bridge CNI in a node network namespace; the agent from `make image BASE_IMAGE=scratch`\n", kubeVersion)
	for _, l := range s.timings {
		fmt.Println("  " + l)
	}
	fmt.Printf("  %-44s %8s\n", "whole run", time.Since(s.start).Round(100*time.Millisecond))
	if len(s.failures) > 0 {
		fmt.Println("failures:")
		for _, f := range s.failures {
			fmt.Println("  - " + f)
		}
	}
	fmt.Printf("e2e-cluster: %d passed, %d failed\n", s.passed, s.failed)
}
