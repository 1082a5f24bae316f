package etcdtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Binary is the etcd server the clusters run.
const Binary = "/usr/bin/etcd"

// startTimeout bounds how long a cluster may take to elect a leader.
const startTimeout = 20 * time.Second

// Cluster is a running etcd cluster of a test (Start) or of a program
// (Launch).
type Cluster struct {
	t       testing.TB // nil for a cluster from Launch
	token   string
	initial string // --initial-cluster
	members []*member
	// Certs are the cluster's CA and certificates; nil for a plaintext
	// cluster (StartPlaintext).
	Certs *Certs
	tls   *tls.Config // the client TLS of Certs
}

// clusters maps each client URL of a running TLS cluster to its client
// TLS, so that helpers given only endpoints can dial them (ClientTLS).
var clusters sync.Map

// ClientTLS is the client TLS configuration (CA and client certificate) of
// the cluster serving endpoints, nil for a plaintext one.
func ClientTLS(endpoints []string) *tls.Config {
	if len(endpoints) == 0 {
		return nil
	}
	if v, ok := clusters.Load(endpoints[0]); ok {
		return v.(*tls.Config)
	}
	return nil
}

// member is one etcd process; its ports and data dir survive restarts.
type member struct {
	name      string
	dir       string
	clientURL string
	peerURL   string
	certs     *Certs // nil: plaintext

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd exits
	out  *tailBuffer
}

// Start launches an n-member cluster over TLS, with client certificates
// required (Certs; ClientTLS gives a client's configuration), and waits
// until every member reports healthy. Everything is stopped and removed
// when t ends.
func Start(t testing.TB, n int) *Cluster {
	t.Helper()
	return start(t, n, true)
}

// StartPlaintext is Start without TLS: plain http:// endpoints, no client
// authentication.
func StartPlaintext(t testing.TB, n int) *Cluster {
	t.Helper()
	return start(t, n, false)
}

func start(t testing.TB, n int, withTLS bool) *Cluster {
	t.Helper()
	if _, err := os.Stat(Binary); err != nil {
		if os.Getenv("SANDWAKE_REQUIRE_DOCKER") == "1" {
			t.Fatalf("etcd required (SANDWAKE_REQUIRE_DOCKER=1) but %s is missing: %v (make tools installs etcd-server)", Binary, err)
		}
		t.Skipf("etcd not installed (%v); set SANDWAKE_REQUIRE_DOCKER=1 to fail instead", err)
	}
	var certs *Certs
	if withTLS {
		var err error
		if certs, err = NewCerts(t.TempDir()); err != nil {
			t.Fatalf("etcd certificates: %v", err)
		}
	}
	c, err := launchRetrying(n, certs, func(int) (string, error) { return memDir(t), nil })
	if err != nil {
		t.Fatalf("starting a %d-member etcd cluster: %v", n, err)
	}
	c.t = t
	// Registered after the temp dirs, so it runs before they are removed.
	t.Cleanup(func() {
		c.Close()
		if t.Failed() {
			for _, m := range c.members {
				t.Logf("etcd member %s output (tail):\n%s", m.name, m.out.String())
			}
		}
	})
	return c
}

// memDir is a new data directory for a member of a test's cluster, on
// /dev/shm where it is a tmpfs: etcd fsyncs every write, and on a disk the
// rest of the suite keeps busy (Docker, Badger, image imports) a leader
// once missed its heartbeats for 30-40 s ("leader is overloaded likely
// from slow disk"), which no node could start through. Elsewhere, the
// test's own temporary directory. Removed after the cluster is closed.
func memDir(t testing.TB) string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		if dir, err := os.MkdirTemp("/dev/shm", "sandwake-etcd-"); err == nil {
			t.Cleanup(func() { os.RemoveAll(dir) })
			return dir
		}
	}
	return t.TempDir()
}

// Launch starts an n-member cluster outside a test, each member's data in
// its own new directory under dir, and waits until every member reports
// healthy. The caller stops it with Close; the processes are also killed
// if the calling program dies first.
func Launch(n int, dir string) (*Cluster, error) {
	if _, err := os.Stat(Binary); err != nil {
		return nil, fmt.Errorf("etcd not installed (make tools installs etcd-server): %w", err)
	}
	certDir, err := os.MkdirTemp(dir, "etcd-certs-")
	if err != nil {
		return nil, err
	}
	certs, err := NewCerts(certDir)
	if err != nil {
		return nil, fmt.Errorf("etcd certificates: %w", err)
	}
	c, err := launchRetrying(n, certs, func(int) (string, error) { return os.MkdirTemp(dir, "etcd-") })
	if err != nil {
		return nil, fmt.Errorf("starting a %d-member etcd cluster: %w", n, err)
	}
	return c, nil
}

