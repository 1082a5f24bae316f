package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
)

// TestStopIsBounded: Ctrl-C (SIGINT) to the built Caddy while a wake, a pool
// fill and a webhook delivery are in flight, a request is held for the wake
// and event streams are open on the API and on the preview host: the
// process exits within sandwake's bound (the engine's close bound, plus
// Caddy's own stop), the held request is answered 503, the streams end,
// and the log says the engine stopped. Before the bound, an open stream
// held Caddy's servers in "shutting down with eternal grace period" for
// good.
func TestStopIsBounded(t *testing.T) {
	bin := buildCaddy(t)
	cli := testenv.Docker(t)
	image := testenv.TestAppImage(t)

	// A webhook receiver that takes deliveries and never answers.
	hookLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var deliveries atomic.Int32
	hook := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		deliveries.Add(1)
		<-r.Context().Done()
	})}
	go hook.Serve(hookLn)
	t.Cleanup(func() { hook.Close() })

	g := newGateway(t, bin, fmt.Sprintf(`wake_timeout 5m
		hold_timeout 5m
		webhook http://%s/hook {
			secret stop-test-secret-0123456789
		}
		template slow {
			image %s
			ports 8080
			memory_mb 32
			env STARTUP_DELAY 10m
			pool {
				min_idle 1
			}
		}`, hookLn.Addr(), image))
	g.start()
	id := testenv.UniqueID("stop")
	g.create(cli, image, id, nil)
	host := fmt.Sprintf("s-%s-8080.preview.localhost:%d", id, g.previewPort)
	pc := g.previewClient()

	// Its next start waits ten minutes: a wake stays in flight.
	req, _ := http.NewRequest("PUT", "http://"+host+"/files/startup_delay", strings.NewReader("10m"))
	if resp, err := pc.Do(req); err != nil || resp.StatusCode/100 != 2 {
		t.Fatalf("PUT startup_delay: %v %v", resp, err)
	}
	if code, body := g.api("POST", "/v1/sandboxes/"+id+"/stop", nil, nil); code != 200 {
		t.Fatalf("stop: %d %s", code, body)
	}

	// The streams: the API's events and the preview host's.
	streamEnded := func(resp *http.Response) <-chan struct{} {
		ended := make(chan struct{})
		go func() {
			defer close(ended)
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
			}
		}()
		return ended
	}
	apiReq, _ := http.NewRequest("GET", fmt.Sprintf("http://127.0.0.1:%d/v1/events", g.apiPort), nil)
	apiReq.Header.Set("Authorization", "Bearer "+crashToken)
	apiResp, err := (&http.Client{}).Do(apiReq)
	if err != nil || apiResp.StatusCode != 200 {
		t.Fatalf("GET /v1/events: %v %v", apiResp, err)
	}
	apiEnded := streamEnded(apiResp)
	previewReq, _ := http.NewRequest("GET", "http://"+host+"/.well-known/sandwake/events", nil)
	previewResp, err := (&http.Client{Transport: pc.Transport}).Do(previewReq)
	if err != nil || previewResp.StatusCode != 200 {
		t.Fatalf("GET the preview's events: %v %v", previewResp, err)
	}
	previewEnded := streamEnded(previewResp)

	// The held request starts the wake.
	type answer struct {
		code int
		body string
		err  error
	}
	held := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest("GET", "http://"+host+"/healthz", nil)
		req.Header.Set("Accept", "application/json")
		resp, err := (&http.Client{Transport: pc.Transport}).Do(req)
		if err != nil {
			held <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		var e client.ErrorResponse
		json.NewDecoder(resp.Body).Decode(&e)
		held <- answer{code: resp.StatusCode, body: e.Error.Code + ": " + e.Error.Message}
	}()

	// Everything in flight: the wake, a pool fill, a delivery.
	testenv.Eventually(t, 60*time.Second, func() (bool, string) {
		var st struct {
			Waking bool `json:"waking"`
		}
		resp, err := pc.Get("http://" + host + "/.well-known/sandwake/status")
		if err == nil {
			json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
		}
		var tl client.TemplateList
		g.api("GET", "/v1/templates", nil, &tl)
		filling := 0
		if len(tl.Templates) == 1 && tl.Templates[0].Pool != nil {
			filling = tl.Templates[0].Pool.Filling
		}
		return st.Waking && filling > 0 && deliveries.Load() > 0,
			fmt.Sprintf("waking %v, pool filling %d, deliveries in flight %d", st.Waking, filling, deliveries.Load())
	})

	start := time.Now()
	if err := g.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	bound := lifecycle.DefaultCloseTimeout + 15*time.Second // Caddy's own stop besides sandwake's
	exited := make(chan error, 1)
	go func() { exited <- g.cmd.Wait() }()
	select {
	case <-exited:
	case <-time.After(bound):
		g.kill()
		t.Fatalf("Caddy still running %s after SIGINT; log:\n%s", bound, tail(g.log.String()))
	}
	took := time.Since(start)
	t.Logf("stopped %s after SIGINT", took.Round(time.Millisecond))
	for name, ended := range map[string]<-chan struct{}{"the API's": apiEnded, "the preview host's": previewEnded} {
		select {
		case <-ended:
		case <-time.After(5 * time.Second):
			t.Errorf("%s event stream still open after the process exited", name)
		}
	}
	select {
	case a := <-held:
		if a.err == nil && a.code != http.StatusServiceUnavailable {
			t.Errorf("the held request: %d %s, want 503 (the gateway is stopping)", a.code, a.body)
		}
		t.Logf("the held request: %d %s %v", a.code, a.body, a.err)
	case <-time.After(5 * time.Second):
		t.Error("the held request is still unanswered after the process exited")
	}
	log := g.log.String()
	if !strings.Contains(log, "sandwake engine stopped") {
		t.Errorf("the log does not say the engine stopped:\n%s", tail(log))
	}
}
