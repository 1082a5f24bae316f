package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// dialHandler serves /dial?addr=host:port[&proto=udp][&hold=20s]: the
// sandbox opens an outbound connection, as code in a sandbox would, and
// says what happened. TCP: connect, send "ping\n", read a line back.
// UDP: send "ping\n", wait for one datagram. With hold, a TCP connection is
// kept, writing a line every 50ms and reading its echo, until hold ends
// ("held …") or the connection breaks ("cut after N lines: …"). 200 with
// "ok <reply>" on success, 502 with the error otherwise.
func dialHandler(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	addr, proto := q.Get("addr"), q.Get("proto")
	if proto == "" {
		proto = "tcp"
	}
	w.Header().Set("Content-Type", "text/plain")
	c, err := net.DialTimeout(proto, addr, 3*time.Second)
	if err != nil {
		http.Error(w, "dial: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	rd := bufio.NewReader(c)
	reply, err := roundTrip(c, rd)
	if err != nil {
		http.Error(w, "exchange: "+err.Error(), http.StatusBadGateway)
		return
	}
	hold, _ := time.ParseDuration(q.Get("hold"))
	if hold <= 0 || proto != "tcp" {
		fmt.Fprintf(w, "ok %s\n", reply)
		return
	}
	// The handshake above is the signal the test waits for on its side.
	end := time.Now().Add(hold)
	for n := 1; time.Now().Before(end); n++ {
		c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := roundTrip(c, rd); err != nil {
			http.Error(w, fmt.Sprintf("cut after %d lines: %v", n, err), http.StatusBadGateway)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Fprintf(w, "held %s\n", hold)
}

func roundTrip(c net.Conn, rd *bufio.Reader) (string, error) {
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return "", err
	}
	if _, ok := c.(*net.UDPConn); ok {
		buf := make([]byte, 512)
		n, err := c.Read(buf)
		return strings.TrimSpace(string(buf[:n])), err
	}
	line, err := rd.ReadString('\n')
	return strings.TrimSpace(line), err
}

// startDial is what dialAtStart saw: the app's very first connection,
// made before it listens (so before any readiness probe can pass).
var startDial string

// dialAtStart connects to addr, if set, as the app's first act, and
// records "ok <ms>ms <reply>" or the error with the time it took.
func dialAtStart(addr string) {
	if addr == "" {
		return
	}
	start := time.Now()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		startDial = fmt.Sprintf("failed %dms %v", time.Since(start).Milliseconds(), err)
		return
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	reply, err := roundTrip(c, bufio.NewReader(c))
	if err != nil {
		startDial = fmt.Sprintf("failed %dms %v", time.Since(start).Milliseconds(), err)
		return
	}
	startDial = fmt.Sprintf("ok %dms %s", time.Since(start).Milliseconds(), reply)
}

func startDialHandler(w http.ResponseWriter, r *http.Request) {
	fmt.Fprintln(w, startDial)
}

// lookupHandler serves /lookup?name=n[&server=addr:53][&proto=udp|tcp]:
// the sandbox looks n up (IPv4), through its resolv.conf or, with server,
// straight at that server, and answers "ok <addr> …" or 502 with the
// error.
func lookupHandler(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	res := net.DefaultResolver
	if server := q.Get("server"); server != "" {
		proto := q.Get("proto")
		if proto == "" {
			proto = "udp"
		}
		res = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, proto, server)
		}}
	}
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	addrs, err := res.LookupIP(ctx, "ip4", q.Get("name"))
	if err != nil {
		http.Error(w, "lookup: "+err.Error(), http.StatusBadGateway)
		return
	}
	out := make([]string, len(addrs))
	for i, a := range addrs {
		out[i] = a.String()
	}
	fmt.Fprintf(w, "ok %s\n", strings.Join(out, " "))
}

