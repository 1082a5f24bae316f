package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sandwake/sandwake/internal/kubetest"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
	k8srt "github.com/sandwake/sandwake/lifecycle/kubernetes"
)

// This file is the kubernetes scenario: a gateway with `engine kubernetes`
// on a real cluster, each cell against its floor made of the same
// client-go calls, alternated: wake from stopped, a wake storm, the hot
// path; the pause tier (resize.go) and the informers' memory
// (informermem.go) follow.

// kubeOptions are the kubernetes scenario's flags.
type kubeOptions struct {
	kubeconfig   string
	pods         int // informer memory: sandboxes (pod and claim each)
	rate         int // informer memory: creations per second
	resizeRounds int
	cells        string // comma-separated cells to run
}

// kubeCells are the scenario's cells, in the order they run.
var kubeCells = []string{"hotpath", "wake", "storm", "replicas", "resize", "informer"}

// runs reports whether cell is among the cells asked for.
func (k kubeOptions) runs(cell string) bool {
	for _, c := range strings.Split(k.cells, ",") {
		if strings.TrimSpace(c) == cell {
			return true
		}
	}
	return false
}

// kubeTitlePrefix starts the title of every table of the scenario (the
// summary lists their goals).
const kubeTitlePrefix = "Kubernetes: "

// kubeLabel marks every object the bench makes on the cluster that is
// not a sandwake sandbox's (raw twins, the resize pod).
const kubeLabel = "sandwake-bench.run"

// kubeBench is the scenario's cluster, client and what it made there.
type kubeBench struct {
	cl     kubetest.Cluster
	cfg    *rest.Config
	cs     kubernetes.Interface
	suffix string
	ns     string // the bench's namespace: bench-<suffix>
	image  string

	namespaces []string // to delete at the end
}

// runKubernetes runs the kubernetes scenario's cells.
func (b *bench) runKubernetes(ctx context.Context) error {
	kb, err := newKubeBench(ctx, b.o.kube.kubeconfig, b.tmp)
	b.kube = kb
	if err != nil {
		return err
	}
	if v, err := kb.cs.Discovery().ServerVersion(); err == nil {
		b.machine += fmt.Sprintf(", Kubernetes %s (node on cgroup v%d)", v.GitVersion, cgroupVersion())
	}
	progress("kubernetes: namespace %s, image %s", kb.ns, kb.image)
	k := b.o.kube
	id := "k" + kb.suffix
	if k.runs("hotpath") || k.runs("wake") || k.runs("storm") || k.runs("informer") {
		if err := b.kubeGatewayCells(ctx, kb, id); err != nil {
			return err
		}
	}
	if k.runs("replicas") {
		progress("kubernetes: replicas: deploy/kubernetes in the cluster, forwarding between its two replicas")
		t, err := b.kubeReplicas(ctx, kb)
		if t != nil && len(t.rows) > 0 {
			b.show(t)
		}
		if err != nil {
			return err
		}
	}
	if k.runs("resize") {
		progress("kubernetes: in-place resize (a pause tier?)")
		t, err := resizeTier(ctx, kb, k.resizeRounds)
		if t != nil && len(t.rows) > 0 {
			b.show(t)
		}
		if err != nil {
			return err
		}
	}
	if k.runs("informer") {
		progress("kubernetes: informer memory at %d sandboxes", k.pods)
		t, err := informerMemory(ctx, kb, id, k.pods, k.rate)
		if t != nil && len(t.rows) > 0 {
			b.show(t)
		}
		return err
	}
	return nil
}

