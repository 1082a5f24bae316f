package kubernetes

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"

	"github.com/sandwake/sandwake/lifecycle"
)

// This file holds what the informers' cache gives the rest of the runtime:
// objects kept small, and a wait for a sandbox's objects to change.

// everything selects every object the (already label-selected) cache has.
var everything = labels.Everything()

// dropManagedFields is the informers' transform: the server-side apply
// bookkeeping is most of a pod's size and nothing here reads it; of a pod
// the cache keeps only what the runtime reads (slimPod).
func dropManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	switch o := obj.(type) {
	case *corev1.Pod:
		slimPod(o)
	case *corev1.PersistentVolumeClaim:
		slimClaim(o)
	}
	return obj, nil
}

// slimClaim keeps of a claim what the runtime reads from the cache: its
// identity, deletion and sandwake's labels, and whether it keeps a pod and
// a NetworkPolicy, as digests of them (the JSON itself is most of a
// claim's size). The owner's annotations, the record's labels, the spec
// and the status go: VolumeOwner, Start and Unpause read the claim from
// the API server.
func slimClaim(c *corev1.PersistentVolumeClaim) {
	c.Annotations = only(c.Annotations, AnnotationPod, AnnotationPolicy)
	for k, v := range c.Annotations {
		c.Annotations[k] = digestOf(v)
	}
	c.Labels = only(c.Labels, ownLabels...)
	c.OwnerReferences, c.Finalizers = nil, nil
	c.Spec, c.Status = corev1.PersistentVolumeClaimSpec{}, corev1.PersistentVolumeClaimStatus{}
}

// ownLabels are the labels of sandwake's that the runtime reads from the
// cache: whose, which sandbox, which service.
var ownLabels = []string{LabelManaged, LabelInstance, LabelID, LabelService}

// only is m with the given keys alone (nil when it has none of them).
func only(m map[string]string, keys ...string) map[string]string {
	var out map[string]string
	for _, k := range keys {
		if v, ok := m[k]; ok {
			if out == nil {
				out = make(map[string]string, len(keys))
			}
			out[k] = v
		}
	}
	return out
}

// digestOf is what the cache holds of a claim's kept pod or policy: a
// digest that tells one write from another.
func digestOf(v string) string {
	sum := sha256.Sum256([]byte(v))
	return hex.EncodeToString(sum[:12])
}

// keptSame reports whether cached, a claim from the cache, holds what
// written, the claim as written, keeps under annotation key (or, alike,
// nothing).
func keptSame(cached, written *corev1.PersistentVolumeClaim, key string) bool {
	c, inCache := cached.Annotations[key]
	w, inWrite := written.Annotations[key]
	return inCache == inWrite && (!inWrite || c == digestOf(w))
}

// slimPod keeps of a pod what the runtime reads from the cache: its
// identity, deletion and sandwake's labels, the pool's annotations, each
// container's name and ports (the upstreams) and a sidecar's restart
// policy and startup probe (its ready), whether it is paused
// (AnnotationPaused, from the app's CPU limit: pause.go), and of the status
// the phase, address and containers' states. The spec the pod was made
// from is on its claim (AnnotationPod); the record's labels, the
// containers' images, env, resources, volumes and security contexts, the
// conditions (a wait that runs out reads them from the API server) and
// the images' ids are dropped: they are most of a pod's size, and an
// informer holds every pod of the instance.
func slimPod(pod *corev1.Pod) {
	keep := only(pod.Annotations, AnnotationPool, AnnotationPoolKey)
	if cutCPUOf(pod) {
		if keep == nil {
			keep = make(map[string]string, 1)
		}
		keep[AnnotationPaused] = "true"
	}
	pod.Annotations = keep
	pod.Labels = only(pod.Labels, ownLabels...)
	pod.OwnerReferences, pod.Finalizers = nil, nil
	pod.Spec = corev1.PodSpec{
		Containers:     slimContainers(pod.Spec.Containers),
		InitContainers: slimContainers(pod.Spec.InitContainers),
		NodeName:       pod.Spec.NodeName,
	}
	pod.Status = corev1.PodStatus{
		Phase:                 pod.Status.Phase,
		PodIP:                 pod.Status.PodIP,
		ContainerStatuses:     slimStatuses(pod.Status.ContainerStatuses),
		InitContainerStatuses: slimStatuses(pod.Status.InitContainerStatuses),
	}
}

