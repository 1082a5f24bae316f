package kubernetes

import (
	"maps"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
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
