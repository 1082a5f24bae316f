package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
)

// This file measures the kubelet's side of the Kubernetes pause tier
// (lifecycle/kubernetes/pause.go): a running pod's CPU cut to the minimum
// through the pod's resize subresource ("paused"), then given back
// ("woken"): whether the process keeps its memory and state, and how long
// the kubelet takes to apply each change. The wake through sandwake is
// kubePausedWake's cell, against the same 100 ms goal.

// Resize tier settings: the CPU a sandbox runs with, the least the API
// takes (the kubelet rounds the CFS quota up to its 1 ms minimum per
// 100 ms period, 10m in effect), and the wake from paused must meet.
var (
	resizeRunCPU  = resource.MustParse("500m")
	resizeIdleCPU = resource.MustParse("1m")
)

const resizeWakeGoal = 100 * time.Millisecond

// resizeTitle names the cell's table.
const resizeTitle = kubeTitlePrefix + "pause tier, the kubelet's side: a pod's CPU cut to 1m in place, then given back"

// resizeTier runs the measurement on a pod of its own in the bench's
// namespace and tabulates it. A resize the cluster refuses or never
// applies is the finding, reported in the table, not an error.
func resizeTier(ctx context.Context, kb *kubeBench, rounds int) (*table, error) {
	t := &table{
		title: resizeTitle,
		note: fmt.Sprintf("a testapp pod (cpu %s, memory 64Mi, requests = limits: Guaranteed) resized through pods/resize to cpu %s and back, %d rounds; applied = the container status shows the new CPU and no PodResizePending/PodResizeInProgress condition (a watch opened before the PATCH); wake = PATCH back → applied → first byte of a GET at the pod's IP",
			resizeRunCPU.String(), resizeIdleCPU.String(), rounds),
	}
	pods := kb.cs.CoreV1().Pods(kb.ns)
	name := "rz-" + kb.suffix
	res := corev1.ResourceList{corev1.ResourceCPU: resizeRunCPU, corev1.ResourceMemory: resource.MustParse("64Mi")}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{kubeLabel: testenv.RunID()}},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "app", Image: kb.image, ImagePullPolicy: corev1.PullNever,
				Ports:     []corev1.ContainerPort{{ContainerPort: 8080}},
				Resources: corev1.ResourceRequirements{Requests: res, Limits: res.DeepCopy()},
			}},
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: new(int64(2)),
			AutomountServiceAccountToken:  new(false),
			EnableServiceLinks:            new(false),
		},
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	w, err := watchPod(wctx, kb.cs, kb.ns, name)
	if err != nil {
		cancel()
		return t, err
	}
	if _, err := pods.Create(wctx, pod, metav1.CreateOptions{}); err != nil {
		w.Stop()
		cancel()
		return t, fmt.Errorf("creating the resize pod: %w", err)
	}
	var first *corev1.Pod
	err = untilPod(wctx, w, "the resize pod to run", func(_ watch.EventType, p *corev1.Pod) (bool, error) {
		first = p
		return appRunning(p), nil
	})
	w.Stop()
	cancel()
	if err != nil {
		return t, err
	}
	if err := kb.cl.CheckOnBridge(first.Status.PodIP); err != nil {
		return t, err
	}
	addr := net.JoinHostPort(first.Status.PodIP, "8080")
	spec := lifecycle.Spec{Ports: []int{8080}, ReadyMode: lifecycle.ReadyHTTP}
	rctx, rcancel := context.WithTimeout(ctx, time.Minute)
	err = lifecycle.WaitReady(rctx, addr, &spec)
	rcancel()
	if err != nil {
		return t, err
	}
	// State only the process holds: the most /wait requests it ever
	// served at once, 5 here.
	if err := holdState(ctx, addr, 5); err != nil {
		return t, err
	}
	started, restarts, ctrID := appStatus(first)

	var cutT, wakeT, appliedT, idleGetT []time.Duration
	var quota, memBefore, memCut string
	memBefore = podCgroup(first.UID, "memory", "memory.usage_in_bytes")
	held := true
	for i := range rounds {
		// Pause: CPU down to the minimum.
		d, _, err := resizeTo(ctx, kb, name, resizeIdleCPU)
		if err != nil {
			t.add(valueRow("pause (resize to "+resizeIdleCPU.String()+")", "", 0, func(float64) string { return "refused: " + err.Error() }, info))
			return t, nil
		}
		cutT = append(cutT, d)
		if i == 0 {
			quota = podCgroup(first.UID, "cpu", "cpu.cfs_quota_us") + " / " + podCgroup(first.UID, "cpu", "cpu.shares")
			memCut = podCgroup(first.UID, "memory", "memory.usage_in_bytes")
		}
		// Paused: the process still answers (not frozen), and still
		// holds its state.
		t0 := time.Now()
		body, err := kubeGet(ctx, addr, "/inflight")
		idleGetT = append(idleGetT, time.Since(t0))
		if err != nil || body != "0 5\n" {
			held = false
			progress("kubernetes: resize round %d: /inflight while cut: %q %v", i+1, body, err)
		}
		// Wake: CPU back, then the first byte.
		t0 = time.Now()
		applied, p, err := resizeTo(ctx, kb, name, resizeRunCPU)
		if err != nil {
			return t, fmt.Errorf("resizing back: %w", err)
		}
		if _, err := firstByte(ctx, directClient, "http://"+addr+"/healthz"); err != nil {
			return t, err
		}
		wakeT, appliedT = append(wakeT, time.Since(t0)), append(appliedT, applied)
		if s, r, id := appStatus(p); !s.Equal(started) || r != restarts || id != ctrID {
			held = false
			progress("kubernetes: resize round %d: the container changed: started %v→%v, restarts %d→%d", i+1, started, s, restarts, r)
		}
	}
	if body, err := kubeGet(ctx, addr, "/inflight"); err != nil || body != "0 5\n" {
		held = false
	}
	ws, as, cs, is := sortedCopy(wakeT), sortedCopy(appliedT), sortedCopy(cutT), sortedCopy(idleGetT)
	heldS := "yes: same container, no restart, /inflight still 0 5"
	if !held {
		heldS = "no"
	}
	t.add(valueRow("process state held while cut", "", 0, func(float64) string { return heldS }, info))
	t.add(valueRow("pause: PATCH → applied, p50", "", percentile(cs, 50).Seconds(), fmtSeconds, info))
	t.add(valueRow("while cut: a GET at the pod's IP, p50", "", percentile(is, 50).Seconds(), fmtSeconds, info))
	t.add(valueRow("while cut: pod cgroup cpu.cfs_quota_us / cpu.shares", "", 0, func(float64) string { return quota }, info))
	t.add(valueRow("pod cgroup memory.usage_in_bytes: running → cut", "", 0, func(float64) string { return mib(memBefore) + " → " + mib(memCut) }, info))
	t.add(valueRow("wake: PATCH back → applied, p50", "", percentile(as, 50).Seconds(), fmtSeconds, info))
	t.add(valueRow("wake: PATCH back → applied, p90", "", percentile(as, 90).Seconds(), fmtSeconds, info))
	t.add(valueRow("wake: PATCH back → applied → first byte, p90", "", percentile(ws, 90).Seconds(), fmtSeconds, info))
	p50 := percentile(ws, 50)
	t.add(valueRow("wake: PATCH back → applied → first byte, p50", "", p50.Seconds(), fmtSeconds, info))
	progress("kubernetes: resize: wake p50 %s p90 %s (applied p50 %s), state held %v", fmtDuration(p50), fmtDuration(percentile(ws, 90)), fmtDuration(percentile(as, 50)), held)
	return t, nil
}

