package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The node's network: everything lives in two network namespaces this run
// creates, never in the machine's own.
//
//	node ns (Kubernetes, containerd, pods)        ext ns (dead end: the "external" host)
//	eth0 172.30.0.2/24  ---------- veth ---------- eth0 172.30.0.1/24
//	default via 172.30.0.1                         lo 203.0.113.10, 198.51.100.10, 10.250.0.10
//	cni0 10.244.0.1/24 (bridge CNI, pods)          10.244.0.0/24 via 172.30.0.2
const (
	nodeName   = "e2e-node"
	nodeIP     = "172.30.0.2"
	extIP      = "172.30.0.1"
	podCIDR    = "10.244.0.0/24"
	podGateway = "10.244.0.1"
	serviceNet = "10.96.0.0/24"
	echoPort   = 8080
	// Destinations in the external namespace.
	internetDst = "203.0.113.10"  // TEST-NET-3: "the internet"
	partnerDst  = "198.51.100.10" // TEST-NET-2
	privateDst  = "10.250.0.10"   // a non-masquerade range of the default config
)

// Global, non-namespaced sysctls the kubelet insists on (it would write
// them; with protectKernelDefaults it only checks them). Inside the private
// mount namespace read-only files with these values are bind-mounted over
// them, so the machine's own values are never written.
var kubeletSysctls = [][2]string{
	{"vm/overcommit_memory", "1"},
	{"vm/panic_on_oom", "0"},
	{"kernel/panic", "10"},
	{"kernel/panic_on_oops", "1"},
	{"kernel/keys/root_maxkeys", "1000000"},
	{"kernel/keys/root_maxbytes", "25000000"},
}

// Host paths the kubelet, containerd, kubectl or the apiserver write by
// default. The private mount namespace covers /run, /var/lib and /var/log with
// directories of this run, and every component is told to use those, so none
// should appear; any that appears anyway is removed and reported.
var watchedHostPaths = []string{
	"/var/lib/kubelet", "/var/lib/containerd", "/var/log/pods", "/var/log/containers",
	"/usr/libexec/kubernetes", "/run/containerd", "/var/run/kubernetes", "/opt/containerd",
	"/etc/kubernetes", "/etc/cni/net.d/10-e2e.conflist", "/root/.kube",
}

type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// node is one run's node: namespaces, mounts, processes and what to undo.
type node struct {
	id      string // unique: ipmae2e-<pid>
	work    string // the run's directory (removed at the end)
	nodeNS  string // /run/netns/<id>-node
	extNS   string // /run/netns/<id>-ext
	holder  *exec.Cmd
	procs   []*proc
	cgroups []string // cgroup directories this run created (one per hierarchy)
	before  map[string]bool
	netnses []string       // names created with ip netns add
	mntNS   syscall.Stat_t // the private mount namespace (its nsfs inode)
}

func newNode() (*node, error) {
	n := &node{id: fmt.Sprintf("ipmae2e-%d", os.Getpid()), before: map[string]bool{}}
	for _, p := range watchedHostPaths {
		n.before[p] = exists(p)
	}
	var err error
	n.work, err = os.MkdirTemp("", n.id+".")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(n.work, 0o755); err != nil {
		return nil, err
	}
	return n, nil
}

func (n *node) path(elem ...string) string {
	return filepath.Join(append([]string{n.work}, elem...)...)
}

// run runs a command on the machine (its own namespaces), bounded by
// timeout, and returns its standard output; the error carries both outputs.
func run(ctx context.Context, timeout time.Duration, name string, args ...string) (string, error) {
	stdout, _, err := runEnv(ctx, timeout, nil, append([]string{name}, args...))
	return stdout, err
}

// runEnv runs argv with env (nil: this process's) and returns both outputs.
func runEnv(ctx context.Context, timeout time.Duration, env []string, argv []string) (string, string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = env
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", err, ctx.Err())
		}
		err = fmt.Errorf("%s: %w: %s", display(argv), err,
			strings.TrimSpace(stderr.String()+"\n"+stdout.String()))
	}
	return stdout.String(), stderr.String(), err
}

