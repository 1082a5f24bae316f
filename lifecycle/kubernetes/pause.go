package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandwake/sandwake/lifecycle"
)

// This file holds the pause tier. Kubernetes cannot freeze a pod; a pause
// cuts the CPU of each of its containers to the least in place, through
// the pod's resize subresource (no restart: the containers' resize policy
// for CPU is the default, NotRequired). The process keeps its memory and
// state and runs on at 1-2 % of a core; a wake gives the CPU back as the
// pod was made (kept on its claim) and returns as soon as the informer
// reads the change, not once the kubelet applied it: the cut app already
// answers, and the kubelet gives its CPU back within about 100 ms
// (docs/kubernetes.md, "Pause on Kubernetes"). A wake whose resize is
// refused deletes the pod: the Manager starts it again from its claim. A pod's QoS class cannot change by a resize, so every pod
// is made with a CPU request and limit (resources) and the cut keeps
// their relation: equal ones are both cut to pausedCPUMilli, a limit above
// its request is cut to pausedBurstCPUMilli.

// CPU of pods, in millicores.
const (
	// minCPUMilli is the least CPU a pod is made with: no running pod
	// reads as paused.
	minCPUMilli = 10
	// idleCPUMilli is the CPU request of a sandbox whose cpus is 0
	// (unlimited), and unlimitedCPUMilli its limit, which bounds nothing.
	idleCPUMilli      = 1
	unlimitedCPUMilli = lifecycle.MaxCPUs * 1000
	// pausedCPUMilli is a paused container's CPU request and limit when
	// they are equal; pausedBurstCPUMilli its limit when above the
	// request (which stays).
	pausedCPUMilli      = 1
	pausedBurstCPUMilli = 2
)

// CanPause implements lifecycle.Pauser: a pause cuts the pod's CPU.
func (r *Runtime) CanPause() bool { return true }

// PauseFreezes implements lifecycle.Pauser: the cut app runs on at 1 % of
// a core, and a wake's first answers wait for the kubelet to give the CPU
// back (up to a CFS period), so pool pods run.
func (r *Runtime) PauseFreezes() bool { return false }

// Pause implements lifecycle.Runtime: every container's CPU is cut to the
// least, in place. It returns once the cache reads the pod as paused. A
// pod without a CPU limit (made before pods always had one), or a cluster
// that cannot resize pods, cannot be paused: ErrPauseUnsupported, and the
// reaper stops the sandbox instead.
func (r *Runtime) Pause(ctx context.Context, id string) error {
	pod, err := r.runningPod(id, "pausing")
	if err != nil {
		return err
	}
	if paused(pod) {
		return nil
	}
	made, err := r.madePod(ctx, id, "pausing")
	if err != nil {
		return err
	}
	cut, ok := cutCPU(made)
	if !ok {
		return fmt.Errorf("pausing sandbox %s: %w: its pod %s has a container without a CPU limit (made before sandwake gave every pod one), which no resize can add", id, lifecycle.ErrPauseUnsupported, pod.Name)
	}
	if err := r.resize(ctx, pod, cut); err != nil {
		return fmt.Errorf("pausing sandbox %s: %w", id, err)
	}
	return r.waitPaused(ctx, id, true)
}

// Unpause implements lifecycle.Runtime: the pod's containers get back the
// CPU they were made with (the pod kept on the claim). It returns once
// the cache reads the pod as running; the kubelet applies the change
// meanwhile, and the app answers, slowly, until it has.
func (r *Runtime) Unpause(ctx context.Context, id string) error {
	pod, err := r.runningPod(id, "unpausing")
	if err != nil {
		return err
	}
	if !paused(pod) {
		return nil
	}
	made, err := r.madePod(ctx, id, "unpausing")
	if err != nil {
		return err
	}
	if err := r.resize(ctx, pod, cpuPatch(made, cpuOf)); errors.Is(err, lifecycle.ErrPauseUnsupported) {
		// Left cut, the app would crawl: it goes, and the wake starts it
		// again from its claim.
		if derr := r.deletePod(ctx, id, pod); derr != nil {
			return fmt.Errorf("unpausing sandbox %s: %w (and deleting its pod: %w)", id, err, derr)
		}
		if werr := r.waitPodGone(ctx, id); werr != nil {
			return fmt.Errorf("unpausing sandbox %s: %w (and deleting its pod: %w)", id, err, werr)
		}
		return fmt.Errorf("unpausing sandbox %s: %w: its pod was deleted, as the CPU could not be given back: %w", id, lifecycle.ErrContainerNotFound, err)
	} else if err != nil {
		return fmt.Errorf("unpausing sandbox %s: %w", id, err)
	}
	return r.waitPaused(ctx, id, false)
}

