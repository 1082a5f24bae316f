package caddymodule_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/internal/kubetest"
	"github.com/sandwake/sandwake/internal/testenv"
)

// installDomain is the preview domain the test's overlay gives the
// gateway.
const installDomain = "sandwake.test"

// TestKubernetesInstall installs the gateways as docs/kubernetes.md tells
// an operator to, with kubectl apply -k deploy/kubernetes, and uses them:
// make image's image, imported into the cluster's containerd; an overlay of
// the base in a namespace of the test's own (its image, imagePullPolicy
// Never, the claim's storage class, the preview domain); the Secrets made
// by the install's Job; both replicas Ready; a sandbox created through the
// API, served, paused, its egress changed, destroyed and purged, all by the
// gateways' service account under the base's Role; then the replicas as
// one cluster (testReplicas).
//
// The test cluster has no kube-proxy: the pod reaches the API server
// through kubetest.ForwardAPIServer (the overlay's hostAliases and
// KUBERNETES_SERVICE_* stand in for the kubernetes Service), and the test
// reaches the pod at its own address, on the cluster's bridge.
func TestKubernetesInstall(t *testing.T) {
	cl := kubetest.Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	kubectl := kubetest.Kubectl()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	suffix := kubetest.Suffix()
	ns := "sandwake-install-" + suffix
	cfg, err := clientcmd.BuildConfigFromFlags("", cl.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	t0 := time.Now()
	image := gatewayImage(t, ctx, cl, root, "sandwake.local/gateway:"+suffix)
	t.Logf("gateway image %s built and imported in %v", image, time.Since(t0).Round(time.Millisecond))
	apiServer := cl.ForwardAPIServer(t)

	// The namespace first, so that its deletion (which takes the gateways,
	// their claims and every sandbox's objects with it) is the first
	// cleanup to run. Nothing else is made by hand: the install's Job
	// makes the Secrets.
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNamespace(t, cl, kubectl, cs, ns) })
	t.Cleanup(func() {
		if t.Failed() {
			describeGateway(t, cl, kubectl, ns)
		}
	})
	t1 := time.Now()
	in := kubetest.Install{Root: root, Namespace: ns, Image: image, StorageClass: cl.StorageClass, Domain: installDomain, APIServer: apiServer.Addr}
	installed, err := in.Apply(ctx, cl, cs, t.TempDir(), replicaNames, 5*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	pods, token := installed.Pods, installed.Token
	t.Logf("kubectl apply -k → pods %v Ready: %v", replicaNames, time.Since(t1).Round(time.Millisecond))
	// The Secrets the install's Job made: the API's token, the cluster's
	// CA and secret.
	if len(token) < 32 {
		t.Fatalf("the install's API token: %d characters, want a random one of 32 or more", len(token))
	}
	if cs, err := cs.CoreV1().Secrets(ns).Get(ctx, "sandwake-cluster", metav1.GetOptions{}); err != nil ||
		len(cs.Data["ca.crt"]) == 0 || len(cs.Data["ca.key"]) == 0 || len(cs.Data["secret"]) < 32 {
		t.Fatalf("the install's Secret sandwake-cluster: %v, want ca.crt, ca.key and a secret", err)
	}
	pod := pods["sandwake-0"]
	apiURL := "http://" + netip.AddrPortFrom(netip.MustParseAddr(pod.Status.PodIP), 8081).String()
	previewAddr := netip.AddrPortFrom(netip.MustParseAddr(pod.Status.PodIP), 8080).String()
	hc := &http.Client{Timeout: 2 * time.Minute}
	call := func(method, path, token string, body any) (int, []byte) {
		t.Helper()
		return apiCall(t, ctx, hc, apiURL, method, path, token, body)
	}

	t.Run("the namespace admits no privileged pod", func(t *testing.T) {
		priv := true
		bad := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "privileged"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "x", Image: "sandwake.local/none:1", SecurityContext: &corev1.SecurityContext{Privileged: &priv},
		}}}}
		_, err := cs.CoreV1().Pods(ns).Create(ctx, bad, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if !apierrors.IsForbidden(err) {
			t.Fatalf("a privileged pod in the install's namespace (dry run): %v, want Forbidden by Pod Security Admission (baseline)", err)
		}
	})
	t.Run("the API needs its token", func(t *testing.T) {
		if code, body := call("GET", "/v1/sandboxes", "", nil); code != http.StatusUnauthorized {
			t.Errorf("GET /v1/sandboxes without the token: %d %s, want 401", code, body)
		}
		if code, body := call("GET", "/v1/sandboxes", "not-"+token, nil); code != http.StatusUnauthorized {
			t.Errorf("GET /v1/sandboxes with another token: %d %s, want 401", code, body)
		}
		// The readiness probe's path answers without one, with no details.
		code, body := call("GET", "/v1/readyz", "", nil)
		if code != http.StatusOK || strings.Contains(string(body), "instance") {
			t.Errorf("GET /v1/readyz without the token: %d %s, want 200 and the checks alone", code, body)
		}
	})

	t.Run("a sandbox created through the API serves its preview", func(t *testing.T) {
		app := cl.Image(t)
		id := "i" + suffix
		t2 := time.Now()
		code, body := call("POST", "/v1/sandboxes", token, map[string]any{"id": id, "image": app, "ports": []int{8080}})
		var rec client.Sandbox
		json.Unmarshal(body, &rec)
		if code != http.StatusCreated || rec.State != "running" {
			t.Fatalf("create: %d %s", code, body)
		}
		t.Logf("create → running: %v", time.Since(t2).Round(time.Millisecond))
		host := fmt.Sprintf("s-%s-8080.preview.%s", id, installDomain)
		if want := "http://" + host + "/"; rec.URLs["8080"] != want {
			t.Errorf("the sandbox's preview URL: %q, want %q (the overlay's domain and scheme)", rec.URLs["8080"], want)
		}
		// The sandbox's objects: in the gateways' namespace, under the
		// name of the replica it was placed on as the instance.
		if _, ok := pods[rec.Node]; !ok {
			t.Fatalf("the sandbox's node: %q, want one of %v", rec.Node, replicaNames)
		}
		sp, err := cs.CoreV1().Pods(ns).Get(ctx, "s-"+id, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the sandbox's pod in %s: %v", ns, err)
		}
		if got := sp.Labels["sandwake.instance"]; got != rec.Node {
			t.Errorf("the sandbox's pod's sandwake.instance: %q, want the name of the replica holding it, %s", got, rec.Node)
		}
		np, err := cs.NetworkingV1().NetworkPolicies(ns).Get(ctx, "s-"+id, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the sandbox's NetworkPolicy (egress enforced by default): %v", err)
		}
		// The bridge plugin here enforces no policy: what can be checked
		// is that the policy admits the gateway's pod by its labels.
		admitted := false
		for _, rule := range np.Spec.Ingress {
			for _, peer := range rule.From {
				if sel, err := metav1.LabelSelectorAsSelector(peer.PodSelector); err == nil && peer.PodSelector != nil && sel.Matches(labels.Set(pod.Labels)) {
					admitted = true
				}
			}
		}
		if !admitted {
			t.Errorf("the sandbox's NetworkPolicy admits no pod labelled as the gateway's (%v): %+v", pod.Labels, np.Spec.Ingress)
		}

		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+previewAddr+"/", nil)
		req.Host = host
		req.Header.Set("Accept", "application/json")
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		page, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || !strings.Contains(string(page), "Hello from the sandbox") || !strings.Contains(string(page), "s-"+id) {
			t.Fatalf("GET / at %s, Host %s: %d %s, want the testapp's page from pod s-%s", previewAddr, host, res.StatusCode, page, id)
		}

		// The CLI in a gateway's pod, as docs/kubernetes.md shows it: its
		// API address and token from the pod's environment; each replica
		// lists every sandbox of the cluster.
		for _, name := range replicaNames {
			ls, err := exec.CommandContext(ctx, kubectl, "--kubeconfig", cl.Kubeconfig, "-n", ns, "exec", name, "--", "caddy", "sandwake", "ls").CombinedOutput()
			if err != nil || !strings.Contains(string(ls), id) {
				t.Errorf("kubectl exec %s -- caddy sandwake ls: %v\n%s", name, err, ls)
			}
		}

		// A pause and an egress change under the base's Role: its patch
		// on pods/resize (a Role without it would turn the pause into a
		// 409, and the reaper's into a stop), and its writes of the claim
		// and the policy.
		before, err := cs.CoreV1().Pods(ns).Get(ctx, "s-"+id, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		code, body = call("POST", "/v1/sandboxes/"+id+"/pause", token, nil)
		var paused struct {
			State string `json:"state"`
		}
		if json.Unmarshal(body, &paused); code != http.StatusOK || paused.State != "paused" {
			t.Fatalf("pause: %d %s", code, body)
		}
		if p, err := cs.CoreV1().Pods(ns).Get(ctx, "s-"+id, metav1.GetOptions{}); err != nil || p.UID != before.UID || p.Spec.Containers[0].Resources.Limits.Cpu().MilliValue() > 2 {
			t.Fatalf("after the pause: %v, want pod %s with its CPU cut", err, before.UID)
		}
		if code, body := call("PATCH", "/v1/sandboxes/"+id, token, map[string]any{"egress": map[string]any{"policy": "none"}}); code != http.StatusOK {
			t.Fatalf("egress PATCH: %d %s", code, body)
		}
		if np, err := cs.NetworkingV1().NetworkPolicies(ns).Get(ctx, "s-"+id, metav1.GetOptions{}); err != nil || len(np.Spec.Egress) != 0 {
			t.Fatalf("the policy after egress none: %v %+v", err, np)
		}
		if c, err := cs.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "s-"+id+"-data", metav1.GetOptions{}); err != nil || c.Annotations["sandwake.networkpolicy"] == "" || strings.Contains(c.Annotations["sandwake.networkpolicy"], "0.0.0.0/0") {
			t.Fatalf("the claim's kept policy after egress none: %v", err)
		}

		// Destroy and purge: the Role's deletes of pod, policy and claim.
		if code, body := call("DELETE", "/v1/sandboxes/"+id, token, nil); code != http.StatusNoContent {
			t.Fatalf("destroy: %d %s", code, body)
		}
		if code, body := call("POST", "/v1/sandboxes/"+id+"/purge", token, nil); code/100 != 2 {
			t.Fatalf("purge: %d %s", code, body)
		}
		testenv.Eventually(t, time.Minute, func() (bool, string) {
			_, perr := cs.CoreV1().Pods(ns).Get(ctx, "s-"+id, metav1.GetOptions{})
			_, cerr := cs.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "s-"+id+"-data", metav1.GetOptions{})
			_, nerr := cs.NetworkingV1().NetworkPolicies(ns).Get(ctx, "s-"+id, metav1.GetOptions{})
			return apierrors.IsNotFound(perr) && apierrors.IsNotFound(cerr) && apierrors.IsNotFound(nerr),
				fmt.Sprintf("the sandbox's pod, claim and policy gone (%v; %v; %v)", perr, cerr, nerr)
		})
	})

	testReplicas(t, ctx, replicaTest{cl: cl, cs: cs, apiServer: apiServer, ns: ns, token: token, hc: hc, kubectl: kubectl, pods: pods, suffix: suffix})
}

