package egress_test

import (
	"bufio"
	"crypto/rand"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// testHosts are hosts of the test's own, in a network namespace it makes:
// a veth pair on a private /30 ("a host of the private network", the
// namespace's end) and an address of 198.18.0.0/15 routed through it ("a
// host of the internet"). Each runs an echo listener on TCP and UDP. All is
// removed when the test ends, whatever its outcome.
type testHosts struct {
	ns       string
	private  netip.Addr // the namespace's end of the /30
	internet netip.Addr // 198.18.x.1 behind it
	// internet2 is a second host of the internet (the next address),
	// for names that resolve to another host.
	internet2 netip.Addr
	port      int // the echo listeners' port, on both addresses
	port2     int // a second TCP echo port on both addresses
	accepted  atomic.Int64
	// veth is the host's end of the pair (in the host's namespace).
	veth string
	// datagrams are the UDP datagrams the hosts received: "<from> <payload>".
	dgMu      sync.Mutex
	datagrams []string
}

// receivedPayload reports whether a datagram with payload came at all,
// from any address.
func (h *testHosts) receivedPayload(payload string) bool {
	h.dgMu.Lock()
	defer h.dgMu.Unlock()
	return slices.ContainsFunc(h.datagrams, func(d string) bool { return strings.HasSuffix(d, " "+payload) })
}

func run(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func newTestHosts(t testing.TB) *testHosts {
	t.Helper()
	b := make([]byte, 3)
	rand.Read(b)
	suffix := fmt.Sprintf("%x", b)
	h := &testHosts{ns: "swt" + suffix}
	x := int(b[0]) | 1 // 1..255, a /30 of 10.254.x.0/24 and 198.18.x.1
	q := int(b[1]%63) * 4
	hostEnd := netip.AddrFrom4([4]byte{10, 254, byte(x), byte(q + 1)})
	h.private = hostEnd.Next()
	h.internet = netip.AddrFrom4([4]byte{198, 18, byte(x), byte(q + 1)})
	h.internet2 = h.internet.Next()
	vethHost, vethNS := "swva"+suffix, "swvb"+suffix
	h.veth = vethHost
	run(t, "ip", "netns", "add", h.ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", h.ns).Run() })
	run(t, "ip", "link", "add", vethHost, "type", "veth", "peer", "name", vethNS)
	t.Cleanup(func() { exec.Command("ip", "link", "del", vethHost).Run() }) // takes its route with it
	run(t, "ip", "link", "set", vethNS, "netns", h.ns)
	run(t, "ip", "addr", "add", hostEnd.String()+"/30", "dev", vethHost)
	run(t, "ip", "link", "set", vethHost, "up")
	run(t, "ip", "netns", "exec", h.ns, "ip", "addr", "add", h.private.String()+"/30", "dev", vethNS)
	run(t, "ip", "netns", "exec", h.ns, "ip", "link", "set", vethNS, "up")
	run(t, "ip", "netns", "exec", h.ns, "ip", "link", "set", "lo", "up")
	run(t, "ip", "netns", "exec", h.ns, "ip", "addr", "add", h.internet.String()+"/32", "dev", "lo")
	run(t, "ip", "netns", "exec", h.ns, "ip", "addr", "add", h.internet2.String()+"/32", "dev", "lo")
	run(t, "ip", "route", "add", h.internet.String()+"/32", "via", h.private.String())
	run(t, "ip", "route", "add", h.internet2.String()+"/32", "via", h.private.String())
	h.listen(t)
	return h
}

// listen opens the echo listeners inside the namespace: a socket belongs
// to the namespace it was made in, whichever thread serves it later.
func (h *testHosts) listen(t testing.TB) {
	t.Helper()
	if err := h.inNS(func() error { return h.openListeners(t) }); err != nil {
		t.Fatalf("listeners in %s: %v", h.ns, err)
	}
}

// inNS runs fn on a thread inside the namespace: sockets it opens belong
// to the namespace.
func (h *testHosts) inNS(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // the thread's namespace changes: it is not reused
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		target, err := os.Open("/var/run/netns/" + h.ns)
		if err != nil {
			errc <- err
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- fn()
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
	}()
	return <-errc
}

func (h *testHosts) openListeners(t testing.TB) error {
	tl, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		return err
	}
	h.port = tl.Addr().(*net.TCPAddr).Port
	tl2, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		return err
	}
	h.port2 = tl2.Addr().(*net.TCPAddr).Port
	// UDP answers must come from the address asked, so one socket each.
	var uls []net.PacketConn
	for _, a := range []netip.Addr{h.internet, h.internet2, h.private} {
		ul, err := net.ListenPacket("udp", netip.AddrPortFrom(a, uint16(h.port)).String())
		if err != nil {
			return err
		}
		uls = append(uls, ul)
	}
	t.Cleanup(func() {
		tl.Close()
		tl2.Close()
		for _, ul := range uls {
			ul.Close()
		}
	})
	for _, l := range []net.Listener{tl, tl2} {
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				h.accepted.Add(1)
				go echo(c)
			}
		}()
	}
	for _, ul := range uls {
		go func() {
			buf := make([]byte, 512)
			for {
				n, from, err := ul.ReadFrom(buf)
				if err != nil {
					return
				}
				if ua, ok := from.(*net.UDPAddr); ok {
					h.dgMu.Lock()
					h.datagrams = append(h.datagrams, ua.AddrPort().Addr().Unmap().String()+" "+string(buf[:n]))
					h.dgMu.Unlock()
				}
				ul.WriteTo(append([]byte("udp "), buf[:n]...), from)
			}
		}()
	}
	return nil
}

func echo(c net.Conn) {
	defer c.Close()
	rd := bufio.NewReader(c)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			return
		}
		if _, err := c.Write([]byte("pong " + line)); err != nil {
			return
		}
	}
}

// hostListener is a listener of the host itself on addr (the sandbox
// network's gateway address): what code in a sandbox must never reach.
func hostListener(t *testing.T, addr netip.Addr) (port int, accepted *atomic.Int64) {
	t.Helper()
	l, err := net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	accepted = new(atomic.Int64)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go echo(c)
		}
	}()
	return l.Addr().(*net.TCPAddr).Port, accepted
}
