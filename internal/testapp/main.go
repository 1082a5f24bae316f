package main

import (
	"context"
	"fmt"
	"html"
	"io"
	"log"
	"maps"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"
)

func main() {
	delay := os.Getenv("STARTUP_DELAY")
	if b, err := os.ReadFile(filepath.Join(envOr("WORKSPACE", "/workspace"), "startup_delay")); err == nil {
		delay = strings.TrimSpace(string(b)) // written through PUT /files/startup_delay: the next start waits
	}
	if d, err := time.ParseDuration(delay); err == nil && d > 0 {
		log.Printf("testapp: waiting %s before listening", d)
		time.Sleep(d)
	}
	dialAtStart(os.Getenv("DIAL_AT_START"))
	fetchAtStart(os.Getenv("FETCH_AT_START"))
	ports := []string{envOr("PORT", "8080")}
	if extra := os.Getenv("EXTRA_PORTS"); extra != "" {
		ports = append(ports, strings.Split(extra, ",")...)
	}
	workspace := envOr("WORKSPACE", "/workspace")
	handler := newMux(workspace)

	servers := make([]*http.Server, 0, len(ports))
	for _, p := range ports {
		// LISTEN_HOST 127.0.0.1 plays a service that listens on loopback
		// only (a database in a group).
		srv := &http.Server{Addr: os.Getenv("LISTEN_HOST") + ":" + strings.TrimSpace(p), Handler: handler, ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, srv)
		go func() {
			if err := srv.ListenAndServe(); err != nil && err != http.ErrServerClosed {
				log.Fatalf("testapp: %v", err)
			}
		}()
		log.Printf("testapp: listening on %s", srv.Addr)
	}

	// As PID 1 in a container, SIGTERM is ignored unless handled: handle it
	// so that docker stop is quick.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, srv := range servers {
		srv.Shutdown(ctx)
	}
}

// held keeps /oom's allocations reachable so the collector cannot free them.
var held [][]byte

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func newMux(workspace string) *http.ServeMux {
	host, _ := os.Hostname()
	mux := http.NewServeMux()
	mux.HandleFunc("/{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!doctype html><html><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">`+
			`<title>sandwake testapp</title></head><body style="font-family:system-ui;margin:3em">`+
			`<h1 id="app">Hello from the sandbox</h1><p>container <code>%s</code>, served at %s</p></body></html>`,
			html.EscapeString(host), time.Now().UTC().Format(time.RFC3339))
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok\n")
	})
	// /wait answers after ms milliseconds; /inflight tells how many /wait
	// requests are being served now and the most there ever were at once
	// (what a gateway's bound on open exchanges is checked by).
	var inflight, maxInflight atomic.Int64
	mux.HandleFunc("/wait", func(w http.ResponseWriter, r *http.Request) {
		n := inflight.Add(1)
		defer inflight.Add(-1)
		for m := maxInflight.Load(); n > m && !maxInflight.CompareAndSwap(m, n); m = maxInflight.Load() {
		}
		ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
		case <-r.Context().Done():
		}
		io.WriteString(w, "waited\n")
	})
	mux.HandleFunc("/inflight", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%d %d\n", inflight.Load(), maxInflight.Load())
	})
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "%s\n%s", r.Method, body)
	})
	mux.HandleFunc("/headers", func(w http.ResponseWriter, r *http.Request) {
		// Values exactly as received, one line per field, names sorted.
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		for _, name := range slices.Sorted(maps.Keys(r.Header)) {
			for _, v := range r.Header[name] {
				fmt.Fprintf(w, "%s: %s\n", name, v)
			}
		}
	})
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			typ, msg, err := c.Read(r.Context())
			if err != nil {
				return
			}
			if err := c.Write(r.Context(), typ, msg); err != nil {
				return
			}
		}
	})
	mux.HandleFunc("/sse", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		if n <= 0 {
			n = 3
		}
		every, err := time.ParseDuration(r.URL.Query().Get("every"))
		if err != nil {
			every = 100 * time.Millisecond
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-store")
		fl, _ := w.(http.Flusher)
		for i := 1; i <= n; i++ {
			fmt.Fprintf(w, "id: %d\ndata: tick %d\n\n", i, i)
			if fl != nil {
				fl.Flush()
			}
			select {
			case <-r.Context().Done():
				return
			case <-time.After(every):
			}
		}
	})
	mux.HandleFunc("/files/{name}", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		if name == "" || name == "." || name == ".." || strings.ContainsAny(name, `/\`) {
			http.Error(w, "bad file name", http.StatusBadRequest)
			return
		}
		p := filepath.Join(workspace, name)
		switch r.Method {
		case http.MethodGet:
			http.ServeFile(w, r, p)
		case http.MethodPut:
			f, err := os.Create(p)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			_, err = io.Copy(f, r.Body)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
		default:
			http.Error(w, "GET or PUT", http.StatusMethodNotAllowed)
		}
	})
	mux.HandleFunc("/dial", dialHandler)
	mux.HandleFunc("/flood", floodHandler)
	mux.HandleFunc("/lookup", lookupHandler)
	mux.HandleFunc("/dials", dialsHandler)
	mux.HandleFunc("/lookups", lookupsHandler)
	mux.HandleFunc("/fetch", fetchHandler)
	mux.HandleFunc("/card", cardHandler)
	mux.HandleFunc("/og.png", ogHandler)
	mux.HandleFunc("/startfetch", startFetchHandler)
	mux.HandleFunc("/self", selfHandler)
	mux.HandleFunc("/raw", rawHandler)
	mux.HandleFunc("/garp", garpHandler)
	mux.HandleFunc("/fill", fillHandler)
	mux.HandleFunc("/gzip", gzipHandler)
	mux.HandleFunc("/startdial", startDialHandler)
	mux.HandleFunc("/exit", func(w http.ResponseWriter, r *http.Request) {
		code, _ := strconv.Atoi(r.URL.Query().Get("code"))
		io.WriteString(w, "exiting\n")
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		}
		go func() {
			time.Sleep(10 * time.Millisecond) // let the answer leave
			os.Exit(code)
		}()
	})
	mux.HandleFunc("/oom", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "allocating\n")
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		}
		go func() {
			for {
				b := make([]byte, 8<<20)
				for i := range b {
					b[i] = byte(i)
				}
				held = append(held, b)
			}
		}()
	})
	return mux
}
