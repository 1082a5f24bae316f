package kubernetes

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/sandwake/sandwake/lifecycle"
)

// This file turns a lifecycle.Spec into the objects that carry it: the pod
// a start makes and the claim that holds the workspace (and the pod).

// appContainer is the name of the sandbox's container in its pod.
const appContainer = "app"

// Volume names inside the pod.
const (
	workspaceVolume = "workspace"
	tmpVolume       = "tmp"
)

// podFor is the pod that runs sandbox id's spec. It is made at create,
// kept on the claim (AnnotationPod) and created at every start.
func (r *Runtime) podFor(id string, spec lifecycle.Spec) (*corev1.Pod, error) {
	workspace := spec.WorkspacePath
	if workspace == "" {
		workspace = lifecycle.DefaultWorkspacePath
	}
	ports := make([]corev1.ContainerPort, 0, len(spec.Ports))
	for _, p := range spec.Ports {
		ports = append(ports, corev1.ContainerPort{ContainerPort: int32(p), Protocol: corev1.ProtocolTCP})
	}
	caps := make([]corev1.Capability, 0, len(lifecycle.SandboxCapabilities)+len(spec.CapAdd))
	for _, c := range append(slices.Clone(lifecycle.SandboxCapabilities), spec.CapAdd...) {
		caps = append(caps, corev1.Capability(strings.TrimPrefix(strings.ToUpper(c), "CAP_")))
	}
	readonly := spec.ReadonlyRootfs != nil && *spec.ReadonlyRootfs
	app := corev1.Container{
		Name:            appContainer,
		Image:           spec.Image,
		Args:            spec.Cmd, // Docker's Cmd: the image's entrypoint stays
		Env:             envVars(spec.Env),
		Ports:           ports,
		ImagePullPolicy: r.pullPolicy(),
		VolumeMounts:    []corev1.VolumeMount{{Name: workspaceVolume, MountPath: workspace}},
		// The same minimum as Docker's containers: every capability
		// dropped and the documented few given back, no privilege
		// escalation (no-new-privileges), the runtime's default seccomp
		// profile (on the pod).
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: new(false),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: caps},
			ReadOnlyRootFilesystem:   new(readonly),
		},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
	app.Resources = resources(spec.MemoryMB, spec.CPUs, spec.DiskMB)
	volumes := []corev1.Volume{{
		Name:         workspaceVolume,
		VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: ClaimName(id)}},
	}}
	if readonly {
		size := resource.NewQuantity(r.opts.TmpMB<<20, resource.BinarySI)
		volumes = append(volumes, corev1.Volume{Name: tmpVolume, VolumeSource: corev1.VolumeSource{
			EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: size},
		}})
		app.VolumeMounts = append(app.VolumeMounts, corev1.VolumeMount{Name: tmpVolume, MountPath: "/tmp"})
	}
	// The services: native sidecars, started in depends_on order before
	// the app (services.go).
	sidecars, svcVolumes, err := r.serviceContainers(id, spec, app.SecurityContext, readonly)
	if err != nil {
		return nil, err
	}
	volumes = append(volumes, svcVolumes...)
	psc := &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
	if spec.User != "" {
		uid, gid, err := numericUser(spec.User)
		if err != nil {
			return nil, err
		}
		psc.RunAsUser = &uid
		if gid >= 0 {
			psc.RunAsGroup = &gid
		}
	}
	grace := int64(r.opts.StopTimeout.Seconds())
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        PodName(id),
			Namespace:   r.opts.Namespace,
			Labels:      r.labels(id),
			Annotations: map[string]string{},
		},
		Spec: corev1.PodSpec{
			InitContainers: sidecars,
			Containers:     []corev1.Container{app},
			Volumes:        volumes,
			// A sandbox that exits is stopped, as on Docker: the next
			// request wakes it.
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			Hostname:                      PodName(id),
			// Untrusted code gets no credentials of the cluster and no
			// list of its services.
			AutomountServiceAccountToken: new(false),
			EnableServiceLinks:           new(false),
			SecurityContext:              psc,
		},
	}
	if len(r.opts.NodeSelector) > 0 {
		pod.Spec.NodeSelector = maps.Clone(r.opts.NodeSelector)
	}
	if len(r.opts.Tolerations) > 0 {
		pod.Spec.Tolerations = slices.Clone(r.opts.Tolerations)
	}
	switch {
	case spec.Runtime != "":
		pod.Spec.RuntimeClassName = &spec.Runtime
	case r.opts.RuntimeClass != "":
		pod.Spec.RuntimeClassName = new(r.opts.RuntimeClass)
	}
	// The record's labels: as pod labels where Kubernetes takes them (a
	// selector can then find a tenant's pods), always as annotations.
	for k, v := range spec.Labels {
		pod.Annotations[AnnotationLabelPrefix+k] = v
		if key := LabelPrefix + k; len(validation.IsQualifiedName(key)) == 0 && len(validation.IsValidLabelValue(v)) == 0 {
			pod.Labels[key] = v
		}
	}
	if spec.Pool.Template != "" {
		pod.Annotations[AnnotationPool] = spec.Pool.Template
		pod.Annotations[AnnotationPoolKey] = spec.Pool.Key
	}
	return pod, nil
}

// envVars are env as a container's, sorted by name.
func envVars(env map[string]string) []corev1.EnvVar {
	out := make([]corev1.EnvVar, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, corev1.EnvVar{Name: k, Value: env[k]})
	}
	return out
}