// kubeGatewayCells starts the gateway, creates sandbox id (the informer
// cell's template too) and runs the cells through the gateway.
func (b *bench) kubeGatewayCells(ctx context.Context, kb *kubeBench, id string) error {
	k := b.o.kube
	g, err := b.startKubeGateway(ctx, kb)
	if err != nil {
		return err
	}
	defer g.stop()
	progress("kubernetes: gateway up, creating sandbox %s (claim bound at its first start)", id)
	// 1 GiB: 128 concurrent 1 MiB echoes must fit.
	if err := g.createSandbox(ctx, id, kb.image, 1024); err != nil {
		return err
	}

	cfg := hotPathConfig{perSide: b.o.perSide, warmup: 500 * time.Millisecond, rounds: 3, concs: []int{1, 16, 128},
		title: kubeTitlePrefix + "hot path: plain reverse_proxy to the pod's IP (baseline) vs sandwake_preview",
		what:  "baseline and sandwake reach the same pod at its IP"}
	if b.o.quick {
		cfg.warmup, cfg.rounds = 250*time.Millisecond, 2
	}
	if k.runs("hotpath") {
		if err := kubeHotPath(ctx, b, kb, g, id, cfg); err != nil {
			return err
		}
	}
	var oneWake time.Duration
	if k.runs("wake") {
		t, w, err := kubeWake(ctx, kb, g, id, b.o.wakes)
		if err != nil {
			return err
		}
		b.show(t)
		oneWake = w
	}
	if k.runs("wake") {
		t, err := kubePausedWake(ctx, g, id, b.o.wakes)
		if err != nil {
			return err
		}
		b.show(t)
	}
	if k.runs("storm") {
		t, err := kubeStorm(ctx, kb, g, id, b.o.stormN, b.o.stormRounds, oneWake)
		if t != nil && len(t.rows) > 0 {
			b.show(t)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// newKubeBench connects to the cluster, makes the bench's namespace and
// imports the testapp image. The kubeBench is returned also with an
// error, for its cleanup.
func newKubeBench(ctx context.Context, kubeconfig, tmp string) (*kubeBench, error) {
	cl, _ := kubetest.FromEnv()
	cl.Kubeconfig = kubeconfig
	if cl.Sock == "" || cl.Bridge == "" {
		return nil, errors.New("the kubernetes scenario needs SANDWAKE_K8S_CONTAINERD_SOCK and SANDWAKE_K8S_BRIDGE (scripts/kubernetes/up.sh writes them to its env file: set -a; . /tmp/sandwake-k8s/env; set +a)")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	// sandwake's own client settings (lifecycle/kubernetes): the floor
	// makes its calls as fast as sandwake does.
	cfg.QPS, cfg.Burst = 100, 200
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	kb := &kubeBench{cl: cl, cfg: cfg, cs: cs, suffix: kubetest.Suffix()}
	kb.ns = "bench-" + kb.suffix
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := cs.Discovery().ServerVersion(); err != nil {
		return kb, fmt.Errorf("kubernetes API server at %s not usable: %w", cfg.Host, err)
	}
	if err := kb.namespace(pctx, kb.ns); err != nil {
		return kb, err
	}
	dir := filepath.Join(tmp, "kube-image")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return kb, err
	}
	progress("kubernetes: building the testapp image and importing it into the cluster's containerd")
	ictx, icancel := context.WithTimeout(ctx, 3*time.Minute)
	defer icancel()
	if kb.image, err = cl.ImportTestApp(ictx, dir); err != nil {
		return kb, err
	}
	return kb, nil
}

// namespace makes namespace ns, deleted at the end.
func (kb *kubeBench) namespace(ctx context.Context, ns string) error {
	_, err := kb.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{kubeLabel: testenv.RunID()}}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating namespace %s: %w", ns, err)
	}
	kb.namespaces = append(kb.namespaces, ns)
	return nil
}

// cleanup deletes the bench's namespaces (with everything in them) and its
// image, and waits a while for the namespaces to go.
func (kb *kubeBench) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, ns := range kb.namespaces {
		kb.releaseClaims(ctx, ns)
		err := kb.cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			fmt.Fprintf(os.Stderr, "sandwake-bench: deleting namespace %s: %v\n", ns, err)
		}
	}
	for _, ns := range kb.namespaces {
		for {
			_, err := kb.cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				progress("kubernetes: namespace %s deleted", ns)
				break
			}
			if ctx.Err() != nil {
				progress("kubernetes: namespace %s still terminating after 3 min (deleted in the background)", ns)
				break
			}
			time.Sleep(time.Second)
		}
	}
	if kb.image != "" {
		if err := kb.cl.RemoveImage(kb.image); err != nil {
			fmt.Fprintln(os.Stderr, "sandwake-bench:", err)
		}
	}
}

