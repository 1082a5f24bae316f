package api

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sandwake/sandwake/client"
)

// TestDecodeBodyMessages: a body the API cannot decode is refused with the
// usual error JSON and status, and a message in plain words: which field,
// what was expected and what came, or where the JSON breaks.
func TestDecodeBodyMessages(t *testing.T) {
	const createFields = "(fields: id, template, pool, image, cmd, env, ports, memory_mb, cpus, workspace_path, ready_path, ready_mode, idle_pause, idle_stop, max_lifetime, labels, access, public_card, egress, activity, user, readonly_rootfs, cap_add, runtime, disk_mb, services)"
	for _, tc := range []struct {
		name, body string
		into       func() any
		status     int
		code, want string
	}{
		{"ports a string", `{"image":"a","ports":"8080"}`, nil, 400, "invalid", "ports: expected an array of whole numbers, got a string"},
		{"port a string", `{"image":"a","ports":["8080"]}`, nil, 400, "invalid", "ports: expected an array of whole numbers, but an element is a string"},
		{"port a fraction", `{"image":"a","ports":[80.5]}`, nil, 400, "invalid", "ports: expected an array of whole numbers, but an element is 80.5, not a whole number"},
		{"port out of range", `{"image":"a","ports":[99999999999999999999]}`, nil, 400, "invalid", "ports: expected an array of whole numbers, but an element is 99999999999999999999, out of range"},
		{"ports an object", `{"ports":{"a":1}}`, nil, 400, "invalid", "ports: expected an array of whole numbers, got an object"},
		{"memory a string", `{"memory_mb":"512"}`, nil, 400, "invalid", "memory_mb: expected a whole number, got a string"},
		{"cpus out of range", `{"cpus":1e400}`, nil, 400, "invalid", "cpus: expected a number, got 1e400, out of range"},
		{"env value a number", `{"env":{"A":1}}`, nil, 400, "invalid", "env: expected an object of strings, but a value is a number"},
		{"env an array", `{"env":[]}`, nil, 400, "invalid", "env: expected an object of strings, got an array"},
		{"cmd element a bool", `{"cmd":["sh",true]}`, nil, 400, "invalid", "cmd: expected an array of strings, but an element is true or false"},
		{"idle_pause a number", `{"idle_pause":90}`, nil, 400, "invalid", "idle_pause: expected a string, got a number"},
		{"id null is fine", `{"id":null,"image":"a"}`, nil, 0, "", ""},
		{"not an object", `[{"image":"a"}]`, nil, 400, "invalid", "request body: expected a JSON object, got an array"},
		{"a string", `"image"`, nil, 400, "invalid", "request body: expected a JSON object, got a string"},
		{"bare word", `{"image": nope}`, nil, 400, "invalid", "request body is not valid JSON: unexpected character 'o' at byte 12 in what starts like null (a string needs double quotes)"},
		{"unquoted value", `{"image": app}`, nil, 400, "invalid", "request body is not valid JSON: unexpected character 'a' at byte 11 where a value should start (a string needs double quotes)"},
		{"trailing comma", `{"image":"a",}`, nil, 400, "invalid", `request body is not valid JSON: unexpected character '}' at byte 14 where a field name in double quotes should start`},
		{"missing comma", `{"image":"a" "ports":[1]}`, nil, 400, "invalid", `request body is not valid JSON: unexpected character '"' at byte 14 after a field's value (expected "," or "}")`},
		{"missing colon", `{"image" "a"}`, nil, 400, "invalid", `unexpected character '"' at byte 10 after a field name (expected ":")`},
		{"array", `{"ports":[1 2]}`, nil, 400, "invalid", `unexpected character '2' at byte 13 after an array element (expected "," or "]")`},
		{"control character", "{\"image\":\"a\x01\"}", nil, 400, "invalid", `unexpected character '\x01' at byte 12 inside a string (control characters must be escaped)`},
		{"single quote", `{'image':1}`, nil, 400, "invalid", `unexpected character '\'' at byte 2 where a field name in double quotes should start`},
		{"truncated", `{"image":"a","ports":[1`, nil, 400, "invalid", "request body is not valid JSON: it ends too early (an unclosed {, [ or string?)"},
		{"empty", ``, nil, 400, "invalid", "request body is empty: a JSON object is required"},
		{"blank", " \n ", nil, 400, "invalid", "request body is empty: a JSON object is required"},
		{"two objects", `{"image":"a"} {}`, nil, 400, "invalid", "request body has more after the JSON object, at byte 15: send one object"},
		{"stray bracket", `{"image":"a"}]`, nil, 400, "invalid", "request body has more after the JSON object, at byte 14: send one object"},
		{"unknown field", `{"image":"a","port":8080}`, nil, 400, "invalid", `unknown field "port" ` + createFields},
		{"unknown fields", `{"imgae":"a","port":8080,"ports":[1],"Memory":5}`, nil, 400, "invalid", `unknown fields "Memory", "imgae", "port" ` + createFields},
		{"unknown service field", `{"image":"a","services":{"db":{"image":"pg","imgae":"x","Ready":"tcp:5432","port":5432}}}`, nil, 400, "invalid",
			`services.db: unknown fields "imgae", "port" (fields: image, cmd, env, memory_mb, cpus, disk_mb, ready, workspace_path, depends_on)`},
		{"unknown egress field", `{"image":"a","egress":{"polcy":"none"}}`, nil, 400, "invalid", `egress: unknown field "polcy" (fields: policy, allow, deny)`},
		{"service memory a string", `{"services":{"db":{"memory_mb":"256"}}}`, nil, 400, "invalid", "services.memory_mb: expected a whole number, got a string"},
		{"service depends_on a string", `{"services":{"db":{"depends_on":"cache"}}}`, nil, 400, "invalid", "services.depends_on: expected an array of strings, got a string"},
		{"service a string", `{"services":{"db":"postgres"}}`, nil, 400, "invalid", "services: expected an object of JSON objects, but a value is a string"},
		{"services an array", `{"services":[{"image":"pg"}]}`, nil, 400, "invalid", "services: expected an object of JSON objects, got an array"},
		{"case-insensitive names are known", `{"IMAGE":"a","Ports":[1]}`, nil, 0, "", ""},
		{"too large", `{"image":"` + strings.Repeat("a", maxBodyBytes) + `"}`, nil, 413, "too_large", "request body is over 1048576 bytes"},
		{"patch: unknown field", `{"idle":"3m"}`, func() any { return new(patchBody) }, 400, "invalid", `unknown field "idle" (fields: access, public_card, idle_pause, idle_stop, max_lifetime, egress)`},
		{"patch: access a bool", `{"access":true}`, func() any { return new(patchBody) }, 400, "invalid", "access: expected a string, got true or false"},
		{"keepalive: for a number", `{"for":600}`, func() any {
			return new(struct {
				For string `json:"for"`
			})
		}, 400, "invalid", "for: expected a string, got a number"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := any(new(createBody))
			if tc.into != nil {
				v = tc.into()
			}
			w := httptest.NewRecorder()
			ok := decodeBody(w, httptest.NewRequest(http.MethodPost, "/v1/sandboxes", strings.NewReader(tc.body)), v)
			if tc.status == 0 {
				if !ok {
					t.Fatalf("refused: %d %s", w.Code, w.Body.String())
				}
				return
			}
			if ok {
				t.Fatalf("accepted, want %d", tc.status)
			}
			var e client.ErrorResponse
			if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil {
				t.Fatalf("answer is not the error JSON: %q", w.Body.String())
			}
			if w.Code != tc.status || e.Error.Code != tc.code || !strings.Contains(e.Error.Message, tc.want) {
				t.Fatalf("got %d %s %q\nwant %d %s %q", w.Code, e.Error.Code, e.Error.Message, tc.status, tc.code, tc.want)
			}
			if strings.Contains(e.Error.Message, "Go ") || strings.Contains(e.Error.Message, "json:") || strings.Contains(e.Error.Message, "createBody") {
				t.Errorf("message in Go's words: %q", e.Error.Message)
			}
		})
	}
}