// madePod is the pod sandbox id's claim keeps, as it was made (the cache
// keeps neither the claim's copy nor the pod's resources), read from the
// API server.
func (r *Runtime) madePod(ctx context.Context, id, doing string) (*corev1.Pod, error) {
	claim, err := r.cs.CoreV1().PersistentVolumeClaims(r.opts.Namespace).Get(ctx, ClaimName(id), metav1.GetOptions{})
	if err != nil {
		return nil, classify("reading claim "+ClaimName(id), err, lifecycle.ErrContainerNotFound)
	}
	made, err := podOf(claim)
	if err != nil {
		return nil, err
	}
	if made == nil {
		return nil, fmt.Errorf("%s sandbox %s: %w: claim %s keeps no pod (removed)", doing, id, lifecycle.ErrContainerNotFound, claim.Name)
	}
	return made, nil
}

// runningPod is sandbox id's pod from the cache, when it runs (doing
// names the operation in errors).
func (r *Runtime) runningPod(id, doing string) (*corev1.Pod, error) {
	if err := r.ready(); err != nil {
		return nil, err
	}
	pod, err := r.pods.Get(PodName(id))
	if err != nil || !r.owns(id, pod.Labels) {
		return nil, fmt.Errorf("%s sandbox %s: %w: it runs no pod", doing, id, lifecycle.ErrContainerNotFound)
	}
	if s := r.fromPod(id, pod).State; s != lifecycle.ContainerRunning && s != lifecycle.ContainerPaused {
		return nil, fmt.Errorf("%s sandbox %s: %w: its pod is %s", doing, id, lifecycle.ErrConflict, s)
	}
	return pod, nil
}

// waitPaused waits for the cache to read sandbox id's pod as paused (or
// not): a reconcile reads it there.
func (r *Runtime) waitPaused(ctx context.Context, id string, want bool) error {
	return r.waitFor(ctx, id, fmt.Sprintf("pod %s to read as paused=%v", PodName(id), want), func() (bool, error) {
		pod, err := r.pods.Get(PodName(id))
		if err != nil {
			return false, fmt.Errorf("%w: pod %s is gone", lifecycle.ErrContainerNotFound, PodName(id))
		}
		return paused(pod) == want, nil
	})
}

// resize sends patch, a pod's containers' new CPU, to pod's resize
// subresource. A resize the cluster refuses (a node that cannot resize,
// no such subresource, no permission, a pod replaced since: its UID is in
// the patch) wraps ErrPauseUnsupported.
func (r *Runtime) resize(ctx context.Context, pod *corev1.Pod, patch podPatch) error {
	patch.Metadata.UID = pod.UID // the very pod: another's UID is immutable
	b, err := json.Marshal(patch)
	if err != nil {
		return fmt.Errorf("encoding the resize of pod %s: %w", pod.Name, err)
	}
	_, err = r.cs.CoreV1().Pods(r.opts.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, b, metav1.PatchOptions{}, "resize")
	switch {
	case err == nil:
		return nil
	case apierrors.IsNotFound(err):
		if cur, cerr := r.pods.Get(pod.Name); cerr == nil && cur.UID == pod.UID {
			// The pod is there: the API server has no pods/resize.
			return fmt.Errorf("%w: the API server has no pods/resize (Kubernetes 1.33 or later has): %w", lifecycle.ErrPauseUnsupported, lifecycle.EngineFailure(err))
		}
		return fmt.Errorf("resizing pod %s: %w: %w", pod.Name, lifecycle.ErrContainerNotFound, lifecycle.EngineFailure(err))
	case apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsMethodNotSupported(err):
		return fmt.Errorf("%w: kubernetes refused to resize pod %s: %w", lifecycle.ErrPauseUnsupported, pod.Name, lifecycle.EngineFailure(err))
	}
	return classify("resizing pod "+pod.Name, err, lifecycle.ErrContainerNotFound)
}

