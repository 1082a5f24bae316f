package preview_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/prometheus/client_golang/prometheus/testutil"

	swclient "github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/preview"

	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle/docker"
)

// pullGate sits in front of a dockerAPIProxy and, while closed, holds every
// image pull (POST /images/create) until it is opened again: a wake that has
// to pull stays in flight for as long as the test needs.
type pullGate struct {
	path string

	mu      sync.Mutex
	open    chan struct{} // closed while pulls pass
	waiting int           // pulls being held
}

func newPullGate(t *testing.T, p *gatewaytest.DockerAPIProxy) *pullGate {
	t.Helper()
	g := &pullGate{path: filepath.Join(t.TempDir(), "gated.sock"), open: make(chan struct{})}
	close(g.open)
	ln, err := net.Listen("unix", g.path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ErrorLog: log.New(io.Discard, "", 0), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/images/create") {
			g.mu.Lock()
			open := g.open
			g.waiting++
			g.mu.Unlock()
			select {
			case <-open:
			case <-r.Context().Done():
			}
			g.mu.Lock()
			g.waiting--
			g.mu.Unlock()
		}
		p.ServeHTTP(w, r)
	})}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		srv.Serve(ln)
	}()
	t.Cleanup(func() {
		g.release()
		srv.Close()
		wg.Wait()
	})
	return g
}

// hold makes later pulls wait until release.
func (g *pullGate) hold() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
		g.open = make(chan struct{})
	default:
	}
}

func (g *pullGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

func (g *pullGate) held() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.waiting
}

