package caddymodule_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/cluster"
	"github.com/sandwake/sandwake/internal/kubetest"
	"github.com/sandwake/sandwake/internal/testenv"
)

// replicaTest is the install of TestKubernetesInstall as its replica
// tests use it: the gateways' pods (by name, replaced when one comes back)
// and the API's token.
type replicaTest struct {
	cl                         kubetest.Cluster
	cs                         kubernetes.Interface
	apiServer                  *kubetest.APIForward // the pods' way to the API server
	ns, token, kubectl, suffix string
	hc                         *http.Client
	pods                       map[string]*corev1.Pod
}

// addr is replica name's address on the cluster's bridge at port.
func (r *replicaTest) addr(t *testing.T, name string, port uint16) string {
	t.Helper()
	p := r.pods[name]
	if p == nil {
		t.Fatalf("no replica %s", name)
	}
	if err := r.cl.CheckOnBridge(p.Status.PodIP); err != nil {
		t.Fatal(err)
	}
	return netip.AddrPortFrom(netip.MustParseAddr(p.Status.PodIP), port).String()
}

// api calls replica name's API.
func (r *replicaTest) api(t *testing.T, ctx context.Context, name, method, path string, body any) (int, []byte) {
	t.Helper()
	return apiCall(t, ctx, r.hc, "http://"+r.addr(t, name, 8081), method, path, r.token, body)
}

// previewAnswer is one preview request's answer.
type previewAnswer struct {
	status int
	body   string
	header http.Header
	err    error
}

// preview asks replica name for sandbox id's port 8080 as an API client
// does (held through a wake, JSON errors).
func (r *replicaTest) preview(ctx context.Context, t *testing.T, name, id string) previewAnswer {
	return r.previewAt(ctx, r.addr(t, name, 8080), id)
}

// previewAt is preview at a replica's preview address (checked by addr).
func (r *replicaTest) previewAt(ctx context.Context, addr, id string) previewAnswer {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+addr+"/", nil)
	if err != nil {
		return previewAnswer{err: err}
	}
	req.Host = fmt.Sprintf("s-%s-8080.preview.%s", id, installDomain)
	req.Header.Set("Accept", "application/json")
	res, err := r.hc.Do(req)
	if err != nil {
		return previewAnswer{err: err}
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return previewAnswer{status: res.StatusCode, body: string(b), header: res.Header}
}

// served reports whether a is the testapp's page from sandbox id's pod.
func (a previewAnswer) served(id string) bool {
	return a.err == nil && a.status == http.StatusOK && strings.Contains(a.body, "Hello from the sandbox") && strings.Contains(a.body, "s-"+id)
}

// create makes sandbox id through replica via and returns its record.
func (r *replicaTest) create(t *testing.T, ctx context.Context, via, id, image string) client.Sandbox {
	t.Helper()
	code, body := r.api(t, ctx, via, "POST", "/v1/sandboxes", map[string]any{"id": id, "image": image, "ports": []int{8080}})
	var rec client.Sandbox
	if err := json.Unmarshal(body, &rec); err != nil || code != http.StatusCreated || rec.State != "running" {
		t.Fatalf("create %s through %s: %d %s", id, via, code, body)
	}
	if _, ok := r.pods[rec.Node]; !ok {
		t.Fatalf("sandbox %s was placed on %q, want one of %v", id, rec.Node, replicaNames)
	}
	return rec
}

// other is the replica that is not name.
func other(name string) string {
	if name == replicaNames[0] {
		return replicaNames[1]
	}
	return replicaNames[0]
}

