// Command etcd is upstream's server/main.go, built in a module of its own because etcd's
// dependency versions clash with kube-apiserver's. Built by testkit/controlplane/build.py.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
