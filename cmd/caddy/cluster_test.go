package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/moby/moby/client"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sandwake/sandwake/cluster"
	"github.com/sandwake/sandwake/internal/etcdtest"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/lifecycle/docker"
)

// noRecords is the record source of a cluster client the test only signs
// with.
type noRecords struct{}

func (noRecords) Get(id string) (lifecycle.Record, error) {
	return lifecycle.Record{}, lifecycle.ErrNotFound
}
func (noRecords) List(lifecycle.State) ([]lifecycle.Record, error) { return nil, nil }
func (noRecords) Capacity() cluster.Capacity                       { return cluster.Capacity{} }

// clusterTTL is the nodes' lease TTL in the cluster tests.
const clusterTTL = 2 * time.Second

// clusterSecret signs the test nodes' requests to each other.
const clusterSecret = "cluster-test-secret-0123456789"

// testCluster is a real 3-member etcd and three built Caddy processes as
// three nodes on this machine's Docker engine.
type testCluster struct {
	// t is the running (sub)test; root the test that owns the cluster,
	// which the sandboxes' cleanups are registered on.
	t, root *testing.T
	etcd    *etcdtest.Cluster
	nodes   []*gateway
	names   []string
	cli     *client.Client
	image   string
	bin     string
	// caDir holds the cluster CA; peerPorts and certs are each node's
	// peer listener and credentials.
	caDir     string
	peerPorts []int
	certs     []nodeCert
}

// nodeCert is a node's certificate and key files.
type nodeCert struct{ cert, key string }

// clusterCA makes a cluster CA with the built binary's CLI (`caddy
// sandwake cluster ca`) and answers its directory.
func clusterCA(t *testing.T, bin string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "ca")
	runBinary(t, bin, "sandwake", "cluster", "ca", "--out", dir)
	return dir
}

// issueNodeCert issues node's certificate for 127.0.0.1 with the built
// binary's CLI (`caddy sandwake cluster cert`).
func issueNodeCert(t *testing.T, bin, caDir, node string) nodeCert {
	t.Helper()
	dir := t.TempDir()
	runBinary(t, bin, "sandwake", "cluster", "cert", "--node", node, "--addr", "127.0.0.1", "--ca", caDir, "--out", dir)
	return nodeCert{cert: filepath.Join(dir, node+".crt"), key: filepath.Join(dir, node+".key")}
}

func runBinary(t *testing.T, bin string, args ...string) {
	t.Helper()
	if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
		t.Fatalf("caddy %v: %v\n%s", args, err, out)
	}
}

// peerBlock is the peer part of node's cluster block.
func peerBlock(caDir string, port int, c nodeCert) string {
	return fmt.Sprintf(`peer_listen 127.0.0.1:%d
			peer_ca_file %s
			peer_cert_file %s
			peer_key_file %s`, port, filepath.Join(caDir, "ca.crt"), c.cert, c.key)
}

// clusterSandbox is a sandbox as the cluster API lists it.
type clusterSandbox struct {
	ID    string `json:"id"`
	State string `json:"state"`
	Node  string `json:"node"`
}

func startTestCluster(t *testing.T) *testCluster {
	cli := testenv.Docker(t)
	image := testenv.TestAppImage(t)
	bin := buildCaddy(t)
	tc := &testCluster{t: t, root: t, etcd: etcdtest.Start(t, 3), cli: cli, image: image, bin: bin, caDir: clusterCA(t, bin)}
	prefix := "/sandwake-" + testenv.RunID() + "/"
	for i := range 3 {
		g := newGateway(t, bin, "")
		g.tokens = tenantTokens
		name := fmt.Sprintf("n%d-%s", i+1, testenv.RunID())
		port, cert := freePort(t), issueNodeCert(t, bin, tc.caDir, name)
		g.configure(fmt.Sprintf(`cluster {
			etcd %s
			etcd_ca_file %s
			etcd_cert_file %s
			etcd_key_file %s
			node %s
			%s
			secret %s
			prefix %s
			lease_ttl %s
		}`, strings.Join(tc.etcd.Endpoints(), " "), tc.etcd.Certs.CAFile, tc.etcd.Certs.ClientCertFile, tc.etcd.Certs.ClientKey, name,
			peerBlock(tc.caDir, port, cert), clusterSecret, prefix, clusterTTL))
		tc.nodes = append(tc.nodes, g)
		tc.names = append(tc.names, name)
		tc.peerPorts = append(tc.peerPorts, port)
		tc.certs = append(tc.certs, cert)
	}
	for _, g := range tc.nodes {
		g.start()
	}
	// Every node sees the three live.
	for i, g := range tc.nodes {
		testenv.Eventually(t, 20*time.Second, func() (bool, string) {
			live := tc.liveNodes(g)
			return len(live) == 3, fmt.Sprintf("node %d sees live nodes %v", i+1, live)
		})
	}
	return tc
}

// liveNodes are the nodes g's API lists as live.
func (tc *testCluster) liveNodes(g *gateway) []string {
	var out struct {
		Nodes []struct {
			Name     string `json:"name"`
			Live     bool   `json:"live"`
			Draining bool   `json:"draining"`
		} `json:"nodes"`
	}
	code, _ := g.api("GET", "/v1/nodes", nil, &out)
	var live []string
	if code == 200 {
		for _, n := range out.Nodes {
			if n.Live {
				live = append(live, n.Name)
			}
		}
	}
	return live
}

// sandboxes lists the cluster's sandboxes through g's API, by id.
func (tc *testCluster) sandboxes(g *gateway) map[string]clusterSandbox {
	tc.t.Helper()
	var out struct{ Sandboxes []clusterSandbox }
	if code, body := g.api("GET", "/v1/sandboxes", nil, &out); code != 200 {
		tc.t.Fatalf("list: %d %s", code, body)
	}
	m := map[string]clusterSandbox{}
	for _, s := range out.Sandboxes {
		m[s.ID] = s
	}
	return m
}

// removeSandbox removes what Docker holds of sandbox id at the end.
func (tc *testCluster) removeSandbox(id string) {
	tc.root.Cleanup(func() {
		tc.cli.ContainerRemove(context.Background(), docker.ContainerName(id), client.ContainerRemoveOptions{Force: true})
		tc.cli.VolumeRemove(context.Background(), docker.VolumeName(id), client.VolumeRemoveOptions{Force: true})
	})
}