// Close kills every member and waits for them to exit. The data dirs are
// left to their owner (the test's temp dirs, or Launch's dir).
func (c *Cluster) Close() {
	for _, m := range c.members {
		m.kill()
		clusters.Delete(m.clientURL)
	}
}

// Output is the end of member i's output, for error reports.
func (c *Cluster) Output(i int) string {
	return c.members[i].out.String()
}

// launchRetrying launches a cluster, again on new ports when one of those
// it picked was taken meanwhile.
func launchRetrying(n int, certs *Certs, dataDir func(i int) (string, error)) (*Cluster, error) {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		c, err := launch(n, certs, dataDir)
		if err == nil {
			return c, nil
		}
		lastErr = err
		if !errors.Is(err, errAddrInUse) {
			break
		}
	}
	return nil, lastErr
}

var errAddrInUse = errors.New("address already in use")

// launch starts n fresh members on new ports and waits for health; on
// failure it stops what it started.
func launch(n int, certs *Certs, dataDir func(i int) (string, error)) (*Cluster, error) {
	c := &Cluster{token: "sw-etcd-" + randomHex(6), Certs: certs}
	scheme := "http"
	if certs != nil {
		scheme = "https"
		var err error
		if c.tls, err = certs.ClientTLS(); err != nil {
			return nil, err
		}
	}
	var initial []string
	for i := range n {
		cport, err := freePort()
		if err != nil {
			return nil, err
		}
		pport, err := freePort()
		if err != nil {
			return nil, err
		}
		dir, err := dataDir(i)
		if err != nil {
			return nil, fmt.Errorf("etcd data dir: %w", err)
		}
		m := &member{
			name:      fmt.Sprintf("m%d", i),
			dir:       dir,
			clientURL: fmt.Sprintf("%s://127.0.0.1:%d", scheme, cport),
			peerURL:   fmt.Sprintf("%s://127.0.0.1:%d", scheme, pport),
			certs:     certs,
		}
		c.members = append(c.members, m)
		initial = append(initial, m.name+"="+m.peerURL)
	}
	c.initial = strings.Join(initial, ",")
	for _, m := range c.members {
		if err := m.start(c.token, c.initial); err != nil {
			c.Close()
			return nil, err
		}
	}
	if err := c.waitHealthy(startTimeout); err != nil {
		inUse := false
		for _, m := range c.members {
			if strings.Contains(m.out.String(), "address already in use") {
				inUse = true
			}
		}
		c.Close()
		if inUse {
			return nil, fmt.Errorf("%w: %v", errAddrInUse, err)
		}
		return nil, err
	}
	if c.tls != nil {
		for _, m := range c.members {
			clusters.Store(m.clientURL, c.tls)
		}
	}
	return c, nil
}

// Endpoints are the members' client URLs.
func (c *Cluster) Endpoints() []string {
	out := make([]string, len(c.members))
	for i, m := range c.members {
		out[i] = m.clientURL
	}
	return out
}

// Kill stops member i with SIGKILL and waits until it is gone.
func (c *Cluster) Kill(i int) {
	c.members[i].kill()
}

// Stop stops member i with SIGTERM (SIGKILL after 10 s) and waits.
func (c *Cluster) Stop(i int) {
	m := c.members[i]
	m.mu.Lock()
	cmd, done := m.cmd, m.done
	m.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		m.kill()
	}
	m.mu.Lock()
	m.cmd = nil
	m.mu.Unlock()
}