// releaseClaims removes the protection finalizer of namespace ns's claims
// that were never bound (the informer cell's thousands), and deletes them:
// the cluster's pvc-protection controller releases them one at a time,
// about 2 a second on this machine, and a namespace of 10,000 would take
// over an hour to go (and hold up the local-path provisioner meanwhile). A
// bound claim keeps its finalizer: its volume may still be in use.
func (kb *kubeBench) releaseClaims(ctx context.Context, ns string) {
	claims := kb.cs.CoreV1().PersistentVolumeClaims(ns)
	list, err := claims.List(ctx, metav1.ListOptions{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "sandwake-bench: listing the claims of %s: %v\n", ns, err)
		return
	}
	names := make(chan string)
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range names {
				claims.Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
				// One by one: the namespace controller's delete of them as
				// a collection times out at the API server, as the pods'.
				claims.Delete(ctx, name, metav1.DeleteOptions{})
			}
		}()
	}
	n := 0
	for _, c := range list.Items {
		if c.Spec.VolumeName == "" {
			names <- c.Name
			n++
		}
	}
	close(names)
	wg.Wait()
	if n > 100 {
		progress("kubernetes: %d unbound claims of %s released and deleted", n, ns)
	}
}

// startKubeGateway starts a gateway of the bench's Caddy whose engine is
// the cluster, in the bench's namespace.
func (b *bench) startKubeGateway(ctx context.Context, kb *kubeBench) (*gateway, error) {
	g, err := newGateway(b.o.caddy, filepath.Join(b.tmp, "kube-gateway"), true)
	if err != nil {
		return nil, err
	}
	class := ""
	if kb.cl.StorageClass != "" {
		class = "\n\tstorage_class " + kb.cl.StorageClass
	}
	g.unlabelled = true
	g.extra = fmt.Sprintf("instance bench-%s\negress unenforced\nengine kubernetes {\n\tkubeconfig %s\n\tnamespace %s\n\tvolume_size 64Mi%s\n}",
		kb.suffix, kb.cl.Kubeconfig, kb.ns, class)
	b.gateways = append(b.gateways, g)
	if err := g.start(ctx, g.apiReady); err != nil {
		return nil, err
	}
	return g, nil
}

// podAddr is the address of port 8080 of pod name, checked to be on the
// cluster's bridge.
func (kb *kubeBench) podAddr(ctx context.Context, name string) (string, error) {
	pod, err := kb.cs.CoreV1().Pods(kb.ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	if err := kb.cl.CheckOnBridge(pod.Status.PodIP); err != nil {
		return "", err
	}
	return net.JoinHostPort(pod.Status.PodIP, "8080"), nil
}

// kubeHotPath runs the hot path against sandbox id's pod: the baseline
// site proxies to the pod's IP.
func kubeHotPath(ctx context.Context, b *bench, kb *kubeBench, g *gateway, id string, cfg hotPathConfig) error {
	addr, err := kb.podAddr(ctx, k8srt.PodName(id))
	if err != nil {
		return err
	}
	g.baseTo = addr
	if err := g.reload(ctx); err != nil {
		return err
	}
	progress("kubernetes: hot path, baseline reverse_proxy %s", addr)
	t, err := hotPath(ctx, g, id, cfg)
	if t != nil && len(t.rows) > 0 {
		b.show(t)
	}
	return err
}

// rawPod is the floor of a wake from stopped: a twin of a sandbox's pod
// (the pod sandwake keeps on its claim: same image, limits, security
// context) with a claim of its own of the same class and size, made and
// deleted by plain client-go calls.
type rawPod struct {
	kb   *kubeBench
	pod  *corev1.Pod
	addr string
}

// newRawPod makes the twin's claim (the pod is made by start).
func newRawPod(ctx context.Context, kb *kubeBench, id string) (*rawPod, error) {
	claim, err := kb.cs.CoreV1().PersistentVolumeClaims(kb.ns).Get(ctx, k8srt.ClaimName(id), metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var pod corev1.Pod
	if err := json.Unmarshal([]byte(claim.Annotations[k8srt.AnnotationPod]), &pod); err != nil {
		return nil, fmt.Errorf("the pod kept on claim %s: %w", claim.Name, err)
	}
	name := "raw-" + kb.suffix
	labels := map[string]string{kubeLabel: testenv.RunID()}
	pod.Name, pod.Labels, pod.Annotations, pod.ResourceVersion = name, labels, nil, ""
	pod.Spec.Hostname = name
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			v.PersistentVolumeClaim.ClaimName = name + "-data"
		}
	}
	twin := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-data", Labels: labels},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      claim.Spec.AccessModes,
			Resources:        claim.Spec.Resources,
			StorageClassName: claim.Spec.StorageClassName,
		},
	}
	if _, err := kb.cs.CoreV1().PersistentVolumeClaims(kb.ns).Create(ctx, twin, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("creating the raw twin's claim: %w", err)
	}
	return &rawPod{kb: kb, pod: &pod}, nil
}

