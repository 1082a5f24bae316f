// Package preview is the preview request path, the gate: a request to
// s-<id>-<port>.preview.<domain> is routed to its sandbox and served as it
// stands: running (the upstream chosen and the request passed on to
// reverse_proxy), sleeping (woken; browsers get the warming page, other
// clients are held until it answers), or owned by another node (forwarded to
// it). It owns the reserved paths (status, events, wake), private previews'
// tokens and cookies on the request, the crawler and wake guards' answers, the
// pages, and the request metrics and spans.
//
// It reads the running gateway (package gateway) and forwards through
// cluster/peer. Of Caddy it uses only caddyhttp's handler type and request
// variables; it must not import caddymodule, api or cli.
package preview
