package engine

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestTolerations: the Caddyfile's tolerations become the pods': a key
// alone (or none: every taint) tolerates with Exists, a key and value with
// Equal, and the effect is kept.
func TestTolerations(t *testing.T) {
	k := KubernetesOptions{Tolerations: []Toleration{{Key: "gpu"}, {}, {Key: "sandbox", Value: "yes", Effect: "NoSchedule"}, {Key: "x", Operator: "Exists", Effect: "NoExecute"}}}
	want := []corev1.Toleration{
		{Key: "gpu", Operator: corev1.TolerationOpExists},
		{Operator: corev1.TolerationOpExists},
		{Key: "sandbox", Operator: corev1.TolerationOpEqual, Value: "yes", Effect: corev1.TaintEffectNoSchedule},
		{Key: "x", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
	}
	if got := k.tolerations(); !reflect.DeepEqual(got, want) {
		t.Fatalf("tolerations %+v, want %+v", got, want)
	}
}
