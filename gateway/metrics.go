package gateway

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandwake/sandwake/egress"
	"github.com/sandwake/sandwake/lifecycle"
)

// Collectors are created once per process and registered on every config's
// registry (Caddy makes one per config load), so counts survive reloads. No
// label carries a sandbox id: thousands of sandboxes must not mean thousands
// of series.
var (
	metricWakes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "sandwake", Name: "wakes_total",
		Help: "Wakes that reached the container engine, by state woken from and result.",
	}, []string{"from", "result"})
	metricWakeDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "caddy", Subsystem: "sandwake", Name: "wake_duration_seconds",
		Help:    "Time from the start of a wake to running (or failure), by state woken from.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"from"})
	metricSandboxes = prometheus.NewDesc("caddy_sandwake_sandboxes",
		"Sandboxes by state.", []string{"state"}, nil)
	metricResident = prometheus.NewDesc("caddy_sandwake_resident",
		"Sandboxes holding memory (running + paused), and admissions reserved by wakes in flight.", []string{"kind"}, nil)
	metricMemAvailable = prometheus.NewDesc("caddy_sandwake_memory_available_bytes",
		"Host memory available to sandboxes, as the pressure check reads it.", nil, nil)
	metricBreakerOpen = prometheus.NewDesc("caddy_sandwake_docker_circuit_open",
		"1 while Docker calls fail fast after repeated failures.", nil, nil)
	metricEgressDenied = prometheus.NewDesc("caddy_sandwake_egress_denied_total",
		"Packets sandboxes sent that their egress policy refused (the firewall's counters).", nil, nil)
	metricEgressEnforced = prometheus.NewDesc("caddy_sandwake_egress_enforced",
		"1 while sandboxes' egress policies are enforced; 0 when the firewall is off (egress unenforced) or cannot be installed.", nil, nil)
	metricReaperActions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "sandwake", Name: "reaper_actions_total",
		Help: "Sandboxes paused, stopped or expired by the background loops, by reaper (idle, expiry, pressure) and action.",
	}, []string{"reaper", "action"})
	metricDeliveries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "sandwake", Name: "webhook_deliveries_total",
		Help: "Webhook delivery attempts, by result (ok, failed, dropped).",
	}, []string{"result"})
	metricDiskQuotaStops = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "sandwake", Name: "disk_quota_stops_total",
		Help: "Sandboxes the disk watchdog stopped for writing past their disk_mb.",
	})
	metricCorrections = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "sandwake", Name: "reconcile_corrections_total",
		Help: "Changes reconcile made so the store follows Docker, by kind.",
	}, []string{"kind"})

	metricPoolClaims = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "sandwake", Name: "pool_claims_total",
		Help: "Creates from a template, by template and result: hit (a warm pool container claimed) or the reason it was created cold (empty, bypass, id, env, failed, no_pool).",
	}, []string{"template", "result"})
	metricPoolClaimSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "caddy", Subsystem: "sandwake", Name: "pool_claim_seconds",
		Help:    "Time a pool hit took, from the claim to the sandbox running.",
		Buckets: []float64{.002, .005, .01, .015, .02, .03, .05, .1, .25, .5, 1},
	})
	metricPoolIdle = prometheus.NewDesc("caddy_sandwake_pool_idle",
		"Idle warm pool containers of the template's current shape, ready to claim.", []string{"template"}, nil)
	metricPoolRefills = prometheus.NewDesc("caddy_sandwake_pool_refills_total",
		"Warm pool containers made, by template (since the gateway started).", []string{"template"}, nil)
	metricServices = prometheus.NewDesc("caddy_sandwake_services",
		"Service containers of running and paused groups (sandboxes with services), by their sandbox's state: what they hold beside the apps max_resident counts.", []string{"state"}, nil)
	metricEgressTablesRemoved = prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "sandwake", Name: "egress_tables_removed_total",
		Help: "Egress firewall tables (inet and bridge) of sandbox networks that are gone, removed by this process.",
	}, func() float64 { return float64(egress.TablesRemoved()) })
	metricPoolRemoved = prometheus.NewDesc("caddy_sandwake_pool_removed_total",
		"Warm pool containers removed unclaimed, by reason: stale, max_age, surplus, pressure, died, leftover, failed (since the gateway started).", []string{"reason"}, nil)

	// metricsEngine is the engine whose states the sandboxes gauge reports.
	metricsEngine atomic.Pointer[Gateway]
)

// Collectors are created once per process and registered on every config's
// registry (Caddy makes one per config load), so counts survive reloads. No
// label carries a sandbox id: thousands of sandboxes must not mean thousands
// of series.

// statesCollector reports sandboxes by state at scrape time from the
// manager's in-memory mirror.
type statesCollector struct{}

func (statesCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- metricSandboxes
	ch <- metricResident
	ch <- metricMemAvailable
	ch <- metricBreakerOpen
	ch <- metricEgressDenied
	ch <- metricEgressEnforced
	ch <- metricPoolIdle
	ch <- metricPoolRefills
	ch <- metricPoolRemoved
	ch <- metricServices
}

