// The e2e harness (make e2e-cluster): its own module, so that the project's
// go.mod and `make test` stay as they are. The Kubernetes components are
// built from a module of their own again, in kube/.
module github.com/ip-masq-agent/ip-masq-agent-nft/e2e

go 1.26.0

require (
	golang.org/x/sys v0.48.0
	sigs.k8s.io/yaml v1.6.0
)

require go.yaml.in/yaml/v2 v2.4.2 // indirect
