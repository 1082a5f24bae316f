package kubernetes

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandwake/sandwake/internal/kubetest"
	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/store"
)

// TestClusterServices runs a sandbox with two services on a real cluster,
// b depending on a, each the test image on a port of its own: both start,
// in order, before the app, which reaches them on 127.0.0.1; a stop keeps
// every claim, a start brings all of them back (a's file with it), and a
// purge removes every claim.
func TestClusterServices(t *testing.T) {
	cl := kubetest.Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r, ns, image, suffix := clusterRuntime(t, ctx, cl)
	id := "v" + suffix
	spec := lifecycle.Spec{Image: image, Ports: []int{8080}, WorkspacePath: "/workspace", MemoryMB: 64, Incarnation: "i1",
		// The app's first act, before it listens: a connection to b.
		Env: map[string]string{"DIAL_AT_START": "127.0.0.1:9002"},
		Services: map[string]lifecycle.Service{
			// a takes 2 s to listen: b must wait for its probe.
			"a": {Image: image, Env: map[string]string{"PORT": "9001", "STARTUP_DELAY": "2s"}, Ready: "http:9001/healthz", MemoryMB: 64},
			"b": {Image: image, Env: map[string]string{"PORT": "9002"}, Ready: "tcp:9002", MemoryMB: 64, DependsOn: []string{"a"}},
		}}
	if _, err := r.Create(ctx, id, spec); err != nil {
		t.Fatal(err)
	}
	claimsLeft := func() []string {
		l, err := r.cs.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{LabelSelector: LabelID + "=" + id})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, c := range l.Items {
			names = append(names, c.Name)
		}
		return names
	}
	if got := claimsLeft(); len(got) != 3 {
		t.Fatalf("claims after create: %v, want the app's, a's and b's", got)
	}
	start := func() (lifecycle.Container, string) {
		t.Helper()
		c, err := r.Start(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if c.State != lifecycle.ContainerRunning || c.Members["a"] != lifecycle.ContainerRunning || c.Members["b"] != lifecycle.ContainerRunning {
			t.Fatalf("started: %+v", c)
		}
		addr := c.Upstreams[8080]
		cl.OnBridge(t, addr)
		get(t, "http://"+addr+"/healthz")
		return c, strings.TrimSuffix(addr, ":8080")
	}
	_, ip := start()

	// The order the kubelet kept: a, then b once a was ready, then the
	// app once b was.
	pod, err := r.cs.CoreV1().Pods(ns).Get(ctx, PodName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	startedAt := map[string]time.Time{}
	for _, s := range append(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses...) {
		if s.State.Running == nil {
			t.Fatalf("%s not running: %+v", s.Name, s.State)
		}
		startedAt[s.Name] = s.State.Running.StartedAt.Time
	}
	if !startedAt["b"].After(startedAt["a"]) || startedAt[appContainer].Before(startedAt["b"]) {
		t.Fatalf("started at %v: want a, then b (after a's 2 s), then the app", startedAt)
	}
	// The app reached b before it listened, and reaches a now, on
	// localhost: the pod's network namespace is theirs.
	if got := get(t, "http://"+ip+":8080/startdial"); !strings.HasPrefix(got, "ok ") {
		t.Fatalf("the app's first dial to b: %q", got)
	}
	if got := get(t, "http://"+ip+":8080/dial?addr=127.0.0.1:9001"); !strings.HasPrefix(got, "ok ") {
		t.Fatalf("the app's dial to a: %q", got)
	}
	// a's own workspace keeps a file across stop and start.
	stamp := "stamp-" + suffix
	req, _ := http.NewRequest(http.MethodPut, "http://"+ip+":9001/files/stamp", strings.NewReader(stamp))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode/100 != 2 {
		t.Fatalf("PUT a's /files/stamp: %s", res.Status)
	}

	// A pause cuts the sidecars' CPU with the app's, in place: no
	// container restarts, and the group answers after the wake.
	if err := r.Pause(ctx, id); err != nil {
		t.Fatalf("pausing a pod with sidecars: %v", err)
	}
	// The kubelet applied the cut to every container, sidecars too.
	allApplied := func(cut bool) func() bool {
		return func() bool {
			p, err := r.cs.CoreV1().Pods(ns).Get(ctx, PodName(id), metav1.GetOptions{})
			if err != nil {
				return false
			}
			for _, c := range p.Status.Conditions {
				if (c.Type == corev1.PodResizePending || c.Type == corev1.PodResizeInProgress) && c.Status == corev1.ConditionTrue {
					return false
				}
			}
			statuses := append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...)
			for _, st := range statuses {
				if st.Resources == nil || (st.Resources.Limits.Cpu().MilliValue() <= pausedBurstCPUMilli) != cut {
					return false
				}
			}
			return len(statuses) == 3
		}
	}
	eventuallyCluster(t, "the kubelet to cut every container's CPU", allApplied(true))
	if err := r.Unpause(ctx, id); err != nil {
		t.Fatal(err)
	}
	eventuallyCluster(t, "the kubelet to give every container its CPU back", allApplied(false))
	if c, err := r.Inspect(ctx, id); err != nil || c.State != lifecycle.ContainerRunning || c.Members["a"] != lifecycle.ContainerRunning || c.Members["b"] != lifecycle.ContainerRunning {
		t.Fatalf("after the wake: %+v %v", c, err)
	}
	if got := get(t, "http://"+ip+":8080/dial?addr=127.0.0.1:9002"); !strings.HasPrefix(got, "ok ") {
		t.Fatalf("the app's dial to b after the wake: %q", got)
	}
	woken, err := r.cs.CoreV1().Pods(ns).Get(ctx, PodName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range append(woken.Status.InitContainerStatuses, woken.Status.ContainerStatuses...) {
		if s.RestartCount != 0 || s.State.Running == nil || !s.State.Running.StartedAt.Time.Equal(startedAt[s.Name]) {
			t.Fatalf("%s restarted across the pause: %+v", s.Name, s)
		}
	}

	if err := r.Stop(ctx, id); err != nil {
		t.Fatal(err)
	}
	if got := claimsLeft(); len(got) != 3 {
		t.Fatalf("claims after stop: %v, want all three kept", got)
	}
	_, ip = start()
	if got := get(t, "http://"+ip+":9001/files/stamp"); got != stamp {
		t.Fatalf("a's file after the wake = %q, want %q", got, stamp)
	}
	if got := get(t, "http://"+ip+":8080/startdial"); !strings.HasPrefix(got, "ok ") {
		t.Fatalf("the app's first dial to b after the wake: %q", got)
	}

	if err := r.Stop(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := r.Remove(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := r.RemoveVolume(ctx, id); err != nil {
		t.Fatal(err)
	}
	eventuallyCluster(t, "every claim to be gone", func() bool { return len(claimsLeft()) == 0 })
}

// TestClusterFailingService: a service that exits at once (the test image
// cannot listen on port "none") fails the start naming it, without
// waiting for the start's deadline.
func TestClusterFailingService(t *testing.T) {
	cl := kubetest.Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r, ns, image, suffix := clusterRuntime(t, ctx, cl)
	id := "f" + suffix
	spec := lifecycle.Spec{Image: image, Ports: []int{8080}, WorkspacePath: "/workspace", MemoryMB: 64,
		Services: map[string]lifecycle.Service{"bad": {Image: image, Env: map[string]string{"PORT": "none"}, Ready: "tcp:9003", MemoryMB: 64}}}
	if _, err := r.Create(ctx, id, spec); err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithTimeout(ctx, 2*time.Minute)
	defer scancel()
	_, err := r.Start(sctx, id)
	var se *lifecycle.ServiceError
	if !errors.As(err, &se) || se.Service != "bad" || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("start: %v, want service bad's failure before the deadline", err)
	}
	t.Logf("start: %v", err)
	if err := r.Stop(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := r.cs.CoreV1().Pods(ns).Get(ctx, PodName(id), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("pod after stop: %v", err)
	}
	if _, err := r.RemoveVolume(ctx, id); err != nil {
		t.Fatal(err)
	}
}

// TestClusterManagerServices drives a sandbox with a service through the
// Manager: its service_states, and a service that dies while the sandbox
// runs (the kubelet would restart it in place), which stops the sandbox
// as a dead member of a Docker group does, with its exit code; the next
// wake brings the whole group back.
func TestClusterManagerServices(t *testing.T) {
	cl := kubetest.Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r, _, image, suffix := clusterRuntime(t, ctx, cl)
	st, err := store.Open(store.Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	m, err := lifecycle.NewManager(st, r, lifecycle.Config{WatchEvents: true, WakeTimeout: 2 * time.Minute, DefaultMemoryMB: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	id := "s" + suffix
	rec, err := m.Create(ctx, lifecycle.CreateRequest{ID: id, Spec: lifecycle.Spec{Image: image, Ports: []int{8080},
		Services: map[string]lifecycle.Service{"db": {Image: image, Env: map[string]string{"PORT": "9001"}, Ready: "tcp:9001"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != lifecycle.Running || rec.ServiceStates["db"] != lifecycle.ContainerRunning {
		t.Fatalf("created: %s, services %v", rec.State, rec.ServiceStates)
	}
	ip := strings.TrimSuffix(rec.Upstreams[8080], ":8080")
	cl.OnBridge(t, ip)
	// db exits (code 3) behind sandwake's back.
	get(t, "http://"+ip+":9001/exit?code=3")
	eventuallyCluster(t, "the sandbox to stop with db's exit", func() bool {
		rec, err := m.Get(id)
		return err == nil && rec.State == lifecycle.Stopped && rec.Reason == "exited(3)"
	})
	eventuallyCluster(t, "the pod to be gone", func() bool {
		_, err := r.cs.CoreV1().Pods(r.opts.Namespace).Get(ctx, PodName(id), metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if rec, err = m.Wake(ctx, id); err != nil || rec.State != lifecycle.Running || rec.ServiceStates["db"] != lifecycle.ContainerRunning {
		t.Fatalf("wake: %+v, %v", rec, err)
	}
	cl.OnBridge(t, rec.Upstreams[8080])
	if got := get(t, "http://"+rec.Upstreams[8080]+"/dial?addr=127.0.0.1:9001"); !strings.HasPrefix(got, "ok ") {
		t.Fatalf("the app's dial to db after the wake: %q", got)
	}
	if _, err := m.Purge(ctx, id, "test"); err != nil {
		t.Fatal(err)
	}
	eventuallyCluster(t, "every claim to be gone", func() bool {
		l, err := r.cs.CoreV1().PersistentVolumeClaims(r.opts.Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelID + "=" + id})
		return err == nil && len(l.Items) == 0
	})
}
