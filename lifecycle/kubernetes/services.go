package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sandwake/sandwake/lifecycle"
)

// This file runs a sandbox's services as its pod's native sidecars: init
// containers with restartPolicy Always, in depends_on order. The kubelet
// starts each one after the one before has passed its startup probe (the
// service's ready), and the app after them all; they share the pod's
// network namespace, so the app reaches them on localhost and their ports
// are the pod's. Each service has a workspace claim of its own,
// s-<id>-svc-<name>, kept across stop and wake until purge, as the Docker
// runtime keeps a volume per service.

// LabelService, on a service's claim, names the service.
const LabelService = "sandwake.service"

// startupProbeWindow bounds how long the kubelet lets a service fail its
// ready probe before it restarts it: longer than any wake, whose own
// timeout ends a start that waits for a service that never gets ready
// (naming it), as the Docker runtime's wait does.
const (
	startupProbePeriod   = 1 // second
	startupProbeFailures = 600
)

// ServiceClaimName is the workspace claim of service svc of sandbox id.
// (Ids have no '-': no service claim can be another sandbox's claim.)
func ServiceClaimName(id, svc string) string { return "s-" + id + "-svc-" + svc }

// serviceVolume and serviceTmpVolume name a service's volumes in the pod.
func serviceVolume(svc string) string    { return "ws-" + svc }
func serviceTmpVolume(svc string) string { return "tmp-" + svc }

// serviceContainers are spec's services as native sidecars in start order,
// with the app's security context (appSC) and, for a read-only root, a
// memory-backed /tmp each; and the pod volumes they mount.
func (r *Runtime) serviceContainers(id string, spec lifecycle.Spec, appSC *corev1.SecurityContext, readonly bool) ([]corev1.Container, []corev1.Volume, error) {
	if len(spec.Services) == 0 {
		return nil, nil, nil
	}
	order, err := lifecycle.ServiceOrder(spec.Services)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", lifecycle.ErrInvalid, err)
	}
	always := corev1.ContainerRestartPolicyAlways
	containers := make([]corev1.Container, 0, len(order))
	var volumes []corev1.Volume
	for _, name := range order {
		svc := spec.Services[name]
		probe, err := startupProbe(svc.Ready)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: services.%s.ready: %v", lifecycle.ErrInvalid, name, err)
		}
		workspace := svc.WorkspacePath
		if workspace == "" {
			workspace = lifecycle.DefaultWorkspacePath
		}
		c := corev1.Container{
			Name:            name,
			Image:           svc.Image,
			Args:            svc.Cmd,
			Env:             envVars(svc.Env),
			ImagePullPolicy: r.pullPolicy(),
			// A native sidecar: it runs beside the app for the pod's
			// life, and the kubelet waits for its startup probe before
			// the next container.
			RestartPolicy:            &always,
			StartupProbe:             probe,
			VolumeMounts:             []corev1.VolumeMount{{Name: serviceVolume(name), MountPath: workspace}},
			SecurityContext:          appSC.DeepCopy(),
			Resources:                resources(svc.MemoryMB, svc.CPUs, svc.DiskMB),
			TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		}
		volumes = append(volumes, corev1.Volume{
			Name:         serviceVolume(name),
			VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: ServiceClaimName(id, name)}},
		})
		if readonly {
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: serviceTmpVolume(name), MountPath: "/tmp"})
			volumes = append(volumes, corev1.Volume{Name: serviceTmpVolume(name), VolumeSource: corev1.VolumeSource{
				EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: resource.NewQuantity(r.opts.TmpMB<<20, resource.BinarySI)},
			}})
		}
		containers = append(containers, c)
	}
	return containers, volumes, nil
}

// startupProbe is a service's ready ("tcp:<port>", "http:<port><path>") as
// the kubelet's startup probe, nil for none. The kubelet dials the pod's
// address, not localhost: a service must listen on it to pass.
func startupProbe(ready string) (*corev1.Probe, error) {
	mode, port, path, err := lifecycle.ParseReady(ready)
	if err != nil || mode == "" {
		return nil, err
	}
	p := &corev1.Probe{PeriodSeconds: startupProbePeriod, TimeoutSeconds: 1, FailureThreshold: startupProbeFailures}
	switch mode {
	case lifecycle.ReadyTCP:
		p.TCPSocket = &corev1.TCPSocketAction{Port: intstr.FromInt32(int32(port))}
	case lifecycle.ReadyHTTP:
		p.HTTPGet = &corev1.HTTPGetAction{Port: intstr.FromInt32(int32(port)), Path: path}
	}
	return p, nil
}

// readyOf is the ready a sidecar's startup probe stands for ("" none).
func readyOf(c *corev1.Container) string {
	switch p := c.StartupProbe; {
	case p == nil:
		return ""
	case p.TCPSocket != nil:
		return lifecycle.ReadyTCP + ":" + p.TCPSocket.Port.String()
	case p.HTTPGet != nil:
		return lifecycle.ReadyHTTP + ":" + p.HTTPGet.Port.String() + p.HTTPGet.Path
	}
	return ""
}

