package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Options tune a Client. The zero value is fine.
type Options struct {
	// HTTPClient makes the requests. Default: a client without an overall
	// timeout, as a create or a wake legitimately waits for the sandbox to
	// be ready and the event stream never ends: the context bounds calls.
	HTTPClient *http.Client
	// MinBackoff and MaxBackoff bound the delay before FollowEvents reopens
	// a dropped stream: doubling from MinBackoff (or the stream's retry:
	// field) up to MaxBackoff. Defaults: 250ms, 10s.
	MinBackoff, MaxBackoff time.Duration
}

// Default reconnection delays of FollowEvents.
const (
	DefaultMinBackoff = 250 * time.Millisecond
	DefaultMaxBackoff = 10 * time.Second
)

// Client calls one sandwake management API. It is safe for concurrent use.
type Client struct {
	base       string // scheme://host[:port][/prefix], no trailing slash
	token      string
	http       *http.Client
	minBackoff time.Duration
	maxBackoff time.Duration
}

// New returns a client of the API at baseURL (an http or https URL, with an
// optional path prefix) that sends token as its bearer token; an empty
// token sends none. opts may be nil.
func New(baseURL, token string, opts *Options) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%q is not an http(s) URL like http://localhost:8081", baseURL)
	}
	c := &Client{base: strings.TrimSuffix(baseURL, "/"), token: token, http: &http.Client{},
		minBackoff: DefaultMinBackoff, maxBackoff: DefaultMaxBackoff}
	if opts != nil {
		if opts.HTTPClient != nil {
			c.http = opts.HTTPClient
		}
		if opts.MinBackoff > 0 {
			c.minBackoff = opts.MinBackoff
		}
		if opts.MaxBackoff > 0 {
			c.maxBackoff = opts.MaxBackoff
		}
	}
	c.maxBackoff = max(c.maxBackoff, c.minBackoff)
	return c, nil
}

// BaseURL is the API's URL, without a trailing slash.
func (c *Client) BaseURL() string { return c.base }

// APIError is an error answered by the API, or an answer that was not the
// API's (a proxy's error page, say: then Code is empty and Message starts
// with "the API answered: ").
type APIError struct {
	// Status is the HTTP status.
	Status int
	// Code is the API's error code (see ErrorBody.Code).
	Code string
	// Message is the API's error message.
	Message string
	// State is the sandbox's state, when the API gave it.
	State string
	// RetryAfter is the answer's Retry-After, 0 when it had none.
	RetryAfter time.Duration
}

// Error is the message and the status: "sandbox abc: not found (404)".
func (e *APIError) Error() string {
	return fmt.Sprintf("%s (%d)", e.Message, e.Status)
}

// StatusOf is the HTTP status of an *APIError in err's chain, 0 when there
// is none.
func StatusOf(err error) int {
	if ae, ok := errors.AsType[*APIError](err); ok {
		return ae.Status
	}
	return 0
}

// decodeError reads an error answer: the API's {"error":{…}}, or else the
// first line of whatever answered.
func decodeError(resp *http.Response, body []byte) *APIError {
	e := &APIError{Status: resp.StatusCode}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
		e.RetryAfter = time.Duration(s) * time.Second
	}
	var er ErrorResponse
	if json.Unmarshal(body, &er) == nil && er.Error.Message != "" {
		e.Code, e.Message, e.State = er.Error.Code, er.Error.Message, er.Error.State
		return e
	}
	msg, _, _ := strings.Cut(strings.TrimSpace(string(body)), "\n")
	if msg == "" || len(msg) > 200 {
		msg = http.StatusText(resp.StatusCode)
	}
	e.Message = "the API answered: " + strings.TrimSpace(msg)
	return e
}

// A CallOption changes one call.
type CallOption func(*callConfig)

type callConfig struct {
	body *[]byte
}

// Body stores the answer's body, as the API sent it, in *dst: for callers
// that show the API's own JSON.
func Body(dst *[]byte) CallOption {
	return func(cc *callConfig) { cc.body = dst }
}

