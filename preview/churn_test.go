package preview_test

import (
	"bytes"
	"encoding/json"
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

	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		total    int
		correct  int
		failures = map[string]int{}
		refused  = map[string]int{}
	)
	deadline := time.Now().Add(duration)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 13))
			for time.Now().Before(deadline) {
				id := ids[rng.IntN(len(ids))]
				body := make([]byte, rng.IntN(maxBody+1))
				for i := range body {
					body[i] = 'a' + byte(rng.IntN(26))
				}
				req, _ := http.NewRequest("POST", "http://"+h.Host(id, 8080)+"/echo", bytes.NewReader(body))
				resp, err := h.Client.Do(req)
				var got []byte
				if err == nil {
					got, err = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				var fail, refusal string
				switch {
				case err != nil:
					fail = fmt.Sprintf("transport error %s into the run: %v", time.Since(start).Round(time.Millisecond), err)
				case resp.StatusCode == 200 && string(got) == "POST\n"+string(body):
				case resp.StatusCode == 200:
					fail = "200 with a wrong body"
				case resp.StatusCode == 502 && len(bytes.TrimSpace(got)) == 0:
					fail = "bare 502"
				default:
					var e client.ErrorResponse
					if json.Unmarshal(got, &e) != nil || e.Error.Code == "" || e.Error.Message == "" {
						fail = fmt.Sprintf("%d without a JSON error: %q", resp.StatusCode, got)
					} else if resp.StatusCode == 503 && resp.Header.Get("Retry-After") == "" {
						fail = fmt.Sprintf("503 %s without Retry-After", e.Error.Code)
					} else {
						refusal = fmt.Sprintf("%d %s", resp.StatusCode, e.Error.Code)
					}
				}
				mu.Lock()
				total++
				switch {
				case fail != "":
					failures[fail]++
				case refusal != "":
					refused[refusal]++
				default:
					correct++
				}
				mu.Unlock()
				time.Sleep(time.Duration(rng.Int64N(int64(maxSleep))))
			}
		}()
	}
	wg.Wait()
	t.Logf("%d requests: %d correct, refused %v, failed %v", total, correct, refused, failures)
	for what, n := range failures {
		t.Errorf("%d requests: %s", n, what)
	}
	if correct < total/2 {
		t.Errorf("only %d of %d requests answered correctly", correct, total)
	}
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
