package test

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/kustomize"
)

// The manifests under deploy/, checked without a cluster: each decodes
// strictly into its k8s.io/api type, and holds what the issue and the
// agent require.

const deployDir = "../deploy"

// decodeStrict decodes one YAML object into out the way the API server's
// strict field validation does: duplicate fields, unknown fields and fields
// spelt with the wrong case (encoding/json would accept "hostnetwork") all
// fail.
func decodeStrict(data []byte, out any) error {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return err
	}
	strict, err := sigsjson.UnmarshalStrict(js, out)
	if err != nil {
		return err
	}
	if len(strict) > 0 {
		msgs := make([]string, len(strict))
		for i, e := range strict {
			msgs[i] = e.Error()
		}
		return fmt.Errorf("strict decoding: %s", strings.Join(msgs, "; "))
	}
	return nil
}

// readManifest decodes deploy/name into out and checks its apiVersion and kind.
func readManifest(t *testing.T, name string, out any, apiVersion, kind string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(deployDir, name))
	if err != nil {
		t.Fatal(err)
	}
	// One object per file: YAML decoding would silently drop the rest.
	content := false
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "---" && content {
			t.Fatalf("deploy/%s:%d: a second YAML document; keep one object per file", name, i+1)
		}
		content = content || line != "" && line != "---" && !strings.HasPrefix(line, "#")
	}
	if err := decodeStrict(data, out); err != nil {
		t.Fatalf("deploy/%s: %v", name, err)
	}
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(data, &tm); err != nil {
		t.Fatalf("deploy/%s: %v", name, err)
	}
	if tm.APIVersion != apiVersion || tm.Kind != kind {
		t.Fatalf("deploy/%s is %s %s, want %s %s", name, tm.APIVersion, tm.Kind, apiVersion, kind)
	}
}