// watchPod opens a watch of pod name in namespace ns from now on.
func watchPod(ctx context.Context, cs kubernetes.Interface, ns, name string) (watch.Interface, error) {
	sel := "metadata.name=" + name
	list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return nil, err
	}
	return cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
}

// untilPod reads w until done says so of a pod, within ctx.
func untilPod(ctx context.Context, w watch.Interface, what string, done func(ev watch.EventType, pod *corev1.Pod) (bool, error)) error {
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case ev, ok := <-w.ResultChan():
			if !ok {
				return fmt.Errorf("waiting for %s: the watch ended", what)
			}
			if ev.Type == watch.Error {
				return fmt.Errorf("waiting for %s: %v", what, apierrors.FromObject(ev.Object))
			}
			pod, isPod := ev.Object.(*corev1.Pod)
			if !isPod {
				continue
			}
			if ok, err := done(ev.Type, pod); err != nil || ok {
				return err
			}
		}
	}
}

// appRunning reports whether pod's app container runs and the pod has its
// IP: what sandwake's Start waits for (the pod has no readiness probe, so
// the kubelet reports it Ready with the same status).
func appRunning(pod *corev1.Pod) bool {
	if pod.Status.PodIP == "" {
		return false
	}
	for _, s := range pod.Status.ContainerStatuses {
		if s.State.Running != nil {
			return true
		}
	}
	return false
}

// start is the raw wake from stopped: create the pod, follow it through a
// watch opened before until it runs with its IP, then the first byte of
// an HTTP answer at its address polled from 5 ms (sandwake's own poll).
// It returns the time from the create to that byte.
func (r *rawPod) start(ctx context.Context) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	w, err := watchPod(ctx, r.kb.cs, r.kb.ns, r.pod.Name)
	if err != nil {
		return 0, err
	}
	defer w.Stop()
	t0 := time.Now()
	if _, err := r.kb.cs.CoreV1().Pods(r.kb.ns).Create(ctx, r.pod, metav1.CreateOptions{}); err != nil {
		return 0, fmt.Errorf("creating the raw twin pod: %w", err)
	}
	var ip string
	if err := untilPod(ctx, w, "the raw twin pod to run", func(_ watch.EventType, pod *corev1.Pod) (bool, error) {
		if pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
			return false, fmt.Errorf("the raw twin pod ended: %s", pod.Status.Phase)
		}
		ip = pod.Status.PodIP
		return appRunning(pod), nil
	}); err != nil {
		return 0, err
	}
	if err := r.kb.cl.CheckOnBridge(ip); err != nil {
		return 0, err
	}
	r.addr = net.JoinHostPort(ip, "8080")
	spec := lifecycle.Spec{Ports: []int{8080}, ReadyMode: lifecycle.ReadyHTTP}
	if err := lifecycle.WaitReady(ctx, r.addr, &spec); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

