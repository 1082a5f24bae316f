package caddymodule_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
)

// TestKubernetesEngine runs a real Caddy with `engine kubernetes` on a real
// cluster (internal/kubetest: skipped without one) and drives a sandbox
// through the API and its preview host as a user would: create (a claim
// and a running pod), a preview request through the gate answered by the
// pod, stop (pod gone, claim kept), a held API-style request that wakes it
// (exactly one pod made), destroy (no pod, claim kept) and purge (no
// claim); its NetworkPolicy made at create and gone at destroy, and a
// create with a name entry refused (400, no record).
func TestKubernetesEngine(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	h := newKubeEnv(t, ctx, "", "")
	cl, cs, ns, suffix := h.cl, h.cs, h.ns, h.suffix
	pods, claims := h.cs.CoreV1().Pods(h.ns), h.cs.CoreV1().PersistentVolumeClaims(h.ns)
	var ready map[string]any
	h.API("GET", "/v1/readyz", nil, &ready)
	t.Logf("readyz: %v", ready)

	// Create: a claim and a running pod on the bridge.
	id := "k" + suffix
	var rec client.Sandbox
	if status := h.API("POST", "/v1/sandboxes", map[string]any{"id": id, "image": h.image, "ports": []int{8080}}, &rec); status != http.StatusCreated || rec.State != "running" {
		t.Fatalf("create: %d %+v", status, rec)
	}
	podOnBridge := func() *corev1.Pod {
		t.Helper()
		pod, err := pods.Get(ctx, "s-"+id, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("pod of a running sandbox: %v", err)
		}
		cl.OnBridge(t, pod.Status.PodIP)
		return pod
	}
	first := podOnBridge()
	if _, err := claims.Get(ctx, "s-"+id+"-data", metav1.GetOptions{}); err != nil {
		t.Fatalf("claim of a running sandbox: %v", err)
	}
	// Its egress policy is a NetworkPolicy (the test cluster's bridge
	// plugin does not enforce it: the object is what is checked); a
	// create with a name entry is refused, 400, and leaves no record.
	policies := cs.NetworkingV1().NetworkPolicies(ns)
	if pol, err := policies.Get(ctx, "s-"+id, metav1.GetOptions{}); err != nil || len(pol.Spec.Egress) != 2 {
		t.Fatalf("policy of a public sandbox: %+v, %v", pol, err)
	}
	named := "n" + suffix
	if status := h.API("POST", "/v1/sandboxes", map[string]any{"id": named, "image": h.image, "ports": []int{8080},
		"egress": map[string]any{"policy": "none", "allow": []string{"registry.npmjs.org"}}}, nil); status != http.StatusBadRequest {
		t.Fatalf("create with a name entry: %d, want 400", status)
	}
	if status := h.API("GET", "/v1/sandboxes/"+named, nil, nil); status != http.StatusNotFound {
		t.Fatalf("the refused create left a record: GET %d", status)
	}
	if _, err := policies.Get(ctx, "s-"+named, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the refused create left a policy: %v", err)
	}
	host := h.Host(id, 8080)
	if res, body := h.Preview("GET", host, "/healthz", nil, gatewaytest.APIHeader()); res.StatusCode != 200 || body != "ok\n" {
		t.Fatalf("preview of a running sandbox: %d %q", res.StatusCode, body)
	}

	// Stop: the pod goes, the claim (the workspace) stays.
	h.Stop(id)
	if _, err := pods.Get(ctx, "s-"+id, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("pod after stop: %v", err)
	}
	if _, err := claims.Get(ctx, "s-"+id+"-data", metav1.GetOptions{}); err != nil {
		t.Fatalf("claim after stop: %v", err)
	}

	// Wake through the gate: an API client's request is held and answered
	// by the pod the wake made, the only one.
	made := h.podsAdded(t, ctx, "")
	req, _ := http.NewRequest("GET", "http://"+host+"/healthz", nil)
	req.Header = gatewaytest.APIHeader()
	var firstByte time.Time
	req = req.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotFirstResponseByte: func() { firstByte = time.Now() }}))
	t0 := time.Now()
	res, err := h.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	wake := firstByte.Sub(t0)
	if res.StatusCode != 200 {
		t.Fatalf("held request to a stopped sandbox: %d", res.StatusCode)
	}
	if s := h.State(id); s != "running" {
		t.Fatalf("after the wake: %s", s)
	}
	second := podOnBridge()
	if second.UID == first.UID {
		t.Fatal("the wake answered from the stopped pod")
	}
	// A request to the awake sandbox makes no pod.
	if res, _ := h.Preview("GET", host, "/healthz", nil, gatewaytest.APIHeader()); res.StatusCode != 200 {
		t.Fatalf("preview after the wake: %d", res.StatusCode)
	}
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		return made.Load() >= 1, "the woken pod's ADDED event"
	})
	if n := made.Load(); n != 1 {
		t.Fatalf("pods made by the wake: %d, want 1", n)
	}

	// Destroy: no pod; purge: no claim.
	if status := h.API("DELETE", "/v1/sandboxes/"+id, nil, nil); status != http.StatusNoContent {
		t.Fatalf("destroy: %d", status)
	}
	if _, err := pods.Get(ctx, "s-"+id, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("pod after destroy: %v", err)
	}
	if _, err := policies.Get(ctx, "s-"+id, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("policy after destroy: %v", err)
	}
	if _, err := claims.Get(ctx, "s-"+id+"-data", metav1.GetOptions{}); err != nil {
		t.Fatalf("claim after destroy (the workspace is kept until purge): %v", err)
	}
	if status := h.API("POST", "/v1/sandboxes/"+id+"/purge", nil, nil); status/100 != 2 {
		t.Fatalf("purge: %d", status)
	}
	testenv.Eventually(t, 60*time.Second, func() (bool, string) {
		_, err := claims.Get(ctx, "s-"+id+"-data", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprintf("claim after purge: %v", err)
	})
	if n := made.Load(); n != 1 {
		t.Fatalf("pods made since the stop: %d, want 1", n)
	}
	t.Logf("wake of a stopped sandbox through the gate (held request → first byte): %v", wake)
}
