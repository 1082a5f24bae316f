package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sandwake/sandwake/internal/kubetest"
)

// kubeReplicasTitle is the replicas cell's table's title.
const kubeReplicasTitle = kubeTitlePrefix + "replicas: straight to the owner replica (baseline) vs forwarded through the other"

// replicasDomain is the preview domain of the bench's install.
const replicasDomain = "bench.test"

// kubeReplicas installs deploy/kubernetes (two replicas joined in one
// cluster on Leases) in a namespace of the run, as TestKubernetesInstall
// does, creates a sandbox and compares a small GET sent straight to the
// replica that owns it with the same GET through the other replica (which
// forwards it over mutual TLS, signed), as the cluster scenario does
// between Docker nodes. The CPU per request is the two gateway pods'
// (their cgroups).
func (b *bench) kubeReplicas(ctx context.Context, kb *kubeBench) (*table, error) {
	root, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(root, "deploy", "kubernetes", "kustomization.yaml")); err != nil {
		return nil, fmt.Errorf("the replicas cell installs deploy/kubernetes: run the bench from the repository's root (%w)", err)
	}
	ns := "bench-replicas-" + kb.suffix
	if err := kb.namespace(ctx, ns); err != nil {
		return nil, err
	}
	ref := "sandwake.local/gateway:bench-" + kb.suffix
	progress("kubernetes: replicas: building the gateway image (make image's) and importing it")
	dir := filepath.Join(b.tmp, "replicas")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	remove, err := kb.cl.GatewayImage(ctx, b.cli, root, ref, dir)
	defer func() {
		if err := remove(); err != nil {
			fmt.Fprintln(os.Stderr, "sandwake-bench:", err)
		}
	}()
	if err != nil {
		return nil, err
	}
	apiServer, stop, err := kb.cl.StartAPIForward()
	if err != nil {
		return nil, err
	}
	defer stop()
	in := kubetest.Install{Root: root, Namespace: ns, Image: ref, StorageClass: kb.cl.StorageClass, Domain: replicasDomain, APIServer: apiServer, ExtraSites: floorSite}
	installed, err := in.Apply(ctx, kb.cl, kb.cs, dir, []string{"sandwake-0", "sandwake-1"}, 5*time.Minute)
	if err != nil {
		return nil, err
	}
	pods, token := installed.Pods, installed.Token

	id := "r" + kb.suffix
	progress("kubernetes: replicas: both Ready; creating sandbox %s through sandwake-0", id)
	body, _ := json.Marshal(map[string]any{"id": id, "image": kb.image, "ports": []int{8080}})
	hr, _ := http.NewRequestWithContext(ctx, "POST", "http://"+net.JoinHostPort(pods["sandwake-0"].Status.PodIP, "8081")+"/v1/sandboxes", strings.NewReader(string(body)))
	hr.Header.Set("Authorization", "Bearer "+token)
	resp, err := (&http.Client{Timeout: 2 * time.Minute}).Do(hr)
	if err != nil {
		return nil, err
	}
	rb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var rec struct{ Node, State string }
	if json.Unmarshal(rb, &rec); resp.StatusCode != http.StatusCreated || pods[rec.Node] == nil {
		return nil, fmt.Errorf("create %s: %d %s", id, resp.StatusCode, rb)
	}
	owner, other := rec.Node, "sandwake-0"
	if owner == other {
		other = "sandwake-1"
	}

	cfg := hotPathConfig{perSide: b.o.perSide, warmup: 500 * time.Millisecond, rounds: 3, concs: []int{1, 16, 128}}
	if b.o.quick {
		cfg.warmup, cfg.rounds = 250*time.Millisecond, 2
	}
	if cfg.perSide == 0 {
		cfg.perSide = 3 * time.Second
		if b.o.quick {
			cfg.perSide = time.Second
		}
	}
	req := request{name: "GET /healthz (3 B)", method: "GET", path: "/healthz", wantLen: 3}
	url := fmt.Sprintf("http://s-%s-8080.preview.%s", id, replicasDomain)
	direct, fwd := podClient(pods[owner].Status.PodIP, 8080, 128, ""), podClient(pods[other].Status.PodIP, 8080, 128, "")
	floor := podClient(pods[other].Status.PodIP, floorPort, 128, net.JoinHostPort(pods[owner].Status.PodIP, "8080"))
	// The other replica routes to the owner once its catalog has the
	// entry: one answer through it first.
	var last string
	if err := poll(ctx, 30*time.Second, func() bool {
		r := load(ctx, fwd, url, req, 1, 50*time.Millisecond)
		last = fmt.Sprint(r.err)
		return r.ok > 0 && r.bad == 0
	}, func() string { return "no answer through " + other + ": " + last }); err != nil {
		return nil, err
	}
	cpu := func() time.Duration {
		var sum time.Duration
		for _, p := range pods {
			d, _ := podCPU(p)
			sum += d
		}
		return sum
	}
	if _, err := podCPU(pods[owner]); err != nil {
		progress("kubernetes: replicas: no CPU per request (%v)", err)
	}
	t := &table{
		title: kubeReplicasTitle,
		sides: [2]string{"direct", "forwarded"},
		note: fmt.Sprintf("deploy/kubernetes installed with kubectl apply -k (2 replicas, cluster on Leases); sandbox on %s, GET sent to its preview port vs to %s's (which forwards it over mutual TLS, signed); the two-proxy floor: %s's plain reverse_proxy site (no TLS, no signature; the bench's, added to the install's Caddyfile) in front of %s's preview port; %s per side per cell after %s warm-up, alternated in %d slices; CPU = both gateway pods' cgroups; ratio = forwarded / direct, or forwarded / floor",
			owner, other, other, owner, cfg.perSide, cfg.warmup, cfg.rounds),
	}
	for _, conc := range cfg.concs {
		res := alternate(ctx, cfg, req, conc, cpu, []side{{direct, url}, {fwd, url}, {floor, url}})
		if ctx.Err() != nil {
			return t, ctx.Err()
		}
		d, f, fl := res[0], res[1], res[2]
		if d.bad > 0 || f.bad > 0 || fl.bad > 0 || d.ok == 0 || f.ok == 0 || fl.ok == 0 {
			return t, fmt.Errorf("replicas, c=%d: direct %d failed (%v), forwarded %d failed (%v), two plain proxies %d failed (%v)", conc, d.bad, d.err, f.bad, f.err, fl.bad, fl.err)
		}
		cell := fmt.Sprintf("%s c=%d", req.name, conc)
		forwardRows(t, cell, conc, d, f, "gateway CPU/request")
		t.add(ratioRow(cell+" vs the two-proxy floor: CPU/request", fl.cpuPerRequest(), f.cpuPerRequest(), fmtNanos, info))
		t.add(ratioRow(cell+" vs the two-proxy floor: p50", percentile(sortedCopy(fl.durs), 50).Seconds(), percentile(sortedCopy(f.durs), 50).Seconds(), fmtSeconds, info))
		progress("kubernetes: replicas: %s: direct %.0f, forwarded %.0f, two plain proxies %.0f req/s", cell, d.throughput(), f.throughput(), fl.throughput())
	}
	return t, nil
}

