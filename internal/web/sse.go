package web

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

// Stream writes a server-sent event stream of sandbox events: the
// preview hosts' /.well-known/sandwake/events and the API's /v1/events.
// Its owner calls Stop when the stream ends.
type Stream struct {
	w  http.ResponseWriter
	rc *http.ResponseController
	// Heartbeat ticks every sseHeartbeat: then send KeepAlive.
	Heartbeat <-chan time.Time
	tick      *time.Ticker
}

// StartSSE answers 200 with the headers of an event stream (not cached,
// not buffered by proxies). Nothing is flushed yet.
func StartSSE(w http.ResponseWriter) *Stream {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	tick := time.NewTicker(sseHeartbeat)
	return &Stream{w: w, rc: http.NewResponseController(w), Heartbeat: tick.C, tick: tick}
}

// Stop ends the heartbeat.
func (s *Stream) Stop() { s.tick.Stop() }

// Event writes ev as one message: its id, when it has one (events of the
// log do; the gate's first message, the current state, does not), and its
// JSON as data. It does not flush.
func (s *Stream) Event(ev lifecycle.Event) error {
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

// Data writes v's JSON as one message without an id (another node's
// event: ids are per node). It does not flush.
func (s *Stream) Data(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(s.w, "data: %s\n\n", b)
	return err
}

// Comment writes a comment line, which clients skip, and flushes.
func (s *Stream) Comment(text string) error {
	if _, err := io.WriteString(s.w, ": "+text+"\n\n"); err != nil {
		return err
	}
	return s.Flush()
}

// KeepAlive writes the heartbeat comment and flushes.
func (s *Stream) KeepAlive() error { return s.Comment("keep-alive") }

// Flush sends what was written to the client.
func (s *Stream) Flush() error { return s.rc.Flush() }

// LastEventID is where a reconnecting client resumes: the Last-Event-ID
// header, else the last_event_id query parameter (for clients that cannot
// set headers). ok is false when the client gave none.
func LastEventID(r *http.Request) (id uint64, ok bool, err error) {
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
