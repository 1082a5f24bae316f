package caddymodule_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/kubetest"
	"github.com/sandwake/sandwake/internal/testenv"
)

// kubeEnv is a real Caddy with engine kubernetes on the test cluster, in
// a namespace of its own that the test's end deletes.
type kubeEnv struct {
	*gatewaytest.Harness
	cl     kubetest.Cluster
	cs     kubernetes.Interface
	ns     string
	image  string
	suffix string
}

// newKubeEnv starts the gateway; global is added to the sandwake block
// ({image} in it is the test image) and tokens to the sandwake_api block.
func newKubeEnv(t *testing.T, ctx context.Context, global, tokens string) *kubeEnv {
	t.Helper()
	cl := kubetest.Need(t)
	e := &kubeEnv{cl: cl, image: cl.Image(t), suffix: kubetest.Suffix()}
	cfg, err := clientcmd.BuildConfigFromFlags("", cl.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if e.cs, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	e.ns = "sandwake-e2e-" + e.suffix
	if _, err := e.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The namespace takes whatever the test left of its pods and
		// claims (and local-path their volumes) with it.
		e.cs.CoreV1().Namespaces().Delete(context.Background(), e.ns, metav1.DeleteOptions{})
	})
	e.Harness = gatewaytest.NewBare(t)
	class := ""
	if cl.StorageClass != "" {
		class = "storage_class " + cl.StorageClass
	}
	gatewaytest.LockCaddy(t)
	e.LoadText(fmt.Sprintf(`{
	admin off
	persist_config off
	auto_https off
	storage file_system %s
	sandwake {
		storage %s
		preview_url http://*.preview.localhost:%d
		stop_timeout 5s
		engine kubernetes {
			kubeconfig %s
			namespace %s
			volume_size 64Mi
			%s
		}
		%s
	}
}
http://*.preview.localhost:%d {
	bind 127.0.0.1
	sandwake_preview
}
http://127.0.0.1:%d {
	bind 127.0.0.1
	sandwake_api {
		token %s
		%s
	}
}
`, filepath.Join(e.Dir, "caddy"), filepath.Join(e.Dir, "sandwake"), e.PreviewPort,
		cl.Kubeconfig, e.ns, class, strings.ReplaceAll(global, "{image}", e.image), e.PreviewPort, e.APIPort, gatewaytest.Token, tokens))
	e.WaitReady()
	return e
}

// pod returns sandbox id's pod (nil when it has none).
func (e *kubeEnv) pod(ctx context.Context, id string) *corev1.Pod {
	p, err := e.cs.CoreV1().Pods(e.ns).Get(ctx, "s-"+id, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return p
}

// podsAdded counts, from now on, the pods the API server adds in the
// namespace under name ("": any); the count ends with the test.
func (e *kubeEnv) podsAdded(t *testing.T, ctx context.Context, name string) *atomic.Int32 {
	t.Helper()
	pods := e.cs.CoreV1().Pods(e.ns)
	list, err := pods.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	opts := metav1.ListOptions{ResourceVersion: list.ResourceVersion}
	if name != "" {
		opts.FieldSelector = "metadata.name=" + name
	}
	w, err := pods.Watch(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	var made atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if ev.Type == watch.Added {
				made.Add(1)
			}
		}
	}()
	t.Cleanup(func() { w.Stop(); <-done })
	return &made
}

// callAs calls the API with token; it returns the status and the body.
func (e *kubeEnv) callAs(t *testing.T, token, method, path string, body any) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, e.APIURL(path), rd)
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// eventually polls cond for up to a minute.
func (e *kubeEnv) eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, func() (bool, string) { return cond(), what })
}
