package kubernetes

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sandwake/sandwake/lifecycle"
)

// servicesSpec is testSpec with four services: cache after db, worker
// after cache, and aa on its own (ties go by name).
func servicesSpec() lifecycle.Spec {
	spec := testSpec()
	spec.Services = map[string]lifecycle.Service{
		"worker": {Image: "sandwake/worker:1", DependsOn: []string{"cache"}},
		"cache":  {Image: "sandwake/cache:1", Ready: "http:6379/health", DependsOn: []string{"db"}, MemoryMB: 64},
		"db": {Image: "sandwake/db:1", Ready: "tcp:5432", Cmd: []string{"postgres", "-p", "5432"}, Env: map[string]string{"Z": "1", "PGDATA": "/data/pg"},
			MemoryMB: 128, CPUs: 0.25, DiskMB: 50, WorkspacePath: "/data"},
		"aa": {Image: "sandwake/aa:1"},
	}
	return spec
}

func TestServicesPodSpec(t *testing.T) {
	r, _ := newFake(t)
	ro := true
	spec := servicesSpec()
	spec.ReadonlyRootfs = &ro
	spec.CapAdd = []string{"NET_RAW"}
	pod, err := r.podFor("abc", spec)
	if err != nil {
		t.Fatal(err)
	}
	ps := pod.Spec
	var names []string
	for _, c := range ps.InitContainers {
		names = append(names, c.Name)
	}
	if want := []string{"aa", "db", "cache", "worker"}; !slices.Equal(names, want) {
		t.Fatalf("init containers %v, want %v (depends_on order, ties by name)", names, want)
	}
	if len(ps.Containers) != 1 || ps.Containers[0].Name != appContainer {
		t.Fatalf("containers %+v, want the app alone", ps.Containers)
	}
	vols := map[string]corev1.Volume{}
	for _, v := range ps.Volumes {
		if _, dup := vols[v.Name]; dup {
			t.Fatalf("volume %s twice", v.Name)
		}
		vols[v.Name] = v
	}
	app := ps.Containers[0]
	for _, c := range ps.InitContainers {
		if c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
			t.Errorf("%s: restartPolicy %v, want Always (a native sidecar)", c.Name, c.RestartPolicy)
		}
		sc := c.SecurityContext
		if sc == nil || *sc.AllowPrivilegeEscalation || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
			!slices.Equal(sc.Capabilities.Add, app.SecurityContext.Capabilities.Add) || !slices.Contains(sc.Capabilities.Add, "NET_RAW") || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("%s: security context %+v, want the app's", c.Name, sc)
		}
		if sc == app.SecurityContext || sc.Capabilities == app.SecurityContext.Capabilities {
			t.Errorf("%s: shares the app's security context (a copy is wanted)", c.Name)
		}
		if c.ImagePullPolicy != app.ImagePullPolicy {
			t.Errorf("%s: pull policy %s, want the app's %s", c.Name, c.ImagePullPolicy, app.ImagePullPolicy)
		}
		if len(c.VolumeMounts) != 2 || c.VolumeMounts[1].MountPath != "/tmp" {
			t.Fatalf("%s: mounts %+v, want its workspace and /tmp", c.Name, c.VolumeMounts)
		}
		ws, tmp := vols[c.VolumeMounts[0].Name], vols[c.VolumeMounts[1].Name]
		if ws.PersistentVolumeClaim == nil || ws.PersistentVolumeClaim.ClaimName != "s-abc-svc-"+c.Name {
			t.Errorf("%s: workspace volume %+v, want claim s-abc-svc-%s", c.Name, ws, c.Name)
		}
		if tmp.EmptyDir == nil || tmp.EmptyDir.Medium != corev1.StorageMediumMemory || tmp.Name == tmpVolume {
			t.Errorf("%s: /tmp volume %+v, want a memory emptyDir of its own", c.Name, tmp)
		}
	}
	db, cache, worker := ps.InitContainers[1], ps.InitContainers[2], ps.InitContainers[3]
	checks := []struct {
		what string
		ok   bool
	}{
		{"db image", db.Image == "sandwake/db:1"},
		{"db cmd as args", slices.Equal(db.Args, []string{"postgres", "-p", "5432"}) && db.Command == nil},
		{"db env sorted", len(db.Env) == 2 && db.Env[0].Name == "PGDATA" && db.Env[1].Value == "1"},
		{"db workspace at /data", db.VolumeMounts[0].MountPath == "/data"},
		{"db tcp startup probe", db.StartupProbe != nil && db.StartupProbe.TCPSocket != nil && db.StartupProbe.TCPSocket.Port.IntValue() == 5432},
		{"probe every second, long enough for any wake", db.StartupProbe.PeriodSeconds == 1 && db.StartupProbe.FailureThreshold >= 300},
		{"db memory 128Mi request=limit", db.Resources.Limits.Memory().Value() == 128<<20 && db.Resources.Requests.Memory().Value() == 128<<20},
		{"db cpu 250m request=limit", db.Resources.Limits.Cpu().MilliValue() == 250 && db.Resources.Requests.Cpu().MilliValue() == 250},
		{"db ephemeral storage 50Mi", db.Resources.Limits.StorageEphemeral().Value() == 50<<20},
		{"cache http startup probe", cache.StartupProbe != nil && cache.StartupProbe.HTTPGet != nil && cache.StartupProbe.HTTPGet.Port.IntValue() == 6379 && cache.StartupProbe.HTTPGet.Path == "/health"},
		{"cache: memory, and cpu 0 as a request of 1m under an unbounding limit", cache.Resources.Limits.Memory().Value() == 64<<20 &&
			cache.Resources.Requests.Cpu().MilliValue() == idleCPUMilli && cache.Resources.Limits.Cpu().MilliValue() == unlimitedCPUMilli},
		{"worker: no probe", worker.StartupProbe == nil},
		{"worker: default workspace", worker.VolumeMounts[0].MountPath == lifecycle.DefaultWorkspacePath},
		{"worker: cpu alone (a pause can cut it)", worker.Resources.Limits.Memory().IsZero() && len(worker.Resources.Limits) == 1 && len(worker.Resources.Requests) == 1},
		{"ready strings read back", readyOf(&db) == "tcp:5432" && readyOf(&cache) == "http:6379/health" && readyOf(&worker) == ""},
		{"the app's claim and /tmp", ps.Volumes[0].PersistentVolumeClaim.ClaimName == "s-abc-data" && vols[tmpVolume].EmptyDir != nil},
		{"the pod still never restarts", ps.RestartPolicy == corev1.RestartPolicyNever},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("pod spec: %s: not so", c.what)
		}
	}
	// Without a read-only root: no /tmp volumes, the root as writable as
	// the app's.
	spec.ReadonlyRootfs = nil
	pod, err = r.podFor("abc", spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range pod.Spec.InitContainers {
		if len(c.VolumeMounts) != 1 || *c.SecurityContext.ReadOnlyRootFilesystem {
			t.Errorf("%s without a read-only root: mounts %+v, read-only %v", c.Name, c.VolumeMounts, *c.SecurityContext.ReadOnlyRootFilesystem)
		}
	}
	if len(pod.Spec.Volumes) != 5 {
		t.Errorf("volumes %d, want 5 (the app's claim and each service's)", len(pod.Spec.Volumes))
	}
}

