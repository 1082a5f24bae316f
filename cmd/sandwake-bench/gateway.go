package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandwake/sandwake/internal/testenv"
)

// benchToken is the API token of the gateways the bench starts; they listen
// on loopback only.
const benchToken = "sandwake-bench-token"

// gateway is the built Caddy running as its own process with a generated
// Caddyfile: a sandwake_preview site, the API, optionally a plain
// reverse_proxy site (the baseline) and the admin endpoint, all on loopback.
type gateway struct {
	bin, dir    string
	storage     string // sandwake's Badger directory
	previewPort int
	apiPort     int
	adminPort   int    // 0: admin off
	basePort    int    // port of the plain reverse_proxy site
	baseTo      string // its upstream; "" = no baseline site
	baseHost    string // the Host it sends upstream; "" = the client's
	twinPort    int    // port of a second plain reverse_proxy site
	twinTo      string // its upstream (a published port); "" = none
	extra       string // extra lines in the sandwake global option
	unlabelled  bool   // no label option (engine kubernetes refuses it)

	cmd    *exec.Cmd
	log    *os.File
	exited chan struct{}
}

// startGateway starts a gateway of the bench's caddy in the bench's
// directory name, with extra in its global options, and counts it among
// the gateways the bench stops at its end (the caller may stop it first).
func (b *bench) startGateway(ctx context.Context, name, extra string, admin bool) (*gateway, error) {
	g, err := newGateway(b.o.caddy, filepath.Join(b.tmp, name), admin)
	if err != nil {
		return nil, err
	}
	g.extra = extra
	b.gateways = append(b.gateways, g)
	if err := g.start(ctx, g.apiReady); err != nil {
		return nil, err
	}
	return g, nil
}

