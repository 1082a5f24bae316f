// Package web writes the HTTP answers the preview path and the management
// API share: JSON bodies, JSON errors (the engine's and the cluster's
// sentinel errors mapped to a status, a code and a Retry-After in one
// place, ErrorStatus) and server-sent event streams of sandbox events.
//
// It imports the engine's and the cluster's error values and the client's
// wire types only; never Caddy, nor a package that handles requests.
package web