// createVia creates sandbox id through node i's API and answers the node it
// was placed on.
func (tc *testCluster) createVia(i int, id string) string {
	tc.t.Helper()
	return tc.createViaWith(i, id, nil)
}

// createViaWith is createVia of a sandbox with labels.
func (tc *testCluster) createViaWith(i int, id string, labels map[string]string) string {
	tc.t.Helper()
	tc.removeSandbox(id)
	var out clusterSandbox
	code, body, h := tc.nodes[i].apiDo(crashToken, "POST", "/v1/sandboxes", map[string]any{"id": id, "image": tc.image, "ports": []int{8080}, "memory_mb": 32, "labels": labels}, &out)
	if code != 201 {
		tc.t.Fatalf("create %s via node %d: %d %s", id, i+1, code, body)
	}
	// Where the create's time went, whichever node made it.
	if st := h.Get("Server-Timing"); !strings.HasPrefix(st, "create;dur=") {
		tc.t.Errorf("create %s via node %d (made on %s): Server-Timing %q, want create;dur=…", id, i+1, out.Node, st)
	}
	if !slices.Contains(tc.names, out.Node) {
		tc.t.Fatalf("create %s: node %q is not one of %v", id, out.Node, tc.names)
	}
	return out.Node
}

// createOn creates sandbox id on node i: the others are drained meanwhile,
// so that placement has one choice.
func (tc *testCluster) createOn(i int, id string) {
	tc.t.Helper()
	tc.createOnWith(i, id, nil)
}

// createOnWith is createOn of a sandbox with labels.
func (tc *testCluster) createOnWith(i int, id string, labels map[string]string) {
	tc.t.Helper()
	g := tc.nodes[i]
	drain := func(on bool) {
		for j, name := range tc.names {
			if j == i {
				continue
			}
			if code, body := g.api("POST", "/v1/nodes/"+name+"/drain", map[string]bool{"draining": on}, nil); code != 200 {
				tc.t.Fatalf("drain %s %v: %d %s", name, on, code, body)
			}
		}
		testenv.Eventually(tc.t, 10*time.Second, func() (bool, string) {
			var out struct {
				Nodes []struct {
					Name     string `json:"name"`
					Draining bool   `json:"draining"`
				} `json:"nodes"`
			}
			g.api("GET", "/v1/nodes", nil, &out)
			n := 0
			for _, nd := range out.Nodes {
				if nd.Name != tc.names[i] && nd.Draining == on && slices.Contains(tc.names, nd.Name) {
					n++
				}
			}
			return n == len(tc.names)-1, fmt.Sprintf("%d nodes with draining=%v: %+v", n, on, out.Nodes)
		})
	}
	drain(true)
	defer drain(false)
	if got := tc.createViaWith(i, id, labels); got != tc.names[i] {
		tc.t.Fatalf("sandbox %s placed on %s with every other node draining, want %s", id, got, tc.names[i])
	}
}

// waitEverywhere waits until every gateway's catalog shows sandbox id in
// state on its node.
func (tc *testCluster) waitEverywhere(id, state, node string) {
	tc.t.Helper()
	for i, g := range tc.nodes {
		testenv.Eventually(tc.t, 20*time.Second, func() (bool, string) {
			s := tc.sandboxes(g)[id]
			return s.State == state && s.Node == node, fmt.Sprintf("node %d lists %s as %+v, want %s on %s", i+1, id, s, state, node)
		})
	}
}