// display shortens a command line for messages: without the nsenter
// prefix, kubectl's path and its connection flags.
func display(argv []string) string {
	if len(argv) > 0 && argv[0] == "nsenter" {
		for i, a := range argv {
			if a == "--" {
				argv = argv[i+1:]
				break
			}
		}
	}
	var out []string
	for i, a := range argv {
		switch {
		case i == 0:
			out = append(out, filepath.Base(a))
		case strings.HasPrefix(a, "--kubeconfig=") || strings.HasPrefix(a, "--cache-dir="):
		default:
			out = append(out, a)
		}
	}
	return strings.Join(out, " ")
}

// inNode returns the argument list that runs argv inside the node: its
// network namespace and its private mount namespace.
func (n *node) inNode(argv ...string) []string {
	pid := strconv.Itoa(n.holder.Process.Pid)
	return append([]string{"nsenter", "--target", pid, "--net", "--mount", "--"}, argv...)
}

// exec runs argv inside the node, bounded by timeout, and returns its
// standard output.
func (n *node) exec(ctx context.Context, timeout time.Duration, argv ...string) (string, error) {
	stdout, _, err := runEnv(ctx, timeout, baseEnv(n), n.inNode(argv...))
	return stdout, err
}

// setupNetwork creates the node and ext namespaces and links them. Every
// link is created inside those namespaces (ip -n), never in the machine's.
func (n *node) setupNetwork(ctx context.Context) error {
	for _, ns := range []string{n.id + "-node", n.id + "-ext"} {
		if _, err := run(ctx, 30*time.Second, "ip", "netns", "add", ns); err != nil {
			return err
		}
		n.netnses = append(n.netnses, ns)
	}
	n.nodeNS, n.extNS = "/run/netns/"+n.id+"-node", "/run/netns/"+n.id+"-ext"
	nodeN, extN := n.id+"-node", n.id+"-ext"
	steps := [][]string{
		{"-n", nodeN, "link", "set", "lo", "up"},
		{"-n", extN, "link", "set", "lo", "up"},
		{"-n", nodeN, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", extN},
		{"-n", nodeN, "addr", "add", nodeIP + "/24", "dev", "eth0"},
		{"-n", nodeN, "link", "set", "eth0", "up"},
		{"-n", nodeN, "route", "add", "default", "via", extIP},
		{"-n", extN, "addr", "add", extIP + "/24", "dev", "eth0"},
		{"-n", extN, "link", "set", "eth0", "up"},
		{"-n", extN, "addr", "add", internetDst + "/32", "dev", "lo"},
		{"-n", extN, "addr", "add", partnerDst + "/32", "dev", "lo"},
		{"-n", extN, "addr", "add", privateDst + "/32", "dev", "lo"},
		// Replies to pod addresses that were not masqueraded.
		{"-n", extN, "route", "add", podCIDR, "via", nodeIP},
	}
	for _, s := range steps {
		if _, err := run(ctx, 30*time.Second, "ip", s...); err != nil {
			return err
		}
	}
	// Forwarding in the node namespace only (written from inside it).
	_, err := run(ctx, 30*time.Second, "nsenter", "--net="+n.nodeNS, "--", "sh", "-c",
		"echo 1 > /proc/sys/net/ipv4/ip_forward")
	return err
}

// setupMounts starts the holder process (in the node network namespace and
// a new private mount namespace) and prepares that mount namespace: a fresh
// sysfs (so /sys/class/net is the node's) with the cgroup mounts moved back
// onto it, /run as a tmpfs, /var/lib and /var/log covered by directories of
// this run, a node-local /etc/hosts, and read-only files over the global
// sysctls the kubelet checks.
func (n *node) setupMounts(ctx context.Context) error {
	for _, d := range []string{"var-lib", "var-log", "mnt/cgroup", "sysctl", "home", "logs"} {
		if err := os.MkdirAll(n.path(d), 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(n.path("hosts"), []byte("127.0.0.1 localhost\n"+nodeIP+" "+nodeName+"\n"), 0o644); err != nil {
		return err
	}
	script := []string{"set -eu",
		"mount --rbind /sys/fs/cgroup " + n.path("mnt/cgroup"),
		"mount -t sysfs -o nosuid,nodev,noexec sysfs /sys",
		"mount --move " + n.path("mnt/cgroup") + " /sys/fs/cgroup",
		"mount -t tmpfs -o mode=0755,size=512m tmpfs /run",
		"mount --bind " + n.path("var-lib") + " /var/lib",
		"mount --bind " + n.path("var-log") + " /var/log",
		"mount --bind -o ro " + n.path("hosts") + " /etc/hosts",
	}
	for _, s := range kubeletSysctls {
		f := n.path("sysctl", strings.ReplaceAll(s[0], "/", "."))
		if err := os.WriteFile(f, []byte(s[1]+"\n"), 0o444); err != nil {
			return err
		}
		script = append(script, "mount --bind -o ro "+f+" /proc/sys/"+s[0])
	}
	n.holder = exec.Command("nsenter", "--net="+n.nodeNS, "--",
		"unshare", "--mount", "--propagation", "private", "--", "sleep", "infinity")
	n.holder.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := n.holder.Start(); err != nil {
		return err
	}
	// nsenter and unshare exec without forking: the process becomes sleep
	// once both namespaces are entered.
	self, _ := os.Readlink("/proc/self/ns/mnt")
	if err := waitFor(ctx, "the namespace holder", 10*time.Second, 20*time.Millisecond, func() (bool, string, error) {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", n.holder.Process.Pid))
		mnt, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", n.holder.Process.Pid))
		return strings.TrimSpace(string(comm)) == "sleep" && mnt != self, "comm " + string(comm), nil
	}); err != nil {
		return err
	}
	if err := syscall.Stat(fmt.Sprintf("/proc/%d/ns/mnt", n.holder.Process.Pid), &n.mntNS); err != nil {
		return err
	}
	_, err := n.exec(ctx, 30*time.Second, "sh", "-c", strings.Join(script, "\n"))
	return err
}

// setupCgroups creates the kubelet's cgroup root, /<id>, in every cgroup
// hierarchy: everything the kubelet and runc create goes below it, and all of
// it is removed at the end. (One path for all hierarchies, so it cannot lie
// below this process's own cgroups, which differ between hierarchies.)
func (n *node) setupCgroups() (string, error) {
	for _, m := range cgroupMounts() {
		d := filepath.Join(m, n.id)
		if err := os.Mkdir(d, 0o755); err != nil {
			return "", err
		}
		n.cgroups = append(n.cgroups, d)
		// A v1 cpuset cgroup accepts no task before cpus and mems are set.
		if exists(filepath.Join(d, "cpuset.cpus")) && !exists(filepath.Join(m, "cgroup.controllers")) {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := os.ReadFile(filepath.Join(m, f))
				if err != nil {
					return "", err
				}
				if err := os.WriteFile(filepath.Join(d, f), v, 0o644); err != nil {
					return "", fmt.Errorf("%s: %w", filepath.Join(d, f), err)
				}
			}
		}
	}
	return "/" + n.id, nil
}

// cgroupMounts lists the mount points of the cgroup hierarchies (v1 and v2).
func cgroupMounts() []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		for i, x := range fields {
			if x == "-" && i+1 < len(fields) && (fields[i+1] == "cgroup" || fields[i+1] == "cgroup2") {
				out = append(out, fields[4])
			}
		}
	}
	return out
}

