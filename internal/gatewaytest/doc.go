// Package gatewaytest runs sandwake in a real Caddy in the test's own
// process (Harness): loopback ports of its own, a store in a temporary
// directory, the real Docker engine, and helpers to call its API and its
// preview hosts. The packages of the request path, the API and the CLI test
// through it.
//
// It imports caddymodule: the packages caddymodule imports can use it only
// from their external tests (package <name>_test).
package gatewaytest
