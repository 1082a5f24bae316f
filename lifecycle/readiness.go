package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// Readiness modes of a spec.
const (
	// ReadyHTTP: the port is ready when it gives any HTTP answer (or, with
	// ready_path, an answer below 500).
	ReadyHTTP = "http"
	// ReadyTCP: for non-HTTP ports; the port is ready when a connection is
	// accepted and not closed straight away.
	ReadyTCP = "tcp"
)

// Backoff of the readiness poll: it starts at 5 ms, the order of a paused
// container's thaw, and grows to 250 ms for slow-starting apps.
const (
	readyFirstDelay = 5 * time.Millisecond
	readyMaxDelay   = 250 * time.Millisecond
	readyAttempt    = 2 * time.Second
	// tcpSettle is how long a TCP connection must stay open for the port to
	// count as ready. Docker's userland proxy accepts a connection on a
	// published port before the app listens and closes it at once when the
	// app is not there; an app that listens keeps it open.
	tcpSettle = 50 * time.Millisecond
)

// probeClient is shared by all readiness probes: no keep-alive (each probe is
// a fresh connection, as a real client's first request would be), no
// redirects followed, no proxy from the environment.
var probeClient = &http.Client{
	Transport: &http.Transport{
		Proxy:             nil,
		DisableKeepAlives: true,
		DialContext:       (&net.Dialer{Timeout: readyAttempt}).DialContext,
	},
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// WaitReady polls addr until it is ready according to spec, with backoff,
// until ctx ends. A bare TCP connect proves nothing on a published port (see
// tcpSettle), so HTTP mode waits for an HTTP answer.
func WaitReady(ctx context.Context, addr string, spec *Spec) error {
	return WaitReadyAt(ctx, addr, spec, false)
}

// WaitReadyAt is WaitReady; direct says that addr is the sandbox's own
// address (no userland proxy accepts for the app), where an accepted TCP
// connection means the app listens: readiness is then that accept, unless
// ready_path asks for an HTTP answer below 500.
func WaitReadyAt(ctx context.Context, addr string, spec *Spec, direct bool) error {
	tcp := acceptReady(spec, direct)
	delay := readyFirstDelay
	var last error
	for {
		var err error
		switch {
		case tcp:
			err = probeAccept(ctx, addr)
		case spec.ReadyMode == ReadyTCP:
			err = probeTCP(ctx, addr)
		default:
			err = probeHTTP(ctx, addr, spec.ReadyPath)
		}
		if err == nil {
			return nil
		}
		last = err
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w: %s did not answer: %v", ErrNotReady, addr, last)
		case <-t.C:
		}
		delay = min(delay*3/2, readyMaxDelay)
	}
}

// acceptReady reports whether readiness at a sandbox's own address is an
// accepted connection (direct upstreams, and no HTTP probe asked for).
func acceptReady(spec *Spec, direct bool) bool {
	return direct && (spec.ReadyMode == ReadyTCP || spec.ReadyPath == "")
}

func probeHTTP(ctx context.Context, addr, path string) error {
	ctx, cancel := context.WithTimeout(ctx, readyAttempt)
	defer cancel()
	target := path
	if target == "" {
		target = "/"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+target, nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", "sandwake-readiness")
	resp, err := probeClient.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if path != "" && resp.StatusCode >= 500 {
		return fmt.Errorf("%s answered %d", target, resp.StatusCode)
	}
	return nil
}

func probeTCP(ctx context.Context, addr string) error {
	d := net.Dialer{Timeout: readyAttempt}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(tcpSettle))
	var b [1]byte
	_, err = conn.Read(b[:])
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		return nil // the app sent a banner, or kept the connection open
	}
	return fmt.Errorf("connection closed at once: %w", err)
}

// probeAccept connects to addr: at a sandbox's own address, the kernel of
// the sandbox accepts only where the app listens.
func probeAccept(ctx context.Context, addr string) error {
	d := net.Dialer{Timeout: readyAttempt}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return conn.Close()
}
