// Package engine builds sandwake's engine from options: the Badger store,
// the container runtime (Docker, or Kubernetes) and the lifecycle.Manager
// over them. It is the one place that knows the implementations; the
// layers above it (the Caddy module, the benchmarks) see lifecycle's types
// and this package only. It imports nothing of Caddy.
package engine
