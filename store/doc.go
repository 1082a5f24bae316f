// Package store persists sandwake's sandbox records, its append-only event log
// and the webhook outbox in an embedded Badger database: it is the Badger
// implementation of lifecycle.Store. It imports lifecycle for the types it
// stores (a Go type satisfies an interface only with the interface's own
// types) and knows nothing of Docker or Caddy.
package store