// TestDecodeBodyDuplicateKeys: a key given twice, at any depth, is a 400
// naming it and the object holding it (encoding/json would keep the last
// one silently); two keys that fill the same field in different case are
// the same key; keys of a map are the same only when equal.
func TestDecodeBodyDuplicateKeys(t *testing.T) {
	patch := func() any { return new(patchBody) }
	for _, tc := range []struct {
		name, body string
		into       func() any
		want       string // "": accepted
	}{
		{"id twice", `{"id":"x1","image":"a","ports":[1],"id":"x2"}`, nil, `duplicate key "id"`},
		{"in another case", `{"id":"x1","image":"a","ports":[1],"ID":"x2"}`, nil, `duplicate key "ID"`},
		{"an unknown field twice", `{"image":"a","port":1,"port":2}`, nil, `duplicate key "port"`},
		{"a label twice", `{"image":"a","ports":[1],"labels":{"tenant":"acme","tenant":"globex"}}`, nil, `labels: duplicate key "tenant"`},
		{"labels in two cases are two", `{"image":"a","ports":[1],"labels":{"tenant":"acme","Tenant":"globex"}}`, nil, ""},
		{"env twice", `{"image":"a","ports":[1],"env":{"A":"1","A":"2"}}`, nil, `env: duplicate key "A"`},
		{"a service twice", `{"image":"a","ports":[1],"services":{"db":{"image":"pg"},"db":{"image":"mysql"}}}`, nil, `services: duplicate key "db"`},
		{"a service's field twice", `{"image":"a","ports":[1],"services":{"db":{"image":"pg","workspace_path":"/w","image":"x"}}}`, nil, `services.db: duplicate key "image"`},
		{"egress policy twice", `{"image":"a","ports":[1],"egress":{"policy":"none","policy":"open"}}`, nil, `egress: duplicate key "policy"`},
		{"inside an array of objects", `{"image":"a","ports":[1],"cmd":[{"a":1,"a":2}]}`, nil, `cmd[0]: duplicate key "a"`},
		{"the same key in sibling objects", `{"image":"a","ports":[1],"services":{"db":{"image":"pg"},"cache":{"image":"redis"}}}`, nil, ""},
		{"patch: access twice", `{"access":"private","access":"public"}`, patch, `duplicate key "access"`},
		{"patch: egress allow twice", `{"egress":{"policy":"none","allow":["a.example"],"allow":["b.example"]}}`, patch, `egress: duplicate key "allow"`},
		{"template twice", `{"template":"web","template":"admin"}`, nil, `duplicate key "template"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := any(new(createBody))
			if tc.into != nil {
				v = tc.into()
			}
			w := httptest.NewRecorder()
			ok := decodeBody(w, httptest.NewRequest(http.MethodPost, "/v1/sandboxes", strings.NewReader(tc.body)), v)
			if tc.want == "" {
				if !ok {
					t.Fatalf("refused: %d %s", w.Code, w.Body.String())
				}
				return
			}
			var e client.ErrorResponse
			if ok || json.Unmarshal(w.Body.Bytes(), &e) != nil || w.Code != 400 || e.Error.Code != "invalid" || !strings.HasPrefix(e.Error.Message, tc.want) {
				t.Fatalf("got ok=%v %d %s, want 400 invalid %q", ok, w.Code, w.Body.String(), tc.want)
			}
		})
	}
}

// TestDuplicateKeyWalkIsBounded: a body nested far deeper than any API
// body costs the duplicate walk a bounded depth, not a frame and a path
// per level (a 40 KB body of '[' took 4 GB and 10 s), and a duplicate
// inside a deep body is still found within the bound.
func TestDuplicateKeyWalkIsBounded(t *testing.T) {
	deep := bytes.Repeat([]byte("["), 1<<20)
	allocs := testing.AllocsPerRun(3, func() {
		if _, _, ok := duplicateKey(deep, nil); ok {
			t.Error("a duplicate found in a body of brackets")
		}
	})
	if allocs > 10*maxDupDepth {
		t.Errorf("walking 1 MiB of '[' allocated %v times, want at most %d (bounded by the depth)", allocs, 10*maxDupDepth)
	}
	nested := strings.Repeat(`{"a":`, 10) + `{"k":1,"k":2}` + strings.Repeat(`}`, 10)
	path, key, ok := duplicateKey([]byte(nested), nil)
	if !ok || key != "k" || path != "a.a.a.a.a.a.a.a.a.a" {
		t.Errorf("duplicateKey(10 levels) = %q, %q, %v; want a.a.a.a.a.a.a.a.a.a, k, true", path, key, ok)
	}
	path, key, ok = duplicateKey([]byte(`{"allow":[{"x":1},{"x":1,"x":2}]}`), nil)
	if !ok || key != "x" || path != "allow[1]" {
		t.Errorf("duplicateKey(array) = %q, %q, %v; want allow[1], x, true", path, key, ok)
	}
}
