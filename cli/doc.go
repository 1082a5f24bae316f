// Package cli is `caddy sandwake …`: the commands that manage sandboxes,
// templates and cluster nodes through a running gateway's management API
// (over package client), and make the cluster's CA and node certificates
// (over package cluster's PKI), and remove what a stopped instance made on
// its host (uninstall, over lifecycle/docker and egress). It registers itself with Caddy's command
// line (caddycmd.RegisterCommand) when imported, as the module root does.
//
// It holds none of the gateway's state: it must not import caddymodule,
// the request path, the API handler or the engine.
package cli