func TestServiceClaims(t *testing.T) {
	r, cs := newFake(t)
	ctx := context.Background()
	sc := "fast"
	r.opts.StorageClass = sc
	if _, err := r.Create(ctx, "abc", servicesSpec()); err != nil {
		t.Fatal(err)
	}
	claims := cs.CoreV1().PersistentVolumeClaims(testNS)
	for _, svc := range []string{"aa", "cache", "db", "worker"} {
		c, err := claims.Get(ctx, "s-abc-svc-"+svc, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("claim of %s: %v", svc, err)
		}
		if !r.owns("abc", c.Labels) || c.Labels[LabelService] != svc {
			t.Errorf("claim of %s: labels %v", svc, c.Labels)
		}
		if c.Spec.StorageClassName == nil || *c.Spec.StorageClassName != sc || c.Spec.Resources.Requests.Storage().String() != DefaultVolumeSize {
			t.Errorf("claim of %s: class %v size %v", svc, c.Spec.StorageClassName, c.Spec.Resources.Requests.Storage())
		}
		if c.Annotations[AnnotationOwnerIncarnation] != "inc1" {
			t.Errorf("claim of %s: owner annotations %v", svc, c.Annotations)
		}
		if _, kept := c.Annotations[AnnotationPod]; kept {
			t.Errorf("claim of %s keeps a pod", svc)
		}
	}
	// The service claims are not sandboxes of their own.
	eventually(t, "the claims in the cache", func() bool {
		_, err := r.claims.Get("s-abc-svc-worker")
		return err == nil
	})
	if l, err := r.List(ctx); err != nil || len(l) != 1 || l[0].SandboxID != "abc" {
		t.Fatalf("list = %+v, %v", l, err)
	}
	// A recreate keeps them; one of another owner refuses it.
	if _, err := r.Create(ctx, "abc", servicesSpec()); err != nil {
		t.Fatalf("recreate: %v", err)
	}
	other := servicesSpec()
	other.Incarnation, other.Labels = "inc2", map[string]string{"tenant": "evil"}
	var se *lifecycle.ServiceError
	if _, err := r.Create(ctx, "abc", other); !errors.Is(err, lifecycle.ErrIDTaken) || !errors.As(err, &se) {
		t.Fatalf("create over another owner's service claims: %v, want a ServiceError wrapping ErrIDTaken", err)
	}
	// Stop and remove keep every claim; purge removes them all.
	if err := r.Stop(ctx, "abc"); err != nil {
		t.Fatal(err)
	}
	if err := r.Remove(ctx, "abc"); err != nil {
		t.Fatal(err)
	}
	if l, err := claims.List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) != 5 {
		t.Fatalf("claims after stop and remove: %d, %v; want 5", len(l.Items), err)
	}
	if _, err := r.RemoveVolume(ctx, "abc"); err != nil {
		t.Fatal(err)
	}
	if l, err := claims.List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) != 0 {
		t.Fatalf("claims after purge: %+v, %v", l.Items, err)
	}
	if _, err := r.RemoveVolume(ctx, "abc"); !errors.Is(err, lifecycle.ErrNotFound) {
		t.Fatalf("second purge: %v, want ErrNotFound", err)
	}
}

