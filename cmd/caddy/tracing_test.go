package main

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandwake/sandwake/internal/testenv"
)

// exportedSpan is a span as the console exporter (stdouttrace) writes it.
type exportedSpan struct {
	Name        string
	SpanContext struct{ TraceID, SpanID string }
	Parent      struct{ TraceID, SpanID string }
	Attributes  []struct {
		Key   string
		Value struct{ Value any }
	}
}

func (s exportedSpan) attr(key string) string {
	for _, a := range s.Attributes {
		if a.Key == key {
			return fmt.Sprint(a.Value.Value)
		}
	}
	return ""
}

// exportedSpans reads the spans of trace id from the gateway's output.
func exportedSpans(out, traceID string) []exportedSpan {
	var spans []exportedSpan
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, `{"Name":`) {
			continue // Caddy's log
		}
		var s exportedSpan
		if json.Unmarshal([]byte(line), &s) == nil && s.SpanContext.TraceID == traceID {
			spans = append(spans, s)
		}
	}
	return spans
}

// TestTracingDirective: the built Caddy, its preview site with Caddy's
// tracing directive and the exporter chosen by OTEL_TRACES_EXPORTER (here
// console, to its standard output), exports a request's wake of a stopped
// sandbox as a sandwake.wake span under the request's server span, with
// the engine's, readiness, hold and proxy spans under it, in the trace the
// client's traceparent named.
func TestTracingDirective(t *testing.T) {
	cli := testenv.Docker(t)
	image := testenv.TestAppImage(t)
	bin := buildCaddy(t)
	t.Setenv("OTEL_TRACES_EXPORTER", "console")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50") // ms
	g := newGateway(t, bin, "")
	path := filepath.Join(g.dir, "Caddyfile")
	cfg, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	traced := strings.Replace(string(cfg), "\tsandwake_preview\n", "\ttracing {\n\t\tspan preview\n\t}\n\tsandwake_preview\n", 1)
	if err := os.WriteFile(path, []byte(traced), 0o600); err != nil {
		t.Fatal(err)
	}
	g.start()
	id := testenv.UniqueID("t")
	g.create(cli, image, id, nil)
	if code, body := g.api("POST", "/v1/sandboxes/"+id+"/stop", nil, nil); code != 200 {
		t.Fatalf("stop: %d %s", code, body)
	}

	var tid [16]byte
	var parent [8]byte
	rand.Read(tid[:])
	rand.Read(parent[:])
	traceID, parentID := hex.EncodeToString(tid[:]), hex.EncodeToString(parent[:])
	req, _ := http.NewRequest("GET", fmt.Sprintf("http://s-%s-8080.preview.localhost:%d/", id, g.previewPort), nil)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Traceparent", "00-"+traceID+"-"+parentID+"-01")
	resp, err := g.previewClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("held request: %d", resp.StatusCode)
	}

	var spans []exportedSpan
	byName := map[string]exportedSpan{}
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		spans = exportedSpans(g.log.String(), traceID)
		clear(byName)
		for _, s := range spans {
			byName[s.Name] = s
		}
		_, server := byName["preview"]
		_, wake := byName["sandwake.wake"]
		return server && wake, fmt.Sprintf("%d spans of the trace exported", len(spans))
	})
	server, wake := byName["preview"], byName["sandwake.wake"]
	if server.Parent.SpanID != parentID {
		t.Errorf("server span's parent %s, want the traceparent's %s", server.Parent.SpanID, parentID)
	}
	if wake.Parent.SpanID != server.SpanContext.SpanID {
		t.Errorf("wake span's parent %s, want the server span %s", wake.Parent.SpanID, server.SpanContext.SpanID)
	}
	for key, want := range map[string]string{
		"sandwake.sandbox.id": id, "sandwake.sandbox.port": "8080",
		"sandwake.wake.outcome": "ready", "sandwake.wake.led": "true",
	} {
		if got := wake.attr(key); got != want {
			t.Errorf("wake span: %s = %q, want %q", key, got, want)
		}
	}
	var children []string
	for _, s := range spans {
		if s.Parent.SpanID == wake.SpanContext.SpanID {
			children = append(children, s.Name)
		}
	}
	slices.Sort(children)
	if want := []string{"docker.start", "sandwake.admission", "sandwake.hold", "sandwake.proxy", "sandwake.readiness"}; !slices.Equal(children, want) {
		t.Errorf("wake span's children %v, want %v", children, want)
	}
}
