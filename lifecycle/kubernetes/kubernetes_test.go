package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
)

// These tests drive the runtime's logic against client-go's fake
// clientset: no kubelet runs, so a test plays it (setPodStatus). What a
// real cluster does is in cluster_test.go.

const testNS = "sandwake-test"

func newFake(t *testing.T, objs ...any) (*Runtime, *fake.Clientset) {
	t.Helper()
	cs := fake.NewClientset()
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.Pod:
			if _, err := cs.CoreV1().Pods(o.Namespace).Create(context.Background(), o, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		case *corev1.PersistentVolumeClaim:
			if _, err := cs.CoreV1().PersistentVolumeClaims(o.Namespace).Create(context.Background(), o, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return startFake(t, cs, Options{})
}

// startFake is a runtime with opts on cs, its informers synced.
func startFake(t *testing.T, cs *fake.Clientset, opts Options) (*Runtime, *fake.Clientset) {
	t.Helper()
	opts.Client, opts.Namespace, opts.Instance, opts.StopTimeout = cs, testNS, "t1", time.Second
	r, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.StartInformers(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r, cs
}

func testSpec() lifecycle.Spec {
	return lifecycle.Spec{Image: "sandwake/testapp:1", Ports: []int{8080}, WorkspacePath: "/workspace",
		Env: map[string]string{"B": "2", "A": "1"}, Labels: map[string]string{"tenant": "acme", "bad key!": "x"}, Incarnation: "inc1"}
}

// eventually polls cond until it holds (bounded).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, func() (bool, string) { return cond(), what })
}

// setPodStatus plays the kubelet: the pod of id gets status st.
func setPodStatus(t *testing.T, cs *fake.Clientset, id string, st corev1.PodStatus) {
	t.Helper()
	ctx := context.Background()
	pod, err := cs.CoreV1().Pods(testNS).Get(ctx, PodName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status = st
	if _, err := cs.CoreV1().Pods(testNS).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func running(ip string) corev1.PodStatus {
	return corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, ContainerStatuses: []corev1.ContainerStatus{{
		Name: appContainer, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}},
	}}}
}

func TestPodSpec(t *testing.T) {
	r, _ := newFake(t)
	ro := true
	spec := testSpec()
	spec.ReadonlyRootfs = &ro
	spec.User = "1000:2000"
	spec.MemoryMB, spec.CPUs, spec.DiskMB = 256, 0.5, 100
	spec.CapAdd = []string{"CAP_NET_RAW"}
	spec.Cmd = []string{"serve", "--port=8080"}
	pod, err := r.podFor("abc", spec)
	if err != nil {
		t.Fatal(err)
	}
	ps := pod.Spec
	app := ps.Containers[0]
	checks := []struct {
		what string
		ok   bool
	}{
		{"name s-abc", pod.Name == "s-abc"},
		{"instance and id labels", pod.Labels[LabelInstance] == "t1" && pod.Labels[LabelID] == "abc" && pod.Labels[LabelManaged] == "true"},
		{"valid record label as a label", pod.Labels[LabelPrefix+"tenant"] == "acme"},
		{"invalid record label only as an annotation", pod.Labels[LabelPrefix+"bad key!"] == "" && pod.Annotations[AnnotationLabelPrefix+"bad key!"] == "x"},
		{"restart never", ps.RestartPolicy == corev1.RestartPolicyNever},
		{"no service account token", ps.AutomountServiceAccountToken != nil && !*ps.AutomountServiceAccountToken},
		{"no service links", ps.EnableServiceLinks != nil && !*ps.EnableServiceLinks},
		{"seccomp RuntimeDefault", ps.SecurityContext.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault},
		{"runAsUser 1000", *ps.SecurityContext.RunAsUser == 1000 && *ps.SecurityContext.RunAsGroup == 2000},
		{"no privilege escalation", !*app.SecurityContext.AllowPrivilegeEscalation},
		{"drop ALL", slices.Equal(app.SecurityContext.Capabilities.Drop, []corev1.Capability{"ALL"})},
		{"add the minimum and NET_RAW", len(app.SecurityContext.Capabilities.Add) == len(lifecycle.SandboxCapabilities)+1 && slices.Contains(app.SecurityContext.Capabilities.Add, "NET_RAW") && slices.Contains(app.SecurityContext.Capabilities.Add, "CHOWN")},
		{"read-only root", *app.SecurityContext.ReadOnlyRootFilesystem},
		{"/tmp in memory", len(app.VolumeMounts) == 2 && app.VolumeMounts[1].MountPath == "/tmp" && ps.Volumes[1].EmptyDir.Medium == corev1.StorageMediumMemory},
		{"workspace claim", app.VolumeMounts[0].MountPath == "/workspace" && ps.Volumes[0].PersistentVolumeClaim.ClaimName == "s-abc-data"},
		{"memory 256Mi request=limit", app.Resources.Limits.Memory().Value() == 256<<20 && app.Resources.Requests.Memory().Value() == 256<<20},
		{"cpu 500m request=limit", app.Resources.Limits.Cpu().MilliValue() == 500 && app.Resources.Requests.Cpu().MilliValue() == 500},
		{"ephemeral storage 100Mi", app.Resources.Limits.StorageEphemeral().Value() == 100<<20},
		{"env sorted", len(app.Env) == 2 && app.Env[0].Name == "A"},
		{"cmd as args", slices.Equal(app.Args, spec.Cmd) && app.Command == nil},
		{"port 8080", len(app.Ports) == 1 && app.Ports[0].ContainerPort == 8080},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("pod spec: %s: not so", c.what)
		}
	}
	for _, bad := range []string{"nobody", "1000:staff", "-1"} {
		spec.User = bad
		if _, err := r.podFor("abc", spec); !errors.Is(err, lifecycle.ErrInvalid) {
			t.Errorf("user %q: err = %v, want ErrInvalid", bad, err)
		}
	}
	spec.User = ""
	spec.Services = map[string]lifecycle.Service{"db": {Image: "x", DependsOn: []string{"db"}}}
	if _, err := r.podFor("abc", spec); !errors.Is(err, lifecycle.ErrInvalid) {
		t.Errorf("services in a cycle: err = %v, want ErrInvalid", err)
	}
}

