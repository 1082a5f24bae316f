package caddymodule_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/internal/gatewaytest"
)

// Tokens of the tenants in TestKubernetesPromises.
const (
	kubeAcmeToken   = "acme-token-0123456789abcdef0123456789"
	kubeGlobexToken = "globex-token-0123456789abcdef01234567"
)

// TestKubernetesPromises runs the promises the Docker engine's tests hold
// on a real cluster, through a real Caddy with engine kubernetes: files
// kept across stop and wake, one pod for a storm of 1,000 requests at a
// stopped sandbox, a pod deleted behind sandwake's back seen from the
// informer and woken again, idle tiers that pause a pod in place (its CPU
// cut) and then stop it, a tenant's create that never mounts another
// tenant's claim, a template's warm pool whose hit makes no pod, and the
// dashboard, in a real browser, pausing and waking a pod.
func TestKubernetesPromises(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// The reaper every 250 ms: at the default 10 s a pass may first see
	// the idle-tiers subtest's sandbox past both its tiers (1 s, 8 s),
	// which stops it without the pause the subtest watches for.
	e := newKubeEnv(t, ctx, `
		reconcile_interval 1s
		reap_interval 250ms
		template web {
			image {image}
			ports 8080
			pool {
				min_idle 1
			}
		}`, `
		token `+kubeAcmeToken+` {
			labels tenant=acme
		}
		token `+kubeGlobexToken+` {
			labels tenant=globex
		}`)
	create := func(t *testing.T, body map[string]any) client.Sandbox {
		t.Helper()
		var rec client.Sandbox
		if status := e.API("POST", "/v1/sandboxes", body, &rec); status != http.StatusCreated || rec.State != "running" {
			t.Fatalf("create %v: %d %+v", body, status, rec)
		}
		return rec
	}
	api := gatewaytest.APIHeader()

	id := "p" + e.suffix
	create(t, map[string]any{"id": id, "image": e.image, "ports": []int{8080}})
	host := e.Host(id, 8080)

	t.Run("files kept across stop and wake", func(t *testing.T) {
		if res, body := e.Preview("PUT", host, "/files/note.txt", strings.NewReader("kept on the claim"), api); res.StatusCode != http.StatusCreated {
			t.Fatalf("writing a file: %d %s", res.StatusCode, body)
		}
		before := e.pod(ctx, id)
		e.Stop(id)
		if e.pod(ctx, id) != nil {
			t.Fatal("a pod after stop")
		}
		res, body := e.Preview("GET", host, "/files/note.txt", nil, api)
		if res.StatusCode != http.StatusOK || body != "kept on the claim" {
			t.Fatalf("the file after a wake: %d %q", res.StatusCode, body)
		}
		if after := e.pod(ctx, id); after == nil || after.UID == before.UID {
			t.Fatal("the file was not read from a new pod")
		}
	})

	t.Run("a storm of 1,000 makes one pod", func(t *testing.T) {
		e.Stop(id)
		made := e.podsAdded(t, ctx, "s-"+id)
		const n = 1000
		var wg sync.WaitGroup
		codes := make(chan int, n)
		for range n {
			wg.Go(func() {
				req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+host+"/healthz", nil)
				req.Header = api.Clone()
				res, err := e.Client.Do(req)
				if err != nil {
					codes <- 0
					return
				}
				res.Body.Close()
				codes <- res.StatusCode
			})
		}
		wg.Wait()
		close(codes)
		bad := map[int]int{}
		for c := range codes {
			if c != http.StatusOK {
				bad[c]++
			}
		}
		if len(bad) > 0 {
			t.Fatalf("answers other than 200 (0: transport error): %v", bad)
		}
		e.eventually(t, "the woken pod's ADDED event", func() bool { return made.Load() >= 1 })
		if m := made.Load(); m != 1 {
			t.Fatalf("pods made for the storm: %d, want 1", m)
		}
	})

	t.Run("a pod deleted behind its back", func(t *testing.T) {
		pod := e.pod(ctx, id)
		if pod == nil {
			t.Fatal("no pod")
		}
		zero := int64(0)
		if err := e.cs.CoreV1().Pods(e.ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
		e.eventually(t, "the record to leave running once the pod is gone", func() bool { return e.State(id) != "running" })
		if res, _ := e.Preview("GET", host, "/healthz", nil, api); res.StatusCode != http.StatusOK {
			t.Fatalf("a request after the deletion: %d", res.StatusCode)
		}
		if s := e.State(id); s != "running" {
			t.Fatalf("after the wake: %s", s)
		}
	})

	t.Run("idle tiers: paused in place, woken by a request, then stopped", func(t *testing.T) {
		idle := "i" + e.suffix
		create(t, map[string]any{"id": idle, "image": e.image, "ports": []int{8080}, "idle_pause": "1s", "idle_stop": "8s"})
		ih := e.Host(idle, 8080)
		// State only the process holds: 3 /wait requests served at once.
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() {
				// Not the test's goroutine: errors, not Fatal.
				if res, _, err := e.PreviewErr("GET", ih, "/wait?ms=300", nil, api); err != nil || res.StatusCode != http.StatusOK {
					t.Errorf("GET /wait: %v %v", res, err)
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		before := e.pod(ctx, idle)
		e.eventually(t, "the idle sandbox paused, its pod's CPU cut in place", func() bool {
			p := e.pod(ctx, idle)
			return e.State(idle) == "paused" && p != nil && p.UID == before.UID &&
				p.Spec.Containers[0].Resources.Limits.Cpu().MilliValue() <= 2
		})
		t0 := time.Now()
		res, body := e.Preview("GET", ih, "/inflight", nil, api)
		woke := time.Since(t0)
		if res.StatusCode != http.StatusOK || body != "0 3\n" {
			t.Fatalf("a request to the paused sandbox: %d %q, want 200 and the process's own state (0 3)", res.StatusCode, body)
		}
		if p := e.pod(ctx, idle); p == nil || p.UID != before.UID || p.Spec.Containers[0].Resources.Limits.Cpu().MilliValue() <= 2 {
			t.Fatalf("after the wake: pod %v, want the same pod (%s) with its CPU back", p, before.UID)
		}
		if s := e.State(idle); s != "running" {
			t.Fatalf("after the wake: %s", s)
		}
		t.Logf("wake from paused through the gateway: request → answer %v", woke)
		e.eventually(t, "the idle sandbox stopped and its pod gone", func() bool {
			return e.State(idle) == "stopped" && e.pod(ctx, idle) == nil
		})
		if _, err := e.cs.CoreV1().PersistentVolumeClaims(e.ns).Get(ctx, "s-"+idle+"-data", metav1.GetOptions{}); err != nil {
			t.Fatalf("the idle sandbox's claim: %v", err)
		}
	})

	t.Run("a tenant never mounts another's claim", func(t *testing.T) {
		x := "x" + e.suffix
		spec := map[string]any{"id": x, "image": e.image, "ports": []int{8080}}
		if code, body := e.callAs(t, kubeAcmeToken, "POST", "/v1/sandboxes", spec); code != http.StatusCreated {
			t.Fatalf("acme creates %s: %d %s", x, code, body)
		}
		if res, body := e.Preview("PUT", e.Host(x, 8080), "/files/secret.txt", strings.NewReader("acme's"), api); res.StatusCode != http.StatusCreated {
			t.Fatalf("acme's file: %d %s", res.StatusCode, body)
		}
		if code, body := e.callAs(t, kubeAcmeToken, "DELETE", "/v1/sandboxes/"+x, nil); code != http.StatusNoContent {
			t.Fatalf("acme destroys %s: %d %s", x, code, body)
		}
		claim, err := e.cs.CoreV1().PersistentVolumeClaims(e.ns).Get(ctx, "s-"+x+"-data", metav1.GetOptions{})
		if err != nil || claim.Annotations["sandwake.owner.label.tenant"] != "acme" {
			t.Fatalf("the kept claim does not record acme: %v %v", err, claim.GetAnnotations())
		}
		made := e.podsAdded(t, ctx, "s-"+x)
		if code, body := e.callAs(t, kubeGlobexToken, "POST", "/v1/sandboxes", spec); code/100 == 2 {
			t.Fatalf("globex creates acme's destroyed %s: %d %s", x, code, body)
		}
		if code, body := e.callAs(t, kubeGlobexToken, "POST", "/v1/sandboxes/"+x+"/purge", nil); code != http.StatusNotFound {
			t.Fatalf("globex purges acme's claim: %d %s, want 404", code, body)
		}
		// acme's create makes the only pod of x: globex's made none.
		if code, body := e.callAs(t, kubeAcmeToken, "POST", "/v1/sandboxes", spec); code != http.StatusCreated {
			t.Fatalf("acme re-creates %s: %d %s", x, code, body)
		}
		if res, body := e.Preview("GET", e.Host(x, 8080), "/files/secret.txt", nil, api); res.StatusCode != http.StatusOK || body != "acme's" {
			t.Fatalf("acme's file after globex's refused create: %d %q", res.StatusCode, body)
		}
		e.eventually(t, "acme's pod's ADDED event", func() bool { return made.Load() >= 1 })
		if m := made.Load(); m != 1 {
			t.Fatalf("pods of %s since acme destroyed it: %d, want 1 (acme's)", x, m)
		}
	})

	t.Run("a pool hit makes no pod", func(t *testing.T) {
		var pooled string
		var pooledUID types.UID
		pool := func() client.PoolStatus {
			var list client.TemplateList
			e.API("GET", "/v1/templates", nil, &list)
			if len(list.Templates) != 1 || list.Templates[0].Pool == nil {
				t.Fatalf("templates: %+v", list)
			}
			return *list.Templates[0].Pool
		}
		e.eventually(t, "a ready pool pod of template web", func() bool { return pool().Idle > 0 })
		// Two full reconciles later (the first may have listed before the
		// pod was ready), the pod is still the pool's: the sweep expects
		// it running (a pause that only throttles keeps pool pods running).
		lastReconcile := func() string {
			var ready struct {
				LastReconcile string `json:"last_reconcile"`
			}
			e.API("GET", "/v1/readyz", nil, &ready)
			return ready.LastReconcile
		}
		for range 2 {
			at := lastReconcile()
			e.eventually(t, "a reconcile after "+at, func() bool { return lastReconcile() > at })
		}
		if p := pool(); p.Idle != 1 || p.Refills != 1 {
			t.Fatalf("the pool after two reconciles: %+v (want the one pod it made, idle)", p)
		}
		list, err := e.cs.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range list.Items {
			if p.Annotations["sandwake.pool"] == "web" {
				pooled, pooledUID = p.Labels["sandwake.id"], p.UID
				// A pause here only throttles: pool pods run, so a hit
				// does not wait for the kubelet to give the CPU back.
				if p.Spec.Containers[0].Resources.Limits.Cpu().MilliValue() <= 2 {
					t.Fatalf("pool pod %s has its CPU cut (paused); pool pods run on Kubernetes", p.Name)
				}
			}
		}
		if pooled == "" {
			t.Fatal("no pod carries the pool's annotation")
		}
		made := e.podsAdded(t, ctx, "s-"+pooled)
		t0 := time.Now()
		var rec client.Sandbox
		if status := e.API("POST", "/v1/sandboxes", map[string]any{"template": "web", "egress": map[string]any{"policy": "none"}}, &rec); status != http.StatusCreated || rec.ID != pooled {
			t.Fatalf("create from the pool: %d %+v (pool pod of %s)", status, rec, pooled)
		}
		res, _ := e.Preview("GET", e.Host(rec.ID, 8080), "/healthz", nil, api)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("the pool hit's first request: %d", res.StatusCode)
		}
		t.Logf("pool hit: create → first answer %v", time.Since(t0))
		// The pool pod was made under the template's policy (public); the
		// claimant asked for none, and its NetworkPolicy says so.
		np, err := e.cs.NetworkingV1().NetworkPolicies(e.ns).Get(ctx, "s-"+rec.ID, metav1.GetOptions{})
		if err != nil || len(np.Spec.Egress) != 0 {
			t.Fatalf("the claimed sandbox's NetworkPolicy (egress none): %v %+v", err, np.Spec.Egress)
		}
		// The claimed sandbox runs on the pool's very pod (a pod made
		// for the hit would have another UID; the watch's count below
		// may not have seen it yet).
		if p := e.pod(ctx, rec.ID); p == nil || p.UID != pooledUID {
			t.Fatalf("the claimed sandbox's pod: %v, want the pool's %s", p, pooledUID)
		}
		if m := made.Load(); m != 0 {
			t.Fatalf("pods made for a pool hit: %d, want 0", m)
		}
	})

	t.Run("a create whose image no node has leaves nothing", func(t *testing.T) {
		bad := "m" + e.suffix
		var body map[string]any
		status := e.API("POST", "/v1/sandboxes", map[string]any{"id": bad, "image": "sandwake.local/no-such-image:" + e.suffix, "ports": []int{8080}}, &body)
		if status != http.StatusUnprocessableEntity || !strings.Contains(fmt.Sprint(body), "image_missing") {
			t.Fatalf("create with a missing image: %d %v, want 422 image_missing", status, body)
		}
		if s := e.API("GET", "/v1/sandboxes/"+bad, nil, nil); s != http.StatusNotFound {
			t.Fatalf("the refused sandbox's record: %d, want 404", s)
		}
		e.eventually(t, "no pod, claim or NetworkPolicy left of the refused create", func() bool {
			_, perr := e.cs.CoreV1().Pods(e.ns).Get(ctx, "s-"+bad, metav1.GetOptions{})
			_, cerr := e.cs.CoreV1().PersistentVolumeClaims(e.ns).Get(ctx, "s-"+bad+"-data", metav1.GetOptions{})
			_, nerr := e.cs.NetworkingV1().NetworkPolicies(e.ns).Get(ctx, "s-"+bad, metav1.GetOptions{})
			return apierrors.IsNotFound(perr) && apierrors.IsNotFound(cerr) && apierrors.IsNotFound(nerr)
		})
		// The id is free.
		create(t, map[string]any{"id": bad, "image": e.image, "ports": []int{8080}})
	})

	t.Run("the dashboard pauses and wakes a pod", func(t *testing.T) {
		row := func(inner string) chromedp.CSS {
			return chromedp.CSS(fmt.Sprintf(`tr[data-id=%q] %s`, id, inner))
		}
		before := e.pod(ctx, id)
		if before == nil || e.State(id) != "running" {
			t.Fatalf("sandbox %s: %s, pod %v; want running", id, e.State(id), before)
		}
		bctx := gatewaytest.NewBrowser(t, chromedp.WindowSize(1280, 800))
		gatewaytest.Browse(t, bctx, "signing in to the dashboard",
			chromedp.Navigate(e.APIURL("/")),
			chromedp.WaitVisible(chromedp.ID("token-form")),
			chromedp.SendKeys(chromedp.ID("token-input"), gatewaytest.Token),
			chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
			chromedp.WaitVisible(row(`td.state[data-state="running"]`)),
		)
		gatewaytest.Browse(t, bctx, "pausing from the row",
			chromedp.Click(row(`button[data-action="pause"]`)),
			chromedp.WaitVisible(row(`td.state[data-state="paused"]`)),
		)
		if p := e.pod(ctx, id); p == nil || p.UID != before.UID || p.Spec.Containers[0].Resources.Limits.Cpu().MilliValue() > 2 {
			t.Fatalf("after the dashboard's pause: pod %v, want the same pod (%s) with its CPU cut", p, before.UID)
		}
		gatewaytest.Browse(t, bctx, "waking from the row",
			chromedp.Click(row(`button[data-action="wake"]`)),
			chromedp.WaitVisible(row(`td.state[data-state="running"]`)),
		)
		if p := e.pod(ctx, id); p == nil || p.UID != before.UID || p.Spec.Containers[0].Resources.Limits.Cpu().MilliValue() <= 2 {
			t.Fatalf("after the dashboard's wake: pod %v, want the same pod (%s) with its CPU back", p, before.UID)
		}
		gatewaytest.Screenshot(t, bctx, "kubernetes-dashboard.png")
	})
}