// podUID is the UID of sandbox id's pod ("" when it has none).
func (r *replicaTest) podUID(t *testing.T, ctx context.Context, id string) string {
	t.Helper()
	p, err := r.cs.CoreV1().Pods(r.ns).Get(ctx, "s-"+id, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(p.UID)
}

// testReplicas: the install's two replicas are one cluster on the
// Kubernetes API (cluster { backend kubernetes }): each lists the other
// live; a sandbox created through either is served through both; a forged
// catalog entry is written back by its owner; a drained replica places
// creates on the other; a storm spread over both at a stopped sandbox
// makes one pod; a replica deleted comes back with its store, adopts its
// sandboxes' pods (never restarted), and meanwhile the other answers for
// them with 503 and Retry-After, or serves them.
func testReplicas(t *testing.T, ctx context.Context, r replicaTest) {
	app := r.cl.Image(t)
	owners := map[string]string{} // sandbox id → its replica
	ids := []string{"a" + r.suffix, "b" + r.suffix}

	t.Run("the replicas are one cluster", func(t *testing.T) {
		for _, name := range replicaNames {
			testenv.Eventually(t, 30*time.Second, func() (bool, string) {
				code, body := r.api(t, ctx, name, "GET", "/v1/nodes", nil)
				var view struct {
					Self  string
					Nodes []cluster.NodeInfo
				}
				if code != http.StatusOK || json.Unmarshal(body, &view) != nil || view.Self != name {
					return false, fmt.Sprintf("GET /v1/nodes at %s: %d %s", name, code, body)
				}
				live := 0
				for _, n := range view.Nodes {
					if n.Live && n.Advertise == r.addr(t, n.Name, 7443) {
						live++
					}
				}
				return live == 2, fmt.Sprintf("%s sees nodes %+v, want both replicas live at their pods' addresses", name, view.Nodes)
			})
		}
		for i, id := range ids {
			rec := r.create(t, ctx, replicaNames[i], id, app)
			owners[id] = rec.Node
			t.Logf("sandbox %s created through %s, placed on %s", id, replicaNames[i], rec.Node)
		}
		for _, id := range ids {
			for _, name := range replicaNames {
				if a := r.preview(ctx, t, name, id); !a.served(id) {
					t.Fatalf("sandbox %s (on %s) through %s: %d %.200s %v", id, owners[id], name, a.status, a.body, a.err)
				}
			}
		}
		// The registry and the catalog are Leases in the namespace: one per
		// replica (held by it) and one per sandbox.
		leases, err := r.cs.CoordinationV1().Leases(r.ns).List(ctx, metav1.ListOptions{LabelSelector: cluster.LabelCatalog + "=sandwake"})
		if err != nil {
			t.Fatal(err)
		}
		held, entries := 0, 0
		for _, l := range leases.Items {
			switch l.Labels[cluster.LabelSpace] {
			case "node":
				if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == l.Annotations[cluster.AnnotationKey] {
					held++
				}
			case "sandbox":
				entries++
			}
		}
		if held != 2 || entries < len(ids) {
			t.Fatalf("Leases: %d held by their replica, %d sandbox entries; want 2 and at least %d", held, entries, len(ids))
		}
	})
	if t.Failed() {
		return
	}
	id := ids[0]
	owner := owners[id]

	t.Run("a forged catalog entry is repaired by its owner", func(t *testing.T) {
		name := "sandwake-sandbox-" + id
		l, err := r.cs.CoordinationV1().Leases(r.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the catalog entry of %s: %v", id, err)
		}
		orig := l.Annotations[cluster.AnnotationValue]
		var e cluster.Entry
		if err := json.Unmarshal([]byte(orig), &e); err != nil || e.Node != owner || e.Sig == "" {
			t.Fatalf("the entry of %s: %v %+v, want %s's, signed", id, err, e, owner)
		}
		// Someone with write access to Leases (not to the cluster's
		// secret) points the sandbox at the other replica.
		e.Node = other(owner)
		forged, _ := json.Marshal(e)
		l.Annotations[cluster.AnnotationValue] = string(forged)
		if _, err := r.cs.CoordinationV1().Leases(r.ns).Update(ctx, l, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, func() (bool, string) {
			l, err := r.cs.CoordinationV1().Leases(r.ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			return l.Annotations[cluster.AnnotationValue] == orig, fmt.Sprintf("the entry of %s: %s, want %s's written back", id, l.Annotations[cluster.AnnotationValue], owner)
		})
		for _, via := range replicaNames {
			if a := r.preview(ctx, t, via, id); !a.served(id) {
				t.Fatalf("sandbox %s through %s after the repair: %d %.200s %v", id, via, a.status, a.body, a.err)
			}
		}
	})

	t.Run("a drained replica hands new creates to the other", func(t *testing.T) {
		drained := replicaNames[0]
		drain := func(on bool) {
			t.Helper()
			if code, body := r.api(t, ctx, replicaNames[1], "POST", "/v1/nodes/"+drained+"/drain", map[string]bool{"draining": on}); code != http.StatusOK {
				t.Fatalf("drain %s %v: %d %s", drained, on, code, body)
			}
		}
		drain(true)
		defer drain(false)
		testenv.Eventually(t, 30*time.Second, func() (bool, string) {
			_, body := r.api(t, ctx, drained, "GET", "/v1/nodes", nil)
			var view struct{ Nodes []cluster.NodeInfo }
			json.Unmarshal(body, &view)
			for _, n := range view.Nodes {
				if n.Name == drained && n.Draining {
					return true, ""
				}
			}
			return false, fmt.Sprintf("%s does not see its drain mark: %s", drained, body)
		})
		for i := range 3 {
			d := fmt.Sprintf("d%d%s", i, r.suffix)
			rec := r.create(t, ctx, drained, d, app)
			if rec.Node != replicaNames[1] {
				t.Fatalf("sandbox %s created through drained %s was placed on %s, want %s", d, drained, rec.Node, replicaNames[1])
			}
			if code, body := r.api(t, ctx, drained, "DELETE", "/v1/sandboxes/"+d, nil); code != http.StatusNoContent {
				t.Fatalf("destroy %s: %d %s", d, code, body)
			}
		}
	})

	t.Run("a storm spread over both replicas makes one pod", func(t *testing.T) {
		if code, body := r.api(t, ctx, other(owner), "POST", "/v1/sandboxes/"+id+"/stop", nil); code != http.StatusOK {
			t.Fatalf("stop %s through %s: %d %s", id, other(owner), code, body)
		}
		testenv.Eventually(t, time.Minute, func() (bool, string) {
			return r.podUID(t, ctx, id) == "", "the stopped sandbox's pod still there"
		})
		// Every pod of the sandbox made from here on: a watch from the
		// list's revision.
		sel := fields.OneTermEqualSelector("metadata.name", "s-"+id).String()
		list, err := r.cs.CoreV1().Pods(r.ns).List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			t.Fatal(err)
		}
		w, err := r.cs.CoreV1().Pods(r.ns).Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		var made atomic.Int64
		uids := map[string]bool{}
		var mu sync.Mutex
		var watchErr atomic.Pointer[error]
		go func() {
			for ev := range w.ResultChan() {
				if ev.Type == watch.Error {
					// (Also what client-go reports once the watch is
					// stopped: told only if the count is wrong.)
					err := apierrors.FromObject(ev.Object)
					watchErr.Store(&err)
				}
				if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Added {
					mu.Lock()
					if !uids[string(p.UID)] {
						uids[string(p.UID)] = true
						made.Add(1)
					}
					mu.Unlock()
				}
			}
		}()
		const n = 200
		answers := make([]previewAnswer, n)
		var wg sync.WaitGroup
		t0 := time.Now()
		addrs := []string{r.addr(t, replicaNames[0], 8080), r.addr(t, replicaNames[1], 8080)}
		for i := range n {
			wg.Go(func() { answers[i] = r.previewAt(ctx, addrs[i%2], id) })
		}
		wg.Wait()
		t.Logf("storm of %d over both replicas at stopped %s (on %s): last answer after %v", n, id, owner, time.Since(t0).Round(time.Millisecond))
		for i, a := range answers {
			if !a.served(id) {
				t.Fatalf("request %d (through %s): %d %.200s %v", i, replicaNames[i%2], a.status, a.body, a.err)
			}
		}
		testenv.Eventually(t, 10*time.Second, func() (bool, string) {
			why := "none"
			if err := watchErr.Load(); err != nil {
				why = (*err).Error()
			}
			return made.Load() >= 1, "the woken pod's ADDED event (watch error: " + why + ")"
		})
		if m := made.Load(); m != 1 {
			t.Fatalf("pods made for the storm: %d, want 1", m)
		}
		// And the pod serving now is that one (a second, made and deleted
		// after the count was read, would show here).
		mu.Lock()
		served := uids[r.podUID(t, ctx, id)]
		mu.Unlock()
		if !served {
			t.Fatalf("the sandbox's pod is %s, not the one pod the storm made (%v)", r.podUID(t, ctx, id), uids)
		}
	})

	t.Run("an outage of the API server leaves both replicas Ready and serving", func(t *testing.T) {
		// How long the kubelet takes to call a replica unready: the
		// StatefulSet's readiness probe, as installed.
		ss, err := r.cs.AppsV1().StatefulSets(r.ns).Get(ctx, "sandwake", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		probe := ss.Spec.Template.Spec.Containers[0].ReadinessProbe
		if probe == nil {
			t.Fatal("the gateway has no readiness probe")
		}
		unready := time.Duration(probe.PeriodSeconds*max(probe.FailureThreshold, 1)+probe.PeriodSeconds) * time.Second
		// And past what would call a replica lost: client-go's 10 s of
		// failed connects (it then hands back an empty watch) and two
		// lease durations (the install's lease_ttl, 10 s).
		window := max(unready, 10*time.Second+2*cluster.DefaultLeaseTTL)
		for _, s := range ids {
			if a := r.preview(ctx, t, other(owners[s]), s); !a.served(s) {
				t.Fatalf("sandbox %s through %s before the outage: %d %.200s %v", s, other(owners[s]), a.status, a.body, a.err)
			}
		}
		cut := time.Now()
		r.apiServer.Cut(true)
		defer r.apiServer.Cut(false)
		// Each replica sees the outage: readyz fails, naming the API
		// server (its engine's check and the cluster's).
		for _, name := range replicaNames {
			testenv.Eventually(t, time.Minute, func() (bool, string) {
				code, body := r.api(t, ctx, name, "GET", "/v1/readyz", nil)
				return code == http.StatusServiceUnavailable, fmt.Sprintf("readyz at %s with the API server cut: %d %s", name, code, body)
			})
		}
		seen := time.Now()
		t.Logf("both replicas unready by readyz %v after the cut", seen.Sub(cut).Round(time.Millisecond))
		// But ready by the install's readiness probe, which leaves out
		// the checks the outage fails.
		if probe.HTTPGet == nil {
			t.Fatal("the gateway's readiness probe is no HTTP GET")
		}
		for _, name := range replicaNames {
			if code, body := r.api(t, ctx, name, "GET", probe.HTTPGet.Path, nil); code != http.StatusOK {
				t.Fatalf("the readiness probe's %s at %s during the outage: %d %s, want 200", probe.HTTPGet.Path, name, code, body)
			}
		}
		// A create needs the API server: refused with a reason, at once.
		code, body := r.api(t, ctx, replicaNames[0], "POST", "/v1/sandboxes", map[string]any{"id": "o" + r.suffix, "image": app, "ports": []int{8080}})
		if code != http.StatusServiceUnavailable || !strings.Contains(string(body), "unreachable") {
			t.Fatalf("a create during the outage: %d %s, want 503 naming the unreachable API server", code, body)
		}
		// Both sandboxes served through both replicas (their own, and
		// forwarded to the other) from memory, every time.
		n := 0
		serveAll := func(when string) {
			t.Helper()
			for _, s := range ids {
				for _, via := range replicaNames {
					if a := r.preview(ctx, t, via, s); !a.served(s) {
						_, nodes := r.api(t, ctx, via, "GET", "/v1/nodes", nil)
						t.Fatalf("sandbox %s (on %s) through %s %v %s: %d %.200s %v (its view of the nodes: %s)", s, owners[s], via, time.Since(cut).Round(time.Millisecond), when, a.status, a.body, a.err, nodes)
					}
					n++
				}
			}
		}
		for time.Since(seen) < window {
			serveAll("into the outage")
		}
		// And the kubelet kept both in the Service: Ready since before
		// the cut.
		for _, name := range replicaNames {
			p, err := r.cs.CoreV1().Pods(r.ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && (c.Status != corev1.ConditionTrue || c.LastTransitionTime.After(cut)) {
					t.Fatalf("replica %s during the outage: Ready %s since %v (the cut at %v), want Ready throughout", name, c.Status, c.LastTransitionTime, cut)
				}
			}
		}
		t.Logf("%v into the outage: %d previews served through both replicas, both still Ready", time.Since(cut).Round(time.Millisecond), n)
		r.apiServer.Cut(false)
		ended := time.Now()
		// Back: serving throughout while each replica sees the API
		// server again (readyz passes), and two lease durations after.
		var ready time.Time
		for ready.IsZero() || time.Since(ready) < 2*cluster.DefaultLeaseTTL {
			serveAll("after the outage")
			if ready.IsZero() {
				if a, _ := r.api(t, ctx, replicaNames[0], "GET", "/v1/readyz", nil); a == http.StatusOK {
					if b, _ := r.api(t, ctx, replicaNames[1], "GET", "/v1/readyz", nil); b == http.StatusOK {
						ready = time.Now()
						t.Logf("both replicas ready again %v after the outage ended", ready.Sub(ended).Round(time.Millisecond))
					}
				}
			}
			if ready.IsZero() && time.Since(ended) > 2*time.Minute {
				t.Fatal("readyz not passing on both replicas 2 minutes after the outage ended")
			}
		}
		t.Logf("%d previews served in all, none failed", n)
	})

	t.Run("a replica deleted comes back and adopts its sandboxes", func(t *testing.T) {
		survivor := other(owner)
		// Both sandboxes running, one on each side or both on one.
		for _, s := range ids {
			if a := r.preview(ctx, t, survivor, s); !a.served(s) {
				t.Fatalf("sandbox %s through %s before the deletion: %d %.200s %v", s, survivor, a.status, a.body, a.err)
			}
		}
		before := r.podUID(t, ctx, id)
		old := r.pods[owner]
		if err := r.cs.CoreV1().Pods(r.ns).Delete(ctx, owner, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		// Until the replica is back: its sandbox, through the survivor,
		// is served or answered 503 with Retry-After, nothing else.
		var served, unavailable int
		back := false
		for deadline := time.Now().Add(4 * time.Minute); time.Now().Before(deadline); {
			a := r.preview(ctx, t, survivor, id)
			switch {
			case a.served(id):
				served++
			case a.err == nil && a.status == http.StatusServiceUnavailable && a.header.Get("Retry-After") != "" &&
				(strings.Contains(a.body, `"host_unavailable"`) || strings.Contains(a.body, `"unavailable"`)):
				// host_unavailable: the survivor cannot reach the owner;
				// unavailable: the owner, stopping, answered the forward.
				unavailable++
			default:
				t.Fatalf("sandbox %s through %s while %s is away: %d %.300s %v (header %v)", id, survivor, owner, a.status, a.body, a.err, a.header)
			}
			p, err := r.cs.CoreV1().Pods(r.ns).Get(ctx, owner, metav1.GetOptions{})
			if err == nil && p.UID != old.UID && kubetest.PodReady(p) {
				r.pods[owner] = p
				back = true
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if !back {
			t.Fatalf("replica %s not back and Ready within 4 minutes", owner)
		}
		t.Logf("replica %s deleted → back and Ready in %v; meanwhile %s answered %d served, %d 503 with Retry-After", owner, time.Since(t0).Round(time.Millisecond), survivor, served, unavailable)
		if unavailable == 0 {
			t.Fatalf("while %s was away, %s answered its sandbox %d times, never 503 with Retry-After: did it go?", owner, survivor, served)
		}
		// Back with its store: it holds the sandbox (its record), adopted
		// the pod (same UID: never restarted), and both replicas serve it.
		testenv.Eventually(t, time.Minute, func() (bool, string) {
			a := r.preview(ctx, t, survivor, id)
			return a.served(id), fmt.Sprintf("sandbox %s through %s after %s came back: %d %.200s %v", id, survivor, owner, a.status, a.body, a.err)
		})
		if a := r.preview(ctx, t, owner, id); !a.served(id) {
			t.Fatalf("sandbox %s through its returned owner: %d %.200s %v", id, a.status, a.body, a.err)
		}
		if after := r.podUID(t, ctx, id); after != before {
			t.Fatalf("sandbox %s's pod: %s before, %s after its replica came back; want it adopted, not replaced", id, before, after)
		}
		code, body := r.api(t, ctx, owner, "GET", "/v1/sandboxes/"+id, nil)
		var rec client.Sandbox
		if json.Unmarshal(body, &rec); code != http.StatusOK || rec.Node != owner || rec.State != "running" {
			t.Fatalf("sandbox %s as its returned owner reads it: %d %s", id, code, body)
		}
	})
}
