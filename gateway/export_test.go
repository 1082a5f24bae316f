package gateway

// MetricDiskQuotaStops is read by the external tests.
var MetricDiskQuotaStops = metricDiskQuotaStops
