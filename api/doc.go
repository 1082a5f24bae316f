// Package api is the management REST API and its dashboard as an
// http.Handler over the running gateway (package gateway) and, in a cluster,
// the node's part in it (cluster/peer): sandboxes, templates, nodes, events,
// tokens with scopes and tenant labels, readiness. It is testable with
// httptest without starting Caddy; the Caddy module http.handlers.sandwake_api
// hands it its requests.
//
// Of Caddy it uses only the duration syntax and placeholders of its options;
// it must not import caddymodule, preview or cli.
package api
