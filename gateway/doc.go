// Package gateway is the running gateway the preview path and the API share:
// the engine (store, runtime and manager), the per-config settings a reload
// swaps, the route cache, the wake guard, per-client budgets, event-stream
// caps, preview tokens, the isolation and egress reports, and the engine's
// metrics. caddymodule opens one per storage directory and hands it to the
// handlers.
//
// It must not import Caddy's app or modules (only caddyhttp's request
// variables), caddymodule, preview or api.
package gateway