func newGateway(bin, dir string, admin bool) (*gateway, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	g := &gateway{bin: bin, dir: dir, storage: filepath.Join(dir, "sandwake")}
	var err error
	for _, p := range []*int{&g.previewPort, &g.apiPort, &g.basePort, &g.twinPort} {
		if *p, err = freePort(); err != nil {
			return nil, err
		}
	}
	if admin {
		if g.adminPort, err = freePort(); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// handedOut holds the ports freePort gave in this run: a port is free again
// once its probe closes, and the kernel may hand it to the next probe, so
// that two listeners of one run (a node's admin and peer ports, say) would
// collide at start.
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// freePort returns a loopback port no listener holds now and that this run
// has not handed out before.
func freePort() (int, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !handedOut.ports[port] {
			handedOut.ports[port] = true
			return port, nil
		}
	}
	return 0, errors.New("no free loopback port that this run has not used")
}

// caddyfile renders the gateway's configuration. Idle tiers are off so that
// nothing sleeps in the middle of a measurement.
// The bench's clients all come from 127.0.0.1, standing for many visitors:
// the per-client budgets, which would count them as one, are off.
func (g *gateway) caddyfile() string {
	admin := "admin off"
	if g.adminPort != 0 {
		admin = fmt.Sprintf("admin 127.0.0.1:%d", g.adminPort)
	}
	label := fmt.Sprintf("\n\t\tlabel %s %s", testenv.LabelRun, testenv.RunID())
	if g.unlabelled {
		label = ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, `{
	%s
	persist_config off
	auto_https off
	storage file_system %s
	sandwake {
		storage %s
		preview_url http://*.preview.localhost:%d%s
		wake_rate_per_client 0
		max_held_per_client 0
		%s
	}
}
http://*.preview.localhost:%d {
	bind 127.0.0.1
	sandwake_preview
}
http://127.0.0.1:%d {
	bind 127.0.0.1
	sandwake_api {
		token %s
	}
}
`, admin, filepath.Join(g.dir, "caddy"), g.storage, g.previewPort, label,
		withDefaults(g.extra), g.previewPort, g.apiPort, benchToken)
	if g.baseTo != "" {
		var host string
		if g.baseHost != "" {
			host = fmt.Sprintf(" {\n\t\theader_up Host %s\n\t}", g.baseHost)
		}
		fmt.Fprintf(&b, `http://127.0.0.1:%d {
	bind 127.0.0.1
	reverse_proxy %s%s
}
`, g.basePort, g.baseTo, host)
	}
	if g.twinTo != "" {
		fmt.Fprintf(&b, `http://127.0.0.1:%d {
	bind 127.0.0.1
	reverse_proxy %s
}
`, g.twinPort, g.twinTo)
	}
	return b.String()
}

// start runs Caddy and waits until ready reports true (Caddy answering as
// wanted) or 60 s pass.
func (g *gateway) start(ctx context.Context, ready func() bool) error {
	path := filepath.Join(g.dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(g.caddyfile()), 0o600); err != nil {
		return err
	}
	var err error
	if g.log, err = os.Create(filepath.Join(g.dir, "caddy.log")); err != nil {
		return err
	}
	g.cmd = exec.Command(g.bin, "run", "--config", path, "--adapter", "caddyfile")
	g.cmd.Stdout, g.cmd.Stderr = g.log, g.log
	g.cmd.Env = append(os.Environ(), "HOME="+g.dir, "XDG_DATA_HOME="+g.dir, "XDG_CONFIG_HOME="+g.dir)
	// Caddy goes with the bench, whatever ends it.
	g.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := g.cmd.Start(); err != nil {
		return fmt.Errorf("starting caddy: %w", err)
	}
	g.exited = make(chan struct{})
	go func() {
		g.cmd.Wait()
		close(g.exited)
	}()
	deadline := time.Now().Add(60 * time.Second)
	for !ready() {
		select {
		case <-g.exited:
			return fmt.Errorf("caddy exited at start:\n%s", g.logTail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("caddy not ready after 60s:\n%s", g.logTail())
		}
	}
	return nil
}

// apiReady reports whether the API answers readyz (store open, Docker
// reachable, boot reconcile done).
func (g *gateway) apiReady() bool {
	code, _, err := g.api(context.Background(), "GET", "/v1/readyz", nil, nil)
	return err == nil && code == 200
}

// stop ends Caddy gracefully (sandwake flushes and closes its store), killing
// it after 10 s.
func (g *gateway) stop() {
	if g.cmd == nil || g.cmd.Process == nil {
		return
	}
	select {
	case <-g.exited:
	default:
		g.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-g.exited:
		case <-time.After(10 * time.Second):
			g.cmd.Process.Kill()
			<-g.exited
		}
	}
	g.log.Close()
	if d := os.Getenv("SANDWAKE_BENCH_KEEP_LOG"); d != "" {
		b, _ := os.ReadFile(g.log.Name())
		os.WriteFile(filepath.Join(d, fmt.Sprintf("caddy-%d.log", g.previewPort)), b, 0o644)
	}
}

// logTail is the end of Caddy's log, for error messages.
func (g *gateway) logTail() string {
	b, _ := os.ReadFile(g.log.Name())
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// reload loads the current Caddyfile through the admin endpoint: a config
// reload, which keeps the sandwake engine (and its sandboxes) as they are.
func (g *gateway) reload(ctx context.Context) error {
	if g.adminPort == 0 {
		return errors.New("reload needs the admin endpoint")
	}
	cfg := g.caddyfile()
	if err := os.WriteFile(filepath.Join(g.dir, "Caddyfile"), []byte(cfg), 0o600); err != nil {
		return err
	}
	req, _ := http.NewRequestWithContext(ctx, "POST", g.adminURL("/load"), strings.NewReader(cfg))
	req.Header.Set("Content-Type", "text/caddyfile")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("reloading caddy: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("reloading caddy: %s: %s", resp.Status, b)
	}
	return nil
}

func (g *gateway) adminURL(path string) string {
	return fmt.Sprintf("http://127.0.0.1:%d%s", g.adminPort, path)
}

var apiClient = &http.Client{Timeout: 2 * time.Minute}

// api calls the management API, decoding a JSON answer into out when given.
func (g *gateway) api(ctx context.Context, method, path string, body, out any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, fmt.Sprintf("http://127.0.0.1:%d%s", g.apiPort, path), rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+benchToken)
	resp, err := apiClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, b, err
	}
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, b, fmt.Errorf("%s %s: decoding %q: %w", method, path, b, err)
		}
	}
	return resp.StatusCode, b, nil
}

// record is what the bench reads of an API record.
type record struct {
	ID      string `json:"id"`
	State   string `json:"state"`
	Error   string `json:"error"`
	Address string `json:"address"`
}

// address is sandbox id's own address on the sandbox network, port 8080:
// what the gateway dials in upstream mode direct.
func (g *gateway) address(ctx context.Context, id string) (string, error) {
	var rec record
	code, body, err := g.api(ctx, "GET", "/v1/sandboxes/"+id, nil, &rec)
	if err != nil {
		return "", err
	}
	if code != 200 || rec.Address == "" {
		return "", fmt.Errorf("sandbox %s has no address: %d %s", id, code, body)
	}
	return net.JoinHostPort(rec.Address, "8080"), nil
}

// act calls POST /v1/sandboxes/{id}/{op} and checks the state it ends in.
func (g *gateway) act(ctx context.Context, id, op, want string) error {
	var rec record
	code, body, err := g.api(ctx, "POST", "/v1/sandboxes/"+id+"/"+op, nil, &rec)
	if err != nil {
		return fmt.Errorf("%s %s: %w", op, id, err)
	}
	if code != 200 || rec.State != want {
		return fmt.Errorf("%s %s: %d %s", op, id, code, body)
	}
	return nil
}