// kustomization is the part of kustomize's Kustomization type that
// deploy/kustomization.yaml may use; anything else fails strict decoding.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
	Components []string `json:"components,omitempty"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
		Digest  string `json:"digest,omitempty"`
	} `json:"images,omitempty"`
}

// TestManifestsStrictDecodingCatchesTypos proves the decoder used below
// fails on what it must.
func TestManifestsStrictDecodingCatchesTypos(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown field":   "apiVersion: apps/v1\nkind: DaemonSet\nspec:\n  template:\n    spec:\n      hostNetwrok: true\n",
		"wrong case":      "apiVersion: apps/v1\nkind: DaemonSet\nspec:\n  template:\n    spec:\n      hostnetwork: true\n",
		"duplicate field": "apiVersion: apps/v1\nkind: DaemonSet\nkind: DaemonSet\n",
		"wrong type":      "apiVersion: apps/v1\nkind: DaemonSet\nspec:\n  minReadySeconds: soon\n",
		"bad quantity":    "apiVersion: apps/v1\nkind: DaemonSet\nspec:\n  template:\n    spec:\n      containers:\n      - name: a\n        resources:\n          limits:\n            memory: 64 megabytes\n",
	} {
		var ds appsv1.DaemonSet
		if err := decodeStrict([]byte(doc), &ds); err == nil {
			t.Errorf("%s: decoded without error:\n%s", name, doc)
		}
	}
	var ds appsv1.DaemonSet
	if err := decodeStrict([]byte("apiVersion: apps/v1\nkind: DaemonSet\nspec:\n  template:\n    spec:\n      hostNetwork: true\n"), &ds); err != nil || !ds.Spec.Template.Spec.HostNetwork {
		t.Errorf("a correct document: %v (hostNetwork %v)", err, ds.Spec.Template.Spec.HostNetwork)
	}
}

// TestManifestsKustomization: kubectl apply -k deploy/ installs every
// manifest in deploy/, and the image it pins is the DaemonSet's.
func TestManifestsKustomization(t *testing.T) {
	var k kustomization
	readManifest(t, "kustomization.yaml", &k, "kustomize.config.k8s.io/v1beta1", "Kustomization")
	entries, err := os.ReadDir(deployDir)
	if err != nil {
		t.Fatal(err)
	}
	var manifests []string
	for _, e := range entries {
		if n := e.Name(); (strings.HasSuffix(n, ".yaml") || strings.HasSuffix(n, ".yml")) && n != "kustomization.yaml" {
			manifests = append(manifests, n)
		}
	}
	got := slices.Sorted(slices.Values(k.Resources))
	if !slices.Equal(got, manifests) {
		t.Errorf("kustomization.yaml resources %v, want every manifest in deploy/: %v", got, manifests)
	}
	var ds appsv1.DaemonSet
	readManifest(t, "daemonset.yaml", &ds, "apps/v1", "DaemonSet")
	for _, img := range k.Images {
		found := false
		for _, c := range ds.Spec.Template.Spec.Containers {
			name, _, _ := strings.Cut(c.Image, "@")
			if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
				name = name[:i]
			}
			found = found || name == img.Name
		}
		if !found {
			t.Errorf("kustomization.yaml sets image %q, which no container of the DaemonSet uses", img.Name)
		}
	}
}

// TestManifestsDaemonSet checks the DaemonSet against the list and
// the agent: the ConfigMap contract, scheduling, probes, and the
// securityContext.
func TestManifestsDaemonSet(t *testing.T) {
	var ds appsv1.DaemonSet
	readManifest(t, "daemonset.yaml", &ds, "apps/v1", "DaemonSet")
	// Beside the iptables agent's DaemonSet (kube-system/ip-masq-agent, pods
	// labelled k8s-app=ip-masq-agent) during an upgrade: another name, and a
	// selector that does not take its pods.
	if ds.Namespace != "kube-system" || ds.Name != "ip-masq-agent-nft" {
		t.Errorf("DaemonSet is %s/%s, want kube-system/ip-masq-agent-nft", ds.Namespace, ds.Name)
	}

	// The selector selects the template (the API server refuses it otherwise).
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	switch {
	case err != nil:
		t.Errorf("selector: %v", err)
	case sel.Empty():
		t.Errorf("the selector is empty")
	case !sel.Matches(labels.Set(ds.Spec.Template.Labels)):
		t.Errorf("selector %s does not match the template's labels %v", sel, ds.Spec.Template.Labels)
	case sel.Matches(labels.Set{"k8s-app": "ip-masq-agent"}):
		t.Errorf("selector %s selects the iptables agent's pods too", sel)
	}

	// A rolling update without surge (old and new pod would share the host
	// port), one node at a time at most in flight.
	us := ds.Spec.UpdateStrategy
	if us.Type != appsv1.RollingUpdateDaemonSetStrategyType || us.RollingUpdate == nil {
		t.Errorf("updateStrategy %+v, want RollingUpdate", us)
	} else {
		mu, ms := us.RollingUpdate.MaxUnavailable, us.RollingUpdate.MaxSurge
		if mu == nil || mu.String() == "0" || mu.String() == "0%" {
			t.Errorf("maxUnavailable %v: must be positive (the API server refuses 0 with maxSurge 0)", mu)
		}
		if ms != nil && ms.String() != "0" && ms.String() != "0%" {
			t.Errorf("maxSurge %v: want 0, the new pod binds the old one's host port", ms)
		}
	}

	ps := ds.Spec.Template.Spec
	if !ps.HostNetwork {
		t.Error("hostNetwork must be true: the rules belong in the node's network namespace")
	}
	if ps.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName %q, want system-node-critical", ps.PriorityClassName)
	}
	// Every Linux node, as the original agent's manifest: a node added
	// later runs the agent without a label (the label-gated variant is the
	// component deploy/components/label-gated).
	if !maps.Equal(ps.NodeSelector, map[string]string{"kubernetes.io/os": "linux"}) {
		t.Errorf("nodeSelector %v, want only kubernetes.io/os: linux", ps.NodeSelector)
	}
	if ps.Affinity != nil {
		t.Errorf("affinity %+v: the agent runs on every Linux node", ps.Affinity)
	}
	if !slices.ContainsFunc(ps.Tolerations, func(tol corev1.Toleration) bool {
		return tol.Operator == corev1.TolerationOpExists && tol.Key == "" && tol.Effect == ""
	}) {
		t.Errorf("tolerations %+v: want one {operator: Exists} (every taint)", ps.Tolerations)
	}
	if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
		t.Error("automountServiceAccountToken must be false: the agent never talks to the API server")
	}
	if len(ps.Containers) != 1 || len(ps.InitContainers) != 0 {
		t.Fatalf("want exactly one container, have %d (and %d init containers)", len(ps.Containers), len(ps.InitContainers))
	}
	c := ps.Containers[0]
	if c.Image == "" {
		t.Error("the container has no image")
	}

	// The config: ConfigMap ip-masq-agent, key config, optional, mounted
	// read-only at /etc/config as ip-masq-agent.
	var vol *corev1.Volume
	for i := range ps.Volumes {
		if cm := ps.Volumes[i].ConfigMap; cm != nil && cm.Name == "ip-masq-agent" {
			vol = &ps.Volumes[i]
		}
	}
	switch {
	case vol == nil:
		t.Error("no volume from ConfigMap ip-masq-agent")
	default:
		cm := vol.ConfigMap
		if cm.Optional == nil || !*cm.Optional {
			t.Error("the ConfigMap volume must be optional: without it the agent applies its defaults")
		}
		if len(cm.Items) != 1 || cm.Items[0].Key != "config" || cm.Items[0].Path != "ip-masq-agent" {
			t.Errorf("ConfigMap items %+v, want key config as path ip-masq-agent", cm.Items)
		}
		if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.Name == vol.Name && m.MountPath == "/etc/config" && m.ReadOnly && m.SubPath == ""
		}) {
			t.Errorf("volume %q is not mounted read-only at /etc/config (without subPath, so that updates reach the pod): %+v", vol.Name, c.VolumeMounts)
		}
	}

	// The arguments: the agent accepts them (--version parses every flag and
	// exits), and they agree with the mount and the probes.
	args := c.Args
	if len(c.Command) > 0 {
		t.Errorf("command %v: the image's entrypoint is the agent; use args", c.Command)
	}
	out, err := exec.Command(agentBin, append(slices.Clone(args), "--version")...).CombinedOutput()
	if err != nil {
		first, _, _ := strings.Cut(string(out), "\n")
		t.Errorf("the agent refuses the DaemonSet's args %q: %v: %s", args, err, first)
	}
	flagValue := func(name, def string) string {
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
				return v
			}
			if v, ok := strings.CutPrefix(a, "-"+name+"="); ok {
				return v
			}
		}
		return def
	}
	if p := flagValue("config", config.DefaultPath); p != "/etc/config/ip-masq-agent" {
		t.Errorf("--config %q, but the ConfigMap key is mounted at /etc/config/ip-masq-agent", p)
	}

	// Probes on the agent's health endpoints, where it listens.
	httpAddr := flagValue("http-address", "127.0.0.1:9753")
	host, port, err := net.SplitHostPort(httpAddr)
	if err != nil {
		t.Fatalf("--http-address %q: %v", httpAddr, err)
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"livenessProbe", c.LivenessProbe, "/healthz"}, {"readinessProbe", c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s: want an httpGet probe on %s", p.name, p.path)
			continue
		}
		g := p.probe.HTTPGet
		if g.Path != p.path {
			t.Errorf("%s path %q, want %s", p.name, g.Path, p.path)
		}
		if g.Port.String() != port && !slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool {
			return cp.Name == g.Port.String() && strconv.Itoa(int(cp.ContainerPort)) == port
		}) {
			t.Errorf("%s port %s, but the agent listens on %s", p.name, g.Port.String(), httpAddr)
		}
		// The kubelet probes the pod IP (the node's, with hostNetwork)
		// unless host is set; a loopback listener needs host set to it.
		if a, err := netip.ParseAddr(host); err == nil && a.IsLoopback() && g.Host != host {
			t.Errorf("%s host %q: the agent listens on %s only, so host must be %s", p.name, g.Host, httpAddr, host)
		}
		if g.Scheme != "" && g.Scheme != corev1.URISchemeHTTP {
			t.Errorf("%s scheme %s, want HTTP", p.name, g.Scheme)
		}
		if p.probe.PeriodSeconds <= 0 || p.probe.TimeoutSeconds <= 0 || p.probe.FailureThreshold <= 0 {
			t.Errorf("%s: set periodSeconds, timeoutSeconds and failureThreshold explicitly: %+v", p.name, p.probe.ProbeHandler)
		}
	}
	// Liveness must not kill an agent that is merely waiting for a resync:
	// allow a full default resync interval of failures.
	if lp := c.LivenessProbe; lp != nil {
		if d := time.Duration(lp.PeriodSeconds*lp.FailureThreshold) * time.Second; d < config.Default(config.Flags{}).ResyncInterval {
			t.Errorf("livenessProbe gives up after %s, less than the default resync interval", d)
		}
	}

	// Resources: requests for CPU and memory and a memory limit, small. No
	// CPU limit (docs/operation.md, "Resources and rollout"); one, if set,
	// not below the request.
	req, lim := c.Resources.Requests, c.Resources.Limits
	if req.Cpu().IsZero() || req.Memory().IsZero() || lim.Memory().IsZero() {
		t.Errorf("resources %+v: want cpu and memory requests and a memory limit", c.Resources)
	}
	if req.Cpu().MilliValue() > 100 || lim.Memory().Value() > 512<<20 || req.Memory().Cmp(*lim.Memory()) > 0 {
		t.Errorf("resources %+v: not small, or requests above limits", c.Resources)
	}
	if cpu, ok := lim[corev1.ResourceCPU]; ok && cpu.Cmp(*req.Cpu()) < 0 {
		t.Errorf("CPU limit %s below the request %s", cpu.String(), req.Cpu())
	}

	checkSecurityContext(t, ps.SecurityContext, c.SecurityContext)
}

// checkSecurityContext: not privileged, CAP_NET_ADMIN only, read-only root
// filesystem, no privilege escalation, RuntimeDefault seccomp.
func checkSecurityContext(t *testing.T, pod *corev1.PodSecurityContext, sc *corev1.SecurityContext) {
	t.Helper()
	if sc == nil {
		t.Fatal("the container has no securityContext")
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Error("privileged: true")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("allowPrivilegeEscalation must be false")
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("readOnlyRootFilesystem must be true")
	}
	if sc.Capabilities == nil {
		t.Error("capabilities: want drop [ALL], add [NET_ADMIN]")
	} else {
		if !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("capabilities.drop %v, want [ALL]", sc.Capabilities.Drop)
		}
		if !slices.Equal(sc.Capabilities.Add, []corev1.Capability{"NET_ADMIN"}) {
			t.Errorf("capabilities.add %v, want [NET_ADMIN]", sc.Capabilities.Add)
		}
	}
	if sc.ProcMount != nil && *sc.ProcMount != corev1.DefaultProcMount {
		t.Errorf("procMount %s, want Default", *sc.ProcMount)
	}
	// seccomp: the container's own setting wins over the pod's.
	seccomp := sc.SeccompProfile
	if seccomp == nil && pod != nil {
		seccomp = pod.SeccompProfile
	}
	if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("seccompProfile %+v, want RuntimeDefault", seccomp)
	}
	if pod != nil && pod.SeccompProfile != nil && pod.SeccompProfile.Type == corev1.SeccompProfileTypeUnconfined {
		t.Error("the pod's seccompProfile is Unconfined")
	}
}

// TestManifestsConfigMap: the example ConfigMap (deploy/examples, not
// applied by deploy/) is the Kubernetes docs' example, and the agent
// accepts it without a warning, with the flags the DaemonSet passes.
func TestManifestsConfigMap(t *testing.T) {
	var cm corev1.ConfigMap
	readManifest(t, "examples/configmap.yaml", &cm, "v1", "ConfigMap")
	if cm.Namespace != "kube-system" || cm.Name != "ip-masq-agent" {
		t.Errorf("ConfigMap is %s/%s, want kube-system/ip-masq-agent", cm.Namespace, cm.Name)
	}
	if len(cm.BinaryData) > 0 || len(cm.Data) != 1 {
		t.Errorf("ConfigMap keys: want only %q, have data %v and binaryData %v", "config", slices.Sorted(maps.Keys(cm.Data)), slices.Sorted(maps.Keys(cm.BinaryData)))
	}
	data, ok := cm.Data["config"]
	if !ok {
		t.Fatal(`the ConfigMap has no key "config"`)
	}

	var ds appsv1.DaemonSet
	readManifest(t, "daemonset.yaml", &ds, "apps/v1", "DaemonSet")
	var f config.Flags
	for _, c := range ds.Spec.Template.Spec.Containers {
		for _, a := range c.Args {
			f.NoMasqAllReservedRanges = f.NoMasqAllReservedRanges || a == "--nomasq-all-reserved-ranges" || a == "--nomasq-all-reserved-ranges=true"
			f.EnableIPv6 = f.EnableIPv6 || a == "--enable-ipv6" || a == "--enable-ipv6=true"
		}
	}
	cfg, warnings, err := config.Parse([]byte(data), f)
	if err != nil {
		t.Fatalf("the agent refuses the example config: %v\n%s", err, data)
	}
	if len(warnings) > 0 {
		t.Errorf("the agent warns about the example config: %q", warnings)
	}
	// The docs' example, key for key.
	want := config.Default(f)
	want.NonMasqueradeCIDRs = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	want.ResyncInterval = 60 * time.Second
	want.MasqLinkLocal = true
	if !cfg.Equal(want) {
		t.Errorf("the example config is\n%s\nwant the Kubernetes docs' example\n%s", cfg, want)
	}
}

// TestManifestsNeverTouchTheConfigMap: kubectl apply -k deploy/ must not
// create or change the ConfigMap kube-system/ip-masq-agent, which the
// cluster's operator (and an iptables agent still running) owns; the
// example lives in deploy/examples, a kustomization of its own.
func TestManifestsNeverTouchTheConfigMap(t *testing.T) {
	var k kustomization
	readManifest(t, "kustomization.yaml", &k, "kustomize.config.k8s.io/v1beta1", "Kustomization")
	for _, r := range k.Resources {
		data, err := os.ReadFile(filepath.Join(deployDir, r))
		if err != nil {
			t.Fatalf("resource %s: %v (deploy/ lists files only)", r, err)
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(data, &tm); err != nil {
			t.Fatalf("deploy/%s: %v", r, err)
		}
		if tm.Kind == "ConfigMap" {
			t.Errorf("deploy/kustomization.yaml applies deploy/%s, a ConfigMap", r)
		}
	}
	var ex kustomization
	readManifest(t, "examples/kustomization.yaml", &ex, "kustomize.config.k8s.io/v1beta1", "Kustomization")
	if !slices.Equal(ex.Resources, []string{"configmap.yaml"}) {
		t.Errorf("deploy/examples/kustomization.yaml resources %v, want [configmap.yaml]", ex.Resources)
	}
}

// imageComponent is deploy/image/kustomization.yaml, the one place that
// sets the agent's image.
type imageComponent struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName"`
		NewTag  string `json:"newTag"`
	} `json:"images"`
}

