//go:build tools

// Package refs pins the kine command into this module.
package refs

import (
	_ "github.com/k3s-io/kine/pkg/app"
	_ "github.com/k3s-io/kine/pkg/endpoint"
)