// directClient talks to pod addresses, one fresh connection per request
// (a pod's first byte after a resize is what is timed).
var directClient = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// holdState gives the app state only its process keeps: n /wait requests
// served at once.
func holdState(ctx context.Context, addr string, n int) error {
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := kubeGet(ctx, addr, "/wait?ms=500")
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	body, err := kubeGet(ctx, addr, "/inflight")
	if err != nil {
		return err
	}
	if body != fmt.Sprintf("0 %d\n", n) {
		return fmt.Errorf("/inflight after %d concurrent waits: %q", n, body)
	}
	return nil
}

// appStatus is what tells one run of the app container from another.
func appStatus(p *corev1.Pod) (started time.Time, restarts int32, id string) {
	if len(p.Status.ContainerStatuses) == 0 {
		return
	}
	s := p.Status.ContainerStatuses[0] // the pod's one container
	if s.State.Running != nil {
		started = s.State.Running.StartedAt.Time
	}
	return started, s.RestartCount, s.ContainerID
}

// resizeTo PATCHes pod name's resize subresource to cpu (requests and
// limits) and waits, on a watch opened before, until the kubelet applied
// it. It returns the time from the PATCH to applied and the pod then. A
// refused PATCH, an infeasible resize or one not applied within 30 s is
// an error saying so.
func resizeTo(ctx context.Context, kb *kubeBench, name string, cpu resource.Quantity) (time.Duration, *corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	w, err := watchPod(ctx, kb.cs, kb.ns, name)
	if err != nil {
		return 0, nil, err
	}
	defer w.Stop()
	patch := fmt.Sprintf(`{"spec":{"containers":[{"name":"app","resources":{"requests":{"cpu":%q},"limits":{"cpu":%q}}}]}}`, cpu.String(), cpu.String())
	t0 := time.Now()
	p, err := kb.cs.CoreV1().Pods(kb.ns).Patch(ctx, name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "resize")
	if err != nil {
		return 0, nil, fmt.Errorf("PATCH pods/%s/resize to cpu %s: %w", name, cpu.String(), err)
	}
	if ok, why := resized(p, cpu); ok {
		return time.Since(t0), p, nil
	} else if why != "" {
		return 0, nil, fmt.Errorf("resize to cpu %s: %s", cpu.String(), why)
	}
	var last *corev1.Pod
	err = untilPod(ctx, w, "the resize to cpu "+cpu.String()+" to be applied", func(_ watch.EventType, pod *corev1.Pod) (bool, error) {
		last = pod
		ok, why := resized(pod, cpu)
		if why != "" {
			return false, fmt.Errorf("resize to cpu %s: %s", cpu.String(), why)
		}
		return ok, nil
	})
	if err != nil {
		if last != nil {
			err = fmt.Errorf("%w (last status: %s)", err, resizeConditions(last))
		}
		return 0, nil, err
	}
	return time.Since(t0), last, nil
}