// TestServiceClaimsNotOurs: a service claim of another instance refuses
// the create (the app's claim is not made) and is never deleted, by the
// create or by a purge; a purge cut short after the app's claim still
// removes the services'.
func TestServiceClaimsNotOurs(t *testing.T) {
	theirs := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "s-abc-svc-db", Namespace: testNS,
		Labels: map[string]string{LabelManaged: "true", LabelInstance: "t2", LabelID: "abc", LabelService: "db"}}}
	r, cs := newFake(t, theirs)
	ctx := context.Background()
	var se *lifecycle.ServiceError
	if _, err := r.Create(ctx, "abc", servicesSpec()); !errors.Is(err, lifecycle.ErrIDTaken) || !errors.As(err, &se) || se.Service != "db" {
		t.Fatalf("create over another instance's service claim: %v, want service db's ErrIDTaken", err)
	}
	claims := cs.CoreV1().PersistentVolumeClaims(testNS)
	l, _ := claims.List(ctx, metav1.ListOptions{})
	if len(l.Items) != 1 || l.Items[0].Name != "s-abc-svc-db" {
		t.Fatalf("after the refused create: %d claims, want theirs alone (what it made removed)", len(l.Items))
	}
	if _, err := r.RemoveVolume(ctx, "abc"); !errors.Is(err, lifecycle.ErrNotFound) {
		t.Fatalf("purge of nothing of ours: %v, want ErrNotFound", err)
	}
	if _, err := claims.Get(ctx, "s-abc-svc-db", metav1.GetOptions{}); err != nil {
		t.Fatalf("another instance's claim was touched: %v", err)
	}
	// Ours, with the app's claim gone: the purge removes it.
	mine := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "s-xyz-svc-db", Namespace: testNS, Labels: r.serviceLabels("xyz", "db")}}
	if _, err := claims.Create(ctx, mine, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.RemoveVolume(ctx, "xyz"); err != nil {
		t.Fatalf("purge with the app's claim gone: %v", err)
	}
	if _, err := claims.Get(ctx, "s-xyz-svc-db", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("service claim after purge: %v", err)
	}
}

// sidecarStatus is a service's status as the kubelet reports it.
func sidecarStatus(name string, started bool, restarts int32) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: name, Started: &started, RestartCount: restarts,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}
}

// startOnFake starts sandbox id and returns Start's answer once the test,
// playing the kubelet, has set the pod's status with status.
func startOnFake(t *testing.T, ctx context.Context, r *Runtime, cs *fake.Clientset, id string, status func() corev1.PodStatus) (lifecycle.Container, error) {
	t.Helper()
	type result struct {
		c   lifecycle.Container
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := r.Start(ctx, id)
		done <- result{c, err}
	}()
	eventually(t, "a new pod", func() bool {
		pod, err := cs.CoreV1().Pods(testNS).Get(context.Background(), PodName(id), metav1.GetOptions{})
		return err == nil && pod.Status.Phase == "" // none the kubelet has seen
	})
	if status != nil {
		setPodStatus(t, cs, id, status())
	}
	select {
	case res := <-done:
		return res.c, res.err
	case <-time.After(20 * time.Second):
		t.Fatal("start did not return")
	}
	return lifecycle.Container{}, nil
}