func TestLifecycleOnFake(t *testing.T) {
	r, cs := newFake(t)
	ctx := context.Background()
	evs, _ := r.Events(ctx)
	c, err := r.Create(ctx, "abc", testSpec())
	if err != nil {
		t.Fatal(err)
	}
	if c.State != lifecycle.ContainerCreated {
		t.Fatalf("create: state %s", c.State)
	}
	claim, err := cs.CoreV1().PersistentVolumeClaims(testNS).Get(ctx, "s-abc-data", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if claim.Annotations[AnnotationOwnerIncarnation] != "inc1" || claim.Annotations[AnnotationOwnerPrefix+"tenant"] != "acme" {
		t.Fatalf("claim annotations %v", claim.Annotations)
	}
	if o, recorded, exists, err := r.VolumeOwner(ctx, "abc"); err != nil || !recorded || !exists || o.Incarnation != "inc1" {
		t.Fatalf("VolumeOwner = %v %v %v %v", o, recorded, exists, err)
	}
	eventually(t, "the claim in the cache", func() bool {
		c, err := r.Inspect(ctx, "abc")
		return err == nil && c.State == lifecycle.ContainerExited
	})
	// Start makes the pod and returns once "the kubelet" runs it.
	type result struct {
		c   lifecycle.Container
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := r.Start(ctx, "abc")
		done <- result{c, err}
	}()
	eventually(t, "the pod", func() bool {
		_, err := cs.CoreV1().Pods(testNS).Get(ctx, "s-abc", metav1.GetOptions{})
		return err == nil
	})
	setPodStatus(t, cs, "abc", running("10.244.0.7"))
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	if res.c.State != lifecycle.ContainerRunning || res.c.Upstreams[8080] != "10.244.0.7:8080" {
		t.Fatalf("start: %+v", res.c)
	}
	if l, err := r.List(ctx); err != nil || len(l) != 1 || l[0].State != lifecycle.ContainerRunning {
		t.Fatalf("list = %+v, %v", l, err)
	}
	// The app exits: oom and die events after its start, and Inspect
	// says exited with its code.
	st := running("10.244.0.7")
	st.Phase = corev1.PodFailed
	st.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"}}
	setPodStatus(t, cs, "abc", st)
	nextEvents(t, evs, "abc", "start", "oom", "die")
	c, err = r.Inspect(ctx, "abc")
	if err != nil || c.State != lifecycle.ContainerExited || c.ExitCode != 137 || !c.OOMKilled {
		t.Fatalf("inspect after OOM = %+v, %v", c, err)
	}
	// Stop deletes the pod (the fake deletes at once) and keeps the claim.
	if err := r.Stop(ctx, "abc"); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods(testNS).Get(ctx, "s-abc", metav1.GetOptions{}); err == nil {
		t.Fatal("pod still there after stop")
	}
	if c, err := r.Inspect(ctx, "abc"); err != nil || c.State != lifecycle.ContainerExited {
		t.Fatalf("inspect after stop = %+v, %v", c, err)
	}
	if err := r.Stop(ctx, "abc"); err != nil {
		t.Fatalf("second stop: %v", err)
	}
	// Remove: no container, the claim stays.
	if err := r.Remove(ctx, "abc"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the removal in the cache", func() bool {
		_, err := r.Inspect(ctx, "abc")
		return errors.Is(err, lifecycle.ErrContainerNotFound)
	})
	if _, err := r.Start(ctx, "abc"); !errors.Is(err, lifecycle.ErrContainerNotFound) {
		t.Fatalf("start after remove: %v, want ErrContainerNotFound", err)
	}
	if l, _ := r.List(ctx); len(l) != 0 {
		t.Fatalf("list after remove = %+v", l)
	}
	if _, err := r.RemoveVolume(ctx, "abc"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.RemoveVolume(ctx, "abc"); !errors.Is(err, lifecycle.ErrNotFound) {
		t.Fatalf("second RemoveVolume: %v, want ErrNotFound", err)
	}
}

func TestNotOurs(t *testing.T) {
	other := func(name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Namespace: testNS, Labels: map[string]string{LabelManaged: "true", LabelInstance: "t2", LabelID: "abc"}}
	}
	r, cs := newFake(t, &corev1.PersistentVolumeClaim{ObjectMeta: other("s-abc-data")},
		&corev1.Pod{ObjectMeta: other("s-xyz")})
	ctx := context.Background()
	if _, err := r.Create(ctx, "abc", testSpec()); !errors.Is(err, lifecycle.ErrIDTaken) {
		t.Fatalf("create over another instance's claim: %v, want ErrIDTaken", err)
	}
	if _, err := r.Create(ctx, "xyz", testSpec()); !errors.Is(err, lifecycle.ErrIDTaken) {
		t.Fatalf("create over another instance's pod: %v, want ErrIDTaken", err)
	}
	if _, err := r.RemoveVolume(ctx, "abc"); !errors.Is(err, lifecycle.ErrNotFound) {
		t.Fatalf("RemoveVolume of another instance's claim: %v, want ErrNotFound", err)
	}
	if _, _, exists, _ := r.VolumeOwner(ctx, "abc"); exists {
		t.Fatal("another instance's claim reported as ours")
	}
	if l, _ := r.List(ctx); len(l) != 0 {
		t.Fatalf("list shows another instance's objects: %+v", l)
	}
	if _, err := cs.CoreV1().PersistentVolumeClaims(testNS).Get(ctx, "s-abc-data", metav1.GetOptions{}); err != nil {
		t.Fatalf("another instance's claim was touched: %v", err)
	}
}