// TestManifestsImagePinned: deploy/image/ pins the agent's image to a
// release tag, and every container of deploy/ that runs the agent names
// the placeholder it replaces (so no tag in a manifest can be edited in
// vain); deploy/, deploy/uninstall/ and deploy/rollback/ use the component.
func TestManifestsImagePinned(t *testing.T) {
	var ic imageComponent
	readManifest(t, "image/kustomization.yaml", &ic, "kustomize.config.k8s.io/v1alpha1", "Component")
	release := regexp.MustCompile(`^v\d+\.\d+\.\d+$`)
	if len(ic.Images) != 1 || ic.Images[0].Name != "ip-masq-agent-nft" || ic.Images[0].NewName != kustomize.ImageName || !release.MatchString(ic.Images[0].NewTag) {
		t.Fatalf("deploy/image/kustomization.yaml images %+v: want one, name ip-masq-agent-nft, newName %s, newTag vX.Y.Z", ic.Images, kustomize.ImageName)
	}
	for _, k := range []struct{ file, component string }{{"kustomization.yaml", "image"}, {"uninstall/kustomization.yaml", "../image"}, {"rollback/kustomization.yaml", "../image"}} {
		var kz kustomization
		readManifest(t, k.file, &kz, "kustomize.config.k8s.io/v1beta1", "Kustomization")
		if !slices.Contains(kz.Components, k.component) || len(kz.Images) > 0 {
			t.Errorf("deploy/%s: components %v, images %+v: want the component %s and no images of its own", k.file, kz.Components, kz.Images, k.component)
		}
	}
	for _, file := range []string{"daemonset.yaml", "uninstall/daemonset.yaml", "rollback/daemonset.yaml"} {
		var ds appsv1.DaemonSet
		readManifest(t, file, &ds, "apps/v1", "DaemonSet")
		for _, c := range append(ds.Spec.Template.Spec.InitContainers, ds.Spec.Template.Spec.Containers...) {
			if strings.HasPrefix(c.Image, "registry.k8s.io/pause:") {
				continue
			}
			if c.Image != "ip-masq-agent-nft" {
				t.Errorf("deploy/%s: container %s has image %q, want the placeholder ip-masq-agent-nft (deploy/image/ sets it)", file, c.Name, c.Image)
			}
		}
	}
	wf, err := os.ReadFile("../.github/workflows/release.yml")
	if err != nil {
		t.Fatalf("the release workflow: %v", err)
	}
	for _, want := range []string{"make image-multiarch", "make manifests", "deploy/image/kustomization.yaml", "bin/manifests/install.yaml", "bin/manifests/uninstall.yaml", "bin/manifests/rollback.yaml"} {
		if !strings.Contains(string(wf), want) {
			t.Errorf(".github/workflows/release.yml does not mention %q", want)
		}
	}
}

