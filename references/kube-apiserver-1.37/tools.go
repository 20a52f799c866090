//go:build tools

// Package refs pins the kube-apiserver command into this module.
package refs

import _ "k8s.io/kubernetes/cmd/kube-apiserver/app"
