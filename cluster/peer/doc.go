// Package peer is the node-to-node part of a cluster: the peer listener
// (requests other nodes forward, accepted only over mutual TLS and signed by
// the node the certificate names), the transports to the other nodes and the
// forwarding of API calls to them, other nodes' changes fanned out to event
// streams, the capacity the node registers, and the cluster's metrics. It
// stands apart from package cluster (catalog, registry, placement,
// identity), which knows nothing of HTTP serving.
//
// What the listener serves is given to it as http.Handlers: it must not import
// gateway, preview, api or caddymodule (only caddyhttp's request variables of
// Caddy).
package peer
