// Package caddymodule is sandwake's Caddy wiring and nothing else: module
// registration, the "sandwake" app (config, provisioning, the shared engine
// and reload), the Caddyfile (the global option and the sandwake_preview and
// sandwake_api directives), metrics registration, and thin handler modules
// that hand requests on: http.handlers.sandwake to package preview,
// http.handlers.sandwake_api to package api, tls.permission.sandwake and
// http.reverse_proxy.upstreams.sandwake.
//
// It is imported by the module root, cmd/ and tests only; the packages it
// wires (preview, api, gateway, cluster/peer, engine) must never import it.
package caddymodule