// TestAPodInTheCacheIsNotEnough: a pod under a sandbox's name that carries
// this instance's label (so the informer holds it) but not sandwake's
// managed label, or another id's, is never deleted by a stop, start or
// remove: each refuses it, untouched.
func TestAPodInTheCacheIsNotEnough(t *testing.T) {
	unmanaged := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "s-qrs", Namespace: testNS, UID: "u1",
		Labels: map[string]string{LabelInstance: "t1", LabelID: "qrs"}}}
	otherID := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "s-tuv", Namespace: testNS, UID: "u2",
		Labels: map[string]string{LabelManaged: "true", LabelInstance: "t1", LabelID: "zzz"}}}
	r, cs := newFake(t, unmanaged, otherID)
	ctx := context.Background()
	eventually(t, "the pods in the cache", func() bool {
		_, e1 := r.pods.Get("s-qrs")
		_, e2 := r.pods.Get("s-tuv")
		return e1 == nil && e2 == nil
	})
	for _, id := range []string{"qrs", "tuv"} {
		if err := r.Stop(ctx, id); !errors.Is(err, lifecycle.ErrIDTaken) {
			t.Errorf("stop %s over a pod not its own: %v, want ErrIDTaken", id, err)
		}
		if err := r.Remove(ctx, id); !errors.Is(err, lifecycle.ErrIDTaken) {
			t.Errorf("remove %s over a pod not its own: %v, want ErrIDTaken", id, err)
		}
		if _, err := cs.CoreV1().Pods(testNS).Get(ctx, PodName(id), metav1.GetOptions{}); err != nil {
			t.Errorf("the pod not %s's was deleted: %v", id, err)
		}
	}
}

