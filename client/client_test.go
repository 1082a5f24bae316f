package client

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// request is what the test server saw of one call.
type request struct {
	method, path, query, auth, contentType, body string
}

// recorder serves one canned answer and records the request.
func recorder(t *testing.T, status int, header http.Header, answer string) (*httptest.Server, *request) {
	t.Helper()
	var got request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = request{r.Method, r.URL.EscapedPath(), r.URL.RawQuery, r.Header.Get("Authorization"), r.Header.Get("Content-Type"), string(b)}
		for k, v := range header {
			w.Header()[k] = v
		}
		w.WriteHeader(status)
		io.WriteString(w, answer)
	}))
	t.Cleanup(srv.Close)
	return srv, &got
}

func newClient(t *testing.T, base, token string) *Client {
	t.Helper()
	c, err := New(base, token, &Options{MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatalf("New(%q): %v", base, err)
	}
	return c
}

const sandboxJSON = `{"id":"abc","state":"running","image":"app:1","env_keys":["A"],"ports":[8080,3000],` +
	`"urls":{"8080":"http://s-abc-8080.preview.localhost/","3000":"http://s-abc-3000.preview.localhost/"},` +
	`"workspace_path":"/workspace","access":"public","created_at":"2025-01-02T03:04:05Z","last_active_at":"2025-01-02T03:04:06Z",` +
	`"state_since":"2025-01-02T03:04:07Z","keepalive_until":"2025-01-02T04:00:00Z","open_connections":2}`

// TestCalls: each method sends its route, token and body, and decodes the
// answer.
func TestCalls(t *testing.T) {
	ctx := context.Background()
	idle := "5m"
	for _, tc := range []struct {
		name                       string
		call                       func(c *Client) (any, error)
		answer                     string
		wantMethod, wantPath, want string // want: the request's body
		wantQuery                  string
		check                      func(t *testing.T, v any)
	}{
		{name: "list", answer: `{"sandboxes":[` + sandboxJSON + `]}`, wantMethod: "GET", wantPath: "/v1/sandboxes", wantQuery: "state=paused",
			call: func(c *Client) (any, error) { return c.List(ctx, ListOptions{State: "paused"}) },
			check: func(t *testing.T, v any) {
				l := v.([]Sandbox)
				if len(l) != 1 || l[0].ID != "abc" || l[0].FirstURL() != "http://s-abc-8080.preview.localhost/" || l[0].OpenConnections != 2 {
					t.Fatalf("list: %+v", l)
				}
			}},
		{name: "get escapes the id", answer: sandboxJSON, wantMethod: "GET", wantPath: "/v1/sandboxes/a%2Fb",
			call: func(c *Client) (any, error) { return c.Get(ctx, "a/b") },
			check: func(t *testing.T, v any) {
				s := v.(Sandbox)
				if s.State != "running" || s.KeepaliveUntil == nil || !s.KeepaliveUntil.Equal(time.Date(2025, 1, 2, 4, 0, 0, 0, time.UTC)) {
					t.Fatalf("get: %+v", s)
				}
			}},
		{name: "create", answer: sandboxJSON, wantMethod: "POST", wantPath: "/v1/sandboxes",
			want: `{"id":"abc","image":"app:1","cmd":null,"env":null,"ports":[8080],"memory_mb":0,"cpus":0,"workspace_path":"","ready_path":"","ready_mode":"","idle_pause":"5m","idle_stop":null,"max_lifetime":null,"labels":null,"access":""}`,
			call: func(c *Client) (any, error) {
				return c.Create(ctx, CreateRequest{ID: "abc", Image: "app:1", Ports: []int{8080}, IdlePause: &idle})
			}},
		{name: "update", answer: sandboxJSON, wantMethod: "PATCH", wantPath: "/v1/sandboxes/abc",
			want: `{"access":null,"idle_pause":"5m","idle_stop":null,"max_lifetime":null}`,
			call: func(c *Client) (any, error) { return c.Update(ctx, "abc", Patch{IdlePause: &idle}) }},
		{name: "wake", answer: sandboxJSON, wantMethod: "POST", wantPath: "/v1/sandboxes/abc/wake",
			call: func(c *Client) (any, error) { return c.Wake(ctx, "abc") }},
		{name: "pause", answer: sandboxJSON, wantMethod: "POST", wantPath: "/v1/sandboxes/abc/pause",
			call: func(c *Client) (any, error) { return c.Pause(ctx, "abc") }},
		{name: "stop", answer: sandboxJSON, wantMethod: "POST", wantPath: "/v1/sandboxes/abc/stop",
			call: func(c *Client) (any, error) { return c.Stop(ctx, "abc") }},
		{name: "keepalive", answer: sandboxJSON, wantMethod: "POST", wantPath: "/v1/sandboxes/abc/keepalive", want: `{"for":"10m"}`,
			call: func(c *Client) (any, error) { return c.Keepalive(ctx, "abc", "10m") }},
		{name: "destroy", wantMethod: "DELETE", wantPath: "/v1/sandboxes/abc",
			call: func(c *Client) (any, error) { return nil, c.Destroy(ctx, "abc") }},
		{name: "purge", answer: `{"freed_bytes":4096}`, wantMethod: "POST", wantPath: "/v1/sandboxes/abc/purge",
			call: func(c *Client) (any, error) { return c.Purge(ctx, "abc") },
			check: func(t *testing.T, v any) {
				if v.(int64) != 4096 {
					t.Fatalf("purge freed %v", v)
				}
			}},
		{name: "history", answer: `{"events":[{"id":3,"type":"sandbox.paused","sandbox_id":"abc","from":"running","to":"paused","at":"2025-01-02T03:04:05Z"}]}`,
			wantMethod: "GET", wantPath: "/v1/sandboxes/abc/history",
			call: func(c *Client) (any, error) { return c.History(ctx, "abc") },
			check: func(t *testing.T, v any) {
				if evs := v.([]Event); len(evs) != 1 || evs[0].ID != 3 || evs[0].To != "paused" {
					t.Fatalf("history: %+v", evs)
				}
			}},
		{name: "create token", answer: `{"expires_at":"2025-01-02T04:00:00Z","token":"t.k","url":"http://s-abc-8080.preview.localhost/?sandwake_token=t.k"}`,
			wantMethod: "POST", wantPath: "/v1/sandboxes/abc/tokens", want: `{"ttl":"2h","subject":"ci"}`,
			call: func(c *Client) (any, error) { return c.CreateToken(ctx, "abc", TokenRequest{TTL: "2h", Subject: "ci"}) },
			check: func(t *testing.T, v any) {
				if tk := v.(Token); tk.Token != "t.k" || !strings.Contains(tk.URL, "sandwake_token=t.k") || tk.ExpiresAt.IsZero() {
					t.Fatalf("token: %+v", tk)
				}
			}},
		{name: "revoke tokens", wantMethod: "DELETE", wantPath: "/v1/sandboxes/abc/tokens",
			call: func(c *Client) (any, error) { return nil, c.RevokeTokens(ctx, "abc") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status := http.StatusOK
			if tc.answer == "" {
				status = http.StatusNoContent
			}
			srv, got := recorder(t, status, nil, tc.answer)
			v, err := tc.call(newClient(t, srv.URL+"/", "sekret"))
			if err != nil {
				t.Fatalf("call: %v", err)
			}
			if got.method != tc.wantMethod || got.path != tc.wantPath || got.query != tc.wantQuery || got.auth != "Bearer sekret" {
				t.Fatalf("request %+v, want %s %s?%s with the bearer token", *got, tc.wantMethod, tc.wantPath, tc.wantQuery)
			}
			if got.body != tc.want {
				t.Fatalf("request body %s, want %s", got.body, tc.want)
			}
			if (tc.want != "") != (got.contentType == "application/json") {
				t.Fatalf("Content-Type %q with body %q", got.contentType, got.body)
			}
			if s, ok := v.(Sandbox); ok && s.ID != "abc" {
				t.Fatalf("answer %+v", s)
			}
			if tc.check != nil {
				tc.check(t, v)
			}
		})
	}
}

// TestBodyOption: Body stores the answer as sent, and no token sends no
// Authorization header.
func TestBodyOption(t *testing.T) {
	answer := "{\n  \"id\": \"abc\",\n  \"state\": \"paused\",\n  \"future_field\": 1\n}\n"
	srv, got := recorder(t, http.StatusOK, nil, answer)
	var raw []byte
	s, err := newClient(t, srv.URL, "").Get(context.Background(), "abc", Body(&raw))
	if err != nil || s.State != "paused" || string(raw) != answer {
		t.Fatalf("Get: %v %+v raw %q", err, s, raw)
	}
	if got.auth != "" {
		t.Fatalf("Authorization %q sent without a token", got.auth)
	}
}

// TestErrors: the API's error body becomes an *APIError with its status,
// code, message and Retry-After; another answer keeps its first line.
func TestErrors(t *testing.T) {
	for _, tc := range []struct {
		name         string
		status       int
		header       http.Header
		body         string
		want         APIError
		wantErrorStr string
	}{
		{name: "API error", status: 404, body: `{"error":{"code":"not_found","message":"sandbox abc: not found"}}`,
			want: APIError{Status: 404, Code: "not_found", Message: "sandbox abc: not found"}, wantErrorStr: "sandbox abc: not found (404)"},
		{name: "retry after and state", status: 503, header: http.Header{"Retry-After": {"5"}},
			body: `{"error":{"code":"sandbox_error","message":"sandbox abc failed","state":"error"}}`,
			want: APIError{Status: 503, Code: "sandbox_error", Message: "sandbox abc failed", State: "error", RetryAfter: 5 * time.Second}},
		{name: "a proxy's page", status: 502, body: "upstream gone\n<html>…</html>",
			want: APIError{Status: 502, Message: "the API answered: upstream gone"}, wantErrorStr: "the API answered: upstream gone (502)"},
		{name: "nothing", status: 500, want: APIError{Status: 500, Message: "the API answered: Internal Server Error"}},
		{name: "a long line", status: 418, body: strings.Repeat("x", 300), want: APIError{Status: 418, Message: "the API answered: I'm a teapot"}},
		{name: "JSON without a message", status: 400, body: `{"error":{"code":"x"}}`, want: APIError{Status: 400, Message: `the API answered: {"error":{"code":"x"}}`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, _ := recorder(t, tc.status, tc.header, tc.body)
			_, err := newClient(t, srv.URL, "tok").Get(context.Background(), "abc")
			ae, ok := errors.AsType[*APIError](err)
			if !ok || *ae != tc.want {
				t.Fatalf("error %#v, want %#v", err, tc.want)
			}
			if tc.wantErrorStr != "" && err.Error() != tc.wantErrorStr {
				t.Fatalf("Error() = %q, want %q", err.Error(), tc.wantErrorStr)
			}
			if StatusOf(fmtWrap(err)) != tc.status {
				t.Fatalf("StatusOf of a wrapped error: %d", StatusOf(fmtWrap(err)))
			}
		})
	}
}

func fmtWrap(err error) error { return errors.Join(errors.New("context"), err) }

// TestTransportErrors: an unreachable API, a bad base URL, an answer that
// is not JSON, and a cancelled context.
func TestTransportErrors(t *testing.T) {
	for _, bad := range []string{"ftp://example.com", "localhost:8081", "http://", "://x"} {
		if _, err := New(bad, "", nil); err == nil || !strings.Contains(err.Error(), "is not an http(s) URL") {
			t.Errorf("New(%q): %v", bad, err)
		}
	}
	srv := httptest.NewServer(http.NotFoundHandler())
	base := srv.URL
	srv.Close()
	_, err := newClient(t, base, "").Get(context.Background(), "abc")
	if err == nil || !strings.HasPrefix(err.Error(), "cannot reach the API at "+base+": ") || StatusOf(err) != 0 {
		t.Fatalf("unreachable: %v", err)
	}

	notJSON, _ := recorder(t, http.StatusOK, nil, "<html>")
	if _, err := newClient(t, notJSON.URL, "").Get(context.Background(), "abc"); err == nil || !strings.Contains(err.Error(), "the answer is not the expected JSON") {
		t.Fatalf("not JSON: %v", err)
	}

	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	defer hang.Close()
	ctx, cancel := context.WithCancel(context.Background())
	go cancel()
	if _, err := newClient(t, hang.URL, "").Wake(ctx, "abc"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

// TestReady: 200 and 503 with checks are readiness reports; a 503 that is
// not one is an error.
func TestReady(t *testing.T) {
	for _, tc := range []struct {
		status    int
		body      string
		wantReady bool
		wantErr   string
	}{
		{200, `{"checks":{"boot_reconcile":"ok","docker":"ok","store":"ok"},"instance":"gw1","ready":true}`, true, ""},
		{503, `{"checks":{"boot_reconcile":"not done","docker":"cannot connect","store":"ok"},"ready":false}`, false, ""},
		{503, `{"error":{"code":"unavailable","message":"sandwake is starting"}}`, false, "sandwake is starting (503)"},
		{401, `{"error":{"code":"unauthorized","message":"no"}}`, false, "no (401)"},
		{200, `[]`, false, "not the expected JSON"},
	} {
		srv, got := recorder(t, tc.status, nil, tc.body)
		r, err := newClient(t, srv.URL, "tok").Ready(context.Background())
		if got.path != "/v1/readyz" {
			t.Fatalf("path %q", got.path)
		}
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("%d %s: error %v, want %q", tc.status, tc.body, err, tc.wantErr)
			}
			continue
		}
		if err != nil || r.Ready != tc.wantReady || r.Checks["store"] != "ok" {
			t.Fatalf("%d %s: %v %+v", tc.status, tc.body, err, r)
		}
	}
}