// dialsHandler serves /dials?addr=name:port&n=N: N lookups each followed
// by a connect and an exchange, as fast as they go; it answers
// "ok <n> refused <r> failed <f>" (refused: the connect failed after the
// lookup succeeded; failed: the lookup did).
func dialsHandler(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	n, _ := strconv.Atoi(q.Get("n"))
	host, port, err := net.SplitHostPort(q.Get("addr"))
	if err != nil || n <= 0 {
		http.Error(w, "want addr=name:port and n", http.StatusBadRequest)
		return
	}
	refused, failed := 0, 0
	var first string
	for i := 0; i < n; i++ {
		name := strings.ReplaceAll(host, "{i}", strconv.Itoa(i))
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		addrs, err := net.DefaultResolver.LookupIP(ctx, "ip4", name)
		cancel()
		if err != nil || len(addrs) == 0 {
			failed++
			if first == "" {
				first = fmt.Sprintf("lookup %s: %v", name, err)
			}
			continue
		}
		c, err := net.DialTimeout("tcp", net.JoinHostPort(addrs[0].String(), port), 3*time.Second)
		if err == nil {
			c.SetDeadline(time.Now().Add(3 * time.Second))
			_, err = roundTrip(c, bufio.NewReader(c))
			c.Close()
		}
		if err != nil {
			refused++
			if first == "" {
				first = fmt.Sprintf("connect %s (%s): %v", name, addrs[0], err)
			}
		}
	}
	fmt.Fprintf(w, "ok %d refused %d failed %d %s\n", n, refused, failed, first)
}

// lookupsHandler serves /lookups?name=n&n=N[&server=addr:53]: N lookups
// of n (IPv4), one after the other, through resolv.conf or straight at
// server; it answers "ok p50 <µs> p99 <µs> mean <µs>" or 502 with the
// first error.
func lookupsHandler(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	n, _ := strconv.Atoi(q.Get("n"))
	if n <= 0 {
		http.Error(w, "want n", http.StatusBadRequest)
		return
	}
	res := net.DefaultResolver
	if server := q.Get("server"); server != "" {
		res = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "udp", server)
		}}
	}
	took := make([]time.Duration, 0, n)
	var total time.Duration
	for i := 0; i < n; i++ {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		start := time.Now()
		_, err := res.LookupIP(ctx, "ip4", q.Get("name"))
		d := time.Since(start)
		cancel()
		if err != nil {
			http.Error(w, "lookup: "+err.Error(), http.StatusBadGateway)
			return
		}
		took = append(took, d)
		total += d
	}
	slices.Sort(took)
	fmt.Fprintf(w, "ok p50 %d p99 %d mean %d\n", took[n/2].Microseconds(), took[n*99/100].Microseconds(), (total / time.Duration(n)).Microseconds())
}

// startFetch is what fetchAtStart saw: the app's first request to another
// server (a service of its group), made before it listens.
var startFetch string

// fetchAtStart GETs url, if set, as the app's first act, and records
// "ok <status> <body>" or the error.
func fetchAtStart(url string) {
	if url == "" {
		return
	}
	c := &http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		startFetch = "failed " + err.Error()
		return
	}
	defer resp.Body.Close()
	b := make([]byte, 256)
	n, _ := resp.Body.Read(b)
	startFetch = fmt.Sprintf("ok %d %s", resp.StatusCode, strings.TrimSpace(string(b[:n])))
}

// fetchHandler serves /fetch?url=u: the app GETs u (a service of its
// group on localhost) and answers "ok <status> <body>", and /startfetch
// what its first fetch at start saw.
func fetchHandler(w http.ResponseWriter, r *http.Request) {
	c := &http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(r.URL.Query().Get("url"))
	if err != nil {
		http.Error(w, "fetch: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	b := make([]byte, 256)
	n, _ := resp.Body.Read(b)
	fmt.Fprintf(w, "ok %d %s\n", resp.StatusCode, strings.TrimSpace(string(b[:n])))
}

func startFetchHandler(w http.ResponseWriter, r *http.Request) {
	fmt.Fprintln(w, startFetch)
}

// cardPage is a page with link-preview tags, some needing escaping, and
// an og:image on its own host (/og.png).
const cardPage = `<!doctype html><html><head><meta charset="utf-8">
<title>Tom &amp; Jerry's "<preview>"</title>
<meta name="description" content="A card with &lt;tags&gt; &amp; &quot;quotes&quot;">
<meta property="og:title" content="Tom &amp; Jerry &lt;3">
<meta property="og:image" content="/og.png">
<meta name="twitter:card" content="summary_large_image">
</head><body><h1>card</h1></body></html>`

// ogPNG is a 1×1 PNG.
var ogPNG = []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89\x00\x00\x00\rIDATx\x9cc\xf8\x0f\x00\x00\x01\x01\x00\x05\x18\xd8N\x00\x00\x00\x00IEND\xaeB`\x82")

func cardHandler(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	fmt.Fprint(w, cardPage)
}

func ogHandler(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "image/png")
	w.Write(ogPNG)
}
