package preview_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandwake/sandwake/client"

	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
)

// TestChurnNoBare502 is the soak of issue 13, shortened: clients post random
// bodies to random sandboxes of a fleet twice max_resident, with idle tiers
// of a second or two, so that idle pauses and stops, admission evictions and
// wakes race with traffic all along. Whatever sandwake does to a sandbox, no
// request may get a bare 502, a lost or corrupted body, or a transport
// error; every refusal is a JSON error with Retry-After.
func TestChurnNoBare502(t *testing.T) {
	if testing.Short() {
		t.Skip("a minute of churn")
	}
	const (
		sandboxes = 6
		clients   = 8
		duration  = 60 * time.Second
		maxBody   = 4096
		maxSleep  = time.Second
	)
	// Created with room for all and the idle tiers off; the churn settings
	// come with a reload once they all run.
	h := newHarness(t, fmt.Sprintf("max_resident %d\n\t\tidle_pause 0\n\t\tidle_stop 0", sandboxes))
	ids := make([]string, sandboxes)
	for i := range ids {
		ids[i] = h.Create(nil).ID
	}
	// The clients all come from 127.0.0.1: the per-client wake budget,
	// which would refuse them as one client, is off.
	h.Load("max_resident 3\n\t\tidle_pause 500ms\n\t\tidle_stop 1500ms\n\t\treap_interval 200ms\n\t\treconcile_interval 5s\n\t\twake_rate_per_client 0")
	// The reload closes the old server's idle keep-alive connections; a POST
	// sent on one as it closes fails with EOF in the client (POST is never
	// retried on another connection). That is HTTP keep-alive, not churn:
	// start the clients on fresh connections.
	h.Client.CloseIdleConnections()
	start := time.Now()
	tally := churn(clients, duration, maxSleep, 13, func(rng *rand.Rand) (string, error) {
		id := ids[rng.IntN(len(ids))]
		body := make([]byte, rng.IntN(maxBody+1))
		for i := range body {
			body[i] = 'a' + byte(rng.IntN(26))
		}
		req, _ := http.NewRequest("POST", "http://"+h.Host(id, 8080)+"/echo", bytes.NewReader(body))
		resp, err := h.Client.Do(req)
		return judge(resp, err, start, func(status int, got []byte) (bool, string) {
			switch {
			case status == 200 && string(got) == "POST\n"+string(body):
				return true, ""
			case status == 200:
				return false, "200 with a wrong body"
			}
			return false, ""
		})
	})
	tally.report(t)
}

// churnTally counts a churn run's answers: correct, refused (a JSON error
// with its code), and failures by kind.
type churnTally struct {
	mu       sync.Mutex
	total    int
	correct  int
	failures map[string]int
	refused  map[string]int
}

// report logs the tally and fails the test on any failure, or when fewer
// than half the requests were answered correctly.
func (c *churnTally) report(t *testing.T) {
	t.Helper()
	t.Logf("%d requests: %d correct, refused %v, failed %v", c.total, c.correct, c.refused, c.failures)
	for what, n := range c.failures {
		t.Errorf("%d requests: %s", n, what)
	}
	if c.correct < c.total/2 {
		t.Errorf("only %d of %d requests answered correctly", c.correct, c.total)
	}
}

// churn runs clients, each sending requests with send until duration has
// passed, sleeping up to maxSleep between them. send answers the refusal
// ("" for none) or the failure (an error) of its request.
func churn(clients int, duration, maxSleep time.Duration, seed uint64, send func(rng *rand.Rand) (string, error)) *churnTally {
	c := &churnTally{failures: map[string]int{}, refused: map[string]int{}}
	var wg sync.WaitGroup
	deadline := time.Now().Add(duration)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), seed))
			for time.Now().Before(deadline) {
				refusal, err := send(rng)
				c.mu.Lock()
				c.total++
				switch {
				case err != nil:
					c.failures[err.Error()]++
				case refusal != "":
					c.refused[refusal]++
				default:
					c.correct++
				}
				c.mu.Unlock()
				time.Sleep(time.Duration(rng.Int64N(int64(maxSleep))))
			}
		}()
	}
	wg.Wait()
	return c
}