func (statesCollector) Collect(ch chan<- prometheus.Metric) {
	e := metricsEngine.Load()
	if e == nil {
		return
	}
	counts := e.Mgr.Counts()
	for _, s := range lifecycle.States {
		ch <- prometheus.MustNewConstMetric(metricSandboxes, prometheus.GaugeValue, float64(counts[s]), string(s))
	}
	resident, reserved := e.Mgr.Resident()
	ch <- prometheus.MustNewConstMetric(metricResident, prometheus.GaugeValue, float64(resident), "resident")
	ch <- prometheus.MustNewConstMetric(metricResident, prometheus.GaugeValue, float64(reserved), "reserved")
	if avail, err := lifecycle.HostMemAvailable(); err == nil {
		ch <- prometheus.MustNewConstMetric(metricMemAvailable, prometheus.GaugeValue, float64(avail))
	}
	open := 0.0
	if o, _ := e.Mgr.BreakerOpen(); o {
		open = 1
	}
	ch <- prometheus.MustNewConstMetric(metricBreakerOpen, prometheus.GaugeValue, open)
	ch <- prometheus.MustNewConstMetric(metricEgressDenied, prometheus.CounterValue, float64(e.Mgr.EgressDeniedTotal(EgressCountersMaxAge)))
	enforced := 0.0
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if !e.EgressUnenforced && e.Mgr.EgressStatus(ctx) == nil {
		enforced = 1
	}
	ch <- prometheus.MustNewConstMetric(metricEgressEnforced, prometheus.GaugeValue, enforced)
	for _, t := range e.Mgr.Templates() {
		ch <- prometheus.MustNewConstMetric(metricPoolIdle, prometheus.GaugeValue, float64(t.Idle), t.Template.Name)
		ch <- prometheus.MustNewConstMetric(metricPoolRefills, prometheus.CounterValue, float64(t.Refills), t.Template.Name)
	}
	if services, err := e.Mgr.ResidentServices(); err == nil {
		for _, s := range []lifecycle.State{lifecycle.Running, lifecycle.Paused} {
			ch <- prometheus.MustNewConstMetric(metricServices, prometheus.GaugeValue, float64(services[s]), string(s))
		}
	}
	removed := e.Mgr.PoolRemoved()
	for _, reason := range poolRemovedReasons {
		ch <- prometheus.MustNewConstMetric(metricPoolRemoved, prometheus.CounterValue, float64(removed[reason]), reason)
	}
}

// poolRemovedReasons are the reasons caddy_sandwake_pool_removed_total
// always reports (zero included, so that rate() sees the first removal).
var poolRemovedReasons = []string{
	lifecycle.PoolRemovedStale, lifecycle.PoolRemovedAge, lifecycle.PoolRemovedSurplus, lifecycle.PoolRemovedPressure,
	lifecycle.PoolRemovedDied, lifecycle.PoolRemovedLeftover, lifecycle.PoolRemovedFailed,
}

// ObservePoolClaim counts a create from a template and times its claim.
func ObservePoolClaim(template string, out lifecycle.PoolOutcome, took time.Duration) {
	if out.Hit {
		metricPoolClaims.WithLabelValues(template, "hit").Inc()
		metricPoolClaimSeconds.Observe(took.Seconds())
		return
	}
	metricPoolClaims.WithLabelValues(template, out.Reason).Inc()
}

// ObserveDiskQuota counts a sandbox stopped over its disk quota.
func ObserveDiskQuota(string, int64, int64) { metricDiskQuotaStops.Inc() }

// observeWake records a wake's outcome.
func observeWake(w lifecycle.WakeResult) {
	result := "ok"
	switch {
	case w.Err == nil:
	case errors.Is(w.Err, lifecycle.ErrCapacity):
		result = "capacity"
	case errors.Is(w.Err, lifecycle.ErrUnavailable), errors.Is(w.Err, lifecycle.ErrStoreUnavailable):
		result = "unavailable" // the host (Docker or the store), not the sandbox
	default:
		result = "error"
	}
	metricWakes.WithLabelValues(string(w.From), result).Inc()
	metricWakeDuration.WithLabelValues(string(w.From)).Observe(w.Duration.Seconds())
}

// ObserveReap counts a reaper pass's actions.
func ObserveReap(s lifecycle.ReapStats) {
	for reaper, byAction := range s.Actions {
		for action, n := range byAction {
			metricReaperActions.WithLabelValues(reaper, action).Add(float64(n))
		}
	}
}

// ObserveDelivery counts a webhook delivery attempt.
func ObserveDelivery(d lifecycle.DeliveryResult) {
	result := "ok"
	switch {
	case d.Dropped:
		result = "dropped"
	case d.Err != nil:
		result = "failed"
	}
	metricDeliveries.WithLabelValues(result).Inc()
}

// ObserveCorrection counts a reconcile correction.
func ObserveCorrection(c lifecycle.Correction) { metricCorrections.WithLabelValues(c.Kind).Inc() }

// Collectors are the engine's metrics.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{
		metricWakes, metricWakeDuration, statesCollector{},
		metricReaperActions, metricCorrections, metricDeliveries, metricDiskQuotaStops,
		metricPoolClaims, metricPoolClaimSeconds, metricEgressTablesRemoved,
	}
}

// Current is the running engine, nil before one starts (the collectors
// read it at scrape time).
func Current() *Gateway { return metricsEngine.Load() }

// SetCurrent makes e the engine the collectors read; Close unsets it.
func SetCurrent(e *Gateway) { metricsEngine.Store(e) }
