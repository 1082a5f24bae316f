package kubetest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	dockerclient "github.com/moby/moby/client"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Install is deploy/kubernetes as a test or the bench installs it on the
// test cluster: an overlay of the base in a namespace of its own.
type Install struct {
	// Root is the repository's root (deploy/kubernetes is under it).
	Root string
	// Namespace, Image (never pulled), StorageClass ("": the cluster's
	// default) and Domain (the previews', served over http) of the
	// install.
	Namespace, Image, StorageClass, Domain string
	// APIServer is the API server's way in for the pods
	// (StartAPIForward: the test cluster has no kube-proxy).
	APIServer netip.AddrPort
	// ExtraSites ("": none) is Caddyfile text appended to the base's
	// Caddyfile (the bench's plain reverse_proxy site).
	ExtraSites string
}

// WriteOverlay writes in dir a kustomization over deploy/kubernetes as an
// operator would: its namespace (kustomize renames the base's Namespace
// object and moves every object and the RoleBindings' subjects into it),
// image, storage class and preview domain; and, for this cluster alone,
// the API server's way in for the gateways and the init Job.
func (in Install) WriteOverlay(dir string) error {
	// kustomize refuses an absolute path to a base.
	base, err := filepath.Rel(dir, filepath.Join(in.Root, "deploy", "kubernetes"))
	if err != nil {
		return err
	}
	name, tag, _ := strings.Cut(in.Image, ":")
	patch := []map[string]any{
		{"op": "replace", "path": "/spec/template/spec/containers/0/imagePullPolicy", "value": "Never"},
		{"op": "add", "path": "/spec/template/spec/hostAliases", "value": []map[string]any{
			{"ip": in.APIServer.Addr().String(), "hostnames": []string{APIServerName}},
		}},
		{"op": "add", "path": "/spec/template/spec/containers/0/env/-", "value": map[string]string{"name": "KUBERNETES_SERVICE_HOST", "value": APIServerName}},
		{"op": "add", "path": "/spec/template/spec/containers/0/env/-", "value": map[string]string{"name": "KUBERNETES_SERVICE_PORT", "value": fmt.Sprint(in.APIServer.Port())}},
	}
	// The Job's pod needs the same way in, and the image never pulled.
	jobPatchJSON, _ := json.Marshal(patch)
	if in.StorageClass != "" {
		patch = append(patch, map[string]any{"op": "add", "path": "/spec/volumeClaimTemplates/0/spec/storageClassName", "value": in.StorageClass})
	}
	patchJSON, _ := json.Marshal(patch)
	var caddyfileGen string
	if in.ExtraSites != "" {
		caddyfile, err := os.ReadFile(filepath.Join(in.Root, "deploy", "kubernetes", "Caddyfile"))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "Caddyfile"), append(caddyfile, "\n"+in.ExtraSites...), 0o644); err != nil {
			return err
		}
		caddyfileGen = `  - name: sandwake-caddyfile
    behavior: replace
    files:
      - Caddyfile
`
	}
	kustomization := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: %s
resources:
  - %s
images:
  - name: sandwake
    newName: %s
    newTag: %s
configMapGenerator:
  - name: sandwake-settings
    behavior: merge
    literals:
      - SANDWAKE_DOMAIN=%s
      - SANDWAKE_PREVIEW_SCHEME=http
%spatches:
  - target:
      kind: StatefulSet
      name: sandwake
    patch: '%s'
  - target:
      kind: Job
      name: sandwake-init
    patch: '%s'
