package preview_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	swclient "github.com/sandwake/sandwake/client"

	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle/docker"
)

// TestDockerCutMidWake: Docker is cut off in the middle of a wake, then
// brought back. The held request ends with the app's 200 or a clear
// 503 + Retry-After JSON: never a 502, never a hang past hold_timeout. Once
// Docker is back, the store comes to agree with Docker, and no goroutine is
// left behind. Two cut points: as soon as Docker itself shows the container
// running (sandwake may still be waiting for the answer to its start call),
// and once sandwake's start and inspect calls are answered and it waits for
// the app, which listens only after STARTUP_DELAY (the readiness phase, which
// needs no Docker).
func TestDockerCutMidWake(t *testing.T) {
	const holdTimeout = 30 * time.Second
	proxy := gatewaytest.NewDockerAPIProxy(t)
	h := newHarness(t, fmt.Sprintf("docker_host unix://%s\n\t\thold_timeout %s\n\t\treconcile_interval 2s", proxy.Path, holdTimeout))
	rec := h.Create(map[string]string{"STARTUP_DELAY": "2s"})
	host := h.Host(rec.ID, 8080)
	name := docker.ContainerName(rec.ID)
	e := engineFor(t, h)
	ci, err := h.Docker.ContainerInspect(context.Background(), name, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cid := ci.Container.ID

	phases := []struct {
		name string
		// cutNow reports whether the wake has reached the cut point, given
		// the Docker calls completed since the request was sent and those
		// in flight.
		cutNow func(t *testing.T, completed, inflight []string) (bool, string)
	}{
		{"docker shows the container running", func(t *testing.T, _, _ []string) (bool, string) {
			s := gatewaytest.DockerRecordState(t, h.Docker, rec.ID)
			return s == "running", "docker shows " + s
		}},
		{"readiness phase", func(_ *testing.T, completed, inflight []string) (bool, string) {
			started := -1
			for i, c := range completed {
				// The start addresses the container by its engine id (checked
				// to be this gateway's), the inspects by its name.
				if strings.HasPrefix(c, "POST ") && (strings.HasSuffix(c, "/containers/"+name+"/start") || strings.HasSuffix(c, "/containers/"+cid+"/start")) {
					started = i
				}
				if started >= 0 && i > started && strings.HasPrefix(c, "GET ") && strings.HasSuffix(c, "/containers/"+name+"/json") {
					// Inspects may be in flight at any moment now (the wake
					// watches the starting container for an early exit);
					// only a start still in flight is not the readiness phase.
					for _, f := range inflight {
						if strings.HasPrefix(f, "POST ") {
							return false, fmt.Sprintf("start and inspect answered; in flight: %v", inflight)
						}
					}
					return true, ""
				}
			}
			return false, fmt.Sprintf("docker calls so far: %v", completed)
		}},
	}
	for _, ph := range phases {
		t.Run(ph.name, func(t *testing.T) {
			defer h.useT(t)()
			// Docker healthy again: readiness answers 200 only with the
			// circuit closed, which the failures of a previous cut may
			// have opened.
			testenv.Eventually(t, 60*time.Second, func() (bool, string) {
				resp, err := http.Get(h.APIURL("/v1/readyz"))
				if err != nil {
					return false, err.Error()
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				return resp.StatusCode == http.StatusOK, fmt.Sprintf("%d %s", resp.StatusCode, b)
			})
			h.Stop(rec.ID)
			baseline := quiescentGoroutines(h)
			mark := proxy.Mark()

			type result struct {
				status int
				header http.Header
				body   string
				err    error
				took   time.Duration
			}
			done := make(chan result, 1)
			// Bounded well past hold_timeout: a request that hung fails here.
			bounded := &http.Client{Transport: h.Client.Transport, Timeout: holdTimeout + 15*time.Second}
			go func() {
				req, _ := http.NewRequest("GET", "http://"+host+"/healthz", nil)
				req.Header = gatewaytest.APIHeader()
				start := time.Now()
				resp, err := bounded.Do(req)
				if err != nil {
					done <- result{err: err, took: time.Since(start)}
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				done <- result{status: resp.StatusCode, header: resp.Header, body: string(b), took: time.Since(start)}
			}()

			testenv.Eventually(t, 30*time.Second, func() (bool, string) {
				completed, inflight := proxy.Calls(mark)
				return ph.cutNow(t, completed, inflight)
			})
			_, wakingAtCut := e.Mgr.Waking(rec.ID)
			proxy.Cut()
			completed, inflight := proxy.Calls(mark)
			t.Logf("docker cut; wake in flight: %v; calls answered: %v; in flight: %v", wakingAtCut, completed, inflight)
			if !wakingAtCut {
				t.Errorf("the wake was over before the cut (the app waits 2s before listening): the cut tested nothing")
			}

			var res result
			select {
			case res = <-done:
			case <-time.After(holdTimeout + 30*time.Second):
				t.Fatalf("the held request did not end within hold_timeout (%s) + 30s", holdTimeout)
			}
			proxy.Restore()
			t.Logf("held request: %d Retry-After=%q in %s: %.300q (err %v)", res.status, res.header.Get("Retry-After"), res.took, res.body, res.err)
			switch {
			case res.err != nil:
				t.Errorf("held request failed: %v (after %s; hold_timeout %s)", res.err, res.took, holdTimeout)
			case res.status == http.StatusOK:
				if res.body != "ok\n" {
					t.Errorf("held request: 200 %q, want the app's \"ok\\n\"", res.body)
				}
			case res.status == http.StatusServiceUnavailable:
				var body swclient.ErrorResponse
				jerr := json.Unmarshal([]byte(res.body), &body)
				if res.header.Get("Retry-After") == "" || !strings.HasPrefix(res.header.Get("Content-Type"), "application/json") ||
					jerr != nil || body.Error.Code == "" || body.Error.Message == "" {
					t.Errorf("held request: 503 without Retry-After and a JSON error: %v %q", res.header, res.body)
				}
			default:
				t.Errorf("held request: %d %.300q, want 200 from the app or 503 + Retry-After JSON", res.status, res.body)
			}

			// Docker back: the store comes to agree with Docker.
			testenv.Eventually(t, 60*time.Second, func() (bool, string) {
				want := gatewaytest.DockerRecordState(t, h.Docker, rec.ID)
				got := h.State(rec.ID)
				return got == want, fmt.Sprintf("store says %s, docker shows %s", got, want)
			})
			t.Logf("after restore: store and docker agree on %s", h.State(rec.ID))
			resp, body := h.Preview("GET", host, "/healthz", nil, gatewaytest.APIHeader())
			if resp.StatusCode != http.StatusOK || body != "ok\n" {
				t.Errorf("after restore: %d %.300q, want the app's 200", resp.StatusCode, body)
			}

			var now int
			testenv.Eventually(t, 30*time.Second, func() (bool, string) {
				now = quiescentGoroutines(h)
				return now <= baseline+10, fmt.Sprintf("%d goroutines, baseline %d", now, baseline)
			})
			t.Logf("goroutines after recovery: %d (baseline %d)", now, baseline)
		})
	}
}

// TestDockerSocketCut: with the Docker daemon unreachable, requests to a
// stopped sandbox fail fast with 503 + Retry-After + JSON, the circuit
// breaker opens, readiness says so, and nothing is written; once the daemon
// is back, readiness recovers, the same request wakes the sandbox, and no
// goroutine is left behind.
func TestDockerSocketCut(t *testing.T) {
	proxy := gatewaytest.NewDockerAPIProxy(t)
	h := newHarness(t, "docker_host unix://"+proxy.Path)
	rec := h.Create(nil)
	host := h.Host(rec.ID, 8080)
	h.Stop(rec.ID)
	e := engineFor(t, h)

	histBefore := len(h.historyOf(rec.ID))
	lastBefore, err := e.Mgr.LastEventID()
	if err != nil {
		t.Fatal(err)
	}
	baseline := quiescentGoroutines(h)
	t.Logf("goroutines before the cut: %d", baseline)

	proxy.Cut()

	// A bounded client: a request that hung on the dead daemon would fail
	// here instead of hanging the test.
	bounded := &http.Client{Transport: h.Client.Transport, Timeout: 5 * time.Second}
	var circuitOpenSeen int
	for i := range 8 {
		req, _ := http.NewRequest("GET", "http://"+host+"/healthz", nil)
		req.Header = gatewaytest.APIHeader()
		start := time.Now()
		resp, err := bounded.Do(req)
		if err != nil {
			t.Fatalf("request %d with docker cut: %v (after %s)", i, err, time.Since(start))
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		took := time.Since(start)
		var body swclient.ErrorResponse
		jerr := json.Unmarshal(b, &body)
		t.Logf("request %d with docker cut: %d Retry-After=%q in %s: %s", i, resp.StatusCode, resp.Header.Get("Retry-After"), took, strings.TrimSpace(string(b)))
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("request %d: status %d, want 503: %s", i, resp.StatusCode, b)
		}
		if resp.Header.Get("Retry-After") == "" {
			t.Errorf("request %d: no Retry-After: %v", i, resp.Header)
		}
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			t.Errorf("request %d: Content-Type %q, want JSON", i, ct)
		}
		if jerr != nil || body.Error.Code == "" || body.Error.Message == "" {
			t.Errorf("request %d: body is not a JSON error: %q (%v)", i, b, jerr)
		}
		if strings.Contains(body.Error.Message, "circuit open") {
			circuitOpenSeen++
		}
	}
	if open, until := e.Mgr.BreakerOpen(); !open {
		t.Errorf("circuit breaker closed after 8 failed wakes with docker cut")
	} else {
		t.Logf("circuit open until %s; %d of 8 requests failed fast on it", until.Format(time.RFC3339), circuitOpenSeen)
	}
	if circuitOpenSeen == 0 {
		t.Errorf("no request was refused by the open circuit")
	}

	// Readiness tells the truth while the daemon is gone.
	resp, err := http.Get(h.APIURL("/v1/readyz"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	t.Logf("readyz with docker cut: %d %s", resp.StatusCode, strings.TrimSpace(string(b)))
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), `"ready": false`) {
		t.Fatalf("readyz with docker cut: %d %s, want 503 not ready", resp.StatusCode, b)
	}

	// The store is local: the API still answers, and nothing was written.
	var got swclient.Sandbox
	if status := h.API("GET", "/v1/sandboxes/"+rec.ID, nil, &got); status != http.StatusOK || got.State != "stopped" {
		t.Fatalf("record with docker cut: %d %+v, want 200 stopped", status, got)
	}
	if n := len(h.historyOf(rec.ID)); n != histBefore {
		t.Fatalf("history grew from %d to %d events while docker was cut", histBefore, n)
	}
	if last, _ := e.Mgr.LastEventID(); last != lastBefore {
		t.Fatalf("event log moved from %d to %d while docker was cut", lastBefore, last)
	}

	proxy.Restore()
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		resp, err := http.Get(h.APIURL("/v1/readyz"))
		if err != nil {
			return false, err.Error()
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, fmt.Sprintf("%d %s", resp.StatusCode, b)
	})
	if open, _ := e.Mgr.BreakerOpen(); open {
		t.Fatal("readyz is 200 but the circuit is still open")
	}
	start := time.Now()
	resp2, body := h.Preview("GET", host, "/healthz", nil, gatewaytest.APIHeader())
	t.Logf("first request after restore: %d %q in %s", resp2.StatusCode, body, time.Since(start))
	if resp2.StatusCode != http.StatusOK || body != "ok\n" {
		t.Fatalf("after restore: %d %.300q, want the app's 200", resp2.StatusCode, body)
	}
	if s := h.State(rec.ID); s != "running" {
		t.Fatalf("after restore: state %s, want running", s)
	}

	var now int
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		now = quiescentGoroutines(h)
		return now <= baseline+10, fmt.Sprintf("%d goroutines, baseline %d", now, baseline)
	})
	t.Logf("goroutines after recovery: %d (baseline %d)", now, baseline)
}
