package caddymodule

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// apiClient calls the management API (the sandwake_api handler) for the
// `caddy sandwake` command. Each method answers the decoded value and the raw
// JSON body, which --json prints as it came.
type apiClient struct {
	base  string // scheme://host[:port][/prefix], no trailing slash
	token string
	http  *http.Client
}

// newAPIClient checks base and returns a client for it.
func newAPIClient(base, token string) (*apiClient, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--api %q is not an http(s) URL like http://localhost:8081", base)
	}
	// No overall timeout: a wake or a create legitimately waits for the
	// sandbox to become ready, and the event stream never ends. The context
	// (Ctrl-C) bounds every call.
	return &apiClient{base: strings.TrimSuffix(base, "/"), token: token, http: &http.Client{}}, nil
}

// callError is an error answered by the API, or a response that was not
// the API's.
type callError struct {
	Status  int
	Code    string
	Message string
}

func (e *callError) Error() string {
	msg := fmt.Sprintf("%s (%d)", e.Message, e.Status)
	if e.Status == http.StatusUnauthorized {
		msg += "; set --token, $SANDWAKE_TOKEN or $SANDWAKE_API_TOKEN"
	}
	return msg
}

// statusOf reports the HTTP status of an API error, 0 for other errors.
func statusOf(err error) int {
	if ce, ok := errors.AsType[*callError](err); ok {
		return ce.Status
	}
	return 0
}

// send makes a request and answers the response when its status is 2xx;
// otherwise the API's error as a *callError. The caller closes the body.
func (c *apiClient) send(ctx context.Context, method, path string, body any, header http.Header) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("encoding the request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if ue, ok := errors.AsType[*url.Error](err); ok {
			err = ue.Err
		}
		return nil, fmt.Errorf("cannot reach the API at %s: %w", c.base, err)
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return nil, decodeCallError(resp.StatusCode, b)
}

// decodeCallError reads an error body: the API's {"error":{…}}, or else the
// first line of whatever answered (a proxy's page, say).
func decodeCallError(status int, body []byte) *callError {
	var ae apiError
	if json.Unmarshal(body, &ae) == nil && ae.Error.Message != "" {
		return &callError{Status: status, Code: ae.Error.Code, Message: ae.Error.Message}
	}
	msg, _, _ := strings.Cut(strings.TrimSpace(string(body)), "\n")
	if msg == "" || len(msg) > 200 {
		msg = http.StatusText(status)
	}
	return &callError{Status: status, Message: "the API answered: " + strings.TrimSpace(msg)}
}

// call makes a request and answers the raw body of a 2xx response, decoded
// into out when out is not nil.
func (c *apiClient) call(ctx context.Context, method, path string, body, out any) ([]byte, error) {
	resp, err := c.send(ctx, method, path, body, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return nil, fmt.Errorf("%s %s: the answer is not the expected JSON: %w", method, path, err)
		}
	}
	return raw, nil
}

func sandboxPath(id string) string { return "/v1/sandboxes/" + url.PathEscape(id) }

// List answers the sandboxes, all or those in state.
func (c *apiClient) List(ctx context.Context, state string) ([]recordView, []byte, error) {
	path := "/v1/sandboxes"
	if state != "" {
		path += "?state=" + url.QueryEscape(state)
	}
	var out struct {
		Sandboxes []recordView `json:"sandboxes"`
	}
	raw, err := c.call(ctx, http.MethodGet, path, nil, &out)
	return out.Sandboxes, raw, err
}

// Get answers one sandbox.
func (c *apiClient) Get(ctx context.Context, id string) (recordView, []byte, error) {
	var rec recordView
	raw, err := c.call(ctx, http.MethodGet, sandboxPath(id), nil, &rec)
	return rec, raw, err
}

// Create creates a sandbox; the API answers once it is running.
func (c *apiClient) Create(ctx context.Context, body createBody) (recordView, []byte, error) {
	var rec recordView
	raw, err := c.call(ctx, http.MethodPost, "/v1/sandboxes", body, &rec)
	return rec, raw, err
}

// Act runs an operation that answers the record: wake, pause or stop.
func (c *apiClient) Act(ctx context.Context, id, op string) (recordView, []byte, error) {
	var rec recordView
	raw, err := c.call(ctx, http.MethodPost, sandboxPath(id)+"/"+op, nil, &rec)
	return rec, raw, err
}

