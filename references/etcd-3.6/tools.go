//go:build tools

// Package refs pins the reference commands into this module.
package refs

import (
	_ "go.etcd.io/etcd/etcdctl/v3/ctlv3"
	_ "go.etcd.io/etcd/etcdutl/v3/etcdutl"
	_ "go.etcd.io/etcd/server/v3/etcdmain"
	_ "go.etcd.io/etcd/v3/tools/benchmark/cmd"
)