func TestDropManagedFields(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}}}
	out, err := dropManagedFields(pod)
	if err != nil || out.(*corev1.Pod).ManagedFields != nil {
		t.Fatalf("managed fields kept: %v", err)
	}
}

// TestSlimPod: the cache keeps of a pod what the runtime reads, and the
// container it reads from a cached pod is the one it reads from the whole
// pod; the rest (images, env, resources, volumes, security, the record's
// labels as annotations) is dropped.
func TestSlimPod(t *testing.T) {
	r, _ := newFake(t)
	spec := servicesSpec()
	spec.Pool = lifecycle.PoolTag{Template: "web", Key: "k1"}
	full, err := r.podFor("abc", spec)
	if err != nil {
		t.Fatal(err)
	}
	full.UID, full.Status = "u1", running("10.244.0.9")
	for _, n := range []string{"aa", "db", "cache", "worker"} {
		full.Status.InitContainerStatuses = append(full.Status.InitContainerStatuses, sidecarStatus(n, true, 0))
	}
	slim := full.DeepCopy()
	slimPod(slim)
	if a, b := r.fromPod("abc", full), r.fromPod("abc", slim); !reflect.DeepEqual(a, b) {
		t.Fatalf("the slim pod reads as %+v, the whole one as %+v", b, a)
	}
	for i, c := range sidecars(full) {
		if readyOf(c) != readyOf(sidecars(slim)[i]) {
			t.Fatalf("sidecar %s: ready %q kept as %q", c.Name, readyOf(c), readyOf(sidecars(slim)[i]))
		}
	}
	wb, _ := json.Marshal(full)
	sb, _ := json.Marshal(slim)
	if len(sb)*2 > len(wb) || slim.Spec.Volumes != nil || slim.Spec.Containers[0].Image != "" || slim.Spec.Containers[0].Env != nil ||
		slim.Annotations[AnnotationLabelPrefix+"tenant"] != "" || slim.Labels[LabelID] != "abc" {
		t.Fatalf("slim pod %d bytes of %d: %+v", len(sb), len(wb), slim)
	}
	t.Logf("a pod with four services: %d bytes as JSON, %d as cached", len(wb), len(sb))
}