// start starts a component inside the node, in its own process group, its
// output in logs/NAME.log.
func (n *node) start(name string, env []string, argv ...string) (*proc, error) {
	logPath := n.path("logs", name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	a := n.inNode(argv...)
	cmd := exec.Command(a[0], a[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(baseEnv(n), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, err
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	n.procs = append(n.procs, p)
	return p, nil
}

func baseEnv(n *node) []string {
	return []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + n.path("home")}
}

// exited reports whether p has exited, with its error.
func (p *proc) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// stop sends SIGTERM to p's process group and SIGKILL after grace.
func (p *proc) stop(grace time.Duration) {
	if ok, _ := p.exited(); ok {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
		}
	}
}

// ours lists the processes that belong to this run: in its node or ext
// network namespace, in its private mount namespace, or in its cgroups.
func (n *node) ours() []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		base := "/proc/" + e.Name()
		match := false
		for _, ns := range []string{n.nodeNS, n.extNS} {
			if ns != "" && sameNS(base+"/ns/net", ns) {
				match = true
			}
		}
		if !match && n.mntNS.Ino != 0 {
			var st syscall.Stat_t
			if syscall.Stat(base+"/ns/mnt", &st) == nil && st.Ino == n.mntNS.Ino && st.Dev == n.mntNS.Dev {
				match = true
			}
		}
		if !match {
			if cg, err := os.ReadFile(base + "/cgroup"); err == nil {
				for _, l := range strings.Split(string(cg), "\n") {
					if strings.Contains(l+"/", "/"+n.id+"/") {
						match = true
					}
				}
			}
		}
		if match {
			pids = append(pids, pid)
		}
	}
	return pids
}

