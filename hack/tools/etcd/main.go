// Command etcd runs the etcd server at the version pinned in ../go.mod, the same
// one k8s.io/kubernetes is built and tested against.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