// judge reads an answer and tells what it was: correct (as correct says,
// which may also name a failure of its own), a refusal in JSON (a 503 with
// Retry-After), or a failure (a transport error, a bare 502, anything
// else).
func judge(resp *http.Response, err error, start time.Time, correct func(status int, body []byte) (bool, string)) (string, error) {
	var got []byte
	if err == nil {
		got, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if err != nil {
		return "", fmt.Errorf("transport error %s into the run: %v", time.Since(start).Round(time.Millisecond), err)
	}
	if ok, fail := correct(resp.StatusCode, got); ok {
		return "", nil
	} else if fail != "" {
		return "", errors.New(fail)
	}
	if resp.StatusCode == 502 && len(bytes.TrimSpace(got)) == 0 {
		return "", errors.New("bare 502")
	}
	var e client.ErrorResponse
	if json.Unmarshal(got, &e) != nil || e.Error.Code == "" || e.Error.Message == "" {
		return "", fmt.Errorf("%d without a JSON error: %q", resp.StatusCode, got)
	}
	if resp.StatusCode == 503 && resp.Header.Get("Retry-After") == "" {
		return "", fmt.Errorf("503 %s without Retry-After", e.Error.Code)
	}
	return fmt.Sprintf("%d %s", resp.StatusCode, e.Error.Code), nil
}

// TestStopMidRequestIsNot502: a request whose body is being sent when the
// sandbox is stopped through the API (which may cut open exchanges) gets a
// 503 JSON error with Retry-After, not a bare 502; the next request wakes
// the sandbox again.
func TestStopMidRequestIsNot502(t *testing.T) {
	h := newHarness(t, "")
	id := h.Create(nil).ID
	pr, pw := io.Pipe()
	defer pw.Close()
	type answer struct {
		resp *http.Response
		body []byte
		err  error
	}
	answers := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest("POST", "http://"+h.Host(id, 8080)+"/echo", pr)
		resp, err := h.Client.Do(req)
		a := answer{resp: resp, err: err}
		if err == nil {
			a.body, a.err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		answers <- a
	}()
	if _, err := pw.Write(bytes.Repeat([]byte("x"), 1024)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		var rec client.Sandbox
		h.API("GET", "/v1/sandboxes/"+id, nil, &rec)
		return rec.OpenConnections == 1, fmt.Sprintf("%d open connections", rec.OpenConnections)
	})
	h.Stop(id)
	pw.Close()
	a := <-answers
	if a.err != nil {
		t.Fatalf("request cut by the stop: %v", a.err)
	}
	var e client.ErrorResponse
	if a.resp.StatusCode != 503 || json.Unmarshal(a.body, &e) != nil || e.Error.Code != "interrupted" || a.resp.Header.Get("Retry-After") == "" {
		t.Fatalf("request cut by the stop: %d %q (Retry-After %q), want 503 interrupted with Retry-After", a.resp.StatusCode, a.body, a.resp.Header.Get("Retry-After"))
	}
	resp, body := h.Preview("POST", h.Host(id, 8080), "/echo", strings.NewReader("again"), nil)
	if resp.StatusCode != 200 || body != "POST\nagain" {
		t.Fatalf("next request: %d %q, want the echo", resp.StatusCode, body)
	}
}

// TestGroupChurnKeepsServices: sandboxes with a service, under churn (more
// sandboxes than max_resident, idle tiers of a second, clients at random):
// every answer is the app reaching its service or a refusal in JSON; the
// app never answers without its service (a wake starts the service, ready,
// before the app; a pause, stop or eviction takes the group whole), and
// nothing is a bare 502.
func TestGroupChurnKeepsServices(t *testing.T) {
	if testing.Short() {
		t.Skip("30 s of churn")
	}
	const (
		sandboxes = 3
		clients   = 3
		duration  = 30 * time.Second
		maxSleep  = 2 * time.Second
	)
	h := newHarness(t, fmt.Sprintf("max_resident %d\n\t\tidle_pause 0\n\t\tidle_stop 0", sandboxes))
	ids := make([]string, sandboxes)
	for i := range ids {
		ids[i] = testenv.UniqueID("gc")
		h.RemoveOnCleanup(ids[i])
		var rec client.Sandbox
		status := h.API("POST", "/v1/sandboxes", map[string]any{"id": ids[i], "image": h.Image, "ports": []int{8080}, "memory_mb": 32,
			"services": map[string]any{"db": map[string]any{"image": h.Image, "memory_mb": 32, "ready": "tcp:5432",
				"env": map[string]string{"PORT": "5432", "LISTEN_HOST": "127.0.0.1"}}}}, &rec)
		if status != http.StatusCreated || rec.State != string(lifecycle.Running) {
			t.Fatalf("create %s: %d %+v", ids[i], status, rec)
		}
	}
	h.Load("max_resident 2\n\t\tmin_resident 0\n\t\tidle_pause 500ms\n\t\tidle_stop 1500ms\n\t\treap_interval 200ms\n\t\treconcile_interval 5s\n\t\twake_rate_per_client 0")
	h.Client.CloseIdleConnections()
	start := time.Now()
	tally := churn(clients, duration, maxSleep, 31, func(rng *rand.Rand) (string, error) {
		id := ids[rng.IntN(len(ids))]
		resp, err := h.Client.Get("http://" + h.Host(id, 8080) + "/fetch?url=http://127.0.0.1:5432/healthz")
		return judge(resp, err, start, func(status int, got []byte) (bool, string) {
			switch {
			case status == 200 && string(got) == "ok 200 ok\n":
				return true, ""
			case status == 200:
				return false, fmt.Sprintf("200 with a wrong body %q", got)
			case status == 502 && bytes.HasPrefix(got, []byte("fetch:")):
				return false, "the app answered without its service"
			}
			return false, ""
		})
	})
	starts := 0
	for _, id := range ids {
		starts += h.StartEvents(id, start)
	}
	t.Logf("%d starts of the apps", starts)
	tally.report(t)
	if starts == 0 {
		t.Errorf("no group was stopped and woken: no churn")
	}
}
