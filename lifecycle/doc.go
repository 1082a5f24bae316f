// Package lifecycle is sandwake's engine: the sandbox state machine, waking,
// admission and the background loops (activity flush, idle reaper, expiry,
// pressure, reconcile with the engine's events). It owns no container engine
// of its own (see Runtime) and imports nothing of Caddy. manager.go holds the
// Manager's core; operations.go, create.go, wake.go and admission.go its
// operations.
//
// It stays one package: the pool, the firewall bookkeeping and the webhook
// outbox all work on the Manager's own state (its per-id locks, admission and
// reservations, the firewall's shared section, the store's outbox under its
// context), so a package of their own would export that state rather than
// separate a concern. It must not import Caddy, Docker, Badger or any
// package of the gateway.
package lifecycle
