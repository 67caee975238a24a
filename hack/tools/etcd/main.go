// Command etcd is etcd's own server entry point, built from the version that the
// Kubernetes module graph selects so that the test control plane matches it.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
