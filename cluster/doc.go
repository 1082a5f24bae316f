// Package cluster joins sandwake nodes into one cluster over etcd: a node
// registry on leases, the sandbox catalog each owner publishes after its
// Badger commit, cluster-wide unique ids, placement of creates, and the
// signing of node-to-node requests. It imports lifecycle for the domain
// types and is imported only by the Caddy module's wiring; without a
// cluster block none of it runs. See docs/DESIGN.md, "Cluster mode".
//
// It must not import Caddy, cluster/peer or any package that serves requests.
package cluster