// floorPort is the port of the bench's two-proxy floor on each replica:
// a plain reverse_proxy (no TLS, no signature) to the address the
// request's floorHeader names, the owner replica's preview port.
const floorPort = 8090

// floorHeader names the floor site's upstream.
const floorHeader = "X-Bench-Upstream"

// floorSite is the floor's site, added to the install's Caddyfile.
var floorSite = fmt.Sprintf(`# sandwake-bench: the two-proxy floor (a plain reverse_proxy to the
# owner replica's preview port, named by the request).
http://:%d {
	reverse_proxy {http.request.header.%s}
}
`, floorPort, floorHeader)

// podClient is an HTTP client that dials ip's port whatever the request's
// host (the preview host names the sandbox), and with upstream (not "")
// names it in floorHeader.
func podClient(ip string, port, conns int, upstream string) *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second}
	target := net.JoinHostPort(ip, strconv.Itoa(port))
	var rt http.RoundTripper = &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, target)
		},
		MaxIdleConnsPerHost: conns,
		DisableCompression:  true,
		Proxy:               nil,
	}
	if upstream != "" {
		rt = headerTransport{rt, floorHeader, upstream}
	}
	return &http.Client{
		Transport:     rt,
		Timeout:       2 * time.Minute,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// podCPU is the CPU time pod p's containers used so far, from its cgroup
// (cgroup v1, the kubelet's cgroupfs layout: kubepods[/<qos>]/pod<uid>).
func podCPU(p *corev1.Pod) (time.Duration, error) {
	for _, qos := range []string{"burstable/", "besteffort/", ""} {
		b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpuacct/kubepods", qos+"pod"+string(p.UID), "cpuacct.usage"))
		if err != nil {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return 0, err
		}
		return time.Duration(n), nil
	}
	return 0, fmt.Errorf("no cgroup v1 cpuacct for pod %s (uid %s)", p.Name, p.UID)
}

// headerTransport sets a header on every request it sends.
type headerTransport struct {
	http.RoundTripper
	name, value string
}

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(h.name, h.value)
	return h.RoundTripper.RoundTrip(r)
}
