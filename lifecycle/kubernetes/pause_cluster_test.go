package kubernetes

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandwake/sandwake/internal/kubetest"
	"github.com/sandwake/sandwake/lifecycle"
)

// applied reports whether the kubelet runs pod's app with the CPU limit
// lim (millicores) and has no resize pending or in progress, and the app
// container's id and restart count.
func applied(pod *corev1.Pod, lim int64) (ok bool, ctrID string, restarts int32) {
	for _, c := range pod.Status.Conditions {
		if (c.Type == corev1.PodResizePending || c.Type == corev1.PodResizeInProgress) && c.Status == corev1.ConditionTrue {
			return false, "", 0
		}
	}
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name == appContainer {
			return s.Resources != nil && s.Resources.Limits.Cpu().MilliValue() == lim, s.ContainerID, s.RestartCount
		}
	}
	return false, "", 0
}

// body GETs url once and returns its body.
func body(t *testing.T, url string) string {
	t.Helper()
	res, err := (&http.Client{Timeout: 10 * time.Second}).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return string(b)
}

// TestClusterPause: a pause cuts a running pod's CPU in place on a real
// kubelet, which applies it without restarting the app; the process keeps
// its state (what only it holds: how many requests it once served at
// once) across the pause and the wake, and a wake gives the CPU back. Both
// pod shapes: cpus given, and cpus 0.
func TestClusterPause(t *testing.T) {
	cl := kubetest.Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r, ns, image, suffix := clusterRuntime(t, ctx, cl)
	for i, tc := range []struct {
		cpus           float64
		runLim, cutLim int64
	}{
		{0.25, 250, pausedCPUMilli},
		{0, unlimitedCPUMilli, pausedBurstCPUMilli},
	} {
		id := fmt.Sprintf("p%d%s", i, suffix)
		spec := lifecycle.Spec{Image: image, Ports: []int{8080}, WorkspacePath: "/workspace", MemoryMB: 64, CPUs: tc.cpus, Incarnation: "i1"}
		if _, err := r.Create(ctx, id, spec); err != nil {
			t.Fatal(err)
		}
		c, err := r.Start(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		addr := c.Upstreams[8080]
		cl.OnBridge(t, addr)
		get(t, "http://"+addr+"/healthz")
		// State only the process holds: 3 /wait requests served at once.
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() {
				// Not the test's goroutine: errors, not Fatal.
				res, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + addr + "/wait?ms=300")
				if err != nil {
					t.Error(err)
					return
				}
				res.Body.Close()
			})
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		if got := body(t, "http://"+addr+"/inflight"); got != "0 3\n" {
			t.Fatalf("/inflight = %q, want 0 3", got)
		}
		pods := r.cs.CoreV1().Pods(ns)
		pod, err := pods.Get(ctx, PodName(id), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, ctr0, restarts0 := applied(pod, tc.runLim)

		t0 := time.Now()
		if err := r.Pause(ctx, id); err != nil {
			t.Fatalf("cpus %g: %v", tc.cpus, err)
		}
		pauseTook := time.Since(t0)
		if c, err := r.Inspect(ctx, id); err != nil || c.State != lifecycle.ContainerPaused {
			t.Fatalf("cpus %g: inspect after pause = %+v, %v; want paused", tc.cpus, c, err)
		}
		eventuallyCluster(t, fmt.Sprintf("the kubelet to apply cpu %dm", tc.cutLim), func() bool {
			p, err := pods.Get(ctx, PodName(id), metav1.GetOptions{})
			ok, _, _ := applied(p, tc.cutLim)
			return err == nil && ok
		})
		appliedCut := time.Since(t0)
		// Cut, the app is not frozen: it answers, with its state.
		if got := body(t, "http://"+addr+"/inflight"); got != "0 3\n" {
			t.Fatalf("cpus %g: /inflight while paused = %q, want 0 3", tc.cpus, got)
		}

		t1 := time.Now()
		if err := r.Unpause(ctx, id); err != nil {
			t.Fatal(err)
		}
		wakeTook := time.Since(t1)
		if c, err := r.Inspect(ctx, id); err != nil || c.State != lifecycle.ContainerRunning || c.Upstreams[8080] != addr {
			t.Fatalf("cpus %g: inspect after unpause = %+v, %v; want running at %s", tc.cpus, c, err, addr)
		}
		var ctr1 string
		var restarts1 int32
		eventuallyCluster(t, fmt.Sprintf("the kubelet to give back cpu %dm", tc.runLim), func() bool {
			p, err := pods.Get(ctx, PodName(id), metav1.GetOptions{})
			if err != nil {
				return false
			}
			ok, id, n := applied(p, tc.runLim)
			ctr1, restarts1 = id, n
			return ok
		})
		appliedBack := time.Since(t1)
		if ctr1 != ctr0 || restarts1 != restarts0 {
			t.Fatalf("cpus %g: the app's container changed across pause and wake: %s (%d restarts) → %s (%d)", tc.cpus, ctr0, restarts0, ctr1, restarts1)
		}
		if got := body(t, "http://"+addr+"/inflight"); got != "0 3\n" {
			t.Fatalf("cpus %g: /inflight after the wake = %q, want 0 3 (the process kept its state)", tc.cpus, got)
		}
		t.Logf("cpus %g: pause %v (applied %v); wake %v (applied %v)", tc.cpus, pauseTook, appliedCut, wakeTook, appliedBack)
	}
}
