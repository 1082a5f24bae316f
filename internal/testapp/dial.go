package main

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
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