// renderedImages renders a kustomization's output into its DaemonSets'
// containers' images, by DaemonSet/container.
func renderedImages(t *testing.T, what string, data []byte) map[string]string {
	t.Helper()
	images := map[string]string{}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var ds appsv1.DaemonSet
		if err := yaml.Unmarshal([]byte(doc), &ds); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if ds.Kind != "DaemonSet" {
			continue
		}
		for _, c := range append(ds.Spec.Template.Spec.InitContainers, ds.Spec.Template.Spec.Containers...) {
			images[ds.Name+"/"+c.Name] = c.Image
		}
	}
	if len(images) == 0 {
		t.Fatalf("%s: no DaemonSet rendered", what)
	}
	return images
}

// TestManifestsImageFollowsOverlay renders deploy/, deploy/uninstall/,
// deploy/rollback/ and the documented private-registry overlays as kubectl apply -k does: every
// container that runs the agent has the pinned image, and an overlay that
// sets another registry and tag (as README "Install" says) reaches each of
// them; make manifests renders the same.
func TestManifestsImageFollowsOverlay(t *testing.T) {
	var ic imageComponent
	readManifest(t, "image/kustomization.yaml", &ic, "kustomize.config.k8s.io/v1alpha1", "Component")
	pinned := ic.Images[0].NewName + ":" + ic.Images[0].NewTag
	const mine = "registry.example.com/mirror/ip-masq-agent-nft:v9.8.7-test"
	agentImages := func(m map[string]string) map[string]string {
		out := map[string]string{}
		for k, v := range m {
			if !strings.HasPrefix(v, "registry.k8s.io/pause:") && !strings.Contains(v, "/pause:") {
				out[k] = v
			}
		}
		return out
	}
	wantContainers := map[string]int{"deploy": 1, "deploy/uninstall": 2, "deploy/rollback": 1}
	for _, base := range []string{"deploy", "deploy/uninstall", "deploy/rollback"} {
		data, err := kustomize.Render(filepath.Join("..", base))
		if err != nil {
			t.Fatalf("kubectl kustomize %s: %v", base, err)
		}
		plain := agentImages(renderedImages(t, base, data))
		if len(plain) != wantContainers[base] {
			t.Errorf("%s renders %d containers that run the agent, want %d: %v", base, len(plain), wantContainers[base], plain)
		}
		for c, img := range plain {
			if img != pinned {
				t.Errorf("%s: %s runs %q, want deploy/image/'s %q", base, c, img, pinned)
			}
		}
		overlay, err := kustomize.ImageOverlay("../"+base, mine)
		if err != nil {
			t.Fatal(err)
		}
		data, err = kustomize.RenderOverlay("..", "overlay-test", overlay)
		if err != nil {
			t.Fatalf("%s with an image overlay: %v", base, err)
		}
		over := agentImages(renderedImages(t, base+" with an overlay", data))
		if len(over) != len(plain) {
			t.Errorf("%s with an overlay: containers %v, want %v", base, over, plain)
		}
		for c, img := range over {
			if img != mine {
				t.Errorf("%s with an overlay setting %s: %s runs %q", base, mine, c, img)
			}
		}
	}
	// make e2e-cluster's overlays (its local image, matched by the name
	// deploy/image/ sets) reach every container too.
	for _, dir := range []string{"e2e/overlay", "e2e/uninstall", "e2e/rollback"} {
		data, err := kustomize.Render(filepath.Join("..", dir))
		if err != nil {
			t.Fatalf("kubectl kustomize %s: %v", dir, err)
		}
		for c, img := range renderedImages(t, dir, data) {
			if !strings.HasSuffix(c, "/done") && img != "localhost/ip-masq-agent-nft-e2e:e2e" { // done: the pause container
				t.Errorf("%s: %s runs %q, want the e2e image", dir, c, img)
			}
		}
	}
	// The documented private-registry overlay: install, uninstall and
	// rollback alike.
	var ex imageComponent
	if err := decodeStrictFile(t, "../examples/private-registry/image/kustomization.yaml", &ex); err != nil {
		t.Fatal(err)
	}
	want := ex.Images[0].NewName + ":" + ex.Images[0].NewTag
	for _, dir := range []string{"examples/private-registry", "examples/private-registry/uninstall", "examples/private-registry/rollback"} {
		data, err := kustomize.Render(filepath.Join("..", dir))
		if err != nil {
			t.Fatalf("kubectl kustomize %s: %v", dir, err)
		}
		imgs := renderedImages(t, dir, data)
		n := 0
		for c, img := range imgs {
			if strings.Contains(c, "/done") {
				continue // the pause container
			}
			n++
			if img != want {
				t.Errorf("%s: %s runs %q, want the overlay's %q", dir, c, img, want)
			}
		}
		if n == 0 {
			t.Errorf("%s: no container runs the agent", dir)
		}
	}
}

