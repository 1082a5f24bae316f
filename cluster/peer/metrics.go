package peer

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Cluster metrics; the gauges are read from the cluster at scrape time and
// absent on a single host.
var (
	metricForwarded = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "sandwake", Name: "cluster_forwarded_requests_total",
		Help: "Requests this node forwarded to the node owning the sandbox, by kind (preview, api).",
	}, []string{"kind"})
	metricClusterNodes = prometheus.NewDesc("caddy_sandwake_cluster_nodes",
		"Live nodes of the cluster (holding their lease), as this node sees them.", nil, nil)
	metricClusterLag = prometheus.NewDesc("caddy_sandwake_cluster_catalog_lag_seconds",
		"How long the oldest local change has waited to be published to the catalog.", nil, nil)
	metricClusterPending = prometheus.NewDesc("caddy_sandwake_cluster_pending",
		"Local changes waiting to be published to the catalog.", nil, nil)
	metricClusterEtcdErrors = prometheus.NewDesc("caddy_sandwake_cluster_etcd_errors_total",
		"etcd calls of this node that failed.", nil, nil)
	metricCatalogRepairs = prometheus.NewDesc("caddy_sandwake_catalog_repairs_total",
		"Catalog entries of this node's sandboxes that differed from its records (forged, moved or put back in etcd) and were written back.", nil, nil)
	metricCatalogRejected = prometheus.NewDesc("caddy_sandwake_catalog_rejected_total",
		"Catalog entries this node read and ignored because no node of the cluster signed them.", nil, nil)

	metricForwardedPreview = metricForwarded.WithLabelValues("preview")
	metricForwardedAPI     = metricForwarded.WithLabelValues("api")
)

// clusterCollector reports the cluster's figures at scrape time: of the
// node node returns (nil: none, nothing is reported).
type clusterCollector struct{ node func() *Node }

func (clusterCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- metricClusterNodes
	ch <- metricClusterLag
	ch <- metricClusterPending
	ch <- metricClusterEtcdErrors
	ch <- metricCatalogRepairs
	ch <- metricCatalogRejected
}

func (cc clusterCollector) Collect(ch chan<- prometheus.Metric) {
	n := cc.node()
	if n == nil {
		return
	}
	st := n.Stats()
	ch <- prometheus.MustNewConstMetric(metricClusterNodes, prometheus.GaugeValue, float64(st.LiveNodes))
	ch <- prometheus.MustNewConstMetric(metricClusterLag, prometheus.GaugeValue, st.OldestPending.Seconds())
	ch <- prometheus.MustNewConstMetric(metricClusterPending, prometheus.GaugeValue, float64(st.Pending))
	ch <- prometheus.MustNewConstMetric(metricClusterEtcdErrors, prometheus.CounterValue, float64(st.EtcdErrors))
	ch <- prometheus.MustNewConstMetric(metricCatalogRepairs, prometheus.CounterValue, float64(st.Repairs))
	ch <- prometheus.MustNewConstMetric(metricCatalogRejected, prometheus.CounterValue, float64(st.RejectedEntries))
}

// Collectors are the cluster's metrics, of the node node returns.
func Collectors(node func() *Node) []prometheus.Collector {
	return []prometheus.Collector{metricForwarded, clusterCollector{node}}
}

// CountForwardedPreview counts a preview request this node forwarded to the
// sandbox's owner.
func CountForwardedPreview() { metricForwardedPreview.Inc() }
