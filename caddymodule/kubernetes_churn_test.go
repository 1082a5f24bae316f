package caddymodule_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/internal/gatewaytest"
)

// TestKubernetesChurn is the churn soak on the cluster, bounded: clients
// post random bodies to random sandboxes of a fleet twice max_resident,
// with idle tiers of a fraction of a second and a few seconds, so that
// pauses (a CPU cut in place), stops (pods deleted), admission's evictions
// and wakes (a resize back, or a pod made again) race with traffic all
// along. No request may get a bare 502, a lost or corrupted body or a
// transport error; a refusal is a JSON error (a code and a message), with
// Retry-After on a 503.
func TestKubernetesChurn(t *testing.T) {
	const (
		sandboxes = 4
		clients   = 6
		duration  = 40 * time.Second
		maxBody   = 4096
		maxSleep  = 800 * time.Millisecond
	)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// The clients all come from 127.0.0.1: the per-client wake budget,
	// which would refuse them as one client, is off.
	e := newKubeEnv(t, ctx, fmt.Sprintf(`
		max_resident %d
		idle_pause 400ms
		idle_stop 3s
		reap_interval 200ms
		reconcile_interval 2s
		wake_rate_per_client 0`, sandboxes/2), "")
	ids := make([]string, sandboxes)
	for i := range ids {
		ids[i] = fmt.Sprintf("c%d%s", i, e.suffix)
		var rec client.Sandbox
		if status := e.API("POST", "/v1/sandboxes", map[string]any{"id": ids[i], "image": e.image, "ports": []int{8080}}, &rec); status != http.StatusCreated {
			t.Fatalf("create %s: %d %+v", ids[i], status, rec)
		}
	}
	api := gatewaytest.APIHeader()
	var (
		mu                       sync.Mutex
		total, correct           int
		refused, failed, reached = map[string]int{}, map[string]int{}, map[string]int{}
	)
	var wg sync.WaitGroup
	deadline := time.Now().Add(duration)
	for c := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), 38))
			for time.Now().Before(deadline) {
				id := ids[rng.IntN(len(ids))]
				body := make([]byte, rng.IntN(maxBody+1))
				for i := range body {
					body[i] = 'a' + byte(rng.IntN(26))
				}
				req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+e.Host(id, 8080)+"/echo", bytes.NewReader(body))
				req.Header = api.Clone()
				res, err := e.Client.Do(req)
				var got []byte
				if err == nil {
					got, err = io.ReadAll(res.Body)
					res.Body.Close()
				}
				mu.Lock()
				total++
				switch {
				case err != nil:
					failed["transport: "+err.Error()]++
				case res.StatusCode == http.StatusOK && string(got) == "POST\n"+string(body):
					correct++
					reached[id]++
				case res.StatusCode == http.StatusOK:
					failed["200 with a wrong body"]++
				default:
					// The API's error shape, as the Docker churn test
					// judges it: a code and a message, and Retry-After
					// on a 503.
					var e struct {
						Error struct{ Code, Message string } `json:"error"`
					}
					switch {
					case json.Unmarshal(got, &e) != nil || e.Error.Code == "" || e.Error.Message == "":
						failed[fmt.Sprintf("%d without a JSON error: %.80q", res.StatusCode, got)]++
					case res.StatusCode == http.StatusServiceUnavailable && res.Header.Get("Retry-After") == "":
						failed[fmt.Sprintf("503 %s without Retry-After", e.Error.Code)]++
					default:
						refused[fmt.Sprintf("%d %s", res.StatusCode, e.Error.Code)]++
					}
				}
				mu.Unlock()
				time.Sleep(time.Duration(rng.Int64N(int64(maxSleep))))
			}
		})
	}
	wg.Wait()
	t.Logf("%d requests: %d correct (by sandbox %v), refused %v, failed %v", total, correct, reached, refused, failed)
	for what, n := range failed {
		t.Errorf("%d requests: %s", n, what)
	}
	if correct < total/2 {
		t.Errorf("only %d of %d requests answered correctly", correct, total)
	}
	// The churn did churn: the sandboxes were paused and stopped under
	// traffic, and woken from both.
	counts := map[string]int{}
	for _, id := range ids {
		var hist client.History
		e.API("GET", "/v1/sandboxes/"+id+"/history?limit=1000", nil, &hist)
		for _, ev := range hist.Events {
			if ev.To != "" {
				counts[ev.From+"→"+ev.To]++
			}
		}
	}
	t.Logf("transitions: %v", counts)
	if counts["running→paused"] == 0 || counts["paused→running"] == 0 || counts["stopped→running"] == 0 {
		t.Errorf("the churn paused, woke and restarted too little to test anything: %v", counts)
	}
}