// sidecars are pod's services: its init containers that run beside the
// app, in start order.
func sidecars(pod *corev1.Pod) []*corev1.Container {
	var out []*corev1.Container
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			out = append(out, c)
		}
	}
	return out
}

// initStatus is the status of pod's init container name (nil: none yet).
func initStatus(pod *corev1.Pod, name string) *corev1.ContainerStatus {
	for i := range pod.Status.InitContainerStatuses {
		if pod.Status.InitContainerStatuses[i].Name == name {
			return &pod.Status.InitContainerStatuses[i]
		}
	}
	return nil
}

// memberState is a service's state as the Manager knows a container's.
func memberState(st *corev1.ContainerStatus) lifecycle.ContainerState {
	switch {
	case st == nil:
		return lifecycle.ContainerCreated
	case st.State.Running != nil:
		return lifecycle.ContainerRunning
	case st.State.Terminated != nil:
		return lifecycle.ContainerExited
	case st.RestartCount > 0:
		return lifecycle.ContainerRestarting // waiting to run again (back-off)
	}
	return lifecycle.ContainerCreated
}

// lastExit is a service's last termination, nil when it never ended.
func lastExit(st *corev1.ContainerStatus) *corev1.ContainerStateTerminated {
	if st == nil {
		return nil
	}
	if st.State.Terminated != nil {
		return st.State.Terminated
	}
	return st.LastTerminationState.Terminated
}

// serviceStates fills c.Members from pod's sidecars. As with the Docker
// runtime's groups, an app running beside a service that is not running,
// or that ended once since the pod started (the kubelet restarts a
// sidecar at once, so a restart is how its death shows), reads exited
// with that service's exit: its die event makes the Manager stop what is
// left of the group, and the next request wakes all of it, in order.
func serviceStates(pod *corev1.Pod, c *lifecycle.Container) {
	scs := sidecars(pod)
	if len(scs) == 0 {
		return
	}
	c.Members = make(map[string]lifecycle.ContainerState, len(scs))
	var broken *corev1.ContainerStatus
	brokenFound := false
	for _, sc := range scs {
		st := initStatus(pod, sc.Name)
		state := memberState(st)
		if c.State == lifecycle.ContainerExited || c.State == lifecycle.ContainerDead {
			state = lifecycle.ContainerExited // the pod is ending or ended
		}
		c.Members[sc.Name] = state
		if !brokenFound && (state != lifecycle.ContainerRunning || st.RestartCount > 0) {
			broken, brokenFound = st, true
		}
	}
	if !brokenFound || c.State != lifecycle.ContainerRunning {
		return
	}
	c.State = lifecycle.ContainerExited
	c.ExitCode = -1
	if t := lastExit(broken); t != nil {
		c.ExitCode = int(t.ExitCode)
		c.OOMKilled = t.Reason == "OOMKilled"
		c.FinishedAt = t.FinishedAt.Time
	}
}

// serviceProblem is the first service of pod that failed while the pod
// starts (an image it cannot have; an exit, the kubelet's kill after a
// failed startup probe included), as a *lifecycle.ServiceError; nil when
// none did.
func serviceProblem(pod *corev1.Pod) error {
	for _, sc := range sidecars(pod) {
		st := initStatus(pod, sc.Name)
		if st == nil {
			continue
		}
		if w := st.State.Waiting; w != nil {
			switch w.Reason {
			case "ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff", "InvalidImageName":
				return &lifecycle.ServiceError{Service: sc.Name, Err: fmt.Errorf("%w: pod %s: %s: %s", lifecycle.ErrImageNotFound, pod.Name, w.Reason, w.Message)}
			}
		}
		if t := lastExit(st); t != nil {
			what := "exited (" + strconv.Itoa(int(t.ExitCode)) + ")"
			if t.Reason != "" && t.Reason != "Error" && t.Reason != "Completed" {
				what += " " + t.Reason
			}
			if ready := readyOf(sc); ready != "" && (st.Started == nil || !*st.Started) {
				what += " before it was ready (" + ready + ")"
			}
			if msg := strings.TrimSpace(t.Message); msg != "" {
				what += ": " + lastLine(msg)
			}
			return &lifecycle.ServiceError{Service: sc.Name, Err: errors.New(what)}
		}
	}
	return nil
}

// lastLine is the last line of a termination message (the logs' tail).
func lastLine(s string) string {
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}

// serviceNotReady names, for a start that ran out of time, the first
// service of sandbox id's pod that has not passed its startup probe: err
// (the wait's) as its *lifecycle.ServiceError. Without one, err is
// returned as it is.
func (r *Runtime) serviceNotReady(id string, err error) error {
	pod, gerr := r.pods.Get(PodName(id))
	if gerr != nil {
		return err
	}
	for _, sc := range sidecars(pod) {
		st := initStatus(pod, sc.Name)
		if st == nil || st.Started == nil || !*st.Started {
			what := "not started"
			if ready := readyOf(sc); ready != "" {
				what = "not ready (" + ready + ")"
			}
			return &lifecycle.ServiceError{Service: sc.Name, Err: fmt.Errorf("%s: %w", what, err)}
		}
	}
	return err
}