// replicaNames are the install's gateways: its StatefulSet's two pods.
var replicaNames = []string{"sandwake-0", "sandwake-1"}

// apiCall sends one API request to base and returns the answer's status
// and body.
func apiCall(t *testing.T, ctx context.Context, hc *http.Client, base, method, path, token string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s%s: %v", method, base, path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

// TestDeployCaddyfileAdapts: deploy/kubernetes's Caddyfile adapts, with
// the pod's environment, to what the install relies on (engine kubernetes
// in the pod's namespace, the pod's name as the instance, the store on the
// claim, the preview domain and scheme from the settings, the API's
// token, the replicas' cluster block), without a cluster: an option renamed breaks this, not only
// TestKubernetesInstall.
func TestDeployCaddyfileAdapts(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "deploy", "kubernetes", "Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("POD_NAME", "sandwake-0")
	t.Setenv("POD_NAMESPACE", "previews")
	t.Setenv("POD_IP", "10.1.2.3")
	t.Setenv("SANDWAKE_DOMAIN", "example.org")
	t.Setenv("SANDWAKE_PREVIEW_SCHEME", "http")
	cfg, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt(src, map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range warnings {
		t.Errorf("warning: %s", w.String())
	}
	var got struct {
		Apps struct {
			Sandwake struct {
				Domain, Storage, Instance string
				PreviewURL                string `json:"preview_url"`
				Engine                    struct{ Name, Namespace, Egress string }
				Cluster                   map[string]any
			} `json:"sandwake"`
			HTTP struct {
				Servers map[string]struct {
					Listen []string
					Routes []struct{ Handle []map[string]any }
				}
			} `json:"http"`
		}
	}
	if err := json.Unmarshal(cfg, &got); err != nil {
		t.Fatal(err)
	}
	sw := got.Apps.Sandwake
	if sw.Domain != "example.org" || sw.PreviewURL != "http://*.preview.example.org" || sw.Storage != "/data/sandwake" || sw.Instance != "sandwake-0" ||
		sw.Engine.Name != "kubernetes" || sw.Engine.Namespace != "previews" || sw.Engine.Egress != "networkpolicy" {
		t.Errorf("the sandwake app: %+v", sw)
	}
	// The replicas' cluster: on the Kubernetes API, each named and
	// advertised as its pod, its certificate issued with the Secret's CA.
	for k, want := range map[string]any{
		"backend": "kubernetes", "node": "sandwake-0", "peer_listen": ":7443", "advertise": "10.1.2.3:7443",
		"peer_ca_file": "/etc/sandwake/cluster/ca.crt", "peer_ca_key_file": "/etc/sandwake/cluster/ca.key",
		"secret": "{env.SANDWAKE_CLUSTER_SECRET}",
	} {
		if got := sw.Cluster[k]; got != want {
			t.Errorf("cluster %s: %v, want %v", k, got, want)
		}
	}
	handlers := map[string]map[string]any{}
	for _, srv := range got.Apps.HTTP.Servers {
		for _, r := range srv.Routes {
			for _, h := range r.Handle {
				handlers[strings.Join(srv.Listen, ",")+" "+fmt.Sprint(h["handler"])] = h
			}
		}
	}
	if _, ok := handlers[":8080 sandwake"]; !ok {
		t.Errorf("no preview gate on :8080 (every address): %v", handlers)
	}
	if api, ok := handlers[":8081 sandwake_api"]; !ok || api["token"] != "{env.SANDWAKE_API_TOKEN}" {
		t.Errorf("the API on :8081 (every address) with the Secret's token: %v", handlers)
	}
}

// gatewayImage builds make image's image under ref into Docker, saves it
// and imports it into the cluster's containerd; both copies are removed
// when the test ends, whatever it did.
func gatewayImage(t *testing.T, ctx context.Context, cl kubetest.Cluster, root, ref string) string {
	t.Helper()
	remove, err := cl.GatewayImage(ctx, testenv.Docker(t), root, ref, t.TempDir())
	t.Cleanup(func() {
		if err := remove(); err != nil {
			t.Error(err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// describeGateway logs what a failed install left to read: the pods'
// descriptions, the namespace's events and the gateway's log.
func describeGateway(t *testing.T, cl kubetest.Cluster, kubectl, ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, args := range [][]string{
		{"describe", "pods"},
		{"get", "events", "--sort-by", ".lastTimestamp"},
		{"get", "leases", "-o", "wide"},
		{"logs", "job/sandwake-init", "--tail", "20"},
		{"logs", "sandwake-0", "--tail", "80"},
		{"logs", "sandwake-1", "--tail", "80"},
		{"logs", "sandwake-0", "--previous", "--tail", "40"},
		{"logs", "sandwake-1", "--previous", "--tail", "40"},
	} {
		out, _ := exec.CommandContext(ctx, kubectl, append([]string{"--kubeconfig", cl.Kubeconfig, "-n", ns}, args...)...).CombinedOutput()
		t.Logf("kubectl %s:\n%s", strings.Join(args, " "), out)
	}
}

// deleteNamespace deletes the test's namespace with kubectl, as an
// operator uninstalls, and waits (bounded) for it to be gone: its pods,
// claims (and local-path their volumes) and policies with it.
func deleteNamespace(t *testing.T, cl kubetest.Cluster, kubectl string, cs kubernetes.Interface, ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, kubectl, "--kubeconfig", cl.Kubeconfig, "delete", "namespace", ns, "--wait=false").CombinedOutput(); err != nil {
		t.Errorf("kubectl delete namespace %s: %v\n%s", ns, err, out)
		return
	}
	t0 := time.Now()
	testenv.Eventually(t, 3*time.Minute, func() (bool, string) {
		_, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprintf("namespace %s gone: %v", ns, err)
	})
	t.Logf("namespace %s deleted in %v", ns, time.Since(t0).Round(time.Millisecond))
}