// cleanup stops everything this run started and removes everything it
// created. It returns what it could not undo.
func (n *node) cleanup() []string {
	var problems []string
	byName := map[string]*proc{}
	for _, p := range n.procs {
		byName[p.name] = p
	}
	// The kubelet first, so that nothing restarts; then the pods' processes
	// (in the run's cgroups); then containerd, the control plane and etcd.
	if p := byName["kubelet"]; p != nil {
		p.stop(10 * time.Second)
	}
	n.killCgroupProcs()
	for i := len(n.procs) - 1; i >= 0; i-- {
		n.procs[i].stop(10 * time.Second)
	}
	// Whatever is left in the run's namespaces or cgroups (containerd's
	// shims, containers, the holder).
	deadline := time.Now().Add(30 * time.Second)
	for {
		pids := n.ours()
		if n.holder != nil && n.holder.Process != nil {
			_ = syscall.Kill(-n.holder.Process.Pid, syscall.SIGKILL)
		}
		if len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			problems = append(problems, fmt.Sprintf("processes still running: %v", pids))
			break
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n.holder != nil && n.holder.Process != nil {
		_, _ = n.holder.Process.Wait()
	}
	// The private mount namespace is gone with its last process, and with it
	// every mount made inside it. The cgroups, leaves first.
	for _, root := range n.cgroups {
		if err := removeCgroupTree(root); err != nil {
			problems = append(problems, err.Error())
		}
	}
	for _, ns := range n.netnses {
		if _, err := run(context.Background(), 30*time.Second, "ip", "netns", "delete", ns); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if n.work != "" {
		if err := os.RemoveAll(n.work); err != nil {
			problems = append(problems, err.Error())
		}
	}
	for _, p := range watchedHostPaths {
		if !n.before[p] && exists(p) {
			err := os.RemoveAll(p)
			problems = append(problems, fmt.Sprintf("host path %s was created during the run (removed: %v)", p, err == nil))
		}
	}
	return problems
}

// killCgroupProcs kills every process in the run's cgroups.
func (n *node) killCgroupProcs() {
	for i := 0; i < 20; i++ {
		found := false
		for _, root := range n.cgroups {
			_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
				if err != nil || !d.IsDir() {
					return nil
				}
				b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
				for _, f := range strings.Fields(string(b)) {
					if pid, err := strconv.Atoi(f); err == nil {
						found = true
						_ = syscall.Kill(pid, syscall.SIGKILL)
					}
				}
				return nil
			})
		}
		if !found {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// removeCgroupTree removes a cgroup directory and its descendants, deepest
// first (cgroup directories are removed with rmdir, their files never).
func removeCgroupTree(root string) error {
	var dirs []string
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	var errs []error
	for _, d := range dirs {
		var err error
		for try := 0; try < 50; try++ {
			if err = syscall.Rmdir(d); err == nil || errors.Is(err, syscall.ENOENT) {
				err = nil
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("rmdir %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("[... %d earlier lines]", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}