// podPatch is a strategic merge patch of a pod's containers' resources
// (merged by container name).
type podPatch struct {
	Metadata struct {
		UID types.UID `json:"uid,omitempty"`
	} `json:"metadata"`
	Spec struct {
		Containers     []containerPatch `json:"containers,omitempty"`
		InitContainers []containerPatch `json:"initContainers,omitempty"`
	} `json:"spec"`
}

// containerPatch is one container's part of a podPatch.
type containerPatch struct {
	Name      string                      `json:"name"`
	Resources corev1.ResourceRequirements `json:"resources"`
}

// cpuPatch patches every container of pod that has a CPU limit (the app
// and the services, which are restartable init containers) with what to
// makes of its resources.
func cpuPatch(pod *corev1.Pod, to func(corev1.ResourceRequirements) corev1.ResourceRequirements) podPatch {
	var p podPatch
	for _, c := range pod.Spec.Containers {
		if _, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
			p.Spec.Containers = append(p.Spec.Containers, containerPatch{Name: c.Name, Resources: to(c.Resources)})
		}
	}
	for _, c := range pod.Spec.InitContainers {
		if _, ok := c.Resources.Limits[corev1.ResourceCPU]; ok && c.RestartPolicy != nil {
			p.Spec.InitContainers = append(p.Spec.InitContainers, containerPatch{Name: c.Name, Resources: to(c.Resources)})
		}
	}
	return p
}

// cutCPU is the patch that pauses pod; false when one of its containers
// has no CPU limit to cut (a resize cannot add one without changing the
// pod's QoS class).
func cutCPU(pod *corev1.Pod) (podPatch, bool) {
	for _, c := range pod.Spec.Containers {
		if _, ok := c.Resources.Limits[corev1.ResourceCPU]; !ok {
			return podPatch{}, false
		}
	}
	for _, c := range sidecars(pod) {
		if _, ok := c.Resources.Limits[corev1.ResourceCPU]; !ok {
			return podPatch{}, false
		}
	}
	return cpuPatch(pod, func(rr corev1.ResourceRequirements) corev1.ResourceRequirements {
		req, lim := rr.Requests[corev1.ResourceCPU], rr.Limits[corev1.ResourceCPU]
		if req.Cmp(lim) == 0 {
			q := *resource.NewMilliQuantity(pausedCPUMilli, resource.DecimalSI)
			return corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: q}, Limits: corev1.ResourceList{corev1.ResourceCPU: q.DeepCopy()}}
		}
		return corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(pausedBurstCPUMilli, resource.DecimalSI)}}
	}), true
}

// paused reports whether pod's app runs with its CPU cut: the informer's
// copy says so (AnnotationPaused, set by slimPod), or, of a whole pod,
// its app's CPU limit (no pod is made with that little: minCPUMilli).
func paused(pod *corev1.Pod) bool {
	return pod.Annotations[AnnotationPaused] == "true" || cutCPUOf(pod)
}

// cutCPUOf reports whether the app's CPU limit in pod's spec is a cut one.
func cutCPUOf(pod *corev1.Pod) bool {
	for _, c := range pod.Spec.Containers {
		if c.Name == appContainer {
			lim, ok := c.Resources.Limits[corev1.ResourceCPU]
			return ok && lim.MilliValue() <= pausedBurstCPUMilli
		}
	}
	return false
}

// cpuOf is the CPU of rr, its request and limit, alone.
func cpuOf(rr corev1.ResourceRequirements) corev1.ResourceRequirements {
	var out corev1.ResourceRequirements
	if q, ok := rr.Requests[corev1.ResourceCPU]; ok {
		out.Requests = corev1.ResourceList{corev1.ResourceCPU: q}
	}
	if q, ok := rr.Limits[corev1.ResourceCPU]; ok {
		out.Limits = corev1.ResourceList{corev1.ResourceCPU: q}
	}
	return out
}
