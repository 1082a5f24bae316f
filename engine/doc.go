// Package engine builds sandwake's engine from options: the Badger store,
// the Docker runtime and the lifecycle.Manager over them. It is the one
// place that knows both implementations; the layers above it (the Caddy
// module, the benchmarks) see lifecycle's types and this package only. It
// imports nothing of Caddy.
package engine
