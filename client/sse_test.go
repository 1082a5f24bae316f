package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestReadSSE: ids, multi-line data, CRLF, comments, unknown fields,
// id-only and unterminated messages, retry, and an emit error.
func TestReadSSE(t *testing.T) {
	stream := ": comment\n\nid: 7\nevent: x\ndata: {\"a\":1}\n\ndata:no-space\r\n\r\nid: 9\ndata: a\ndata: b\n\nid: 10\n\nretry: 1500\nretry: soon\ndata: last\n"
	var got []Message
	var retries []time.Duration
	err := ReadSSE(strings.NewReader(stream), func(m Message) error {
		got = append(got, m)
		return nil
	}, func(d time.Duration) { retries = append(retries, d) })
	want := []Message{{ID: "7", Data: `{"a":1}`}, {Data: "no-space"}, {ID: "9", Data: "a\nb"}}
	if err != nil || fmt.Sprint(got) != fmt.Sprint(want) || fmt.Sprint(retries) != "[1.5s]" {
		t.Fatalf("ReadSSE: %v %q retries %v, want %q [1.5s]", err, got, retries, want)
	}
	stop := errors.New("stop")
	n := 0
	if err := ReadSSE(strings.NewReader(stream), func(Message) error { n++; return stop }, nil); err != stop || n != 1 {
		t.Fatalf("an emit error: %v after %d messages", err, n)
	}
}

func TestMessageEvent(t *testing.T) {
	ev, err := Message{Data: `{"id":4,"type":"sandbox.destroyed","sandbox_id":"a1","from":"stopped","reason":"api","at":"2025-01-02T03:04:05Z"}`}.Event()
	if err != nil || ev.ID != 4 || ev.SandboxID != "a1" || ev.From != "stopped" || ev.To != "" || ev.At.Year() != 2025 {
		t.Fatalf("Event: %v %+v", err, ev)
	}
	if _, err := (Message{Data: "nope"}).Event(); err == nil || !strings.Contains(err.Error(), "not the expected JSON") {
		t.Fatalf("not JSON: %v", err)
	}
}

func eventData(id int) string {
	return fmt.Sprintf(`{"id":%d,"type":"sandbox.paused","sandbox_id":"abc","from":"running","to":"paused","at":"2025-01-02T03:04:05Z"}`, id)
}

// TestFollowEventsResumes: a stream that drops, a 5xx and a 429 are
// followed by a reconnection with Last-Event-ID (the last id seen, kept
// over connections that carried no event), so every event arrives once;
// a retry: field raises the delay; warn hears of each reconnection.
func TestFollowEventsResumes(t *testing.T) {
	var mu sync.Mutex
	var lastIDs []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/events" || r.URL.Query().Get("sandbox") != "abc" || r.Header.Get("Accept") != "text/event-stream" {
			http.Error(w, "unexpected "+r.URL.String(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		lastIDs = append(lastIDs, r.Header.Get("Last-Event-ID"))
		n := len(lastIDs)
		mu.Unlock()
		switch n {
		case 2:
			w.Header().Set("Retry-After", "1")
			http.Error(w, `{"error":{"code":"unavailable","message":"sandwake is starting"}}`, http.StatusServiceUnavailable)
			return
		case 4:
			http.Error(w, `{"error":{"code":"too_many_streams","message":"slow down"}}`, http.StatusTooManyRequests)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		switch n {
		case 1:
			fmt.Fprint(w, ": hello\n\nid: 1\ndata: "+eventData(1)+"\n\nid: 2\ndata: "+eventData(2)+"\n\n")
		case 3:
			fmt.Fprint(w, "retry: 30\n\n: nothing new\n\n")
		case 5:
			fmt.Fprint(w, "id: 3\ndata: "+eventData(3)+"\n\n")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}
	}))
	defer srv.Close()
	c, err := New(srv.URL, "", &Options{MinBackoff: time.Millisecond, MaxBackoff: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var got []string
	var warns []string
	err = c.FollowEvents(ctx, "abc", func(m Message) error {
		ev, err := m.Event()
		if err != nil {
			return err
		}
		got = append(got, fmt.Sprintf("%s=%d", m.ID, ev.ID))
		if len(got) == 3 {
			cancel()
		}
		return nil
	}, func(err error, delay time.Duration) { warns = append(warns, fmt.Sprintf("%v after %v", err, delay)) })
	if err != nil {
		t.Fatalf("FollowEvents: %v", err)
	}
	if fmt.Sprint(got) != "[1=1 2=2 3=3]" {
		t.Fatalf("events %v", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(lastIDs) != "[ 2 2 2 2]" {
		t.Fatalf("Last-Event-ID of the connections: %q", lastIDs)
	}
	if len(warns) != 4 || !strings.Contains(warns[0], "the stream ended") || !strings.Contains(warns[1], "sandwake is starting (503)") ||
		!strings.HasSuffix(warns[3], "after 30ms") || !strings.Contains(warns[3], "slow down (429)") {
		t.Fatalf("warnings: %q", warns)
	}
}

// TestFollowEventsEnds: a 4xx other than 429 ends the follow with the
// API's error, without a retry; an emit error ends it with that error.
func TestFollowEventsEnds(t *testing.T) {
	var mu sync.Mutex
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls++
		mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer right" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"error":{"code":"unauthorized","message":"missing or wrong bearer token"}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "id: 1\ndata: "+eventData(1)+"\n\n")
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := newClient(t, srv.URL, "wrong").FollowEvents(ctx, "", func(Message) error { return nil }, nil)
	if ae, ok := errors.AsType[*APIError](err); !ok || ae.Status != 401 || ae.Code != "unauthorized" || calls != 1 {
		t.Fatalf("wrong token: %v after %d calls", err, calls)
	}
	stop := errors.New("stop")
	if err := newClient(t, srv.URL, "right").FollowEvents(ctx, "", func(Message) error { return stop }, nil); err != stop {
		t.Fatalf("emit error: %v", err)
	}
	if ctx.Err() != nil {
		t.Fatal("the follow kept retrying until the deadline")
	}
}
