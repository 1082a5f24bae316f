// Package docker implements lifecycle.Runtime on the Docker Engine API.
//
// It must not import Caddy, the store or any package of the gateway.
package docker