func TestServiceMembers(t *testing.T) {
	r, cs := newFake(t)
	ctx := context.Background()
	evs, _ := r.Events(ctx)
	if _, err := r.Create(ctx, "abc", servicesSpec()); err != nil {
		t.Fatal(err)
	}
	all := func() corev1.PodStatus {
		st := running("10.244.0.9")
		for _, n := range []string{"aa", "db", "cache", "worker"} {
			st.InitContainerStatuses = append(st.InitContainerStatuses, sidecarStatus(n, true, 0))
		}
		return st
	}
	c, err := startOnFake(t, ctx, r, cs, "abc", all)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]lifecycle.ContainerState{"aa": "running", "db": "running", "cache": "running", "worker": "running"}
	if c.State != lifecycle.ContainerRunning || c.Upstreams[8080] != "10.244.0.9:8080" || len(c.Members) != 4 {
		t.Fatalf("start: %+v", c)
	}
	for n, s := range want {
		if c.Members[n] != s {
			t.Fatalf("members %v, want %v", c.Members, want)
		}
	}
	// db is OOM-killed and the kubelet restarts it at once: the group is
	// broken, as on Docker: oom and die, and the sandbox reads exited with
	// db's end.
	st := all()
	st.InitContainerStatuses[1].RestartCount = 1
	st.InitContainerStatuses[1].LastTerminationState.Terminated = &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"}
	setPodStatus(t, cs, "abc", st)
	nextEvents(t, evs, "abc", "start", "oom", "die")
	c, err = r.Inspect(ctx, "abc")
	if err != nil || c.State != lifecycle.ContainerExited || c.ExitCode != 137 || !c.OOMKilled || c.Members["db"] != lifecycle.ContainerRunning {
		t.Fatalf("inspect with db restarted = %+v, %v", c, err)
	}
	if l, _ := r.List(ctx); len(l) != 1 || l[0].State != lifecycle.ContainerExited {
		t.Fatalf("list with db restarted = %+v", l)
	}
	// A start now makes a new pod (the broken one deleted first), whose
	// services all run.
	if c, err = startOnFake(t, ctx, r, cs, "abc", all); err != nil || c.State != lifecycle.ContainerRunning || c.Members["db"] != lifecycle.ContainerRunning {
		t.Fatalf("start after the broken group: %+v, %v", c, err)
	}
	// Stopped: the members are not reported (nothing of them runs).
	if err := r.Stop(ctx, "abc"); err != nil {
		t.Fatal(err)
	}
	if c, err = r.Inspect(ctx, "abc"); err != nil || c.State != lifecycle.ContainerExited {
		t.Fatalf("inspect after stop = %+v, %v", c, err)
	}
}

func TestFailingService(t *testing.T) {
	cases := []struct {
		name    string
		status  func() corev1.PodStatus
		timeout time.Duration
		service string
		is      error
	}{
		{"crashed before ready", func() corev1.PodStatus {
			return corev1.PodStatus{Phase: corev1.PodPending, InitContainerStatuses: []corev1.ContainerStatus{
				sidecarStatus("aa", true, 0),
				{Name: "db", RestartCount: 1, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
					LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 3, Reason: "Error", Message: "starting\nno such table"}}},
			}}
		}, 0, "db", nil},
		{"exited", func() corev1.PodStatus {
			return corev1.PodStatus{Phase: corev1.PodPending, InitContainerStatuses: []corev1.ContainerStatus{
				sidecarStatus("aa", true, 0), sidecarStatus("db", true, 0),
				{Name: "cache", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1}}},
			}}
		}, 0, "cache", nil},
		{"image missing", func() corev1.PodStatus {
			return corev1.PodStatus{Phase: corev1.PodPending, InitContainerStatuses: []corev1.ContainerStatus{
				{Name: "aa", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImageNeverPull"}}},
			}}
		}, 0, "aa", lifecycle.ErrImageNotFound},
		{"never ready", func() corev1.PodStatus {
			return corev1.PodStatus{Phase: corev1.PodPending, InitContainerStatuses: []corev1.ContainerStatus{
				sidecarStatus("aa", true, 0), sidecarStatus("db", false, 0),
			}}
		}, 2 * time.Second, "db", context.DeadlineExceeded},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, cs := newFake(t)
			ctx := context.Background()
			if _, err := r.Create(ctx, "abc", servicesSpec()); err != nil {
				t.Fatal(err)
			}
			sctx := ctx
			if tc.timeout > 0 {
				var cancel context.CancelFunc
				sctx, cancel = context.WithTimeout(ctx, tc.timeout)
				defer cancel()
			}
			_, err := startOnFake(t, sctx, r, cs, "abc", tc.status)
			var se *lifecycle.ServiceError
			if !errors.As(err, &se) || se.Service != tc.service {
				t.Fatalf("start: %v, want a ServiceError naming %s", err, tc.service)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Fatalf("start: %v, want it to wrap %v", err, tc.is)
			}
			t.Logf("start: %v", err)
		})
	}
}