// decodeStrictFile reads a YAML file strictly.
func decodeStrictFile(t *testing.T, path string, out any) error {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return decodeStrict(data, out)
}

// component is the part of kustomize's Component type that
// deploy/components/label-gated may use.
type component struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Patches    []struct {
		Target struct {
			Group   string `json:"group,omitempty"`
			Version string `json:"version,omitempty"`
			Kind    string `json:"kind"`
			Name    string `json:"name"`
		} `json:"target"`
		Patch string `json:"patch"`
	} `json:"patches"`
}

// TestManifestsLabelGatedComponent: the Kubernetes docs' variant, an
// optional component, adds exactly the node label to the nodeSelector.
func TestManifestsLabelGatedComponent(t *testing.T) {
	var c component
	readManifest(t, "components/label-gated/kustomization.yaml", &c, "kustomize.config.k8s.io/v1alpha1", "Component")
	if len(c.Patches) != 1 {
		t.Fatalf("%d patches, want 1", len(c.Patches))
	}
	p := c.Patches[0]
	if p.Target.Kind != "DaemonSet" || p.Target.Name != "ip-masq-agent-nft" {
		t.Errorf("patch target %+v, want the DaemonSet ip-masq-agent-nft", p.Target)
	}
	var ops []struct {
		Op    string `json:"op"`
		Path  string `json:"path"`
		Value any    `json:"value"`
	}
	if err := decodeStrict([]byte(p.Patch), &ops); err != nil {
		t.Fatalf("the patch: %v", err)
	}
	want := "/spec/template/spec/nodeSelector/node.kubernetes.io~1masq-agent-ds-ready"
	if len(ops) != 1 || ops[0].Op != "add" || ops[0].Path != want || ops[0].Value != "true" {
		t.Errorf("patch %+v, want one add of %s: \"true\"", ops, want)
	}
	// The path's parent exists in the DaemonSet, so the JSON patch applies.
	var ds appsv1.DaemonSet
	readManifest(t, "daemonset.yaml", &ds, "apps/v1", "DaemonSet")
	if ds.Spec.Template.Spec.NodeSelector == nil {
		t.Error("the DaemonSet has no nodeSelector for the component's patch to add to")
	}
}

