package main

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	k8srt "github.com/sandwake/sandwake/lifecycle/kubernetes"
)

// This file measures what the kubernetes runtime's informers hold per
// sandbox: n sandboxes' pods and claims, made like sandwake's (the pod a
// real sandbox keeps on its claim, renamed), for an instance of the bench
// in a namespace of its own; the pods select a node that does not exist,
// so they stay pending and cost no node anything. The heap (after a
// collection) of a Runtime whose informers have synced over them, against
// before, divided by n.

// informerMemGoal is the heap the informers may hold per sandbox.
const informerMemGoal = 4 << 10

// informerCreateBudget bounds the time spent creating objects: the cell
// measures over what exists then.
const informerCreateBudget = 4 * time.Minute

// informerMemory runs the cell; id is the bench's sandbox, whose pod and
// claim are the templates.
func informerMemory(ctx context.Context, kb *kubeBench, id string, n, rate int) (*table, error) {
	t := &table{
		title: kubeTitlePrefix + "informer memory per sandbox (pod + claim)",
		note: fmt.Sprintf("%d sandboxes (a pending pod and a claim each, made like sandwake's, nodeSelector unsatisfiable) created at up to %d objects/s; heap after GC of a lifecycle/kubernetes Runtime's informers (its transform: managedFields dropped) synced over them, minus before, per sandbox",
			n, rate),
	}
	claim, err := kb.cs.CoreV1().PersistentVolumeClaims(kb.ns).Get(ctx, k8srt.ClaimName(id), metav1.GetOptions{})
	if err != nil {
		return t, err
	}
	var tmpl corev1.Pod
	if err := json.Unmarshal([]byte(claim.Annotations[k8srt.AnnotationPod]), &tmpl); err != nil {
		return t, fmt.Errorf("the pod kept on claim %s: %w", claim.Name, err)
	}
	ns := kb.ns + "-mem"
	if err := kb.namespace(ctx, ns); err != nil {
		return t, err
	}
	instance := "bench-mem-" + kb.suffix
	cfg := *kb.cfg
	cfg.QPS, cfg.Burst = float32(rate), rate
	cs, err := kubernetes.NewForConfig(&cfg)
	if err != nil {
		return t, err
	}

	// Create, a few workers at a bounded rate, within the budget.
	cctx, cancel := context.WithTimeout(ctx, informerCreateBudget)
	defer cancel()
	var made atomic.Int64
	var firstErr error
	var errOnce sync.Once
	next := make(chan int)
	var wg sync.WaitGroup
	t0 := time.Now()
	// Enough workers that the API server's latency, not their number,
	// bounds the rate below the limiter's.
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := createSandboxObjects(cctx, cs, ns, instance, fmt.Sprintf("m%s-%05d", kb.suffix, i), &tmpl, claim); err != nil {
					errOnce.Do(func() { firstErr = err })
					cancel()
					return
				}
				if m := made.Add(1); m%2000 == 0 {
					progress("kubernetes: informer memory: %d sandboxes created", m)
				}
			}
		}()
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-cctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	created := int(made.Load())
	createTime := time.Since(t0)
	if created == 0 {
		return t, fmt.Errorf("informer memory: no sandbox created: %v", firstErr)
	}
	if created < n {
		progress("kubernetes: informer memory: %d of %d sandboxes created in %s (%v); measuring over those", created, n, createTime.Round(time.Second), firstErr)
	}

	// The informers' fixed cost: a Runtime over an instance with no
	// objects.
	heap := func() uint64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	synced := func(inst string) (*k8srt.Runtime, time.Duration, error) {
		r, err := k8srt.New(k8srt.Options{Kubeconfig: kb.cl.Kubeconfig, Namespace: ns, Instance: inst})
		if err != nil {
			return nil, 0, err
		}
		sctx, scancel := context.WithTimeout(ctx, 3*time.Minute)
		defer scancel()
		s0 := time.Now()
		if err := r.StartInformers(sctx); err != nil {
			r.Close()
			return nil, 0, err
		}
		return r, time.Since(s0), nil
	}
	h0 := heap()
	empty, _, err := synced("bench-none-" + kb.suffix)
	if err != nil {
		return t, err
	}
	h1 := heap()
	empty.Close()
	h2 := heap()
	r, syncTime, err := synced(instance)
	if err != nil {
		return t, err
	}
	h3 := heap()
	listed, err := r.List(ctx)
	runtime.KeepAlive(r)
	r.Close()
	if err != nil {
		return t, err
	}

	// One object of each, as the informers keep them, for their sizes.
	size := func(o any) float64 {
		b, _ := json.Marshal(o)
		return float64(len(b))
	}
	var running, pending float64
	if p, err := kb.cs.CoreV1().Pods(kb.ns).Get(ctx, k8srt.PodName(id), metav1.GetOptions{}); err == nil {
		p.ManagedFields = nil
		running = size(p)
	}
	if ps, err := kb.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{Limit: 1}); err == nil && len(ps.Items) > 0 {
		ps.Items[0].ManagedFields = nil
		pending = size(&ps.Items[0])
	}
	var claimSize float64
	if cl, err := kb.cs.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{Limit: 1}); err == nil && len(cl.Items) > 0 {
		cl.Items[0].ManagedFields = nil
		claimSize = size(&cl.Items[0])
	}
	// The cluster can start on the namespace's deletion now. Its pods go
	// first, a few at a time: the namespace controller deletes them as one
	// collection, which times out at the API server at these numbers.
	deletePods(ctx, cs, ns, kb.suffix, created)
	kb.releaseClaims(ctx, ns)
	if err := kb.cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		progress("kubernetes: deleting namespace %s: %v", ns, err)
	}

	per := (float64(h3) - float64(h2)) / float64(created)
	fixed := float64(h1) - float64(h0)
	t.add(valueRow("sandboxes created (pod + claim each)", "", float64(created), fmtCount, info))
	// A create cut short by the budget may leave a claim without its pod
	// (listed too): the count is checked only when every create was done.
	listGoal := info
	if created == n {
		listGoal = exactly(float64(created))
	}
	t.add(valueRow("sandboxes the Runtime lists", "", float64(len(listed)), fmtCount, listGoal))
	t.add(valueRow("creation, at most "+fmt.Sprint(rate)+" objects/s", "", createTime.Seconds(), fmtSeconds, info))
	t.add(valueRow("informers' first list (sync)", "", syncTime.Seconds(), fmtSeconds, info))
	t.add(valueRow("heap of the informers with no object (fixed cost)", "", fixed, fmtBytes, info))
	t.add(valueRow(fmt.Sprintf("heap per sandbox at %s", groupThousands(int64(created))), "", per, fmtBytes, goal{op: "<=", limit: informerMemGoal, format: fmtBytes}))
	t.add(valueRow("JSON of a running sandbox's pod (no managedFields)", "", running, fmtBytes, info))
	t.add(valueRow("JSON of a bench pod (pending)", "", pending, fmtBytes, info))
	t.add(valueRow("JSON of a claim (keeps its pod as an annotation)", "", claimSize, fmtBytes, info))
	progress("kubernetes: informer memory: %s per sandbox over %d (sync %s)", fmtBytes(per), created, fmtDuration(syncTime))
	return t, nil
}