// serviceLabels are the labels of service svc's claim of sandbox id.
func (r *Runtime) serviceLabels(id, svc string) map[string]string {
	l := r.labels(id)
	l[LabelService] = svc
	return l
}

// ensureServiceClaims makes the workspace claim of each of spec's
// services that has none, or checks that the one there is this
// instance's, this service's and (kept from before) the spec's owner's, as
// the lifecycle checks the app's. It returns the claims it made, for the
// caller to delete if the create fails after it.
func (r *Runtime) ensureServiceClaims(ctx context.Context, id string, spec lifecycle.Spec) (made []*corev1.PersistentVolumeClaim, err error) {
	if len(spec.Services) == 0 {
		return nil, nil
	}
	order, err := lifecycle.ServiceOrder(spec.Services)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", lifecycle.ErrInvalid, err)
	}
	defer func() {
		if err != nil {
			r.deleteClaims(context.WithoutCancel(ctx), made)
			made = nil
		}
	}()
	claims := r.cs.CoreV1().PersistentVolumeClaims(r.opts.Namespace)
	for _, name := range order {
		cname := ServiceClaimName(id, name)
		want, err := r.newClaim(cname, r.serviceLabels(id, name), spec)
		if err != nil {
			return made, err
		}
		for {
			cur, err := claims.Get(ctx, cname, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				var c *corev1.PersistentVolumeClaim
				c, err = claims.Create(ctx, want, metav1.CreateOptions{})
				if apierrors.IsAlreadyExists(err) {
					continue // made meanwhile: check it
				}
				if apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) {
					return made, &lifecycle.ServiceError{Service: name, Err: fmt.Errorf("%w: kubernetes refused the claim %s: %w", lifecycle.ErrInvalid, cname, lifecycle.EngineFailure(err))}
				}
				if err != nil {
					return made, &lifecycle.ServiceError{Service: name, Err: classify("creating claim "+cname, err, lifecycle.ErrNotFound)}
				}
				made = append(made, c)
				break
			}
			if err != nil {
				return made, &lifecycle.ServiceError{Service: name, Err: classify("reading claim "+cname, err, lifecycle.ErrNotFound)}
			}
			if !r.owns(id, cur.Labels) || cur.Labels[LabelService] != name {
				return made, &lifecycle.ServiceError{Service: name, Err: notOurs("claim", cname, cur.Labels, lifecycle.ErrIDTaken)}
			}
			if inc := cur.Annotations[AnnotationOwnerIncarnation]; inc != "" && spec.Incarnation != "" && inc != spec.Incarnation && !sameOwner(cur.Annotations, spec) {
				return made, &lifecycle.ServiceError{Service: name, Err: fmt.Errorf("%w: claim %s was kept for another owner", lifecycle.ErrIDTaken, cname)}
			}
			if cur.DeletionTimestamp != nil {
				// A purge of this id not yet done: its files are going,
				// and the create waits for the claim to be gone.
				if err := r.waitFor(ctx, id, "claim "+cname+" to be deleted", func() (bool, error) {
					_, err := r.claims.Get(cname)
					return apierrors.IsNotFound(err), nil
				}); err != nil {
					return made, &lifecycle.ServiceError{Service: name, Err: err}
				}
				continue
			}
			break
		}
	}
	return made, nil
}

// sameOwner reports whether a kept claim's owner annotations are the
// spec's labels (the tenant of the sandbox re-creating the id).
func sameOwner(a map[string]string, spec lifecycle.Spec) bool {
	for k, v := range a {
		if rest, ok := strings.CutPrefix(k, AnnotationOwnerPrefix); ok && spec.Labels[rest] != v {
			return false
		}
	}
	return true
}

// deleteClaims deletes the claims a failed create made (its own, just
// made), as far as it can.
func (r *Runtime) deleteClaims(ctx context.Context, made []*corev1.PersistentVolumeClaim) {
	for _, c := range made {
		// That very claim (its UID), not one made under its name since.
		r.cs.CoreV1().PersistentVolumeClaims(r.opts.Namespace).Delete(ctx, c.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &c.UID}})
	}
}

// removeServiceClaims deletes this instance's claims of sandbox id's
// services (those of services a recreate dropped too) and reports how
// many it deleted.
func (r *Runtime) removeServiceClaims(ctx context.Context, id string) (int, error) {
	claims := r.cs.CoreV1().PersistentVolumeClaims(r.opts.Namespace)
	sel := metav1.ListOptions{LabelSelector: LabelInstance + "=" + r.opts.Instance + "," + LabelID + "=" + id + "," + LabelService}
	list, err := claims.List(ctx, sel)
	if err != nil {
		return 0, classify("listing the service claims of "+PodName(id), err, lifecycle.ErrNotFound)
	}
	n := 0
	for _, c := range list.Items {
		svc := c.Labels[LabelService]
		if !r.owns(id, c.Labels) || c.Name != ServiceClaimName(id, svc) {
			continue
		}
		err := claims.Delete(ctx, c.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &c.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return n, classify("removing claim "+c.Name, err, lifecycle.ErrNotFound)
		}
		n++
	}
	return n, nil
}
