package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandwake/sandwake/internal/kubetest"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/store"
)

// The tests here run on a real cluster (see internal/kubetest): without
// one they skip; with SANDWAKE_REQUIRE_KUBERNETES=1 they fail instead.

// get polls url until it answers 200 (bounded) and returns the body.
func get(t *testing.T, url string) string {
	t.Helper()
	client := &http.Client{Timeout: 2 * time.Second}
	var body string
	testenv.Eventually(t, 60*time.Second, func() (bool, string) {
		res, err := client.Get(url)
		if err != nil {
			return false, fmt.Sprintf("GET %s: %v", url, err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		body = string(b)
		return res.StatusCode == http.StatusOK, fmt.Sprintf("GET %s: status %d: %s", url, res.StatusCode, b)
	})
	return body
}

// clusterRuntime is a started runtime on the cluster, in a namespace of
// its own that goes (with its pods and claims) at the end of the test, and
// the test image.
func clusterRuntime(t *testing.T, ctx context.Context, cl kubetest.Cluster) (r *Runtime, ns, image, suffix string) {
	t.Helper()
	image = cl.Image(t)
	suffix = kubetest.Suffix()
	ns = "sandwake-test-" + suffix
	r, err := New(Options{Kubeconfig: cl.Kubeconfig, Namespace: ns, Instance: "t" + suffix,
		StorageClass: cl.StorageClass, Pull: PullNever, StopTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The namespace takes its pods and claims (and local-path their
		// volumes) with it.
		r.cs.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
	if err := r.StartInformers(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	if err := r.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	return r, ns, image, suffix
}

func TestClusterSandboxLifecycle(t *testing.T) {
	cl := kubetest.Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r, ns, image, suffix := clusterRuntime(t, ctx, cl)
	evCtx, evCancel := context.WithCancel(ctx)
	defer evCancel()
	evs, _ := r.Events(evCtx)

	id := "k" + suffix
	spec := lifecycle.Spec{Image: image, Ports: []int{8080}, WorkspacePath: "/workspace", MemoryMB: 64, CPUs: 0.25, Incarnation: "i1"}
	if _, err := r.Create(ctx, id, spec); err != nil {
		t.Fatal(err)
	}
	// Create → start → first byte, the first time (claim bound on the way).
	t0 := time.Now()
	c, err := r.Start(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	addr := c.Upstreams[8080]
	cl.OnBridge(t, addr)
	get(t, "http://"+addr+"/healthz")
	first := time.Since(t0)
	if c.State != lifecycle.ContainerRunning {
		t.Fatalf("started: state %s", c.State)
	}
	pod, err := r.cs.CoreV1().Pods(ns).Get(ctx, PodName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sc := pod.Spec.Containers[0].SecurityContext; *sc.AllowPrivilegeEscalation || sc.Capabilities.Drop[0] != "ALL" || pod.Spec.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Fatalf("pod security context not applied: %+v", sc)
	}
	// What the app sees of itself: no CAP_SYS_ADMIN among its capabilities.
	self := get(t, "http://"+addr+"/self")
	if strings.Contains(strings.ToLower(self), "sys_admin") {
		t.Fatalf("the sandbox has CAP_SYS_ADMIN: %s", self)
	}
	stamp := "stamp-" + suffix
	req, _ := http.NewRequest(http.MethodPut, "http://"+addr+"/files/stamp", strings.NewReader(stamp))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode/100 != 2 {
		t.Fatalf("PUT /files/stamp: %s", res.Status)
	}

	// Stop: the pod is gone when Stop returns, the claim stays.
	t1 := time.Now()
	if err := r.Stop(ctx, id); err != nil {
		t.Fatal(err)
	}
	stopTook := time.Since(t1)
	if _, err := r.cs.CoreV1().Pods(ns).Get(ctx, PodName(id), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("pod after stop: %v", err)
	}
	if _, err := r.cs.CoreV1().PersistentVolumeClaims(ns).Get(ctx, ClaimName(id), metav1.GetOptions{}); err != nil {
		t.Fatalf("claim after stop: %v", err)
	}
	if c, err := r.Inspect(ctx, id); err != nil || c.State != lifecycle.ContainerExited {
		t.Fatalf("inspect after stop = %+v, %v", c, err)
	}

	// Start again: the workspace's file is still there.
	t2 := time.Now()
	c, err = r.Start(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	addr = c.Upstreams[8080]
	cl.OnBridge(t, addr)
	got := get(t, "http://"+addr+"/files/stamp")
	again := time.Since(t2)
	if got != stamp {
		t.Fatalf("file after restart = %q, want %q", got, stamp)
	}

	// The pod deleted behind sandwake's back: a die event, and the
	// sandbox reads as exited (stopped), its claim kept.
	drain(evs)
	if err := r.cs.CoreV1().Pods(ns).Delete(ctx, PodName(id), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, evs, id, "die")
	eventuallyCluster(t, "the deleted pod to read as exited", func() bool {
		c, err := r.Inspect(ctx, id)
		return err == nil && c.State == lifecycle.ContainerExited
	})
	if err := r.Stop(ctx, id); err != nil { // waits for the pod to be gone
		t.Fatal(err)
	}

	// Remove and purge: nothing of the sandbox is left.
	if err := r.Remove(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := r.RemoveVolume(ctx, id); err != nil {
		t.Fatal(err)
	}
	eventuallyCluster(t, "the claim to be gone", func() bool {
		_, err := r.cs.CoreV1().PersistentVolumeClaims(ns).Get(ctx, ClaimName(id), metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if _, err := r.Inspect(ctx, id); !errors.Is(err, lifecycle.ErrContainerNotFound) {
		t.Fatalf("inspect after purge: %v", err)
	}
	t.Logf("first start (claim provisioned and bound, pod made) → first byte: %v; stop (pod gone): %v; start again → file read: %v", first, stopTook, again)
}

func drain(evs <-chan lifecycle.RuntimeEvent) {
	for {
		select {
		case <-evs:
		default:
			return
		}
	}
}

func waitEvent(t *testing.T, evs <-chan lifecycle.RuntimeEvent, id, action string) {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case ev, ok := <-evs:
			if !ok {
				t.Fatalf("event stream ended before %s", action)
			}
			if ev.SandboxID == id && ev.Action == action {
				return
			}
		case <-timeout:
			t.Fatalf("no %s event for %s", action, id)
		}
	}
}

func eventuallyCluster(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, func() (bool, string) { return cond(), what })
}

// TestClusterManager drives the runtime through lifecycle's Manager, as the
// gateway does: create (running), stop, wake, a pod deleted behind its back
// reconciled from the die event, an idle_pause that stops, and purge.
func TestClusterManager(t *testing.T) {
	cl := kubetest.Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r, ns, image, suffix := clusterRuntime(t, ctx, cl)
	st, err := store.Open(store.Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	m, err := lifecycle.NewManager(st, r, lifecycle.Config{WatchEvents: true, WakeTimeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	id := "m" + suffix
	rec, err := m.Create(ctx, lifecycle.CreateRequest{ID: id, Spec: lifecycle.Spec{Image: image, Ports: []int{8080}}})
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != lifecycle.Running {
		t.Fatalf("created: %s", rec.State)
	}
	cl.OnBridge(t, rec.Upstreams[8080])
	get(t, "http://"+rec.Upstreams[8080]+"/healthz")

	if rec, err = m.Stop(ctx, id, "test"); err != nil || rec.State != lifecycle.Stopped {
		t.Fatalf("stop: %v, %v", rec.State, err)
	}
	if _, err := m.Pause(ctx, id, "test"); !errors.Is(err, lifecycle.ErrConflict) {
		t.Fatalf("pause of a stopped sandbox: %v", err)
	}
	t0 := time.Now()
	if rec, err = m.Wake(ctx, id); err != nil || rec.State != lifecycle.Running {
		t.Fatalf("wake: %v, %v", rec.State, err)
	}
	cl.OnBridge(t, rec.Upstreams[8080])
	get(t, "http://"+rec.Upstreams[8080]+"/healthz")
	wake := time.Since(t0)
	// Paused in place: the record and the pod agree (a reconcile corrects
	// nothing), and a wake gives back the same pod at the same address.
	podBefore, err := r.cs.CoreV1().Pods(ns).Get(ctx, PodName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rec, err = m.Pause(ctx, id, "test"); err != nil || rec.State != lifecycle.Paused {
		t.Fatalf("pause: %v, %v", rec.State, err)
	}
	if stats, err := m.Reconcile(ctx); err != nil || len(stats.Corrections) != 0 || len(stats.Orphans) != 0 {
		t.Fatalf("reconcile of a paused sandbox: %+v, %v", stats, err)
	}
	addr := rec.Upstreams[8080]
	if rec, err = m.Wake(ctx, id); err != nil || rec.State != lifecycle.Running || rec.Upstreams[8080] != addr {
		t.Fatalf("wake from paused: %v %v, %v", rec.State, rec.Upstreams, err)
	}
	get(t, "http://"+addr+"/healthz")
	if p, err := r.cs.CoreV1().Pods(ns).Get(ctx, PodName(id), metav1.GetOptions{}); err != nil || p.UID != podBefore.UID {
		t.Fatalf("the pod after pause and wake: %v (want the same pod %s)", err, podBefore.UID)
	}

	// Deleted behind sandwake's back: the die event makes it stopped.
	if err := r.cs.CoreV1().Pods(ns).Delete(ctx, PodName(id), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventuallyCluster(t, "the record to follow the deleted pod", func() bool {
		rec, err := m.Get(id)
		return err == nil && rec.State == lifecycle.Stopped
	})
	// And the next wake makes a pod again.
	if rec, err = m.Wake(ctx, id); err != nil || rec.State != lifecycle.Running {
		t.Fatalf("wake after the deletion: %v, %v", rec.State, err)
	}
	cl.OnBridge(t, rec.Upstreams[8080])
	get(t, "http://"+rec.Upstreams[8080]+"/healthz")
	if stats, err := m.Reconcile(ctx); err != nil || len(stats.Corrections) != 0 || len(stats.Orphans) != 0 {
		t.Fatalf("reconcile of a consistent sandbox: %+v, %v", stats, err)
	}

	if _, err := m.Purge(ctx, id, "test"); err != nil {
		t.Fatal(err)
	}
	eventuallyCluster(t, "the pod and claim to be gone", func() bool {
		_, perr := r.cs.CoreV1().Pods(ns).Get(ctx, PodName(id), metav1.GetOptions{})
		_, cerr := r.cs.CoreV1().PersistentVolumeClaims(ns).Get(ctx, ClaimName(id), metav1.GetOptions{})
		return apierrors.IsNotFound(perr) && apierrors.IsNotFound(cerr)
	})
	t.Logf("wake of a stopped sandbox (pod made, claim bound) → first byte: %v", wake)
}

// TestClusterNetworkPolicy: the API server takes the policies sandwake
// makes (its validation is the fake's blind spot: an except outside its
// cidr, a bad selector), a create makes one with the expected rules that
// selects the sandbox's pod, a PATCH replaces it and a destroy deletes
// it. The test cluster's bridge plugin does not enforce NetworkPolicy:
// these are the objects, not packets dropped.
func TestClusterNetworkPolicy(t *testing.T) {
	cl := kubetest.Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r, ns, image, suffix := clusterRuntime(t, ctx, cl)
	pols := r.cs.NetworkingV1().NetworkPolicies(ns)
	id := "n" + suffix
	spec := lifecycle.Spec{Image: image, Ports: []int{8080}, WorkspacePath: "/workspace", MemoryMB: 64, Incarnation: "i1",
		Egress: lifecycle.Egress{Policy: lifecycle.EgressPublic, Allow: []string{"198.51.100.0/24:443/tcp"}, Deny: []string{"198.51.100.7", "8.8.8.8"}}}
	if err := lifecycle.NormalizeEgress(&spec.Egress, lifecycle.EgressConfig{}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Create(ctx, id, spec); err != nil {
		t.Fatal(err)
	}
	pol, err := pols.Get(ctx, PolicyName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("no policy after create: %v", err)
	}
	got := readRules(pol.Spec.Egress)
	want := []rule{
		{to: []string{"0.0.0.0/0 except 0.0.0.0/8,8.8.8.8/32,10.0.0.0/8,100.64.0.0/10,127.0.0.0/8,169.254.0.0/16,172.16.0.0/12,192.168.0.0/16,198.51.100.7/32,224.0.0.0/4,240.0.0.0/4"}},
		dnsRule,
		{to: []string{"198.51.100.0/24 except 198.51.100.7/32"}, ports: []string{"TCP/443"}},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("egress rules as stored\n got %+v\nwant %+v", got, want)
	}
	if len(pol.Spec.Ingress) != 1 || len(pol.Spec.Ingress[0].Ports) != 1 || pol.Spec.Ingress[0].Ports[0].Port.IntValue() != 8080 {
		t.Fatalf("ingress as stored: %+v", pol.Spec.Ingress)
	}
	// The pod it selects is the sandbox's.
	if _, err := r.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	sel, err := metav1.LabelSelectorAsSelector(&pol.Spec.PodSelector)
	if err != nil {
		t.Fatal(err)
	}
	pods, err := r.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil || len(pods.Items) != 1 || pods.Items[0].Name != PodName(id) {
		t.Fatalf("the policy selects %d pods (%v), want the sandbox's alone", len(pods.Items), err)
	}
	// A PATCH to none: no egress rule left.
	spec.Egress = lifecycle.Egress{Policy: lifecycle.EgressNone}
	if err := r.ApplyEgress(ctx, id, spec); err != nil {
		t.Fatal(err)
	}
	if pol, err = pols.Get(ctx, PolicyName(id), metav1.GetOptions{}); err != nil || len(pol.Spec.Egress) != 0 {
		t.Fatalf("after a PATCH to none: %+v, %v", pol.Spec.Egress, err)
	}
	// A name is refused before anything is made.
	other := "m" + suffix
	spec.Egress = lifecycle.Egress{Policy: lifecycle.EgressNone, Allow: []string{"registry.npmjs.org"}}
	if _, err := r.Create(ctx, other, spec); !errors.Is(err, lifecycle.ErrInvalid) {
		t.Fatalf("create with a name: %v, want ErrInvalid", err)
	}
	if _, err := pols.Get(ctx, PolicyName(other), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a refused create left a policy: %v", err)
	}
	// Destroy: the pod goes, then the policy.
	if err := r.Remove(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := pols.Get(ctx, PolicyName(id), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("policy after remove: %v", err)
	}
	if _, err := r.cs.CoreV1().Pods(ns).Get(ctx, PodName(id), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("pod after remove: %v", err)
	}
}