// resized reports whether the app container's status shows cpu as its
// request and limit with no resize pending or in progress; why is set
// when the kubelet said the resize cannot be done.
func resized(p *corev1.Pod, cpu resource.Quantity) (ok bool, why string) {
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch {
		case c.Type == corev1.PodResizePending && c.Reason == corev1.PodReasonInfeasible:
			return false, fmt.Sprintf("%s %s: %s", c.Type, c.Reason, c.Message)
		case c.Type == corev1.PodResizeInProgress && c.Reason == corev1.PodReasonError:
			return false, fmt.Sprintf("%s %s: %s", c.Type, c.Reason, c.Message)
		case c.Type == corev1.PodResizePending, c.Type == corev1.PodResizeInProgress:
			return false, ""
		}
	}
	if len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].Resources == nil {
		return false, ""
	}
	r := p.Status.ContainerStatuses[0].Resources // the pod's one container
	return r.Requests.Cpu().Cmp(cpu) == 0 && r.Limits.Cpu().Cmp(cpu) == 0, ""
}

// resizeConditions tells a pod's resize conditions and its container's
// CPU as its status shows them.
func resizeConditions(p *corev1.Pod) string {
	var parts []string
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodResizePending || c.Type == corev1.PodResizeInProgress {
			parts = append(parts, fmt.Sprintf("%s=%s %s %s", c.Type, c.Status, c.Reason, c.Message))
		}
	}
	for _, s := range p.Status.ContainerStatuses {
		if s.Resources != nil {
			parts = append(parts, fmt.Sprintf("status cpu request %s limit %s", s.Resources.Requests.Cpu(), s.Resources.Limits.Cpu()))
		}
	}
	if len(parts) == 0 {
		return "no resize condition, no container resources"
	}
	return strings.Join(parts, "; ")
}

// podCgroup reads file of pod uid's cgroup in the controller's v1
// hierarchy on this machine (the node), "?" when not found.
func podCgroup(uid types.UID, controller, file string) string {
	for _, root := range []string{"/sys/fs/cgroup/" + controller, "/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/memory"} {
		for _, qos := range []string{"", "burstable", "besteffort"} {
			b, err := os.ReadFile(filepath.Join(root, "kubepods", qos, "pod"+string(uid), file))
			if err == nil {
				return strings.TrimSpace(string(b))
			}
		}
	}
	return "?"
}

// mib shows a byte count read from a cgroup file in MiB.
func mib(s string) string {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return s
	}
	return fmtBytes(float64(n))
}

// cgroupVersion is 2 on a unified hierarchy, else 1.
func cgroupVersion() int {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return 2
	}
	return 1
}