// previewPost sends a POST with body to sandbox id through g.
func previewPost(g *gateway, id, path, body string) (int, string, error) {
	req, _ := http.NewRequest("POST", fmt.Sprintf("http://s-%s-8080.preview.localhost:%d%s", id, g.previewPort, path), strings.NewReader(body))
	resp, err := g.previewClient().Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// previewCode sends one GET to sandbox id through g and answers the status
// and the error code of a JSON error (0 and the error when it failed).
func previewCode(c *http.Client, g *gateway, id string, header http.Header) (int, string, error) {
	req, _ := http.NewRequest("GET", fmt.Sprintf("http://s-%s-8080.preview.localhost:%d/healthz", id, g.previewPort), nil)
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	json.Unmarshal(b, &e)
	return resp.StatusCode, e.Error.Code, nil
}

// TestCluster runs three nodes on one etcd and checks that any gateway
// serves any sandbox, that ids are unique cluster-wide, that wakes collapse
// on the owner, and what node and etcd losses do.
func TestCluster(t *testing.T) {
	tc := startTestCluster(t)

	// home is a sandbox per node, made by createOn in "placement".
	home := make([]string, 3)

	// First, while the nodes are equal (empty): three creates in a row,
	// one through each gateway, land on three nodes (issue 32: they all
	// went to one, each gateway seeing the others' placements only at the
	// next capacity refresh). Ties are broken at random, so the figure is
	// a share of runs: at least 9 of 10.
	t.Run("creates spread over nodes", func(t *testing.T) {
		tc.t = t
		type nodesBody struct {
			Nodes []struct {
				Name      string `json:"name"`
				Sandboxes int    `json:"sandboxes"`
				Capacity  struct {
					Resident int `json:"resident"`
				} `json:"capacity"`
			} `json:"nodes"`
		}
		// empty waits until every gateway sees every node holding nothing,
		// registered figures included.
		empty := func() {
			for i, g := range tc.nodes {
				testenv.Eventually(t, 30*time.Second, func() (bool, string) {
					var out nodesBody
					code, body := g.api("GET", "/v1/nodes", nil, &out)
					if code != 200 || len(out.Nodes) != len(tc.nodes) {
						return false, fmt.Sprintf("nodes via node %d: %d %s", i+1, code, body)
					}
					for _, n := range out.Nodes {
						if n.Sandboxes != 0 || n.Capacity.Resident != 0 {
							return false, fmt.Sprintf("via node %d, node %s holds %d sandboxes (%d resident)", i+1, n.Name, n.Sandboxes, n.Capacity.Resident)
						}
					}
					return true, ""
				})
			}
		}
		const runs = 10
		spread := 0
		for run := range runs {
			empty()
			on := map[string]int{}
			var ids []string
			for i := range tc.nodes {
				id := testenv.UniqueID("sp")
				ids = append(ids, id)
				on[tc.createVia(i, id)]++
			}
			if len(on) == len(tc.nodes) {
				spread++
			}
			t.Logf("run %d: %v", run+1, on)
			for _, id := range ids {
				if code, body := tc.nodes[0].api("DELETE", "/v1/sandboxes/"+id, nil, nil); code != 204 {
					t.Fatalf("destroying %s: %d %s", id, code, body)
				}
			}
		}
		empty()
		if spread < 9 {
			t.Fatalf("3 creates in a row through 3 gateways landed on 3 nodes in %d of %d runs, want at least 9", spread, runs)
		}
	})

	t.Run("placement and routing", func(t *testing.T) {
		tc.t = t
		id := testenv.UniqueID("r")
		owner := tc.createVia(0, id)
		tc.waitEverywhere(id, "running", owner)
		for i, g := range tc.nodes {
			testenv.Eventually(t, 10*time.Second, func() (bool, string) {
				code, body := g.previewDo("GET", id, "/healthz", nil)
				return code == 200 && body == "ok\n", fmt.Sprintf("GET via node %d: %d %q", i+1, code, body)
			})
			if code, body, err := previewPost(g, id, "/echo", "hello from node "+fmt.Sprint(i+1)); err != nil || code != 200 || body != "POST\nhello from node "+fmt.Sprint(i+1) {
				t.Fatalf("POST via node %d: %d %q %v", i+1, code, body, err)
			}
			// The signature never reaches the app.
			if code, body := g.previewDo("GET", id, "/headers", nil); code != 200 || strings.Contains(strings.ToLower(body), "sandwake-forwarded") {
				t.Fatalf("headers via node %d: %d %q", i+1, code, body)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			c, _, err := websocket.Dial(ctx, fmt.Sprintf("ws://s-%s-8080.preview.localhost:%d/ws", id, g.previewPort), &websocket.DialOptions{HTTPClient: g.previewClient()})
			if err != nil {
				cancel()
				t.Fatalf("websocket via node %d: %v", i+1, err)
			}
			for _, msg := range []string{"one", "two"} {
				if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
					t.Fatalf("websocket write via node %d: %v", i+1, err)
				}
				if _, got, err := c.Read(ctx); err != nil || string(got) != msg {
					t.Fatalf("websocket echo via node %d: %q %v", i+1, got, err)
				}
			}
			c.Close(websocket.StatusNormalClosure, "done")
			cancel()
			// The API on every node answers for it (forwarded to the owner).
			var got clusterSandbox
			if code, body := g.api("GET", "/v1/sandboxes/"+id, nil, &got); code != 200 || got.Node != owner || got.State != "running" {
				t.Fatalf("GET sandbox via node %d: %d %s", i+1, code, body)
			}
		}
		// The CLI lists the nodes and drains one.
		out := tc.run(t, 1, "nodes")
		for _, name := range tc.names {
			if !strings.Contains(out, name) {
				t.Fatalf("caddy sandwake nodes does not list %s:\n%s", name, out)
			}
		}
		if strings.Count(out, "live") != 3 {
			t.Fatalf("caddy sandwake nodes, want 3 live:\n%s", out)
		}
		tc.run(t, 1, "node", "drain", tc.names[2])
		if out := tc.run(t, 0, "nodes"); !strings.Contains(out, "live,draining") {
			t.Fatalf("after node drain:\n%s", out)
		}
		tc.run(t, 0, "node", "drain", "--undo", tc.names[2])
		if out := tc.run(t, 2, "nodes"); strings.Contains(out, "draining") {
			t.Fatalf("after node drain --undo:\n%s", out)
		}
		if out, err := tc.cliErr(0, "node", "remove", tc.names[1]); err == nil || !strings.Contains(out, "node_live") && !strings.Contains(out, "holds its lease") {
			t.Fatalf("node remove of a live node: %v\n%s", err, out)
		}
		// One sandbox on each node, for the loss tests.
		for i := range tc.nodes {
			home[i] = testenv.UniqueID(fmt.Sprintf("h%d", i+1))
			tc.createOn(i, home[i])
		}
		for i, id := range home {
			tc.waitEverywhere(id, "running", tc.names[i])
		}
	})

	t.Run("streams through a forwarding gateway", func(t *testing.T) {
		tc.t = t
		id, owner := home[1], tc.names[1]
		fwd := tc.nodes[0]
		// The app's own event stream: its first event arrives while the
		// stream stays open (the next one is an hour away), so neither
		// gateway buffers it.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("http://s-%s-8080.preview.localhost:%d/sse?n=2&every=1h", id, fwd.previewPort), nil)
		req.Header.Set("Accept", "text/event-stream")
		resp, err := fwd.previewClient().Do(req)
		if err != nil {
			t.Fatalf("app SSE via node 1: %v", err)
		}
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			resp.Body.Close()
			t.Fatalf("app SSE via node 1: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() && sc.Text() != "data: tick 1" {
		}
		if sc.Text() != "data: tick 1" {
			resp.Body.Close()
			t.Fatalf("app SSE via node 1: the first event did not come while the stream was open: %v %v", sc.Err(), ctx.Err())
		}
		resp.Body.Close()
		cancel()

		// The preview host's own stream (the warming page's): the current
		// state at once, then the owner's transitions as they happen.
		events := openSSE(t, fwd.previewClient(), fmt.Sprintf("http://s-%s-8080.preview.localhost:%d/.well-known/sandwake/events", id, fwd.previewPort))
		events.await(t, func(ev map[string]any) bool { return ev["type"] == "sandbox.running" })
		if code, body := fwd.api("POST", "/v1/sandboxes/"+id+"/stop", nil, nil); code != 200 {
			t.Fatalf("stop via node 1: %d %s", code, body)
		}
		events.await(t, func(ev map[string]any) bool { return ev["type"] == "sandbox.stopped" && ev["sandbox_id"] == id })
		if code, ecode, err := previewCode(fwd.previewClient(), fwd, id, nil); code != 200 {
			t.Fatalf("wake via node 1: %d %s %v", code, ecode, err)
		}
		events.await(t, func(ev map[string]any) bool { return ev["type"] == "sandbox.running" && ev["sandbox_id"] == id })
		tc.waitEverywhere(id, "running", owner)

		// The owner takes the forwarding node for a trusted proxy: the app
		// gets the X-Forwarded-For that node set (the visitor) with the
		// node's hop added, not the node alone.
		if code, body := fwd.previewDo("GET", id, "/headers", nil); code != 200 || !strings.Contains(body, "X-Forwarded-For: 127.0.0.1, 127.0.0.1\n") {
			t.Fatalf("headers via node 1: %d %q, want the visitor's X-Forwarded-For kept", code, body)
		}
		if code, body := tc.nodes[1].previewDo("GET", id, "/headers", nil); code != 200 || !strings.Contains(body, "X-Forwarded-For: 127.0.0.1\n") {
			t.Fatalf("headers via the owner: %d %q", code, body)
		}

		// A path Go escapes when it writes it (| here) is signed as sent:
		// the app answers (404, no such route), not the owner's 403.
		for i, g := range tc.nodes {
			req, _ := http.NewRequest("GET", fmt.Sprintf("http://s-%s-8080.preview.localhost:%d/", id, g.previewPort), nil)
			req.URL.Opaque = "/no|such^route"
			resp, err := g.previewClient().Do(req)
			if err != nil {
				t.Fatalf("path with | via node %d: %v", i+1, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 404 || strings.Contains(string(b), "unsigned_forward") {
				t.Fatalf("path with | via node %d: %d %s, want the app's 404", i+1, resp.StatusCode, b)
			}
		}
	})

	t.Run("unique ids", func(t *testing.T) {
		tc.t = t
		id := testenv.UniqueID("u")
		tc.removeSandbox(id)
		var created, taken, other atomic.Int32
		var others sync.Map
		var wg sync.WaitGroup
		for i := range 100 {
			wg.Go(func() {
				code, body := tc.nodes[i%3].api("POST", "/v1/sandboxes", map[string]any{"id": id, "image": tc.image, "ports": []int{8080}, "memory_mb": 32}, nil)
				switch code {
				case 201:
					created.Add(1)
				case 409:
					if !strings.Contains(body, `"id_taken"`) {
						others.Store(body, code)
						other.Add(1)
					}
					taken.Add(1)
				default:
					others.Store(body, code)
					other.Add(1)
				}
			})
		}
		wg.Wait()
		if created.Load() != 1 || taken.Load() != 99 || other.Load() != 0 {
			var bad []string
			others.Range(func(k, v any) bool { bad = append(bad, fmt.Sprintf("%v %v", v, k)); return true })
			t.Fatalf("100 creates of one id: %d created, %d taken, %d other: %v", created.Load(), taken.Load(), other.Load(), bad)
		}
	})

	t.Run("wake storm collapses on the owner", func(t *testing.T) {
		tc.t = t
		id := home[1]
		// Node 1's event stream carries node 2's transitions too.
		events := tc.followEvents(t, 0)
		if code, body := tc.nodes[0].api("POST", "/v1/sandboxes/"+id+"/stop", nil, nil); code != 200 {
			t.Fatalf("stop via node 1: %d %s", code, body)
		}
		tc.waitEverywhere(id, "stopped", tc.names[1])
		events.await(t, func(ev map[string]any) bool {
			return ev["sandbox_id"] == id && ev["type"] == "sandbox.stopped" && ev["node"] == tc.names[1]
		})
		// From now: the stop is done, and an earlier subtest's wake of the
		// same sandbox (streams) must not count.
		since := time.Now()
		clients := make([]*http.Client, 3)
		for i, g := range tc.nodes {
			clients[i] = g.previewClient()
		}
		var ok atomic.Int32
		var fails sync.Map
		var wg sync.WaitGroup
		for i := range 1000 {
			wg.Go(func() {
				code, ecode, err := previewCode(clients[i%3], tc.nodes[i%3], id, nil)
				if code == 200 {
					ok.Add(1)
					return
				}
				fails.Store(fmt.Sprintf("node %d: %d %s %v", i%3+1, code, ecode, err), true)
			})
		}
		wg.Wait()
		if ok.Load() != 1000 {
			var bad []string
			fails.Range(func(k, _ any) bool { bad = append(bad, k.(string)); return true })
			t.Fatalf("%d of 1000 requests got 200; failures: %v", ok.Load(), bad)
		}
		if n := dockerStarts(t, tc.cli, id, since); n != 1 {
			t.Fatalf("%d Docker starts for 1000 requests over 3 gateways, want 1", n)
		}
	})

	t.Run("unsigned forward refused", func(t *testing.T) {
		tc.t = t
		forged := http.Header{"Sandwake-Forwarded": {tc.names[0] + ";" + fmt.Sprint(time.Now().Unix()) + ";00ff"}}
		for i, g := range tc.nodes {
			code, ecode, err := previewCode(g.previewClient(), g, home[0], forged)
			if err != nil || code != 403 || ecode != "unsigned_forward" {
				t.Fatalf("forged preview request via node %d: %d %s %v", i+1, code, ecode, err)
			}
		}
		req, _ := http.NewRequest("GET", fmt.Sprintf("http://127.0.0.1:%d/v1/sandboxes/%s", tc.nodes[1].apiPort, home[0]), nil)
		req.Header.Set("Authorization", "Bearer "+crashToken)
		req.Header.Set("Sandwake-Forwarded", "x;1;zz")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 403 || !strings.Contains(string(b), "unsigned_forward") {
			t.Fatalf("forged API request: %d %s", resp.StatusCode, b)
		}
	})

	t.Run("peer listener takes verified nodes only", func(t *testing.T) {
		tc.t = t
		owner := 1
		id := home[owner]
		tc.waitEverywhere(id, "running", tc.names[owner])
		pool := x509.NewCertPool()
		if pem, err := os.ReadFile(filepath.Join(tc.caDir, "ca.crt")); err != nil || !pool.AppendCertsFromPEM(pem) {
			t.Fatalf("reading the cluster CA: %v", err)
		}
		load := func(c nodeCert) *tls.Certificate {
			cert, err := tls.LoadX509KeyPair(c.cert, c.key)
			if err != nil {
				t.Fatal(err)
			}
			return &cert
		}
		// The test signs as node 1 (it knows the cluster's secret).
		n1, err := cluster.LoadCredentials(filepath.Join(tc.caDir, "ca.crt"), tc.certs[0].cert, tc.certs[0].key, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		signer, err := cluster.New(cluster.Config{Endpoints: []string{"https://127.0.0.1:1"}, Node: tc.names[0],
			Advertise: fmt.Sprintf("127.0.0.1:%d", tc.peerPorts[0]), Peers: cluster.NewPeerTLS(n1), Secret: []byte(clusterSecret)}, noRecords{})
		if err != nil {
			t.Fatal(err)
		}
		// send sends a preview request (or, api, an API call) for the
		// owner's sandbox to its peer listener.
		send := func(cert *tls.Certificate, signed, api bool) (int, string, error) {
			cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}
			if cert != nil {
				cfg.Certificates = []tls.Certificate{*cert}
			}
			c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
			defer c.CloseIdleConnections()
			req, _ := http.NewRequest("GET", fmt.Sprintf("https://127.0.0.1:%d/healthz", tc.peerPorts[owner]), nil)
			req.Host = fmt.Sprintf("s-%s-8080.preview.localhost", id)
			if api {
				req.URL.Path, req.Host = "/v1/sandboxes/"+id, "api.sandwake.invalid"
			}
			if signed {
				if api {
					req.Header.Set(cluster.CallerHeader, "admin;")
				}
				signer.Sign(req)
			}
			resp, err := c.Do(req)
			if err != nil {
				return 0, "", err
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b), nil
		}
		strangerCA := clusterCA(t, tc.bin)
		stranger := load(issueNodeCert(t, tc.bin, strangerCA, tc.names[0])) // node 1's name, another CA
		intruder := load(issueNodeCert(t, tc.bin, tc.caDir, "intruder"))    // the cluster's CA, without the secret
		for _, api := range []bool{false, true} {
			for _, c := range []struct {
				name   string
				cert   *tls.Certificate
				signed bool
			}{{"no client certificate", nil, true}, {"a certificate of another CA", stranger, true}} {
				if code, body, err := send(c.cert, c.signed, api); err == nil {
					t.Fatalf("api=%v, %s: %d %.200s, want the TLS handshake refused", api, c.name, code, body)
				}
			}
			if code, body, err := send(intruder, false, api); err != nil || code != 403 || !strings.Contains(body, "unsigned_forward") {
				t.Fatalf("api=%v, a node certificate without a signature: %d %.200s %v, want 403 unsigned_forward", api, code, body, err)
			}
			if code, body, err := send(intruder, true, api); err != nil || code != 403 || !strings.Contains(body, "unsigned_forward") {
				t.Fatalf("api=%v, node 1's signature on another node's certificate: %d %.200s %v, want 403 unsigned_forward", api, code, body, err)
			}
			// Node 1's certificate and signature: served, the API call
			// without a token.
			code, body, err := send(load(tc.certs[0]), true, api)
			if want := "ok\n"; api {
				var got clusterSandbox
				if err != nil || code != 200 || json.Unmarshal([]byte(body), &got) != nil || got.ID != id {
					t.Fatalf("API call from node 1: %d %.200s %v, want the sandbox", code, body, err)
				}
			} else if err != nil || code != 200 || body != want {
				t.Fatalf("preview request from node 1: %d %q %v, want %q", code, body, err, want)
			}
		}
	})

	t.Run("forged catalog entry reaches nobody", func(t *testing.T) {
		tc.t = t
		// A listener of the test, which a forged registration names.
		trap, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var accepted atomic.Int32
		trapDone := make(chan struct{})
		go func() {
			defer close(trapDone)
			for {
				c, err := trap.Accept()
				if err != nil {
					return
				}
				accepted.Add(1)
				c.Close()
			}
		}()
		defer func() { trap.Close(); <-trapDone }()
		cli, err := clientv3.New(clientv3.Config{Endpoints: tc.etcd.Endpoints(), TLS: etcdtest.ClientTLS(tc.etcd.Endpoints()), DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		lease, err := cli.Grant(ctx, 120)
		if err != nil {
			t.Fatal(err)
		}
		prefix := "/sandwake-" + testenv.RunID() + "/"
		evil, ghost := "evil-"+testenv.RunID(), "ghost-"+testenv.RunID()
		viaEvil, viaGhost := testenv.UniqueID("fe"), testenv.UniqueID("fg")
		defer func() {
			cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer ccancel()
			cli.Revoke(cctx, lease.ID)
			cli.Delete(cctx, prefix+"sandboxes/"+viaEvil)
			cli.Delete(cctx, prefix+"sandboxes/"+viaGhost)
		}()
		// The registration is leased and carries a real node's certificate
		// (certificates are public), with room to draw every create.
		certPEM, err := os.ReadFile(tc.certs[0].cert)
		if err != nil {
			t.Fatal(err)
		}
		blk, _ := pem.Decode(certPEM)
		reg, _ := json.Marshal(map[string]any{"name": evil, "advertise": trap.Addr().String(), "certs": [][]byte{blk.Bytes},
			"capacity": map[string]any{"max_resident": 1000000, "free_memory_mb": 1000000}})
		entry := func(id, node string) string {
			b, _ := json.Marshal(map[string]any{"id": id, "node": node, "state": "running", "ports": []int{8080}, "access": "public"})
			return string(b)
		}
		for k, v := range map[string]string{"sandboxes/" + viaEvil: entry(viaEvil, evil), "sandboxes/" + viaGhost: entry(viaGhost, ghost)} {
			if _, err := cli.Put(ctx, prefix+k, v); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := cli.Put(ctx, prefix+"nodes/"+evil, string(reg), clientv3.WithLease(lease.ID)); err != nil {
			t.Fatal(err)
		}
		// The entries carry no node's signature: every node ignores them
		// (the sandboxes are unknown), and counts them.
		for i, g := range tc.nodes {
			for _, id := range []string{viaEvil, viaGhost} {
				testenv.Eventually(t, 20*time.Second, func() (bool, string) {
					code, ecode, err := previewCode(g.previewClient(), g, id, http.Header{"Authorization": {"Bearer a-preview-token"}})
					return code == 404, fmt.Sprintf("forged sandbox %s via node %d: %d %s %v, want 404", id, i+1, code, ecode, err)
				})
			}
			for _, call := range [][2]string{{"GET", "/v1/sandboxes/" + viaEvil}, {"POST", "/v1/sandboxes/" + viaEvil + "/tokens"}} {
				if code, body := g.api(call[0], call[1], nil, nil); code != 404 {
					t.Fatalf("%s %s via node %d: %d %s, want 404", call[0], call[1], i+1, code, body)
				}
			}
			if _, ok := tc.sandboxes(g)[viaEvil]; ok {
				t.Fatalf("node %d lists the forged entry %s", i+1, viaEvil)
			}
			live := tc.liveNodes(g)
			if slices.Contains(live, evil) {
				t.Fatalf("node %d lists the forged registration as live: %v", i+1, live)
			}
		}
		// Creates are placed on the real nodes only.
		for range 3 {
			id := testenv.UniqueID("fc")
			if node := tc.createVia(0, id); !slices.Contains(tc.names, node) {
				t.Fatalf("create placed on %s", node)
			}
			if code, body := tc.nodes[0].api("DELETE", "/v1/sandboxes/"+id, nil, nil); code != 204 {
				t.Fatalf("destroy %s: %d %s", id, code, body)
			}
		}
		if n := accepted.Load(); n != 0 {
			t.Fatalf("the forged registration's address got %d connections, want none", n)
		}
	})

	t.Run("a forged catalog grants a tenant nothing", func(t *testing.T) {
		tc.t = t
		forgedCatalogGrantsNothing(t, tc)
	})

	t.Run("node loss", func(t *testing.T) {
		tc.t = t
		victim := 2
		lost, kept := home[victim], []string{home[0], home[1]}
		for _, id := range kept {
			tc.waitEverywhere(id, "running", tc.names[slices.Index(home, id)])
		}
		stop, failures := tc.hammer(t, []int{0, 1}, kept)
		// Only the victim takes new sandboxes, so the create made right
		// after its death (its lease still held) is placed on it.
		setDrain := func(on bool) {
			for _, j := range []int{0, 1} {
				if code, body := tc.nodes[0].api("POST", "/v1/nodes/"+tc.names[j]+"/drain", map[string]bool{"draining": on}, nil); code != 200 {
					t.Fatalf("drain %s %v: %d %s", tc.names[j], on, code, body)
				}
			}
			testenv.Eventually(t, 10*time.Second, func() (bool, string) {
				var out struct {
					Nodes []struct {
						Name     string `json:"name"`
						Draining bool   `json:"draining"`
					} `json:"nodes"`
				}
				tc.nodes[0].api("GET", "/v1/nodes", nil, &out)
				for _, n := range out.Nodes {
					if n.Name != tc.names[victim] && n.Draining != on {
						return false, fmt.Sprintf("nodes as node 1 sees them: %+v", out.Nodes)
					}
				}
				return true, ""
			})
		}
		setDrain(true)
		killedAt := time.Now()
		tc.nodes[victim].kill()
		// The victim refuses the connection: the create is placed again
		// without it (here: no other node takes sandboxes, so no_room
		// naming it), not answered host_unavailable.
		orphan := testenv.UniqueID("o")
		tc.removeSandbox(orphan)
		if code, body := tc.nodes[0].api("POST", "/v1/sandboxes", map[string]any{"id": orphan, "image": tc.image, "ports": []int{8080}, "memory_mb": 32}, nil); code != 503 ||
			!strings.Contains(body, "no_room") || !strings.Contains(body, tc.names[victim]+": did not answer the create") {
			t.Fatalf("create placed on a node that just died: %d %s, want 503 no_room naming its silence", code, body)
		}
		setDrain(false)
		for _, i := range []int{0, 1} {
			g := tc.nodes[i]
			c := g.previewClient()
			deadline := killedAt.Add(clusterTTL + 2*time.Second)
			for {
				code, ecode, err := previewCode(c, g, lost, nil)
				if code == 503 && ecode == "host_unavailable" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("sandbox of the lost node via node %d: %d %q %v, want 503 host_unavailable within %s of the kill", i+1, code, ecode, err, clusterTTL+2*time.Second)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
		// Once the lease is gone the node is listed lost, and a browser
		// gets a page.
		testenv.Eventually(t, 10*time.Second, func() (bool, string) {
			live := tc.liveNodes(tc.nodes[0])
			return len(live) == 2 && !slices.Contains(live, tc.names[victim]), fmt.Sprintf("live %v", live)
		})
		req, _ := http.NewRequest("GET", fmt.Sprintf("http://s-%s-8080.preview.localhost:%d/", lost, tc.nodes[0].previewPort), nil)
		req.Header.Set("Accept", "text/html")
		resp, err := tc.nodes[0].previewClient().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(b), "Host unavailable") {
			t.Fatalf("browser on the lost node's sandbox: %d Retry-After %q %.200s", resp.StatusCode, resp.Header.Get("Retry-After"), b)
		}
		// API calls for it say so too.
		if code, body := tc.nodes[0].api("GET", "/v1/sandboxes/"+lost, nil, nil); code != 503 || !strings.Contains(body, "host_unavailable") {
			t.Fatalf("API on the lost node's sandbox: %d %s", code, body)
		}
		tc.nodes[victim].start()
		for i, g := range tc.nodes {
			testenv.Eventually(t, 20*time.Second, func() (bool, string) {
				code, ecode, err := previewCode(g.previewClient(), g, lost, nil)
				return code == 200, fmt.Sprintf("via node %d after the restart: %d %s %v", i+1, code, ecode, err)
			})
		}
		if n := stop(); n == 0 {
			t.Fatal("the hammer sent nothing")
		}
		if f := failures(); len(f) > 0 {
			t.Fatalf("requests to other nodes' sandboxes failed during the node loss: %v", f)
		}
	})

	t.Run("etcd member loss", func(t *testing.T) {
		tc.t = t
		stop, failures := tc.hammer(t, []int{0, 1, 2}, home)
		// The leader: the hardest member to lose (an election follows).
		lost := tc.etcd.Leader()
		tc.etcd.Kill(lost)
		// Reads and creates go on with two members of three.
		for i := range tc.nodes {
			id := testenv.UniqueID(fmt.Sprintf("m%d", i+1))
			tc.removeSandbox(id)
			code, body := tc.nodes[i].api("POST", "/v1/sandboxes", map[string]any{"id": id, "image": tc.image, "ports": []int{8080}, "memory_mb": 32}, nil)
			if code != 201 {
				t.Fatalf("create via node %d with one etcd member down: %d %s", i+1, code, body)
			}
		}
		if n := stop(); n == 0 {
			t.Fatal("the hammer sent nothing")
		}
		if f := failures(); len(f) > 0 {
			t.Fatalf("requests failed while one etcd member was down: %v", f)
		}
		tc.etcd.Restart(lost)
		tc.etcd.WaitHealthy()
	})

	t.Run("etcd loss", func(t *testing.T) {
		tc.t = t
		for i := range 3 {
			tc.etcd.Stop(i)
		}
		// Running sandboxes are still served by every gateway.
		for i, g := range tc.nodes {
			for _, id := range home {
				code, ecode, err := previewCode(g.previewClient(), g, id, nil)
				if code != 200 {
					t.Fatalf("sandbox %s via node %d with etcd down: %d %s %v", id, i+1, code, ecode, err)
				}
			}
		}
		// Creates answer 503 naming etcd; readyz says so.
		for i, g := range tc.nodes {
			id := testenv.UniqueID("x")
			tc.removeSandbox(id)
			testenv.Eventually(t, 20*time.Second, func() (bool, string) {
				code, body := g.api("POST", "/v1/sandboxes", map[string]any{"id": id, "image": tc.image, "ports": []int{8080}, "memory_mb": 32}, nil)
				return code == 503 && strings.Contains(body, "etcd"), fmt.Sprintf("create via node %d with etcd down: %d %s", i+1, code, body)
			})
			testenv.Eventually(t, 20*time.Second, func() (bool, string) {
				var out struct {
					Checks map[string]string `json:"checks"`
				}
				code, body := g.api("GET", "/v1/readyz", nil, &out)
				return code == 503 && strings.Contains(out.Checks["cluster"], "etcd"), fmt.Sprintf("readyz via node %d: %d %s", i+1, code, body)
			})
		}
		// A change made meanwhile is published once etcd is back.
		if code, body := tc.nodes[0].api("POST", "/v1/sandboxes/"+home[0]+"/stop", nil, nil); code != 200 {
			t.Fatalf("stop on its own node with etcd down: %d %s", code, body)
		}
		for i := range 3 {
			tc.etcd.Restart(i)
		}
		tc.etcd.WaitHealthy()
		for i, g := range tc.nodes {
			testenv.Eventually(t, 30*time.Second, func() (bool, string) {
				code, body := g.api("GET", "/v1/readyz", nil, nil)
				return code == 200, fmt.Sprintf("readyz via node %d after etcd came back: %d %s", i+1, code, body)
			})
		}
		// The catalog matches every node's records, as every node sees it.
		testenv.Eventually(t, 30*time.Second, func() (bool, string) {
			views := make([]map[string]clusterSandbox, 3)
			for i, g := range tc.nodes {
				views[i] = tc.sandboxes(g)
			}
			for i := range tc.nodes {
				for id, s := range views[i] {
					if s.Node != tc.names[i] {
						continue // node i's own records only
					}
					for j := range tc.nodes {
						if o := views[j][id]; o != s {
							return false, fmt.Sprintf("node %d's record %+v is %+v on node %d", i+1, s, o, j+1)
						}
					}
				}
				for j := range tc.nodes {
					for id, s := range views[j] {
						if s.Node == tc.names[i] && views[i][id] != s {
							return false, fmt.Sprintf("node %d lists %+v on node %d, which has %+v", j+1, s, i+1, views[i][id])
						}
					}
				}
			}
			return views[1][home[0]].State == "stopped", fmt.Sprintf("the stop made without etcd is not published: %+v", views[1][home[0]])
		})
	})

	t.Run("removed node", func(t *testing.T) {
		tc.t = t
		victim := 2
		gone := home[victim]
		tc.waitEverywhere(gone, "running", tc.names[victim])
		tc.nodes[victim].kill()
		testenv.Eventually(t, 20*time.Second, func() (bool, string) {
			live := tc.liveNodes(tc.nodes[0])
			return len(live) == 2 && !slices.Contains(live, tc.names[victim]), fmt.Sprintf("live %v", live)
		})
		// Lost, not removed: nobody can destroy its sandbox yet.
		if code, body := tc.nodes[1].api("DELETE", "/v1/sandboxes/"+gone, nil, nil); code != 503 || !strings.Contains(body, "host_unavailable") {
			t.Fatalf("destroy of a lost node's sandbox: %d %s, want 503 host_unavailable", code, body)
		}
		if out := tc.run(t, 0, "node", "remove", tc.names[victim]); !strings.Contains(out, "removed node "+tc.names[victim]) {
			t.Fatalf("node remove: %q", out)
		}
		testenv.Eventually(t, 10*time.Second, func() (bool, string) {
			s := tc.sandboxes(tc.nodes[1])[gone]
			return s.State == "killed", fmt.Sprintf("the removed node's sandbox as node 2 lists it: %+v", s)
		})
		// Removed: destroying it through any gateway forgets it.
		if code, body := tc.nodes[1].api("DELETE", "/v1/sandboxes/"+gone, nil, nil); code != 204 {
			t.Fatalf("destroy of a removed node's sandbox: %d %s, want 204", code, body)
		}
		testenv.Eventually(t, 10*time.Second, func() (bool, string) {
			for i := range 2 {
				if s, ok := tc.sandboxes(tc.nodes[i])[gone]; ok {
					return false, fmt.Sprintf("node %d still lists %+v", i+1, s)
				}
			}
			return true, ""
		})
		// Its files went with the host (here: removed by hand from the one
		// engine the nodes share), and the id is free again.
		ctx := context.Background()
		tc.cli.ContainerRemove(ctx, docker.ContainerName(gone), client.ContainerRemoveOptions{Force: true})
		tc.cli.VolumeRemove(ctx, docker.VolumeName(gone), client.VolumeRemoveOptions{Force: true})
		if node := tc.createVia(0, gone); node == tc.names[victim] {
			t.Fatalf("create of a forgotten id placed on the removed node %s", node)
		}
	})
}

// run runs `caddy sandwake <args>` against node i's API and answers its
// output; it fails the test when the command fails.
func (tc *testCluster) run(t *testing.T, i int, args ...string) string {
	t.Helper()
	out, err := tc.cliErr(i, args...)
	if err != nil {
		t.Fatalf("caddy sandwake %v: %v\n%s", args, err, out)
	}
	return out
}

func (tc *testCluster) cliErr(i int, args ...string) (string, error) {
	cmd := exec.Command(tc.bin, append([]string{"sandwake", "--api", fmt.Sprintf("http://127.0.0.1:%d", tc.nodes[i].apiPort), "--token", crashToken}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// eventStream is an open /v1/events stream.
type eventStream struct {
	events chan map[string]any
}

// followEvents opens node i's /v1/events; it is closed when the test ends.
func (tc *testCluster) followEvents(t *testing.T, i int) *eventStream {
	return tc.followEventsAs(t, i, crashToken)
}

// followEventsAs is followEvents with another token.
func (tc *testCluster) followEventsAs(t *testing.T, i int, token string) *eventStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("http://127.0.0.1:%d/v1/events", tc.nodes[i].apiPort), nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		cancel()
		t.Fatalf("events of node %d: %v %v", i+1, err, resp)
	}
	return readEvents(t, resp, cancel)
}

// openSSE opens the event stream at url with c; it is closed when the test
// ends.
func openSSE(t *testing.T, c *http.Client, url string) *eventStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := c.Do(req)
	if err != nil || resp.StatusCode != 200 {
		cancel()
		t.Fatalf("event stream %s: %v %v", url, err, resp)
	}
	return readEvents(t, resp, cancel)
}

// readEvents reads the JSON events of an open stream into an eventStream.
func readEvents(t *testing.T, resp *http.Response, cancel context.CancelFunc) *eventStream {
	es := &eventStream{events: make(chan map[string]any, 1024)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(es.events)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			var ev map[string]any
			if json.Unmarshal([]byte(data), &ev) == nil {
				select {
				case es.events <- ev:
				default:
				}
			}
		}
	}()
	t.Cleanup(func() { cancel(); resp.Body.Close(); <-done })
	return es
}

// await waits for an event matching match.
func (es *eventStream) await(t *testing.T, match func(map[string]any) bool) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	var seen []map[string]any
	for {
		select {
		case ev, ok := <-es.events:
			if !ok {
				t.Fatalf("event stream ended; seen %v", seen)
			}
			if match(ev) {
				return
			}
			seen = append(seen, ev)
		case <-timeout:
			t.Fatalf("no matching event within 20s; seen %v", seen)
		}
	}
}

// hammer sends GETs (previews and API reads) to sandboxes ids through gateways gws until stop is
// called; stop answers how many were sent, failures what failed.
func (tc *testCluster) hammer(t *testing.T, gws []int, ids []string) (stop func() int, failures func() []string) {
	var sent atomic.Int32
	var mu sync.Mutex
	var failed []string
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, i := range gws {
		g := tc.nodes[i]
		c := g.previewClient()
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-done:
					return
				default:
				}
				id := ids[n%len(ids)]
				what, code, ecode, err := "preview", 0, "", error(nil)
				if n%4 == 3 {
					// An API read, forwarded to the owner for others' sandboxes.
					what = "API"
					var body string
					code, body = g.api("GET", "/v1/sandboxes/"+id, nil, nil)
					if code != 200 {
						ecode = body
					}
				} else {
					code, ecode, err = previewCode(c, g, id, nil)
				}
				sent.Add(1)
				if code != 200 {
					mu.Lock()
					failed = append(failed, fmt.Sprintf("%s %s via node %d: %d %s %v", what, id, i+1, code, ecode, err))
					mu.Unlock()
				}
			}
		})
	}
	var once sync.Once
	stop = func() int {
		once.Do(func() { close(done); wg.Wait() })
		return int(sent.Load())
	}
	t.Cleanup(func() { stop() })
	failures = func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(failed)
	}
	return stop, failures
}