// TestSlimClaim: the cache keeps digests of the claim's kept pod and
// policy, which tell one write from another, and the claim's size falls.
func TestSlimClaim(t *testing.T) {
	r, _ := newFake(t)
	spec := servicesSpec()
	spec.Incarnation, spec.Labels = "inc1", map[string]string{"tenant": "acme"}
	pod, err := r.podFor("abc", spec)
	if err != nil {
		t.Fatal(err)
	}
	full, err := r.claimFor("abc", spec, pod)
	if err != nil {
		t.Fatal(err)
	}
	full.Annotations[AnnotationPolicy] = `{"podSelector":{}}`
	slim := full.DeepCopy()
	slimClaim(slim)
	if !keptSame(slim, full, AnnotationPod) || !keptSame(slim, full, AnnotationPolicy) {
		t.Fatalf("the cached claim's digests do not match what was written: %v", slim.Annotations)
	}
	other := full.DeepCopy()
	other.Annotations[AnnotationPolicy] = `{"podSelector":{},"policyTypes":["Egress"]}`
	delete(other.Annotations, AnnotationPod)
	if keptSame(slim, other, AnnotationPolicy) || keptSame(slim, other, AnnotationPod) {
		t.Fatal("another policy, or no pod, reads as the same as the cached claim's")
	}
	if _, ok := slim.Annotations[AnnotationOwnerIncarnation]; ok || slim.Labels[LabelID] != "abc" || slim.Labels["sandwake.label.tenant"] != "" || slim.Spec.Resources.Requests != nil {
		t.Fatalf("slim claim: %+v", slim)
	}
	wb, _ := json.Marshal(full)
	sb, _ := json.Marshal(slim)
	if len(sb)*3 > len(wb) {
		t.Fatalf("slim claim %d bytes of %d", len(sb), len(wb))
	}
	t.Logf("a claim keeping a pod with four services: %d bytes as JSON, %d as cached", len(wb), len(sb))
}

// pausable makes sandbox id's claim (keeping its pod) and its pod,
// running, on the fake cluster.
func pausable(t *testing.T, cs *fake.Clientset, r *Runtime, id string, spec lifecycle.Spec) {
	t.Helper()
	pod, err := r.podFor(id, spec)
	if err != nil {
		t.Fatal(err)
	}
	claim, err := r.claimFor(id, spec, pod)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := cs.CoreV1().PersistentVolumeClaims(testNS).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod.UID, pod.Status = types.UID("u-"+id), running("10.244.0.9")
	if _, err := cs.CoreV1().Pods(testNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the pod in the cache", func() bool { _, err := r.pods.Get(PodName(id)); return err == nil })
}

// cpuOfPod is the app container's CPU request and limit as the fake
// cluster holds them, in millicores.
func cpuOfPod(t *testing.T, cs *fake.Clientset, id string) (req, lim int64) {
	t.Helper()
	p, err := cs.CoreV1().Pods(testNS).Get(context.Background(), PodName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rr := p.Spec.Containers[0].Resources
	return rr.Requests.Cpu().MilliValue(), rr.Limits.Cpu().MilliValue()
}

// TestPauseCutsCPU: a pause cuts the app's CPU in place through the
// pod's resize subresource, keeping the relation of request to limit (its
// QoS class), and reads as paused; a wake gives back what the pod was made
// with. Both shapes: cpus given (request = limit) and cpus 0 (a request of
// 1m under a limit that bounds nothing).
func TestPauseCutsCPU(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		cpus                   float64
		req, lim, cutR, cutLim int64
	}{
		{"cpus 0.5", 0.5, 500, 500, pausedCPUMilli, pausedCPUMilli},
		{"cpus 0", 0, idleCPUMilli, unlimitedCPUMilli, idleCPUMilli, pausedBurstCPUMilli},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, cs := newFake(t)
			if !r.CanPause() {
				t.Fatal("CanPause is false")
			}
			spec := testSpec()
			spec.MemoryMB, spec.CPUs = 256, tc.cpus
			pausable(t, cs, r, "abc", spec)
			if req, lim := cpuOfPod(t, cs, "abc"); req != tc.req || lim != tc.lim {
				t.Fatalf("made with cpu %dm/%dm, want %dm/%dm", req, lim, tc.req, tc.lim)
			}
			ctx := context.Background()
			if err := r.Pause(ctx, "abc"); err != nil {
				t.Fatal(err)
			}
			if resized := resizes(cs); resized != 1 {
				t.Fatalf("%d patches of pods/resize, want 1", resized)
			}
			if req, lim := cpuOfPod(t, cs, "abc"); req != tc.cutR || lim != tc.cutLim {
				t.Fatalf("paused with cpu %dm/%dm, want %dm/%dm", req, lim, tc.cutR, tc.cutLim)
			}
			p, _ := cs.CoreV1().Pods(testNS).Get(ctx, "s-abc", metav1.GetOptions{})
			if p.Spec.Containers[0].Resources.Limits.Memory().Value() != 256<<20 {
				t.Fatalf("the pause changed the memory limit: %v", p.Spec.Containers[0].Resources.Limits)
			}
			if c, err := r.Inspect(ctx, "abc"); err != nil || c.State != lifecycle.ContainerPaused {
				t.Fatalf("inspect after pause: %+v %v, want paused", c, err)
			}
			if err := r.Pause(ctx, "abc"); err != nil { // paused already: no call
				t.Fatal(err)
			}
			if n := resizes(cs); n != 1 {
				t.Fatalf("%d patches of pods/resize after a second pause, want still 1", n)
			}
			if err := r.Unpause(ctx, "abc"); err != nil {
				t.Fatal(err)
			}
			if req, lim := cpuOfPod(t, cs, "abc"); req != tc.req || lim != tc.lim {
				t.Fatalf("woken with cpu %dm/%dm, want %dm/%dm", req, lim, tc.req, tc.lim)
			}
			if c, err := r.Inspect(ctx, "abc"); err != nil || c.State != lifecycle.ContainerRunning || c.Upstreams[8080] != "10.244.0.9:8080" {
				t.Fatalf("inspect after unpause: %+v %v, want running at its address", c, err)
			}
		})
	}
}

