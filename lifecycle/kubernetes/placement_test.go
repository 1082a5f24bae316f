package kubernetes

import (
	"context"
	"maps"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestPodPlacement: the engine's node selector, tolerations and runtime
// class reach every pod; a sandbox's own runtime wins over the engine's.
func TestPodPlacement(t *testing.T) {
	tol := []corev1.Toleration{{Key: "sandbox", Operator: corev1.TolerationOpEqual, Value: "yes", Effect: corev1.TaintEffectNoSchedule}}
	sel := map[string]string{"pool": "sandboxes"}
	r, err := New(Options{Client: fake.NewClientset(), Namespace: testNS, Instance: "t1", NodeSelector: sel, Tolerations: tol, RuntimeClass: "gvisor"})
	if err != nil {
		t.Fatal(err)
	}
	pod, err := r.podFor("abc", testSpec())
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(pod.Spec.NodeSelector, sel) || !slices.Equal(pod.Spec.Tolerations, tol) {
		t.Fatalf("placement: selector %v tolerations %v", pod.Spec.NodeSelector, pod.Spec.Tolerations)
	}
	if pod.Spec.RuntimeClassName == nil || *pod.Spec.RuntimeClassName != "gvisor" {
		t.Fatalf("runtime class %v, want the engine's gvisor", pod.Spec.RuntimeClassName)
	}
	// The pod's map is its own: a change to one pod reaches no other.
	pod.Spec.NodeSelector["x"] = "y"
	if len(r.opts.NodeSelector) != 1 {
		t.Fatal("the pod shares the engine's node selector map")
	}
	spec := testSpec()
	spec.Runtime = "kata"
	if pod, _ = r.podFor("abc", spec); *pod.Spec.RuntimeClassName != "kata" {
		t.Fatalf("runtime class %v, want the sandbox's kata", *pod.Spec.RuntimeClassName)
	}
	plain, _ := newFake(t)
	if pod, _ = plain.podFor("abc", testSpec()); pod.Spec.NodeSelector != nil || pod.Spec.Tolerations != nil || pod.Spec.RuntimeClassName != nil {
		t.Fatalf("no placement configured: %+v", pod.Spec)
	}
}

// TestConfiguredLabels: the configured labels are on every object made
// (pod, claim, NetworkPolicy) beside sandwake's own, which they cannot
// replace; labels Kubernetes would refuse are refused at New.
func TestConfiguredLabels(t *testing.T) {
	cs := fake.NewClientset()
	r, _ := startFake(t, cs, Options{Labels: map[string]string{"team": "previews", "example.com/cost-center": "c42"}})
	ctx := context.Background()
	if _, err := r.Create(ctx, "abc", testSpec()); err != nil {
		t.Fatal(err)
	}
	pod, err := r.podFor("abc", testSpec())
	if err != nil {
		t.Fatal(err)
	}
	claim, err := cs.CoreV1().PersistentVolumeClaims(testNS).Get(ctx, ClaimName("abc"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	policy, err := cs.NetworkingV1().NetworkPolicies(testNS).Get(ctx, PolicyName("abc"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for kind, l := range map[string]map[string]string{"pod": pod.Labels, "claim": claim.Labels, "policy": policy.Labels} {
		if l["team"] != "previews" || l["example.com/cost-center"] != "c42" || !r.owns("abc", l) {
			t.Fatalf("%s labels %v: want the configured ones and sandwake's", kind, l)
		}
	}
	for _, bad := range []map[string]string{{"sandwake.id": "x"}, {"team": "a/b"}, {"bad key!": "x"}} {
		if _, err := New(Options{Client: cs, Namespace: testNS, Instance: "t1", Labels: bad}); err == nil {
			t.Fatalf("labels %v accepted", bad)
		}
	}
}