// resources are a container's memory and CPU, and its disk as an
// ephemeral-storage limit; 0 is none. A CPU is always given, in a shape a
// pause can cut in place (pause.go): cpus as equal request and limit (at
// least minCPUMilli), or, for cpus 0, a request of idleCPUMilli and a
// limit of unlimitedCPUMilli, which bounds nothing.
func resources(memoryMB int64, cpus float64, diskMB int64) corev1.ResourceRequirements {
	rr := corev1.ResourceRequirements{Requests: corev1.ResourceList{}, Limits: corev1.ResourceList{}}
	if memoryMB > 0 {
		// Requests equal to limits: the scheduler places the sandbox where
		// what it may use is free, as max_resident admits it on Docker.
		m := *resource.NewQuantity(memoryMB<<20, resource.BinarySI)
		rr.Requests[corev1.ResourceMemory], rr.Limits[corev1.ResourceMemory] = m, m.DeepCopy()
	}
	if cpus > 0 {
		c := *resource.NewMilliQuantity(max(int64(cpus*1000), minCPUMilli), resource.DecimalSI)
		rr.Requests[corev1.ResourceCPU], rr.Limits[corev1.ResourceCPU] = c, c.DeepCopy()
	} else {
		rr.Requests[corev1.ResourceCPU] = *resource.NewMilliQuantity(idleCPUMilli, resource.DecimalSI)
		rr.Limits[corev1.ResourceCPU] = *resource.NewMilliQuantity(unlimitedCPUMilli, resource.DecimalSI)
	}
	if diskMB > 0 {
		// The kubelet evicts a pod past it (writable layer, logs, /tmp):
		// the nearest to Docker's quota on the writable layer.
		rr.Limits[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(diskMB<<20, resource.BinarySI)
	}
	return rr
}

// numericUser parses Docker's uid[:gid]; Kubernetes takes no user names.
// gid is -1 when not given.
func numericUser(user string) (uid, gid int64, err error) {
	u, g, hasGroup := strings.Cut(user, ":")
	uid, err = strconv.ParseInt(u, 10, 64)
	if err != nil || uid < 0 {
		return 0, 0, fmt.Errorf("%w: user %q: the kubernetes engine takes a numeric uid[:gid]", lifecycle.ErrInvalid, user)
	}
	gid = -1
	if hasGroup {
		gid, err = strconv.ParseInt(g, 10, 64)
		if err != nil || gid < 0 {
			return 0, 0, fmt.Errorf("%w: user %q: the kubernetes engine takes a numeric uid[:gid]", lifecycle.ErrInvalid, user)
		}
	}
	return uid, gid, nil
}

// claimFor is sandbox id's workspace claim, carrying the pod to start
// (AnnotationPod) and whose the workspace is (as Docker's volume labels).
func (r *Runtime) claimFor(id string, spec lifecycle.Spec, pod *corev1.Pod) (*corev1.PersistentVolumeClaim, error) {
	c, err := r.newClaim(ClaimName(id), r.labels(id), spec)
	if err != nil {
		return nil, err
	}
	if err := setPod(c, pod); err != nil {
		return nil, err
	}
	return c, nil
}

// newClaim is a workspace claim of the configured class and size, with
// labels and spec's owner annotations.
func (r *Runtime) newClaim(name string, labels map[string]string, spec lifecycle.Spec) (*corev1.PersistentVolumeClaim, error) {
	size, err := resource.ParseQuantity(r.opts.VolumeSize)
	if err != nil {
		return nil, fmt.Errorf("volume size %q: %w", r.opts.VolumeSize, err)
	}
	c := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Namespace:   r.opts.Namespace,
			Labels:      labels,
			Annotations: ownerAnnotations(spec),
		},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
		},
	}
	if r.opts.StorageClass != "" {
		c.Spec.StorageClassName = &r.opts.StorageClass
	}
	return c, nil
}

// ownerAnnotations record whose the workspace is (lifecycle.VolumeOwner);
// none for a pool's, whose claim the Manager records.
func ownerAnnotations(spec lifecycle.Spec) map[string]string {
	a := map[string]string{}
	if spec.Incarnation == "" {
		return a
	}
	a[AnnotationOwnerIncarnation] = spec.Incarnation
	for k, v := range spec.Labels {
		a[AnnotationOwnerPrefix+k] = v
	}
	return a
}

// setPod keeps pod on claim c: the sandbox's "container" while it is not
// running.
func setPod(c *corev1.PersistentVolumeClaim, pod *corev1.Pod) error {
	b, err := json.Marshal(pod)
	if err != nil {
		return fmt.Errorf("encoding pod %s: %w", pod.Name, err)
	}
	if c.Annotations == nil {
		c.Annotations = map[string]string{}
	}
	c.Annotations[AnnotationPod] = string(b)
	return nil
}

// podOf is the pod claim c keeps (nil: none, the sandbox has no container).
func podOf(c *corev1.PersistentVolumeClaim) (*corev1.Pod, error) {
	s, ok := c.Annotations[AnnotationPod]
	if !ok {
		return nil, nil
	}
	var pod corev1.Pod
	if err := json.Unmarshal([]byte(s), &pod); err != nil {
		return nil, fmt.Errorf("decoding the pod kept on claim %s: %w", c.Name, err)
	}
	return &pod, nil
}

func (r *Runtime) pullPolicy() corev1.PullPolicy {
	switch r.opts.Pull {
	case PullNever:
		return corev1.PullNever
	case PullAlways:
		return corev1.PullAlways
	}
	return corev1.PullIfNotPresent
}
