package preview_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
)

// withReadHeaderTimeout adds a servers { timeouts { read_header … } } global
// option to a harness Caddyfile.
func withReadHeaderTimeout(src, timeout string) string {
	return strings.Replace(src, "\tsandwake {",
		"\tservers {\n\t\ttimeouts {\n\t\t\tread_header "+timeout+"\n\t\t}\n\t}\n\tsandwake {", 1)
}

// slowWriter dials the preview port and writes data one byte every interval
// until it is all written, the server closes the connection, or stop is
// closed. Its reader reports how the connection ended.
type slowWriter struct {
	conn    net.Conn
	stop    chan struct{}
	wg      sync.WaitGroup
	written atomic.Int64
	ended   chan error // the first read's error (io.EOF when the server closed)
	data    chan []byte
}

func startSlowWriter(t *testing.T, port int, data string, interval time.Duration, readFor time.Duration) *slowWriter {
	t.Helper()
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	w := &slowWriter{conn: conn, stop: make(chan struct{}), ended: make(chan error, 1), data: make(chan []byte, 1)}
	w.wg.Add(2)
	go func() {
		defer w.wg.Done()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for i := 0; i < len(data); i++ {
			if _, err := conn.Write([]byte{data[i]}); err != nil {
				return
			}
			w.written.Store(int64(i + 1))
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
		}
	}()
	go func() {
		defer w.wg.Done()
		conn.SetReadDeadline(time.Now().Add(readFor))
		b, err := io.ReadAll(conn)
		if err == nil {
			err = io.EOF
		}
		w.data <- b
		w.ended <- err
	}()
	t.Cleanup(w.close)
	return w
}

// close stops the writer, closes the connection and waits for both goroutines.
func (w *slowWriter) close() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	w.conn.Close()
	w.wg.Wait()
}

// TestSlowloris: clients that send their request headers one byte every
// 200 ms, to a sleeping sandbox, as a page load (warming page) and as an API
// call (held): Caddy's read_header timeout closes their connections, nothing
// is woken, and other clients are served meanwhile. A held request whose body
// arrives slowly does not hold up the wake or the other held requests.
func TestSlowloris(t *testing.T) {
	h := newHarness(t, "hold_timeout 30s")
	// Caddy's default read_header timeout is a minute (caddyhttp
	// defaultReadHeaderTimeout); the test sets a short one.
	h.reloadCaddyfile(withReadHeaderTimeout(h.Caddyfile("hold_timeout 30s"), "2s"))
	running := h.Create(nil)
	sleeping := h.Create(nil)
	h.Stop(sleeping.ID)
	since := time.Now()

	for _, kind := range []struct {
		name   string
		header string
	}{
		{"warming page", "Accept: text/html,application/xhtml+xml\r\nSec-Fetch-Mode: navigate\r\nSec-Fetch-Dest: document\r\n"},
		{"held request", "Accept: application/json\r\nUser-Agent: sdk/1.0\r\n"},
	} {
		t.Run(kind.name, func(t *testing.T) {
			defer h.useT(t)()
			req := "GET / HTTP/1.1\r\nHost: " + h.Host(sleeping.ID, 8080) + "\r\n" + kind.header + "\r\n"
			const slow = 20
			writers := make([]*slowWriter, slow)
			for i := range writers {
				writers[i] = startSlowWriter(t, h.PreviewPort, req, 200*time.Millisecond, 10*time.Second)
			}
			// Meanwhile the gateway serves everyone else.
			for i := range 20 {
				resp, body := h.Preview("GET", h.Host(running.ID, 8080), "/healthz", nil, gatewaytest.APIHeader())
				if resp.StatusCode != http.StatusOK || body != "ok\n" {
					t.Fatalf("request %d from another client while %d connections drip headers: %d %.200q", i, slow, resp.StatusCode, body)
				}
			}
			for i, w := range writers {
				err := <-w.ended
				got := <-w.data
				var ne net.Error
				written := int(w.written.Load())
				if errors.As(err, &ne) && ne.Timeout() {
					t.Errorf("slow connection %d: still open after 10s (%d of %d header bytes sent): no read_header timeout applied", i, written, len(req))
					continue
				}
				if written == len(req) {
					t.Errorf("slow connection %d: the whole request got through before the connection was closed", i)
				}
				if i == 0 {
					t.Logf("slow connection closed by the server after %d of %d header bytes: %v %q", written, len(req), err, got)
				}
				w.close()
			}
		})
	}
	if s := h.State(sleeping.ID); s != "stopped" {
		t.Fatalf("headers that never completed woke the sandbox: %s", s)
	}
	if n := h.StartEvents(sleeping.ID, since); n != 0 {
		t.Fatalf("headers that never completed caused %d docker starts", n)
	}

	t.Run("slow body of a held request", func(t *testing.T) {
		defer h.useT(t)()
		const bodyLen = 1000 // 200 s at one byte every 200 ms: never done on its own
		body := strings.Repeat("b", bodyLen)
		head := "POST /echo HTTP/1.1\r\nHost: " + h.Host(sleeping.ID, 8080) + "\r\nAccept: application/json\r\n" +
			fmt.Sprintf("Content-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n", bodyLen)
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", h.PreviewPort), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := io.WriteString(conn, head); err != nil {
			t.Fatal(err)
		}
		// The held request is in: its wake starts (or is joined by others).
		e := engineFor(t, h)
		testenv.Eventually(t, 10*time.Second, func() (bool, string) {
			_, waking := e.Mgr.Waking(sleeping.ID)
			s := h.State(sleeping.ID)
			return waking || s == "running", "state " + s
		})
		drip := startBodyDrip(conn, body, 200*time.Millisecond)

		// Other held requests get the app while the body still drips.
		var wg sync.WaitGroup
		codes := make(chan string, 5)
		for range 5 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				status, err := h.previewCode(h.Host(sleeping.ID, 8080), gatewaytest.APIHeader())
				codes <- fmt.Sprintf("%d %v", status, err)
			}()
		}
		wg.Wait()
		close(codes)
		for c := range codes {
			if c != "200 <nil>" {
				t.Errorf("held request while another's body drips: %s, want 200", c)
			}
		}
		if s := h.State(sleeping.ID); s != "running" {
			t.Errorf("state %s while a held request's body drips, want running: the wake waited for the body", s)
		}
		sent := drip.finish()
		if sent >= bodyLen {
			t.Fatalf("the whole body dripped before the others were served; the test proved nothing")
		}
		t.Logf("%d of %d body bytes dripped while 5 other held requests got 200", sent, bodyLen)
		if _, err := io.WriteString(conn, body[sent:]); err != nil {
			t.Fatalf("sending the rest of the body: %v", err)
		}
		conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("reading the slow request's response: %v", err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(got) != "POST\n"+body {
			t.Fatalf("slow-body request: %d %.200q, want 200 and its body echoed whole", resp.StatusCode, got)
		}
	})
}

// bodyDrip writes a body one byte every interval until finish.
type bodyDrip struct {
	stop chan struct{}
	done chan int
}

func startBodyDrip(conn net.Conn, body string, interval time.Duration) *bodyDrip {
	d := &bodyDrip{stop: make(chan struct{}), done: make(chan int, 1)}
	go func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		sent := 0
		defer func() { d.done <- sent }()
		for sent < len(body) {
			select {
			case <-d.stop:
				return
			case <-tick.C:
			}
			if _, err := conn.Write([]byte{body[sent]}); err != nil {
				return
			}
			sent++
		}
	}()
	return d
}

// finish stops the drip and returns how many bytes it sent.
func (d *bodyDrip) finish() int {
	close(d.stop)
	return <-d.done
}