// Keepalive keeps a sandbox from the idle tiers for d (a duration string).
func (c *apiClient) Keepalive(ctx context.Context, id, d string) (recordView, []byte, error) {
	var rec recordView
	raw, err := c.call(ctx, http.MethodPost, sandboxPath(id)+"/keepalive", map[string]string{"for": d}, &rec)
	return rec, raw, err
}

// Destroy removes a sandbox's container and record; its volume is kept.
func (c *apiClient) Destroy(ctx context.Context, id string) ([]byte, error) {
	return c.call(ctx, http.MethodDelete, sandboxPath(id), nil, nil)
}

// Purge removes a sandbox with its volume and answers the bytes freed.
func (c *apiClient) Purge(ctx context.Context, id string) (int64, []byte, error) {
	var out struct {
		FreedBytes int64 `json:"freed_bytes"`
	}
	raw, err := c.call(ctx, http.MethodPost, sandboxPath(id)+"/purge", nil, &out)
	return out.FreedBytes, raw, err
}

// sseEvent is one event of a server-sent event stream.
type sseEvent struct {
	ID   string
	Data string
}

// readSSE reads a text/event-stream until it ends, calling emit for each
// event that carries data. retry is called with a "retry:" field's value.
// Comment lines (":…") are keep-alives and are skipped.
func readSSE(r io.Reader, emit func(sseEvent) error, retry func(time.Duration)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	var ev sseEvent
	var data []string
	for sc.Scan() {
		line := strings.TrimSuffix(sc.Text(), "\r")
		if line == "" {
			if data != nil {
				ev.Data = strings.Join(data, "\n")
				if err := emit(ev); err != nil {
					return err
				}
			}
			ev, data = sseEvent{}, nil
			continue
		}
		if strings.HasPrefix(line, ":") {
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "id":
			ev.ID = value
		case "data":
			data = append(data, value)
		case "retry":
			if ms, err := strconv.Atoi(value); err == nil && ms >= 0 && retry != nil {
				retry(time.Duration(ms) * time.Millisecond)
			}
		}
	}
	return sc.Err()
}

// OpenEvents opens the event stream, all sandboxes' or one's, resuming after
// lastID when it is not empty.
func (c *apiClient) OpenEvents(ctx context.Context, sandbox, lastID string) (*http.Response, error) {
	path := "/v1/events"
	if sandbox != "" {
		path += "?sandbox=" + url.QueryEscape(sandbox)
	}
	h := http.Header{"Accept": {"text/event-stream"}}
	if lastID != "" {
		h.Set("Last-Event-ID", lastID)
	}
	return c.send(ctx, http.MethodGet, path, nil, h)
}

// The delays between reconnections of the event stream: doubling from
// eventsMinBackoff up to eventsMaxBackoff, back to the minimum once events
// flow again.
const (
	eventsMinBackoff = 250 * time.Millisecond
	eventsMaxBackoff = 10 * time.Second
)

// FollowEvents calls emit for every event of the stream until ctx ends (then
// it answers nil) or emit fails. A dropped stream is reopened with
// Last-Event-ID, so no event is missed or repeated; warn is told of each
// reconnection. Errors the API answers with a 4xx status (wrong token, no
// such route) end it, as retrying cannot mend them.
func (c *apiClient) FollowEvents(ctx context.Context, sandbox string, emit func(sseEvent) error, warn func(error, time.Duration)) error {
	var lastID string
	minDelay := eventsMinBackoff
	delay := minDelay
	for {
		resp, err := c.OpenEvents(ctx, sandbox, lastID)
		if ctx.Err() != nil {
			if resp != nil {
				resp.Body.Close()
			}
			return nil
		}
		if err != nil {
			if s := statusOf(err); s >= 400 && s < 500 && s != http.StatusTooManyRequests {
				return err
			}
		} else {
			var emitErr error
			err = readSSE(resp.Body, func(ev sseEvent) error {
				if ev.ID != "" {
					lastID = ev.ID
				}
				delay = minDelay
				if emitErr = emit(ev); emitErr != nil {
					return emitErr
				}
				return nil
			}, func(d time.Duration) { minDelay = max(d, 10*time.Millisecond) })
			resp.Body.Close()
			if ctx.Err() != nil {
				return nil
			}
			if emitErr != nil {
				return emitErr
			}
			if err == nil {
				err = errors.New("the stream ended")
			}
		}
		if warn != nil {
			warn(err, delay)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		delay = min(max(delay*2, minDelay), eventsMaxBackoff)
	}
}