// stop deletes the raw twin pod with sandwake's grace period (the bench's
// stop_timeout) and waits until it is gone.
func (r *rawPod) stop(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	w, err := watchPod(ctx, r.kb.cs, r.kb.ns, r.pod.Name)
	if err != nil {
		return err
	}
	defer w.Stop()
	grace := int64(2)
	err = r.kb.cs.CoreV1().Pods(r.kb.ns).Delete(ctx, r.pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	return untilPod(ctx, w, "the raw twin pod to be gone", func(ev watch.EventType, _ *corev1.Pod) (bool, error) {
		return ev == watch.Deleted, nil
	})
}

// kubeWake times, alternately, the floor (raw twin: pod create → running
// → first byte at its IP) and a wake through sandwake (stop through the
// API, then a held GET at the preview host, timed to its first byte). It
// returns the table and the floor's median, one wake for the storm.
func kubeWake(ctx context.Context, kb *kubeBench, g *gateway, id string, n int) (*table, time.Duration, error) {
	raw, err := newRawPod(ctx, kb, id)
	if err != nil {
		return nil, 0, err
	}
	c := loopbackClient(4)
	url := g.previewURL(id, "/healthz")
	if _, err := firstByte(ctx, c, url); err != nil { // a warm connection to Caddy
		return nil, 0, err
	}
	var rawT, swT []time.Duration
	var engine0 wakeMetric
	// One untimed round first: the raw claim is bound at its first pod.
	for i := -1; i < n; i++ {
		if i == 0 {
			engine0, _ = g.wakeMetric(ctx, "stopped")
		}
		d, err := raw.start(ctx)
		if err != nil {
			return nil, 0, fmt.Errorf("raw wake from stopped: %w", err)
		}
		if err := raw.stop(ctx); err != nil {
			return nil, 0, fmt.Errorf("raw stop: %w", err)
		}
		if err := g.act(ctx, id, "stop", "stopped"); err != nil {
			return nil, 0, err
		}
		s, err := firstByte(ctx, c, url)
		if err != nil {
			return nil, 0, fmt.Errorf("wake from stopped through sandwake: %w", err)
		}
		if i >= 0 {
			rawT, swT = append(rawT, d), append(swT, s)
		}
		if i%5 == 4 {
			progress("kubernetes: wake %d/%d: raw p50 %s, sandwake p50 %s", i+1, n, fmtDuration(percentile(sortedCopy(rawT), 50)), fmtDuration(percentile(sortedCopy(swT), 50)))
		}
	}
	t := &table{
		title: kubeTitlePrefix + "wake from stopped: raw pod create → running → first byte at its IP (floor) vs first byte through sandwake",
		note: fmt.Sprintf("%d wakes of each, alternated (floor, sandwake, …); floor = a twin of the sandbox's pod (same spec, its own claim of the same class and size) created with client-go, followed by a watch until it runs with its IP, then a GET at its IP polled from 5 ms; sandwake = stop through the API, then a held GET at the preview host",
			n),
	}
	rs, ss := sortedCopy(rawT), sortedCopy(swT)
	t.add(ratioRow("from stopped, p50", percentile(rs, 50).Seconds(), percentile(ss, 50).Seconds(), fmtSeconds, atMost(1.10)))
	t.add(ratioRow("from stopped, mean", mean(rs).Seconds(), mean(ss).Seconds(), fmtSeconds, info))
	t.add(ratioRow("from stopped, p90", percentile(rs, 90).Seconds(), percentile(ss, 90).Seconds(), fmtSeconds, info))
	t.add(ratioRow("from stopped, max", rs[len(rs)-1].Seconds(), ss[len(ss)-1].Seconds(), fmtSeconds, info))
	if m, err := g.wakeMetric(ctx, "stopped"); err == nil && m.count > engine0.count {
		d := time.Duration((m.sum - engine0.sum) / (m.count - engine0.count) * float64(time.Second))
		t.add(ratioRow("from stopped, of which the engine's wake, mean", mean(rs).Seconds(), d.Seconds(), fmtSeconds, info))
	}
	return t, percentile(rs, 50), nil
}

// kubePausedWake pauses sandbox id through the API (its pod's CPU cut in
// place) and times a held GET through sandwake to its first byte, n
// times: the pause tier's wake (the resize cell measures the kubelet's
// side of it).
func kubePausedWake(ctx context.Context, g *gateway, id string, n int) (*table, error) {
	c := loopbackClient(4)
	url := g.previewURL(id, "/healthz")
	var ts []time.Duration
	for range n {
		if err := g.act(ctx, id, "pause", "paused"); err != nil {
			return nil, err
		}
		d, err := firstByte(ctx, c, url)
		if err != nil {
			return nil, fmt.Errorf("wake from paused through sandwake: %w", err)
		}
		ts = append(ts, d)
	}
	t := &table{
		title: kubeTitlePrefix + "wake from paused (CPU cut in place): first byte through sandwake",
		note:  fmt.Sprintf("%d rounds: pause through the API (PATCH pods/resize to cpu 1m, until the informer reads it), then a held GET at the preview host; the wake PATCHes the CPU back and forwards as soon as the API server took it", n),
	}
	s := sortedCopy(ts)
	t.add(valueRow("wake from paused, p50", "", percentile(s, 50).Seconds(), fmtSeconds, goal{op: "<=", limit: resizeWakeGoal.Seconds(), format: fmtSeconds}))
	t.add(valueRow("wake from paused, p90", "", percentile(s, 90).Seconds(), fmtSeconds, info))
	t.add(valueRow("wake from paused, max", "", s[len(s)-1].Seconds(), fmtSeconds, info))
	progress("kubernetes: wake from paused: p50 %s p90 %s", fmtDuration(percentile(s, 50)), fmtDuration(percentile(s, 90)))
	return t, nil
}

// kubeStorm fires n concurrent held GETs at sandbox id stopped, rounds
// times, counting the pods made (ADDED events of a watch on its pod), then
// the same storm at it running (the floor of the storm itself).
func kubeStorm(ctx context.Context, kb *kubeBench, g *gateway, id string, n, rounds int, oneWake time.Duration) (*table, error) {
	t := &table{
		title: fmt.Sprintf("%swake storm: %s concurrent GETs to a stopped sandbox", kubeTitlePrefix, groupThousands(int64(n))),
		note:  "held requests (no Accept: text/html); pods made counted from ADDED events of a watch on the sandbox's pod; one wake = the floor's p50 of the wake cell (raw pod create → first byte)",
	}
	url := func(int) string { return g.previewURL(id, "/healthz") }
	var all, hot []time.Duration
	for r := range rounds {
		if err := g.act(ctx, id, "stop", "stopped"); err != nil {
			return t, err
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		w, err := watchPod(wctx, kb.cs, kb.ns, k8srt.PodName(id))
		if err != nil {
			cancel()
			return t, err
		}
		var added atomic.Int32
		watching := make(chan struct{})
		go func() {
			defer close(watching)
			for ev := range w.ResultChan() {
				if ev.Type == watch.Added {
					added.Add(1)
				}
			}
		}()
		res := fireRequests(ctx, loopbackClient(n), url, n, nil)
		// The ADDED event may trail the answers.
		for deadline := time.Now().Add(10 * time.Second); added.Load() == 0 && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(500 * time.Millisecond)
		w.Stop()
		<-watching
		cancel()
		warm := fireRequests(ctx, loopbackClient(n), url, n, nil)
		for what, k := range res.failures {
			fmt.Printf("   round %d: %d requests got %s\n", r+1, k, what)
		}
		for what, k := range warm.failures {
			fmt.Printf("   round %d, sandbox running: %d requests got %s\n", r+1, k, what)
		}
		label := fmt.Sprintf("round %d: ", r+1)
		t.add(valueRow(label+"pods made", "", float64(added.Load()), fmtCount, exactly(1)))
		t.add(valueRow(label+"answered 200", "", float64(res.answered), fmtCount, exactly(float64(n))))
		all, hot = append(all, res.durs...), append(hot, warm.durs...)
		ds := sortedCopy(res.durs)
		progress("kubernetes: wake storm round %d: %d pods made, %d/%d answered 200, p50 %s p99 %s; running: p99 %s",
			r+1, added.Load(), res.answered, n, fmtDuration(percentile(ds, 50)), fmtDuration(percentile(ds, 99)), fmtDuration(percentile(sortedCopy(warm.durs), 99)))
	}
	ds, hs := sortedCopy(all), sortedCopy(hot)
	p99 := percentile(ds, 99)
	t.add(valueRow("p50 time to answer, all rounds", "", percentile(ds, 50).Seconds(), fmtSeconds, info))
	t.add(valueRow("p99, same storm at the running sandbox (no wake)", "", percentile(hs, 99).Seconds(), fmtSeconds, info))
	if oneWake == 0 { // the wake cell did not run
		t.add(valueRow("p99 time to answer", "", p99.Seconds(), fmtSeconds, info))
		return t, nil
	}
	t.add(ratioRow("p99 time to answer vs one wake", oneWake.Seconds(), p99.Seconds(), fmtSeconds, atMost(1.5)))
	t.add(ratioRow("p99 time to answer vs one wake + running storm p99", (oneWake + percentile(hs, 99)).Seconds(), p99.Seconds(), fmtSeconds, info))
	return t, nil
}

// kubeGet sends GET path to addr (a pod's) and returns the answer's body.
func kubeGet(ctx context.Context, addr, path string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+addr+path, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return string(b), err
}