`, in.Namespace, base, name, tag, in.Domain, caddyfileGen, patchJSON, jobPatchJSON)
	return os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kustomization), 0o644)
}

// GatewayImage builds make image's image as ref into Docker (go run
// ./internal/image from root), saves it to a tarball in dir and imports it
// into the cluster's containerd. The returned function removes both
// copies; it is returned (and must be called) even when the build fails
// midway.
func (c Cluster) GatewayImage(ctx context.Context, docker *dockerclient.Client, root, ref, dir string) (func() error, error) {
	imported := false
	remove := func() error {
		var errs []string
		if _, err := docker.ImageRemove(context.WithoutCancel(ctx), ref, dockerclient.ImageRemoveOptions{}); err != nil && !cerrdefs.IsNotFound(err) {
			errs = append(errs, fmt.Sprintf("removing %s from Docker: %v", ref, err))
		}
		if imported {
			if err := c.RemoveImage(ref); err != nil {
				errs = append(errs, err.Error())
			}
		}
		if len(errs) > 0 {
			return fmt.Errorf("%s", strings.Join(errs, "; "))
		}
		return nil
	}
	build := exec.CommandContext(ctx, "go", "run", "./internal/image", "--tag", ref)
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return remove, fmt.Errorf("go run ./internal/image --tag %s: %v\n%s", ref, err, out)
	}
	tarball := filepath.Join(dir, "gateway.tar")
	if err := saveImage(ctx, docker, ref, tarball); err != nil {
		return remove, err
	}
	imported = true // (a failed import may have left part of it)
	if err := c.ImportImage(ctx, tarball); err != nil {
		return remove, err
	}
	return remove, nil
}

// saveImage writes Docker's image ref to tarball, as docker save does.
func saveImage(ctx context.Context, docker *dockerclient.Client, ref, tarball string) error {
	rd, err := docker.ImageSave(ctx, []string{ref})
	if err != nil {
		return fmt.Errorf("saving %s: %w", ref, err)
	}
	defer rd.Close()
	f, err := os.Create(tarball)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, rd); err != nil {
		f.Close()
		return fmt.Errorf("saving %s: %w", ref, err)
	}
	return f.Close()
}

// Kubectl is the kubectl the tests and the bench run:
// $SANDWAKE_K8S_KUBECTL, else kubectl on the PATH.
func Kubectl() string {
	if k := os.Getenv("SANDWAKE_K8S_KUBECTL"); k != "" {
		return k
	}
	return "kubectl"
}

// Installed is what Apply leaves: the replicas' pods by name, Ready at
// addresses on the cluster's bridge, and the API's token (the Secret
// sandwake-api, which the install's Job made).
type Installed struct {
	Pods  map[string]*corev1.Pod
	Token string
}

// Apply writes the install's overlay in dir, applies it with kubectl
// apply -k as an operator would, and waits up to wait for the pods names
// to be Ready at addresses on c's bridge and for the API token. The
// namespace must exist; nothing else is made by hand.
func (in Install) Apply(ctx context.Context, c Cluster, cs kubernetes.Interface, dir string, names []string, wait time.Duration) (Installed, error) {
	if err := in.WriteOverlay(dir); err != nil {
		return Installed{}, err
	}
	if out, err := exec.CommandContext(ctx, Kubectl(), "--kubeconfig", c.Kubeconfig, "apply", "-k", dir).CombinedOutput(); err != nil {
		return Installed{}, fmt.Errorf("kubectl apply -k: %v\n%s", err, out)
	}
	got := Installed{Pods: map[string]*corev1.Pod{}}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		last := in.ready(wctx, cs, names, got.Pods)
		if last == "" {
			break
		}
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return Installed{}, fmt.Errorf("waiting for the install's pods %v: %w (%s)", names, context.Cause(ctx), last)
			}
			return Installed{}, fmt.Errorf("the install's pods %v not Ready after %s: %s", names, wait, last)
		case <-tick.C:
		}
	}
	for _, p := range got.Pods {
		if err := c.CheckOnBridge(p.Status.PodIP); err != nil {
			return Installed{}, err
		}
	}
	sec, err := cs.CoreV1().Secrets(in.Namespace).Get(ctx, "sandwake-api", metav1.GetOptions{})
	if err != nil {
		return Installed{}, fmt.Errorf("the install's Secret sandwake-api: %w", err)
	}
	got.Token = string(sec.Data["token"])
	return got, nil
}

// ready reads the pods names into pods and tells what is not Ready yet
// ("": all are).
func (in Install) ready(ctx context.Context, cs kubernetes.Interface, names []string, pods map[string]*corev1.Pod) string {
	for _, name := range names {
		p, err := cs.CoreV1().Pods(in.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return "pod " + name + ": " + err.Error()
		}
		pods[name] = p
		if !PodReady(p) {
			return fmt.Sprintf("pod %s not Ready (phase %s%s)", name, p.Status.Phase, containerWaiting(p))
		}
	}
	return ""
}

// containerWaiting says why p's containers are not running, if they wait.
func containerWaiting(p *corev1.Pod) string {
	var why strings.Builder
	for _, s := range p.Status.ContainerStatuses {
		if w := s.State.Waiting; w != nil {
			fmt.Fprintf(&why, "; %s waiting: %s %s", s.Name, w.Reason, w.Message)
		}
	}
	return why.String()
}
