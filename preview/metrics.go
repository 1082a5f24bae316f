package preview

import "github.com/prometheus/client_golang/prometheus"

// Request outcomes counted by caddy_sandwake_requests_total.
const (
	outcomeProxied     = "proxied"      // sent to a running sandbox
	outcomeHeldProxied = "held_proxied" // held through a wake, then proxied
	outcomeWarming     = "warming"      // browser shown the warming page
	outcomeHoldTimeout = "hold_timeout" // held past hold_timeout: 503
	// outcomeDiskQuota: the sandbox was stopped over its disk quota and
	// requests do not wake it: 507.
	outcomeDiskQuota = "disk_quota"
	// outcomeClientRateLimited: the client's own wake budget
	// (wake_rate_per_client) was spent: 429.
	outcomeClientRateLimited = "client_rate_limited"
	// outcomeClientHeldLimit: the client already had max_held_per_client
	// requests held: 429.
	outcomeClientHeldLimit = "client_held_limit"
	outcomeNotFound        = "not_found"    // malformed host, unknown sandbox or port
	outcomeRefused         = "refused"      // creating, killed, expired, error: state page or JSON
	outcomeCapacity        = "capacity"     // admission refused
	outcomeUnavailable     = "unavailable"  // gateway not ready or Docker unreachable
	outcomeWakeFailed      = "wake_failed"  // the wake failed
	outcomeReserved        = "reserved"     // /.well-known/sandwake/*
	outcomeRobots          = "robots"       // /robots.txt answered by sandwake
	outcomeUnauthorized    = "unauthorized" // private sandbox without a valid token
	outcomeCrawler         = "crawler"      // a crawler or monitor, not woken
	outcomeUnfurl          = "unfurl"       // an unfurl bot given a sleeping sandbox's card, not woken
	outcomeBackoff         = "backoff"      // wakes of this sandbox keep failing
	outcomeRateLimited     = "rate_limited" // past wake_rate
	outcomeInterrupted     = "interrupted"  // sandwake stopped the sandbox mid-request (body partly sent): 503
	// outcomeBusy: the sandbox had max_open_per_sandbox exchanges open
	// until hold_timeout passed: 503.
	outcomeBusy = "busy"
	// cluster mode
	outcomeHostUnavailable = "host_unavailable" // the sandbox's node is lost: 503
	outcomeUnsignedForward = "unsigned_forward" // claimed to be forwarded by a node, not signed: 403
)

var (
	metricRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "sandwake", Name: "requests_total",
		Help: "Requests to preview hosts, by outcome.",
	}, []string{"outcome"})
	metricSlotWaiting = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "caddy", Subsystem: "sandwake", Name: "requests_waiting_slot",
		Help: "Requests waiting for one of their sandbox's max_open_per_sandbox slots now.",
	})
	metricWaitersCollapsed = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "sandwake", Name: "wake_waiters_collapsed_total",
		Help: "Requests that joined a wake already in flight instead of starting one.",
	})
	// Pre-resolved counters of the hot path: WithLabelValues would hash the
	// label on every request.
	requestsProxied = metricRequests.WithLabelValues(outcomeProxied)
)

func countRequest(outcome string) { metricRequests.WithLabelValues(outcome).Inc() }

// Collectors are the preview path's metrics.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{metricRequests, metricWaitersCollapsed, metricSlotWaiting}
}

// CountUnsignedForward counts a request the peer listener refused: not
// signed by the node whose certificate it came with.
func CountUnsignedForward() { countRequest(outcomeUnsignedForward) }
