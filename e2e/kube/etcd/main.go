// etcd for the e2e cluster: the etcd server of the release that Kubernetes
// v1.36.3 depends on (go.etcd.io/etcd/server/v3 in its go.mod).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
