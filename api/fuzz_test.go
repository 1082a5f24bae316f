package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"path"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/sandwake/sandwake/client"

	"github.com/sandwake/sandwake/internal/web"
	"github.com/sandwake/sandwake/lifecycle"
)

// FuzzDecodeCreateBody feeds bytes as the body of POST /v1/sandboxes through
// the same steps as the handler (decodeBody, createBody.spec,
// lifecycle.NormalizeSpec). Nothing may panic; a refusal is a JSON error with
// a 4xx status; what is accepted satisfies the spec's invariants and is a
// fixed point of NormalizeSpec.
func FuzzDecodeCreateBody(f *testing.F) {
	for _, s := range []string{
		`{"image":"app:1","ports":[8080]}`,
		`{"id":"abc","image":"registry.example.com/app@sha256:0123","cmd":["sh","-c","x"],"env":{"A":"1"},"ports":[80,443,8080],` +
			`"memory_mb":256,"cpus":1.5,"workspace_path":"/w/./x/","ready_path":"/healthz","ready_mode":"tcp",` +
			`"idle_pause":"90s","idle_stop":"1d","max_lifetime":"0s","labels":{"k":"v"},"access":"private"}`,
		``,
		`{}`,
		`[]`,
		`null`,
		`"image"`,
		`{"image":"a","ports":[0]}`,
		`{"image":"a","ports":[65536]}`,
		`{"image":"a","ports":[80,80]}`,
		`{"image":"a","ports":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`,
		`{"image":" a b ","ports":[1]}`,
		`{"image":"\t","ports":[1]}`,
		`{"image":"a","ports":[1],"idle_pause":"-1s"}`,
		`{"image":"a","ports":[1],"idle_stop":"1.5d"}`,
		`{"image":"a","ports":[1],"max_lifetime":"forever"}`,
		`{"image":"a","ports":[1]} {}`,
		`{"image":"a","ports":[1]}]`,
		`{"image":"a","ports":[1]`,
		`{"unknown":1}`,
		`{"IMAGE":"a","Ports":[1]}`,
		`{"image":"a","ports":[1],"workspace_path":"rel"}`,
		`{"image":"a","ports":[1],"workspace_path":"/../.."}`,
		`{"image":"a","ports":[1],"ready_mode":"udp"}`,
		`{"image":"a","ports":[1],"ready_path":"healthz"}`,
		`{"image":"a","ports":[1],"access":"secret"}`,
		`{"image":"a","ports":[1],"cpus":1e400}`,
		`{"image":"a","ports":[1],"cpus":-0.5}`,
		`{"image":"a","ports":[1],"memory_mb":5}`,
		`{"image":"a","ports":[1],"env":{"":"x"}}`,
		`{"image":"a","ports":[1],"services":{"db":{"image":"pg","ready":"tcp:5432","memory_mb":256,"depends_on":["cache"]},"cache":{"image":"redis"}}}`,
		`{"image":"a","ports":[1],"services":{"db":{"image":"pg","imgae":"x"}}}`,
		`{"image":"a","ports":[1],"services":{"db":{"memory_mb":"x"}}}`,
		`{"image":"a","ports":[1],"services":[{"image":"pg"}]}`,
		`{"image":"a","ports":[1],"env":{"A=B":"x"}}`,
		`{"image":"a","ports":[1.5]}`,
		`{"image":"a","ports":["80"]}`,
		`{"image":"a","ports":null}`,
		`{"id":"x1","image":"a","ports":[1],"id":"x2"}`,
		`{"id":"x1","image":"a","ports":[1],"ID":"x2"}`,
		`{"image":"a","ports":[1],"labels":{"k":"v","k":"w"}}`,
		`{"image":"a","ports":[1],"labels":{"k":"v","K":"w"}}`,
		`{"image":"a","ports":[1],"services":{"db":{"image":"pg","image":"x"}}}`,
		`{"image":"a","ports":[1],"egress":{"policy":"none","policy":"open"}}`,
		`{"image":"a","ports":[1],"cmd":[{"a":1,"a":2}],"cmd":[]}`,
		`{"image":"a","image":"b",`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := httptest.NewRequest(http.MethodPost, "/v1/sandboxes", bytes.NewReader(data))
		w := httptest.NewRecorder()
		var body createBody
		if !decodeBody(w, r, &body) {
			if w.Code != http.StatusBadRequest && w.Code != http.StatusRequestEntityTooLarge {
				t.Fatalf("refused body %q with status %d", data, w.Code)
			}
			var e client.ErrorResponse
			if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Error.Code == "" || e.Error.Message == "" {
				t.Fatalf("refusal of %q is not a JSON error: %q (%v)", data, w.Body.Bytes(), err)
			}
			return
		}
		if !json.Valid(data) {
			t.Fatalf("decodeBody accepted invalid JSON %q", data)
		}
		spec, err := body.spec()
		if err == nil {
			err = lifecycle.NormalizeSpec(&spec)
		}
		if err != nil {
			if !errors.Is(err, lifecycle.ErrInvalid) {
				t.Fatalf("body %q: error %v does not wrap ErrInvalid", data, err)
			}
			if status, _, _ := web.ErrorStatus(err); status != http.StatusBadRequest {
				t.Fatalf("body %q: error %v maps to %d, want 400", data, err, status)
			}
			return
		}
		checkSpec(t, data, &spec)
		// What NormalizeSpec accepted it accepts again, unchanged.
		again := spec
		again.Ports = append([]int(nil), spec.Ports...)
		if err := lifecycle.NormalizeSpec(&again); err != nil {
			t.Fatalf("body %q: normalized spec refused on a second pass: %v", data, err)
		}
		if !reflect.DeepEqual(again, spec) {
			t.Fatalf("body %q: NormalizeSpec is not idempotent:\n%+v\n%+v", data, spec, again)
		}
	})
}

