package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// EventsOptions choose the events of GET /v1/events.
type EventsOptions struct {
	// Sandbox follows one sandbox's events; empty follows all.
	Sandbox string
	// LastEventID resumes after this event id: the stream starts with the
	// events the log kept since. Empty starts from now.
	LastEventID string
}

// OpenEvents opens the event stream. Read it with ReadSSE; the caller
// closes it.
func (c *Client) OpenEvents(ctx context.Context, opts EventsOptions) (io.ReadCloser, error) {
	path := "/v1/events"
	if opts.Sandbox != "" {
		path += "?sandbox=" + url.QueryEscape(opts.Sandbox)
	}
	h := http.Header{"Accept": {"text/event-stream"}}
	if opts.LastEventID != "" {
		h.Set("Last-Event-ID", opts.LastEventID)
	}
	resp, err := c.send(ctx, http.MethodGet, path, nil, h)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// Event decodes the event a message of GET /v1/events carries.
func (m Message) Event() (Event, error) {
	var ev Event
	if err := json.Unmarshal([]byte(m.Data), &ev); err != nil {
		return ev, fmt.Errorf("an event is not the expected JSON (%v): %.200s", err, m.Data)
	}
	return ev, nil
}

// FollowEvents calls emit for every message of the event stream until ctx
// ends (then it answers nil) or emit fails (then it answers emit's error).
// A dropped stream is reopened with Last-Event-ID, so no event is missed
// or repeated, after a delay that doubles from the client's MinBackoff (or
// the stream's retry: field) up to its MaxBackoff and falls back to the
// minimum once messages flow again; warn, when not nil, is told of each
// reconnection. An error the API answers with a 4xx status other than 429
// (a wrong token, no such route) ends it, as retrying cannot mend it.
func (c *Client) FollowEvents(ctx context.Context, sandbox string, emit func(Message) error, warn func(err error, delay time.Duration)) error {
	opts := EventsOptions{Sandbox: sandbox}
	minDelay := c.minBackoff
	delay := minDelay
	for {
		body, err := c.OpenEvents(ctx, opts)
		if ctx.Err() != nil {
			if body != nil {
				body.Close()
			}
			return nil
		}
		if err != nil {
			if s := StatusOf(err); s >= 400 && s < 500 && s != http.StatusTooManyRequests {
				return err
			}
		} else {
			var emitErr error
			err = ReadSSE(body, func(m Message) error {
				if m.ID != "" {
					opts.LastEventID = m.ID
				}
				delay = minDelay
				emitErr = emit(m)
				return emitErr
			}, func(d time.Duration) { minDelay = max(d, 10*time.Millisecond) })
			body.Close()
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
		delay = min(max(delay*2, minDelay), c.maxBackoff)
	}
}