// TestPauseRefusesAPodWithoutCPULimit: a pod made before every pod had a
// CPU limit cannot be cut (a resize cannot add one without changing its
// QoS class): ErrPauseUnsupported, with no write, so the reaper stops it.
func TestPauseRefusesAPodWithoutCPULimit(t *testing.T) {
	r, cs := newFake(t)
	spec := testSpec()
	pod, err := r.podFor("old", spec)
	if err != nil {
		t.Fatal(err)
	}
	pod.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
	claim, err := r.claimFor("old", spec, pod)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := cs.CoreV1().PersistentVolumeClaims(testNS).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod.Status = running("10.244.0.7")
	if _, err := cs.CoreV1().Pods(testNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the pod in the cache", func() bool { _, err := r.pods.Get("s-old"); return err == nil })
	cs.ClearActions()
	if err := r.Pause(ctx, "old"); !errors.Is(err, lifecycle.ErrPauseUnsupported) {
		t.Fatalf("pause = %v, want ErrPauseUnsupported", err)
	}
	for _, a := range cs.Actions() {
		if a.GetVerb() != "get" {
			t.Fatalf("a pause that cannot be made %s %s, want reads only", a.GetVerb(), a.GetResource().Resource)
		}
	}
	if err := r.Pause(ctx, "none"); !errors.Is(err, lifecycle.ErrContainerNotFound) {
		t.Fatalf("pause of a sandbox with no pod = %v, want ErrContainerNotFound", err)
	}
}

// nextEvents reads the next events of evs, which must be sandbox id's
// actions, in that order (each within 10 s).
func nextEvents(t *testing.T, evs <-chan lifecycle.RuntimeEvent, id string, actions ...string) {
	t.Helper()
	for _, w := range actions {
		select {
		case ev := <-evs:
			if ev.SandboxID != id || ev.Action != w {
				t.Fatalf("event %+v, want %s of %s", ev, w, id)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s event of %s", w, id)
		}
	}
}

// resizes counts the patches of pods/resize made on cs.
func resizes(cs *fake.Clientset) int {
	n := 0
	for _, a := range cs.Actions() {
		if a.GetVerb() == "patch" && a.GetSubresource() == "resize" {
			n++
		}
	}
	return n
}
