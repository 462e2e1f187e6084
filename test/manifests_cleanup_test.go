package test

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/kustomize"
)

// renderedDaemonSets renders a kustomization and returns its DaemonSets.
func renderedDaemonSets(t *testing.T, what string, data []byte) []appsv1.DaemonSet {
	t.Helper()
	var out []appsv1.DaemonSet
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var ds appsv1.DaemonSet
		if err := yaml.Unmarshal([]byte(doc), &ds); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if ds.Kind == "DaemonSet" {
			out = append(out, ds)
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: no DaemonSet rendered", what)
	}
	return out
}

// TestManifestsCleanupSchedulesAsTheAgent: the rollback and uninstall
// DaemonSets, as every documented way renders them (deploy/, the
// private-registry example, make e2e-cluster's overlays, make manifests),
// carry the agent's priority class and tolerations: they run on every node
// the agent ran on, a node at its pod limit included, where a pod of lower
// priority would stay Pending and `kubectl rollout status` would wait for
// ever.
func TestManifestsCleanupSchedulesAsTheAgent(t *testing.T) {
	data, err := kustomize.Render(filepath.Join("..", "deploy"))
	if err != nil {
		t.Fatal(err)
	}
	agents := renderedDaemonSets(t, "deploy", data)
	agent := agents[0].Spec.Template.Spec
	if agent.PriorityClassName != "system-node-critical" || len(agent.Tolerations) == 0 {
		t.Fatalf("the agent's DaemonSet: priorityClassName %q, tolerations %+v", agent.PriorityClassName, agent.Tolerations)
	}
	check := func(what string, data []byte) {
		for _, ds := range renderedDaemonSets(t, what, data) {
			spec := ds.Spec.Template.Spec
			if spec.PriorityClassName != agent.PriorityClassName {
				t.Errorf("%s: DaemonSet %s has priorityClassName %q, want the agent's %q", what, ds.Name, spec.PriorityClassName, agent.PriorityClassName)
			}
			if !reflect.DeepEqual(spec.Tolerations, agent.Tolerations) {
				t.Errorf("%s: DaemonSet %s tolerates %+v, want the agent's %+v", what, ds.Name, spec.Tolerations, agent.Tolerations)
			}
		}
	}
	for _, dir := range []string{"deploy/rollback", "deploy/uninstall", "examples/private-registry/rollback",
		"examples/private-registry/uninstall", "e2e/rollback", "e2e/uninstall"} {
		data, err := kustomize.Render(filepath.Join("..", dir))
		if err != nil {
			t.Fatalf("kubectl kustomize %s: %v", dir, err)
		}
		check(dir, data)
	}
	// make manifests IMAGE=... renders them through an image overlay.
	for _, base := range []string{"deploy/rollback", "deploy/uninstall"} {
		overlay, err := kustomize.ImageOverlay("../"+base, "registry.example.com/ip-masq-agent-nft:v9.8.7")
		if err != nil {
			t.Fatal(err)
		}
		data, err := kustomize.RenderOverlay("..", ".manifests-overlay", overlay)
		if err != nil {
			t.Fatalf("%s with an image overlay: %v", base, err)
		}
		check(base+" (make manifests)", data)
	}
}
