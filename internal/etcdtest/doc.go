// Package etcdtest runs a real etcd cluster for tests and benchmarks: n etcd
// processes (Debian's etcd-server, /usr/bin/etcd) on loopback ports. Start
// puts their data in the test's temp dirs and kills them when the test ends;
// without the binary the test is skipped, or fails under
// SANDWAKE_REQUIRE_DOCKER=1. Launch does the same outside a test (the
// benchmark command), the caller closing the cluster.
package etcdtest
