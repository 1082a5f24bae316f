// Command sandwake-bench runs sandwake's side-by-side benchmarks on this
// machine, each against its baseline in the same run, and prints one table per
// scenario (baseline, sandwake, ratio, goal):
//
//   - hot path: plain reverse_proxy to the container's address vs
//     sandwake_preview, same Caddy, same container, and a plain reverse_proxy
//     to a twin's port published through Docker's userland proxy;
//     throughput, p50 and p99 for a small GET and a 1 MiB POST at
//     concurrency 1, 16 and 128;
//   - wake latency: raw Docker unpause / start plus the first byte at the
//     container's address vs the first byte through sandwake, from paused and
//     from stopped;
//   - create: create → first byte at the preview URL for a pool hit (paused
//     and running pools) and a cold create, vs raw docker create + start +
//     first byte at the container's address;
//   - wake storm: concurrent requests to a stopped sandbox (Docker start calls,
//     answers, p50, p99), each round followed by the same storm at the
//     sandbox running (the floor: what the machine takes to answer that many
//     requests with no wake);
//   - scale: 10,000 records (gate lookup, reaper pass, boot reconcile, memory
//     per sandbox) and real containers woken in sequence and at once;
//   - cluster: a 3-member etcd and three Caddy nodes; a small GET forwarded
//     through another gateway vs straight to the owner (c=1, 16, 128), and
//     a wake storm spread over the three gateways vs all on the owner
//     (Docker start calls, answers, time to the last answer, p50, p99);
//     skipped when etcd is not installed, unless asked for with --only;
//   - kubernetes (with --only kubernetes, or when a cluster is configured:
//     --kubeconfig, default $SANDWAKE_KUBECONFIG): a gateway with engine
//     kubernetes on a real cluster; wake from stopped through sandwake vs a
//     raw pod create → running → first byte at the pod's IP, a 1,000-request
//     wake storm (pods made counted from a watch), the hot path vs a plain
//     reverse_proxy to the pod's IP, in-place resize as a pause tier (CPU
//     cut to 1m and given back), and the informers' heap per sandbox over
//     10,000 pending pods and their claims;
//   - soak (only with --only soak): clients posting random bodies to random
//     sandboxes of a fleet larger than max_resident, with short idle tiers,
//     for minutes: bare 502s, wrong bodies, 503s by code, wakes per request,
//     evictions, Caddy's RSS and goroutines.
//
// Everything listens on loopback, every scenario is bounded, and everything
// the run creates on the Docker engine (image, containers, volumes, labelled
// with the run's id) is removed at the end, also after an error or Ctrl-C;
// on a cluster, its namespaces (bench-<random>) and image.
//
//	go run ./cmd/sandwake-bench [--quick] [--skip-containers] [--caddy bin/caddy]
//	    [--only hotpath,wake,storm,create,containers,egress,records,cluster,soak,kubernetes] [--profile cpu.prof]
//	    [--kubeconfig FILE --kube-pods 10000 --kube-rate 150 --kube-resize-rounds 10]
//	    [--markdown results.md] [--soak-duration 8m --soak-clients 12 …]
//
// `make bench` builds bin/caddy and runs it (BENCH_FLAGS passes flags). The
// full run takes 7–9 minutes on 2 cores; --quick takes about 2–3 (shorter
// cells, fewer wakes, one storm, 20 containers); --skip-containers leaves out
// the real-containers part, the longest. With SANDWAKE_BENCH_KEEP_LOG=<dir>,
// each gateway's Caddy log is copied there when it stops.
package main
