package main

import "fmt"

// containerd 1.6 (Debian's). Paths are inside the node's private mount
// namespace, where /run is a tmpfs and /var/lib a directory of this run.
func containerdConfig(cniDir, sandboxImage string) string {
	return fmt.Sprintf(`version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.internal.v1.opt"]
  path = "/var/lib/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  # No image can be pulled here: the sandbox image is built and imported by the harness.
  sandbox_image = %q
  # Root here lacks CAP_SYS_RESOURCE and cannot lower oom_score_adj; without
  # this runc fails with "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %q
`, sandboxImage, cniDir)
}

// The bridge CNI: pods on cni0 in the node namespace, the node as their
// gateway, and no masquerade of its own (ipMasq: false): masquerade is the
// agent's job.
func cniConfig() string {
	return fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "e2e",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %q, "gateway": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "/var/lib/cni/networks"
      }
    }
  ]
}
`, podCIDR, podGateway)
}

// The kubelet on cgroup v1 with cgroupfs, no swap check, and the global
// sysctls checked, never written (protectKernelDefaults). syncFrequency 10s
// (default 1m) bounds how long a ConfigMap change takes to reach the pod.
func kubeletConfig(caFile, cgroupRoot string) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
imageServiceEndpoint: unix:///run/containerd/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: %s
failCgroupV1: false
failSwapOn: false
protectKernelDefaults: true
syncFrequency: 10s
address: %s
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: %s
authorization:
  mode: AlwaysAllow
resolvConf: ""
volumePluginDir: /var/lib/kubelet/volume-plugins
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%%
  imagefs.available: 1%%
  nodefs.inodesFree: 1%%
`, cgroupRoot, nodeIP, caFile)
}
