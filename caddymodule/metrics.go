package caddymodule

import (
	"errors"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandwake/sandwake/cluster/peer"
	"github.com/sandwake/sandwake/gateway"
	"github.com/sandwake/sandwake/preview"
)

// allCollectors are sandwake's metrics: the engine's, the preview path's
// and the cluster's.
func allCollectors() []prometheus.Collector {
	return slices.Concat(gateway.Collectors(), preview.Collectors(), peer.Collectors(currentNode))
}

// currentNode is the running engine's part in a cluster, nil on a single
// host or before the engine starts.
func currentNode() *peer.Node {
	if e := gateway.Current(); e != nil {
		return e.Cluster
	}
	return nil
}

// registerMetrics registers the collectors on reg; a collector already there
// (a second module of the same config) is fine.
func registerMetrics(reg *prometheus.Registry) error {
	if reg == nil {
		return nil
	}
	for _, c := range allCollectors() {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return err
			}
		}
	}
	return nil
}