// createSandbox creates a running sandbox of image through the API.
func (g *gateway) createSandbox(ctx context.Context, id, image string, memoryMB int) error {
	return g.createSandboxWith(ctx, id, image, memoryMB, nil)
}

// createSandboxWith is createSandbox with more fields of the create body
// (an egress policy, say).
func (g *gateway) createSandboxWith(ctx context.Context, id, image string, memoryMB int, extra map[string]any) error {
	var rec record
	req := map[string]any{"id": id, "image": image, "ports": []int{8080}, "memory_mb": memoryMB}
	for k, v := range extra {
		req[k] = v
	}
	code, body, err := g.api(ctx, "POST", "/v1/sandboxes", req, &rec)
	if err != nil {
		return fmt.Errorf("creating sandbox %s: %w", id, err)
	}
	if code != http.StatusCreated || rec.State != "running" {
		return fmt.Errorf("creating sandbox %s: %d %s", id, code, body)
	}
	return nil
}

// previewURL is the URL of path on sandbox id's port 8080.
func (g *gateway) previewURL(id, path string) string {
	return fmt.Sprintf("http://%s:%d%s", previewHost(id), g.previewPort, path)
}

// previewHost is the preview host of sandbox id's port 8080.
func previewHost(id string) string { return "s-" + id + "-8080.preview.localhost" }

// baseURL is the URL of path on the plain reverse_proxy site.
func (g *gateway) baseURL(path string) string {
	return fmt.Sprintf("http://127.0.0.1:%d%s", g.basePort, path)
}

// twinURL is the URL of path on the second plain reverse_proxy site.
func (g *gateway) twinURL(path string) string {
	return fmt.Sprintf("http://127.0.0.1:%d%s", g.twinPort, path)
}

// rss is the resident set size of the Caddy process, from /proc.
func (g *gateway) rss() (int64, error) { return g.status("VmRSS") }

// rssAnon is the anonymous part of the RSS: without the pages of mapped
// files (Badger's tables and value log), which the kernel can drop.
func (g *gateway) rssAnon() (int64, error) { return g.status("RssAnon") }

// status reads a size field of the Caddy process's /proc status.
func (g *gateway) status(field string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", g.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no %s in /proc status", field)
}

// cpuTime is the CPU time (user + system, all threads) the Caddy process
// has used, from /proc (in ticks of 10 ms).
func (g *gateway) cpuTime() (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", g.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	return parseStatCPU(string(b))
}

// parseStatCPU reads utime + stime from a /proc/<pid>/stat line. The fields
// are counted after the command name, which may hold spaces.
func parseStatCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("malformed /proc stat")
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	var ticks int64
	for _, s := range f[11:13] { // fields 14 and 15: utime, stime
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += n
	}
	const userHZ = 100 // USER_HZ, 100 on Linux
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// heapInUse forces a garbage collection in Caddy (the heap profile's gc=1)
// and returns the heap in use afterwards, from the admin endpoint's expvar
// memstats.
func (g *gateway) heapInUse(ctx context.Context) (int64, error) {
	for _, p := range []string{"/debug/pprof/heap?gc=1", "/debug/vars"} {
		req, _ := http.NewRequestWithContext(ctx, "GET", g.adminURL(p), nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			return 0, fmt.Errorf("GET %s: %d %v", p, resp.StatusCode, err)
		}
		if p == "/debug/vars" {
			var v struct {
				Memstats struct{ HeapInuse int64 }
			}
			if err := json.Unmarshal(b, &v); err != nil {
				return 0, err
			}
			return v.Memstats.HeapInuse, nil
		}
	}
	return 0, nil
}

// loopbackClient returns a client that dials 127.0.0.1 whatever the host
// (preview hosts are *.localhost), keeping up to conns idle connections.
func loopbackClient(conns int) *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second}
	return &http.Client{
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				_, port, err := net.SplitHostPort(addr)
				if err != nil {
					return nil, err
				}
				return d.DialContext(ctx, network, net.JoinHostPort("127.0.0.1", port))
			},
			MaxIdleConns:        0,
			MaxIdleConnsPerHost: conns,
			DisableCompression:  true,
			Proxy:               nil,
		},
		Timeout:       2 * time.Minute,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// benchDefaults are the sandwake options of every bench gateway unless its
// extra lines set them (an option may be given once).
var benchDefaults = []string{"idle_pause 0", "idle_stop 0", "stop_timeout 2s"}

// withDefaults returns extra preceded by the defaults it does not set.
func withDefaults(extra string) string {
	set := map[string]bool{}
	for _, line := range strings.Split(extra, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			set[f[0]] = true
		}
	}
	var lines []string
	for _, d := range benchDefaults {
		if !set[strings.Fields(d)[0]] {
			lines = append(lines, d)
		}
	}
	return strings.Join(append(lines, extra), "\n\t\t")
}
