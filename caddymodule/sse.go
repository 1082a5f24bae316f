package caddymodule

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/sandwake/sandwake/lifecycle"
)

// sseHeartbeat keeps idle event streams open through proxies.
const sseHeartbeat = 15 * time.Second

// sseStream writes a server-sent event stream of sandbox events: the
// preview hosts' /.well-known/sandwake/events and the API's /v1/events.
// Its owner calls stop when the stream ends.
type sseStream struct {
	w  http.ResponseWriter
	rc *http.ResponseController
	// heartbeat ticks every sseHeartbeat: then send keepAlive.
	heartbeat <-chan time.Time
	tick      *time.Ticker
}

// startSSE answers 200 with the headers of an event stream (not cached,
// not buffered by proxies). Nothing is flushed yet.
func startSSE(w http.ResponseWriter) *sseStream {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	tick := time.NewTicker(sseHeartbeat)
	return &sseStream{w: w, rc: http.NewResponseController(w), heartbeat: tick.C, tick: tick}
}

// stop ends the heartbeat.
func (s *sseStream) stop() { s.tick.Stop() }

// event writes ev as one message: its id, when it has one (events of the
// log do; the gate's first message, the current state, does not), and its
// JSON as data. It does not flush.
func (s *sseStream) event(ev lifecycle.Event) error {
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	if ev.ID > 0 {
		if _, err := fmt.Fprintf(s.w, "id: %d\n", ev.ID); err != nil {
			return err
		}
	}
	_, err = fmt.Fprintf(s.w, "data: %s\n\n", b)
	return err
}

// comment writes a comment line, which clients skip, and flushes.
func (s *sseStream) comment(text string) error {
	if _, err := io.WriteString(s.w, ": "+text+"\n\n"); err != nil {
		return err
	}
	return s.flush()
}

// keepAlive writes the heartbeat comment and flushes.
func (s *sseStream) keepAlive() error { return s.comment("keep-alive") }

// flush sends what was written to the client.
func (s *sseStream) flush() error { return s.rc.Flush() }

// lastEventID is where a reconnecting client resumes: the Last-Event-ID
// header, else the last_event_id query parameter (for clients that cannot
// set headers). ok is false when the client gave none.
func lastEventID(r *http.Request) (id uint64, ok bool, err error) {
	v := r.Header.Get("Last-Event-ID")
	if v == "" {
		v = r.URL.Query().Get("last_event_id")
	}
	if v == "" {
		return 0, false, nil
	}
	id, err = strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("Last-Event-ID %q is not an event id", v)
	}
	return id, true, nil
}