// Restart starts member i again with its data dir and ports. It does not
// wait for health: a member alone cannot serve until a quorum is back
// (see WaitHealthy). Only for a cluster from Start: it fails the test.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	m := c.members[i]
	m.mu.Lock()
	running := m.cmd != nil
	m.mu.Unlock()
	if running {
		c.t.Fatalf("etcd member %s is still running", m.name)
	}
	var err error
	for attempt := 0; attempt < 20; attempt++ {
		// The same ports are needed; one just freed may take a moment.
		if err = m.start(c.token, c.initial); err == nil {
			if err = m.waitListening(5 * time.Second); err == nil {
				return
			}
			m.kill() // not listening: this process must not outlive the retry
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.t.Fatalf("restarting etcd member %s: %v", m.name, err)
}

// Leader returns the index of the member that leads the cluster now. Only
// for a cluster from Start: it fails the test when there is none.
func (c *Cluster) Leader() int {
	c.t.Helper()
	for i, m := range c.members {
		m.mu.Lock()
		running := m.cmd != nil
		m.mu.Unlock()
		if !running {
			continue
		}
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.clientURL}, DialTimeout: 2 * time.Second, Logger: zap.NewNop(), TLS: c.tls})
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, err := cli.Status(ctx, m.clientURL)
		cancel()
		_ = cli.Close()
		if err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
			return i
		}
	}
	c.t.Fatal("no etcd member is the leader")
	return -1
}

// WaitHealthy waits until every running member reports healthy (it has a
// leader and answers). Only for a cluster from Start: it fails the test.
func (c *Cluster) WaitHealthy() {
	c.t.Helper()
	if err := c.waitHealthy(startTimeout); err != nil {
		c.t.Fatalf("etcd cluster: %v", err)
	}
}

func (c *Cluster) waitHealthy(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: c.tls}}
	for _, m := range c.members {
		m.mu.Lock()
		running, done := m.cmd != nil, m.done
		m.mu.Unlock()
		if !running {
			continue
		}
		for {
			select {
			case <-done:
				return fmt.Errorf("etcd member %s exited: %s", m.name, lastLine(m.out.String()))
			default:
			}
			if healthy(hc, m.clientURL) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("etcd member %s not healthy within %s: %s", m.name, timeout, lastLine(m.out.String()))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

func healthy(hc *http.Client, url string) bool {
	resp, err := hc.Get(url + "/health")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode == http.StatusOK && bytes.Contains(body, []byte(`"health":"true"`))
}

// waitListening waits until the member's peer and client ports accept
// connections (it serves clients only once a quorum is up).
func (m *member) waitListening(timeout time.Duration) error {
	m.mu.Lock()
	done := m.done
	m.mu.Unlock()
	deadline := time.Now().Add(timeout)
	for _, u := range []string{m.peerURL, m.clientURL} {
		addr := u[strings.Index(u, "://")+3:]
		for {
			select {
			case <-done:
				m.mu.Lock()
				m.cmd = nil
				m.mu.Unlock()
				return fmt.Errorf("etcd member %s exited: %s", m.name, lastLine(m.out.String()))
			default:
			}
			conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
			if err == nil {
				conn.Close()
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("etcd member %s not listening on %s within %s", m.name, addr, timeout)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

// start launches the member's process with the initial cluster (ignored
// by etcd on a restart, when the data dir knows its cluster).
func (m *member) start(token, cluster string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.out == nil {
		m.out = &tailBuffer{max: 16 << 10}
	}
	args := []string{
		"--name", m.name,
		"--data-dir", m.dir,
		"--listen-client-urls", m.clientURL,
		"--advertise-client-urls", m.clientURL,
		"--listen-peer-urls", m.peerURL,
		"--initial-advertise-peer-urls", m.peerURL,
		"--initial-cluster-token", token,
		"--initial-cluster-state", "new",
		// Quick elections on loopback keep member-loss tests short.
		"--heartbeat-interval", "50",
		"--election-timeout", "500",
		"--logger", "zap",
		"--log-level", "warn",
	}
	if c := m.certs; c != nil {
		args = append(args,
			"--cert-file", c.ServerCertFile, "--key-file", c.ServerKey,
			"--client-cert-auth", "--trusted-ca-file", c.CAFile,
			"--peer-cert-file", c.ServerCertFile, "--peer-key-file", c.ServerKey,
			"--peer-client-cert-auth", "--peer-trusted-ca-file", c.CAFile)
	}
	args = append(args, "--initial-cluster", cluster)
	cmd := exec.Command(Binary, args...)
	cmd.Stdout = m.out
	cmd.Stderr = m.out
	// The process dies with the test binary even if cleanup never runs.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting etcd member %s: %w", m.name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	m.cmd, m.done = cmd, done
	return nil
}

// kill SIGKILLs the member and waits for its exit.
func (m *member) kill() {
	m.mu.Lock()
	cmd, done := m.cmd, m.done
	m.cmd = nil
	m.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

// freePort returns a loopback port free at the time of the call.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if len(b.buf) > b.max {
		b.buf = append(b.buf[:0], b.buf[len(b.buf)-b.max:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
