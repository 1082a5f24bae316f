package caddymodule

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

var collectors = []prometheus.Collector{
	metricRequests, metricWakes, metricWakeDuration, metricWaitersCollapsed, metricSlotWaiting, statesCollector{},
	metricReaperActions, metricCorrections, metricDeliveries, metricDiskQuotaStops,
	metricPoolClaims, metricPoolClaimSeconds,
}

// registerMetrics registers the collectors on reg; a collector already there
// (a second module of the same config) is fine.
func registerMetrics(reg *prometheus.Registry) error {
	if reg == nil {
		return nil
	}
	for _, c := range collectors {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return err
			}
		}
	}
	return nil
}