// send makes a request and answers the response when its status is 2xx;
// otherwise an *APIError. The caller closes the body.
func (c *Client) send(ctx context.Context, method, path string, in any, header http.Header) (*http.Response, error) {
	var rd io.Reader
	if in != nil {
		b, err := json.Marshal(in)
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
	if in != nil {
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
	return nil, decodeError(resp, b)
}

// call makes a request and decodes a 2xx answer into out when out is not
// nil.
func (c *Client) call(ctx context.Context, method, path string, in, out any, opts []CallOption) error {
	var cc callConfig
	for _, o := range opts {
		o(&cc)
	}
	resp, err := c.send(ctx, method, path, in, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	if cc.body != nil {
		*cc.body = raw
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("%s %s: the answer is not the expected JSON: %w", method, path, err)
		}
	}
	return nil
}

func sandboxPath(id string) string { return "/v1/sandboxes/" + url.PathEscape(id) }

// List answers the sandboxes, all or those in opts.State.
func (c *Client) List(ctx context.Context, opts ListOptions, co ...CallOption) ([]Sandbox, error) {
	out, err := c.ListPage(ctx, opts, co...)
	return out.Sandboxes, err
}

// ListPage answers one page of sandboxes (every one when opts.Limit and
// opts.Cursor are unset) with the cursor of the next page.
func (c *Client) ListPage(ctx context.Context, opts ListOptions, co ...CallOption) (SandboxList, error) {
	q := url.Values{}
	if opts.State != "" {
		q.Set("state", opts.State)
	}
	for _, k := range slices.Sorted(maps.Keys(opts.Labels)) {
		q.Add("label", k+"="+opts.Labels[k])
	}
	if opts.Limit > 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	if opts.Cursor != "" {
		q.Set("cursor", opts.Cursor)
	}
	path := "/v1/sandboxes"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out SandboxList
	err := c.call(ctx, http.MethodGet, path, nil, &out, co)
	return out, err
}

// Get answers one sandbox.
func (c *Client) Get(ctx context.Context, id string, co ...CallOption) (Sandbox, error) {
	var sb Sandbox
	err := c.call(ctx, http.MethodGet, sandboxPath(id), nil, &sb, co)
	return sb, err
}

// Templates lists the gateway's templates and their warm pools.
func (c *Client) Templates(ctx context.Context, co ...CallOption) (TemplateList, error) {
	var out TemplateList
	err := c.call(ctx, http.MethodGet, "/v1/templates", nil, &out, co)
	return out, err
}

// Create creates a sandbox; the API answers once it is running.
func (c *Client) Create(ctx context.Context, req CreateRequest, co ...CallOption) (Sandbox, error) {
	var sb Sandbox
	err := c.call(ctx, http.MethodPost, "/v1/sandboxes", req, &sb, co)
	return sb, err
}

// Update changes a sandbox's access, idle settings and egress policy.
func (c *Client) Update(ctx context.Context, id string, p Patch, co ...CallOption) (Sandbox, error) {
	var sb Sandbox
	err := c.call(ctx, http.MethodPatch, sandboxPath(id), p, &sb, co)
	return sb, err
}

// EgressLog answers what a sandbox tried outbound: its connections and
// lookups and, under the learn policy, the allow list a lock would make.
func (c *Client) EgressLog(ctx context.Context, id string, co ...CallOption) (EgressLog, error) {
	var out EgressLog
	err := c.call(ctx, http.MethodGet, sandboxPath(id)+"/egress", nil, &out, co)
	return out, err
}

// LockEgress turns what a sandbox under the learn policy used into an
// allow list under none, and answers the sandbox.
func (c *Client) LockEgress(ctx context.Context, id string, co ...CallOption) (Sandbox, error) {
	return c.act(ctx, id, "egress/lock", nil, co)
}

// act runs an operation that answers the sandbox.
func (c *Client) act(ctx context.Context, id, op string, in any, co []CallOption) (Sandbox, error) {
	var sb Sandbox
	err := c.call(ctx, http.MethodPost, sandboxPath(id)+"/"+op, in, &sb, co)
	return sb, err
}

// Wake wakes a sandbox and answers once it is running.
func (c *Client) Wake(ctx context.Context, id string, co ...CallOption) (Sandbox, error) {
	return c.act(ctx, id, "wake", nil, co)
}

// Pause pauses a sandbox; it keeps its memory.
func (c *Client) Pause(ctx context.Context, id string, co ...CallOption) (Sandbox, error) {
	return c.act(ctx, id, "pause", nil, co)
}

// Stop stops a sandbox; it keeps its disk.
func (c *Client) Stop(ctx context.Context, id string, co ...CallOption) (Sandbox, error) {
	return c.act(ctx, id, "stop", nil, co)
}

// Keepalive keeps a sandbox from the idle tiers for d, a duration like
// "10m".
func (c *Client) Keepalive(ctx context.Context, id, d string, co ...CallOption) (Sandbox, error) {
	return c.act(ctx, id, "keepalive", KeepaliveRequest{For: d}, co)
}

// Destroy removes a sandbox's container and record; its volume is kept.
func (c *Client) Destroy(ctx context.Context, id string, co ...CallOption) error {
	return c.call(ctx, http.MethodDelete, sandboxPath(id), nil, nil, co)
}

// Purge removes a sandbox with its volume (also the volume of a destroyed
// one) and answers the bytes freed.
func (c *Client) Purge(ctx context.Context, id string, co ...CallOption) (int64, error) {
	var out PurgeResult
	err := c.call(ctx, http.MethodPost, sandboxPath(id)+"/purge", nil, &out, co)
	return out.FreedBytes, err
}

// History answers the events the log keeps of a sandbox, oldest first.
func (c *Client) History(ctx context.Context, id string, co ...CallOption) ([]Event, error) {
	out, err := c.HistoryPage(ctx, id, HistoryOptions{}, co...)
	return out.Events, err
}

// HistoryPage answers one page of a sandbox's events (every one when
// opts.Limit and opts.After are unset) with the After of the next page.
func (c *Client) HistoryPage(ctx context.Context, id string, opts HistoryOptions, co ...CallOption) (History, error) {
	q := url.Values{}
	if opts.Limit > 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	if opts.After > 0 {
		q.Set("after", strconv.FormatUint(opts.After, 10))
	}
	path := sandboxPath(id) + "/history"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out History
	err := c.call(ctx, http.MethodGet, path, nil, &out, co)
	return out, err
}

// CreateToken issues a preview token for a private sandbox.
func (c *Client) CreateToken(ctx context.Context, id string, req TokenRequest, co ...CallOption) (Token, error) {
	var out Token
	err := c.call(ctx, http.MethodPost, sandboxPath(id)+"/tokens", req, &out, co)
	return out, err
}

// RevokeTokens invalidates every preview token of a sandbox issued so far.
func (c *Client) RevokeTokens(ctx context.Context, id string, co ...CallOption) error {
	return c.call(ctx, http.MethodDelete, sandboxPath(id)+"/tokens", nil, nil, co)
}

// Ready answers the gateway's readiness, with each check's detail when the
// client has a token (of any scope). A gateway that is up but not
// ready answers 503 with its checks: that is a Readiness with Ready false
// and no error.
func (c *Client) Ready(ctx context.Context) (Readiness, error) {
	var out Readiness
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/readyz", nil)
	if err != nil {
		return out, fmt.Errorf("GET /v1/readyz: %w", err)
	}
	if c.token != "" {
		// Without a token the gateway names its checks with ok or fail
		// only.
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return out, ctx.Err()
		}
		return out, fmt.Errorf("cannot reach the API at %s: %w", c.base, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return out, fmt.Errorf("GET /v1/readyz: reading the answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusServiceUnavailable {
		return out, decodeError(resp, body)
	}
	if err := json.Unmarshal(body, &out); err != nil || out.Checks == nil {
		if resp.StatusCode == http.StatusOK {
			return out, errors.New("GET /v1/readyz: the answer is not the expected JSON")
		}
		// A 503 from something else (a proxy, or the API while it
		// starts) is not a readiness report.
		return out, decodeError(resp, body)
	}
	return out, nil
}
