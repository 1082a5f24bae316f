package main

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"
)

// This file is the sandbox side of the denial-flood test: UDP datagrams
// to many distinct destinations, each a refused destination to a sandbox
// under the none policy (its firewall drops them in the kernel).

// flood is the state of the one flood a sandbox runs.
var flood struct {
	mu      sync.Mutex
	running bool
	sent    int
	errs    int
}

// floodHandler serves /flood?net=198.51.100.0/24&port=10000&rate=1000&for=60s:
// in the background, one datagram a destination to every address of net
// and then the next port, rate destinations a second, for the duration;
// it answers "started" at once (409 while one runs). /flood?status=1
// answers "running|done sent <n> errors <e>".
func floodHandler(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	flood.mu.Lock()
	defer flood.mu.Unlock()
	if q.Get("status") != "" {
		state := "done"
		if flood.running {
			state = "running"
		}
		fmt.Fprintf(w, "%s sent %d errors %d\n", state, flood.sent, flood.errs)
		return
	}
	prefix, err := netip.ParsePrefix(q.Get("net"))
	port, _ := strconv.Atoi(q.Get("port"))
	rate, _ := strconv.Atoi(q.Get("rate"))
	d, derr := time.ParseDuration(q.Get("for"))
	if err != nil || !prefix.Addr().Is4() || prefix.Bits() > 30 || port <= 0 || rate <= 0 || derr != nil {
		http.Error(w, "want net=<IPv4 prefix> port=<first port> rate=<per second> for=<duration>", http.StatusBadRequest)
		return
	}
	if flood.running {
		http.Error(w, "a flood is running", http.StatusConflict)
		return
	}
	flood.running, flood.sent, flood.errs = true, 0, 0
	go runFlood(prefix.Masked(), port, rate, d)
	fmt.Fprintln(w, "started")
}

func runFlood(prefix netip.Prefix, port, rate int, d time.Duration) {
	defer func() {
		flood.mu.Lock()
		flood.running = false
		flood.mu.Unlock()
	}()
	c, err := net.ListenUDP("udp4", nil)
	if err != nil {
		flood.mu.Lock()
		flood.errs++
		flood.mu.Unlock()
		return
	}
	defer c.Close()
	first := prefix.Addr().Next() // not the network address
	addr := first
	end := time.Now().Add(d)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	perTick := max(rate/100, 1)
	for now := range tick.C {
		if now.After(end) {
			return
		}
		sent, errs := 0, 0
		for range perTick {
			if _, err := c.WriteToUDPAddrPort([]byte("ping\n"), netip.AddrPortFrom(addr, uint16(port))); err != nil {
				errs++
			} else {
				sent++
			}
			addr = addr.Next()
			if !prefix.Contains(addr.Next()) { // skip the broadcast address
				addr, port = first, port+1
			}
		}
		flood.mu.Lock()
		flood.sent += sent
		flood.errs += errs
		flood.mu.Unlock()
	}
}