// TestManifestsRollback: deploy/rollback/ removes this agent's table, and
// nothing else, on every Linux node: one init container running
// --cleanup (never cleanup-iptables, which would remove the original
// agent's rules just re-installed), no node selector beyond the OS (the
// agent may have run on any node), every taint tolerated, the release
// image of deploy/; neither it nor deploy/uninstall/ touches the nodes'
// labels (the label-gated original needs node.kubernetes.io/masq-agent-ds-ready).
func TestManifestsRollback(t *testing.T) {
	var k kustomization
	readManifest(t, "rollback/kustomization.yaml", &k, "kustomize.config.k8s.io/v1beta1", "Kustomization")
	if !slices.Equal(k.Resources, []string{"daemonset.yaml"}) {
		t.Errorf("resources %v", k.Resources)
	}
	var ds, agent, uninstall appsv1.DaemonSet
	readManifest(t, "rollback/daemonset.yaml", &ds, "apps/v1", "DaemonSet")
	readManifest(t, "daemonset.yaml", &agent, "apps/v1", "DaemonSet")
	readManifest(t, "uninstall/daemonset.yaml", &uninstall, "apps/v1", "DaemonSet")
	spec := ds.Spec.Template.Spec
	if ds.Namespace != "kube-system" || ds.Name == agent.Name || ds.Name == uninstall.Name {
		t.Errorf("%s/%s", ds.Namespace, ds.Name)
	}
	if len(spec.InitContainers) != 1 || !slices.Equal(spec.InitContainers[0].Command, []string{"/ip-masq-agent", "--cleanup"}) {
		t.Fatalf("init containers %+v, want one running /ip-masq-agent --cleanup", spec.InitContainers)
	}
	if img := spec.InitContainers[0].Image; img != agent.Spec.Template.Spec.Containers[0].Image {
		t.Errorf("image %s, want deploy/'s %s", img, agent.Spec.Template.Spec.Containers[0].Image)
	}
	if !maps.Equal(spec.NodeSelector, map[string]string{"kubernetes.io/os": "linux"}) {
		t.Errorf("nodeSelector %v, want only kubernetes.io/os: linux", spec.NodeSelector)
	}
	if len(spec.Tolerations) != 1 || spec.Tolerations[0].Operator != corev1.TolerationOpExists || spec.Tolerations[0].Key != "" {
		t.Errorf("tolerations %+v, want every taint tolerated", spec.Tolerations)
	}
	if c := spec.InitContainers[0].SecurityContext; c == nil || c.Capabilities == nil || !slices.Equal(c.Capabilities.Add, []corev1.Capability{"NET_ADMIN"}) || !spec.HostNetwork {
		t.Errorf("the cleanup needs NET_ADMIN in the node's network namespace: %+v hostNetwork %v", c, spec.HostNetwork)
	}
	for _, name := range []string{"rollback/daemonset.yaml", "uninstall/daemonset.yaml"} {
		data, err := os.ReadFile(filepath.Join(deployDir, name))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(data), "\n") {
			if !strings.HasPrefix(strings.TrimSpace(l), "#") && strings.Contains(l, "masq-agent-ds-ready") {
				t.Errorf("deploy/%s touches the node label: %s", name, l)
			}
		}
	}
}