// dockerStarts counts Docker's start events of sandbox id's container since.
func dockerStarts(t *testing.T, cli *client.Client, id string, since time.Time) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	now := time.Now()
	res := cli.Events(ctx, client.EventsListOptions{
		Since:   fmt.Sprintf("%d.%09d", since.Unix(), since.Nanosecond()),
		Until:   fmt.Sprintf("%d.%09d", now.Unix(), now.Nanosecond()),
		Filters: client.Filters{}.Add("container", docker.ContainerName(id)).Add("event", "start").Add("type", "container"),
	})
	n := 0
	for {
		select {
		case _, ok := <-res.Messages:
			if !ok {
				return n
			}
			n++
		case err := <-res.Err:
			if err != nil && err != io.EOF && !strings.Contains(err.Error(), "EOF") {
				t.Fatalf("reading docker events: %v", err)
			}
			return n
		}
	}
}

// TestClusterPlaintextEtcd: a node refuses to start on plaintext (http://)
// etcd unless its cluster block says insecure_plaintext; with it, the node
// joins, warns at start and flags it in readyz without being unready.
func TestClusterPlaintextEtcd(t *testing.T) {
	testenv.Docker(t)
	bin := buildCaddy(t)
	ec := etcdtest.StartPlaintext(t, 1)
	g := newGateway(t, bin, "")
	caDir, name := clusterCA(t, bin), "p1-"+testenv.RunID()
	peers := peerBlock(caDir, freePort(t), issueNodeCert(t, bin, caDir, name))
	block := func(extra string) string {
		return fmt.Sprintf(`cluster {
			etcd %s
			node %s
			%s
			secret %s
			prefix /sandwake-plain-%s/
			lease_ttl %s
			%s
		}`, ec.Endpoints()[0], name, peers, clusterSecret, testenv.RunID(), clusterTTL, extra)
	}

	g.configure(block(""))
	g.launch()
	exited := make(chan struct{})
	go func() { g.cmd.Wait(); close(exited) }()
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("caddy kept running on plaintext etcd without insecure_plaintext:\n%s", g.log.String())
	}
	if out := g.log.String(); !strings.Contains(out, "is plaintext http") || !strings.Contains(out, "insecure_plaintext") {
		t.Fatalf("caddy exited without saying why plaintext etcd is refused:\n%s", out)
	}

	g.configure(block("insecure_plaintext"))
	g.start()
	var ready struct {
		Ready  bool              `json:"ready"`
		Checks map[string]string `json:"checks"`
	}
	if code, body := g.api("GET", "/v1/readyz", nil, &ready); code != 200 || !ready.Ready || !strings.Contains(ready.Checks["cluster"], "etcd is plaintext") {
		t.Fatalf("readyz with insecure_plaintext: %d %s, want ready with the cluster check flagging plaintext etcd", code, body)
	}
	if out := g.log.String(); !strings.Contains(out, "etcd over plaintext http (insecure_plaintext)") {
		t.Fatalf("no start-up warning about plaintext etcd:\n%s", out)
	}
}