// TestFailedSandboxShowsOnlyItsReason: a sandbox whose image names a registry
// at localhost:1 fails with Docker's words, which carry the address the
// daemon dialled. Anonymous visitors of its preview host (page, status, API
// requests told or held through a wake that fails again, the event stream,
// the wake endpoint) see the reason code and its sentence, never those words;
// the management API still has them.
func TestFailedSandboxShowsOnlyItsReason(t *testing.T) {
	proxy := gatewaytest.NewDockerAPIProxy(t)
	pulls := newPullGate(t, proxy)
	h := newHarness(t, fmt.Sprintf("docker_host unix://%s\n\t\twake_timeout 30s\n\t\tallowed_registries localhost:1", pulls.path))

	// A create whose image is missing leaves nothing (422), so the sandbox
	// is made with the image under that name (a local tag), which is then
	// untagged and the container removed: the recreate must pull from
	// localhost:1, and fails with Docker's words.
	ctx := context.Background()
	image := "localhost:1/nope-" + testenv.RunID() + ":1"
	if _, err := h.Docker.ImageTag(ctx, client.ImageTagOptions{Source: h.Image, Target: image}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Docker.ImageRemove(context.Background(), image, client.ImageRemoveOptions{}) })
	status, rec := h.CreateWith(map[string]any{"image": image})
	if status != http.StatusCreated {
		t.Fatalf("create from a local tag: %d", status)
	}
	id := rec.ID
	if _, err := h.Docker.ImageRemove(ctx, image, client.ImageRemoveOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Docker.ContainerRemove(ctx, docker.ContainerName(id), client.ContainerRemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		var v swclient.Sandbox
		h.API("GET", "/v1/sandboxes/"+id, nil, &v)
		return v.State == "killed", "state " + v.State
	})
	if code := h.API("POST", "/v1/sandboxes/"+id+"/wake", nil, nil); code == http.StatusOK {
		t.Fatal("the recreate from an unreachable registry succeeded")
	}
	var full swclient.Sandbox
	h.API("GET", "/v1/sandboxes/"+id, nil, &full)
	if full.State != "error" || full.Reason != "image_missing" || !strings.Contains(full.Error, "localhost:1") {
		t.Fatalf("management API record: state %q reason %q error %q; want error, image_missing and Docker's words", full.State, full.Reason, full.Error)
	}
	sentence := preview.ReasonSentence("image_missing")
	// Fragments of Docker's words: the dialled address, the registry path,
	// the resolver's verdict.
	secrets := []string{full.Error, "127.0.0.1:1", "localhost:1/", "/v2/", "dial tcp", "connection refused", "pulling"}
	leaks := func(what, body string) {
		t.Helper()
		for _, s := range secrets {
			if strings.Contains(body, s) {
				t.Errorf("%s shows %q: %.400q", what, s, body)
			}
		}
	}
	host := h.Host(id, 8080)

	resp, body := h.Preview("GET", host, "/", nil, gatewaytest.BrowserHeader())
	if resp.StatusCode != http.StatusServiceUnavailable || pageKind(body) != preview.PageError ||
		!strings.Contains(body, `<dd id="sandwake-reason">image_missing</dd>`) || !strings.Contains(body, sentence) {
		t.Errorf("error page: %d kind %q, want 503, the error page with the reason and %q: %.600q", resp.StatusCode, pageKind(body), sentence, body)
	}
	leaks("the error page", body)

	resp, body = h.Preview("GET", host, preview.PathStatus, nil, gatewaytest.APIHeader())
	var st map[string]any
	if err := json.Unmarshal([]byte(body), &st); err != nil || resp.StatusCode != 200 {
		t.Fatalf("status: %d %q (%v)", resp.StatusCode, body, err)
	}
	if st["state"] != "error" || st["reason"] != "image_missing" || st["message"] != sentence {
		t.Errorf("status = %s; want state error, reason image_missing, message %q", body, sentence)
	}
	if _, ok := st["error"]; ok {
		t.Errorf("status has an error field: %s", body)
	}
	leaks("the status", body)

	resp, body = h.Preview("GET", host, "/", nil, gatewaytest.APIHeader())
	code, msg := jsonErrorCode(body)
	if resp.StatusCode != http.StatusServiceUnavailable || code != "sandbox_error" || !strings.Contains(msg, sentence) {
		t.Errorf("API request: %d %s; want 503 sandbox_error with %q", resp.StatusCode, body, sentence)
	}
	leaks("an API request's answer", body)

	// The preview host's event stream: its first message is the state.
	req, _ := http.NewRequest("GET", "http://"+host+preview.PathEvents, nil)
	sresp, err := h.Client.Do(req)
	if err != nil || sresp.StatusCode != 200 {
		t.Fatalf("event stream: %v %v", err, sresp)
	}
	sc := bufio.NewScanner(sresp.Body)
	for sc.Scan() && !strings.HasPrefix(sc.Text(), "data: ") {
	}
	if !strings.Contains(sc.Text(), `"to":"error"`) {
		t.Errorf("first event: %q", sc.Text())
	}
	leaks("the event stream", sc.Text())
	sresp.Body.Close()

	// A wake asked for on the preview host, kept in flight at its pull;
	// API requests meanwhile are held through it and told how it ended.
	pulls.hold()
	joined := testutil.ToFloat64(preview.MetricWaitersCollapsed)
	// The recreate that failed above set the failing-wake backoff: the
	// wake endpoint refuses until it has passed.
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		resp, body = h.Preview("POST", host, preview.PathWake, nil, gatewaytest.APIHeader())
		return !strings.Contains(body, `"backoff"`), fmt.Sprintf("%d %s", resp.StatusCode, body)
	})
	if resp.StatusCode != http.StatusAccepted || !strings.Contains(body, `"waking": true`) {
		t.Errorf("wake: %d %s; want 202 and waking true", resp.StatusCode, body)
	}
	leaks("the wake endpoint's answer", body)
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		return pulls.held() == 1, fmt.Sprintf("%d pulls held", pulls.held())
	})
	const held = 4
	answers := make(chan string, held)
	for range held {
		go func() {
			resp, body, err := h.PreviewErr("GET", host, "/", nil, gatewaytest.APIHeader())
			if err != nil {
				answers <- "error " + err.Error()
				return
			}
			answers <- fmt.Sprintf("%d %s", resp.StatusCode, body)
		}()
	}
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		n := testutil.ToFloat64(preview.MetricWaitersCollapsed) - joined
		return n >= held, fmt.Sprintf("%.0f requests joined the wake", n)
	})
	pulls.release()
	for range held {
		a := <-answers
		status, body, _ := strings.Cut(a, " ")
		code, msg := jsonErrorCode(body)
		// Every request joined the wake (counted above): each is held
		// through it and told how it ended.
		if status != "422" || code != "image_missing" || !strings.Contains(msg, sentence) {
			t.Errorf("request held through a failing wake: %s; want 422 image_missing with %q", a, sentence)
		}
		leaks("a held request's answer", body)
	}
	h.API("GET", "/v1/sandboxes/"+id, nil, &full)
	if full.State != "error" || !strings.Contains(full.Error, "localhost:1") {
		t.Errorf("after the failed wake the record is %q with error %q; want error and Docker's words", full.State, full.Error)
	}
}
