// Package clustertest makes throwaway cluster CAs and node credentials for
// tests of the cluster and of its Caddy wiring.
package clustertest