// deletePods deletes the cell's pods of namespace ns, 32 at a time.
func deletePods(ctx context.Context, cs kubernetes.Interface, ns, suffix string, n int) {
	next := make(chan int)
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				cs.CoreV1().Pods(ns).Delete(ctx, k8srt.PodName(fmt.Sprintf("m%s-%05d", suffix, i)), metav1.DeleteOptions{})
			}
		}()
	}
	for i := range n + 1 { // and the one a cut-short create may have left
		next <- i
	}
	close(next)
	wg.Wait()
}

// createSandboxObjects makes sandbox sid's claim and pod in namespace ns
// for instance, from a real sandbox's pod and claim.
func createSandboxObjects(ctx context.Context, cs kubernetes.Interface, ns, instance, sid string, tmpl *corev1.Pod, tmplClaim *corev1.PersistentVolumeClaim) error {
	labels := map[string]string{k8srt.LabelManaged: "true", k8srt.LabelInstance: instance, k8srt.LabelID: sid}
	pod := tmpl.DeepCopy()
	pod.Name, pod.Namespace, pod.ResourceVersion = k8srt.PodName(sid), ns, ""
	pod.Labels = labels
	pod.Spec.Hostname = k8srt.PodName(sid)
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			v.PersistentVolumeClaim.ClaimName = k8srt.ClaimName(sid)
		}
	}
	kept, err := json.Marshal(pod)
	if err != nil {
		return err
	}
	// No node has this label: the pod stays pending.
	pod.Spec.NodeSelector = map[string]string{"sandwake-bench/unschedulable": "true"}
	claim := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: k8srt.ClaimName(sid), Namespace: ns, Labels: labels, Annotations: map[string]string{}},
		Spec:       *tmplClaim.Spec.DeepCopy(),
	}
	claim.Spec.VolumeName = ""
	for k, v := range tmplClaim.Annotations {
		if k != k8srt.AnnotationPod && strings.HasPrefix(k, "sandwake.") {
			claim.Annotations[k] = v
		}
	}
	claim.Annotations[k8srt.AnnotationPod] = string(kept)
	if _, err := cs.CoreV1().PersistentVolumeClaims(ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating claim %s: %w", claim.Name, err)
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating pod %s: %w", pod.Name, err)
	}
	return nil
}