// checkSpec asserts the invariants of a spec NormalizeSpec accepted.
func checkSpec(t *testing.T, data []byte, spec *lifecycle.Spec) {
	t.Helper()
	if spec.Image == "" || strings.IndexFunc(spec.Image, unicode.IsSpace) >= 0 {
		t.Fatalf("body %q: accepted image %q (empty or with white space)", data, spec.Image)
	}
	if n := len(spec.Ports); n < 1 || n > lifecycle.MaxPorts {
		t.Fatalf("body %q: accepted %d ports", data, n)
	}
	seen := map[int]bool{}
	for _, p := range spec.Ports {
		if p < 1 || p > 65535 || seen[p] {
			t.Fatalf("body %q: accepted ports %v", data, spec.Ports)
		}
		seen[p] = true
	}
	if !path.IsAbs(spec.WorkspacePath) || path.Clean(spec.WorkspacePath) != spec.WorkspacePath || spec.WorkspacePath == "/" {
		t.Fatalf("body %q: accepted workspace_path %q", data, spec.WorkspacePath)
	}
	if spec.ReadyMode != lifecycle.ReadyHTTP && spec.ReadyMode != lifecycle.ReadyTCP {
		t.Fatalf("body %q: accepted ready_mode %q", data, spec.ReadyMode)
	}
	if spec.ReadyPath != "" && spec.ReadyPath[0] != '/' {
		t.Fatalf("body %q: accepted ready_path %q", data, spec.ReadyPath)
	}
	if spec.Access != lifecycle.AccessPublic && spec.Access != lifecycle.AccessPrivate {
		t.Fatalf("body %q: accepted access %q", data, spec.Access)
	}
	for name, d := range map[string]*time.Duration{"idle_pause": spec.IdlePause, "idle_stop": spec.IdleStop, "max_lifetime": spec.MaxLifetime} {
		if d != nil && *d < 0 {
			t.Fatalf("body %q: accepted negative %s %s", data, name, *d)
		}
	}
	if spec.MemoryMB < 0 || (spec.MemoryMB > 0 && spec.MemoryMB < lifecycle.MinMemoryMB) {
		t.Fatalf("body %q: accepted memory_mb %d", data, spec.MemoryMB)
	}
	if !(spec.CPUs >= 0 && spec.CPUs <= 1024) {
		t.Fatalf("body %q: accepted cpus %v", data, spec.CPUs)
	}
	if spec.PidsLimit < 1 {
		t.Fatalf("body %q: pids_limit %d after normalizing", data, spec.PidsLimit)
	}
	for k := range spec.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			t.Fatalf("body %q: accepted env name %q", data, k)
		}
	}
}