// slimContainers are cs with only their names, ports, restart policies
// and startup probes.
func slimContainers(cs []corev1.Container) []corev1.Container {
	if len(cs) == 0 {
		return nil
	}
	out := make([]corev1.Container, len(cs))
	for i, c := range cs {
		out[i] = corev1.Container{Name: c.Name, Ports: c.Ports, RestartPolicy: c.RestartPolicy, StartupProbe: c.StartupProbe}
	}
	return out
}

// slimStatuses are ss with only their names, states, last terminations,
// restart counts and whether started and ready.
func slimStatuses(ss []corev1.ContainerStatus) []corev1.ContainerStatus {
	if len(ss) == 0 {
		return nil
	}
	out := make([]corev1.ContainerStatus, len(ss))
	for i, s := range ss {
		out[i] = corev1.ContainerStatus{Name: s.Name, State: s.State, LastTerminationState: s.LastTerminationState,
			RestartCount: s.RestartCount, Started: s.Started, Ready: s.Ready}
	}
	return out
}

// idOf is the sandbox an informer's object (or its tombstone) belongs to.
func idOf(obj any) string {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if m, ok := obj.(metav1.Object); ok {
		return m.GetLabels()[LabelID]
	}
	return ""
}

// changes lets an operation wait for sandbox id's pod or claim to change,
// as the informers see it: a channel per waited-on id, closed at the next
// change (no poll, no API call).
type changes struct {
	mu      sync.Mutex
	waiting map[string]chan struct{}
}

// next is closed at the next change of sandbox id's objects.
func (c *changes) next(id string) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.waiting == nil {
		c.waiting = map[string]chan struct{}{}
	}
	ch, ok := c.waiting[id]
	if !ok {
		ch = make(chan struct{})
		c.waiting[id] = ch
	}
	return ch
}

// fire wakes whoever waits on sandbox id.
func (c *changes) fire(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ch, ok := c.waiting[id]; ok {
		close(ch)
		delete(c.waiting, id)
	}
}

// waitFor waits until done says so (or fails), checking it now and at
// every change of sandbox id's objects, within ctx. what names the wait
// for the error.
func (r *Runtime) waitFor(ctx context.Context, id, what string, done func() (bool, error)) error {
	for {
		next := r.changes.next(id)
		ok, err := done()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-next:
		case <-r.stop:
			return fmt.Errorf("waiting for %s: %w: the runtime was closed", what, lifecycle.ErrUnavailable)
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w%s", what, ctx.Err(), r.why(id))
		}
	}
}

// why tells, for a wait that ran out, what the pod's conditions say (an
// unbound claim, no node with room), read from the API server (the cache
// keeps no conditions).
func (r *Runtime) why(id string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pod, err := r.cs.CoreV1().Pods(r.opts.Namespace).Get(ctx, PodName(id), metav1.GetOptions{})
	if err != nil || !r.owns(id, pod.Labels) {
		return ""
	}
	for _, c := range pod.Status.Conditions {
		if c.Status != "True" && c.Message != "" {
			return fmt.Sprintf(" (pod %s: %s: %s)", pod.Name, c.Reason, c.Message)
		}
	}
	for _, s := range slices.Concat(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses) {
		if w := s.State.Waiting; w != nil && w.Reason != "" && w.Reason != "PodInitializing" {
			return fmt.Sprintf(" (pod %s: %s: %s)", pod.Name, w.Reason, w.Message)
		}
	}
	return ""
}
