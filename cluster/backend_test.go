package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	authv1 "k8s.io/api/authentication/v1"
	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sclient "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sandwake/sandwake/internal/etcdtest"
	"github.com/sandwake/sandwake/internal/kubetest"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
)

// testBackend is one store a test runs its nodes on: an etcd cluster of
// the test's, or a namespace of its own on the test Kubernetes cluster.
type testBackend struct {
	name string
	// start starts node name under prefix (closed when the test ends).
	start func(t testing.TB, prefix, name string, src Source) *Cluster
	// raw reads the value of a key straight from the store (ok false:
	// absent); put writes one (a forgery, a stale entry).
	raw func(t testing.TB, key string) ([]byte, bool)
	put func(t testing.TB, key string, value []byte)
	// kube is the Kubernetes store's backend (nil on etcd), admin the
	// test cluster's admin config.
	kube  *KubeBackend
	admin *rest.Config
}

// eachBackend runs fn as subtests etcd and kubernetes (the latter skips
// without a test cluster; make test-k8s runs it with -run '/kubernetes$').
func eachBackend(t *testing.T, fn func(t *testing.T, b testBackend)) {
	t.Run("etcd", func(t *testing.T) { fn(t, etcdBackend(t)) })
	t.Run("kubernetes", func(t *testing.T) { fn(t, kubeBackend(t)) })
}

func etcdBackend(t *testing.T) testBackend {
	ec := etcdtest.Start(t, 3)
	cli := newClient(t, ec.Endpoints())
	return testBackend{
		name: "etcd",
		start: func(t testing.TB, prefix, name string, src Source) *Cluster {
			return startNode(t, ec.Endpoints(), prefix, name, src)
		},
		raw: func(t testing.TB, key string) ([]byte, bool) {
			resp, err := cli.Get(ctxT(t), key)
			if err != nil {
				t.Fatalf("reading %s: %v", key, err)
			}
			if len(resp.Kvs) == 0 {
				return nil, false
			}
			return resp.Kvs[0].Value, true
		},
		put: func(t testing.TB, key string, value []byte) {
			if _, err := cli.Put(ctxT(t), key, string(value)); err != nil {
				t.Fatalf("writing %s: %v", key, err)
			}
		},
	}
}

// kubeBackend makes a namespace of the test's own on the test cluster
// (deleted at the end) for its nodes' Leases.
func kubeBackend(t *testing.T) testBackend {
	kc := kubetest.Need(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", kc.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 100, 200
	cli, err := k8sclient.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ns := "sw-cluster-" + kubetest.Suffix()
	if _, err := cli.CoreV1().Namespaces().Create(ctxT(t), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := cli.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting namespace %s: %v", ns, err)
		}
	})
	kb := KubeBackend{Client: cli, Namespace: ns, Server: cfg.Host}
	// A store of the test's own reads and writes keys as the nodes do.
	stores := map[string]*kubeStore{}
	storeOf := func(key string) *kubeStore {
		for _, p := range []string{nodesDir, drainDir, sandboxesDir} {
			if i := strings.Index(key, "/"+p); i >= 0 {
				prefix := key[:i+1]
				if stores[prefix] == nil {
					stores[prefix] = newKubeStore(kb, prefix, "test", testTTL)
				}
				return stores[prefix]
			}
		}
		t.Fatalf("key %s is in no space", key)
		return nil
	}
	return testBackend{
		name:  "kubernetes",
		kube:  &kb,
		admin: cfg,
		start: func(t testing.TB, prefix, name string, src Source) *Cluster {
			cfg := testConfig(t, prefix, name)
			cfg.Kubernetes = &kb
			return startConfig(t, cfg, src, nil)
		},
		raw: func(t testing.TB, key string) ([]byte, bool) {
			_, k, err := storeOf(key).get(ctxT(t), key)
			if err != nil {
				t.Fatalf("reading %s: %v", key, err)
			}
			return k.Value, k.Rev != 0
		},
		put: func(t testing.TB, key string, value []byte) {
			if err := storeOf(key).Put(ctxT(t), key, value); err != nil {
				t.Fatalf("writing %s: %v", key, err)
			}
		},
	}
}

// entry reads id's entry straight from b's store.
func (b testBackend) entry(t testing.TB, prefix, id string) (Entry, bool) {
	t.Helper()
	v, ok := b.raw(t, prefix+sandboxesDir+id)
	if !ok {
		return Entry{}, false
	}
	e, err := testSigner.decodeEntry(id, kv{Key: prefix + sandboxesDir + id, Value: v})
	if err != nil {
		t.Fatal(err)
	}
	return e, true
}

// TestForgedEntryIsRepaired: an entry written without the cluster's secret
// (someone with write access to the store, pointing a sandbox at another
// node) is ignored by every node and written back by its owner; a node
// registration written by someone else (no lease held) counts for none.
func TestForgedEntryIsRepaired(t *testing.T) {
	eachBackend(t, func(t *testing.T, be testBackend) {
		prefix := testPrefix()
		srcA := newMemSource()
		a := be.start(t, prefix, "node-a", srcA)
		b := be.start(t, prefix, "node-b", newMemSource())
		srcA.set(record("x", lifecycle.Running))
		a.Changed("x")
		testenv.Eventually(t, 10*time.Second, func() (bool, string) {
			e, ok := b.Lookup("x")
			return ok && e.Node == "node-a", fmt.Sprintf("node-b sees x as %+v (%v)", e, ok)
		})
		want, _ := be.raw(t, prefix+sandboxesDir+"x")

		forger := &Cluster{cfg: Config{Secret: []byte("not-the-secret")}, log: zap.NewNop()}
		forger.ekey = forger.entryKey()
		forged, err := forger.sealEntry(Entry{ID: "x", Node: "node-b", State: lifecycle.Running, Ports: []int{8080}})
		if err != nil {
			t.Fatal(err)
		}
		be.put(t, prefix+sandboxesDir+"x", forged)
		testenv.Eventually(t, 10*time.Second, func() (bool, string) {
			got, _ := be.raw(t, prefix+sandboxesDir+"x")
			return string(got) == string(want), fmt.Sprintf("x in the store: %s, want node-a's entry written back", got)
		})
		testenv.Eventually(t, 10*time.Second, func() (bool, string) {
			e, ok := b.Lookup("x")
			return ok && e.Node == "node-a", fmt.Sprintf("node-b sees x as %+v (%v) after the repair", e, ok)
		})
		if st := a.Stats(); st.Repairs == 0 || st.RejectedEntries == 0 {
			t.Fatalf("node-a's stats: %+v, want the forgery rejected and repaired", st)
		}
		if st := b.Stats(); st.RejectedEntries == 0 {
			t.Fatalf("node-b's stats: %+v, want the forgery rejected", st)
		}

		// A registration someone else wrote: node-a's own record, under
		// another name, without a lease.
		reg, ok := be.raw(t, prefix+nodesDir+"node-a")
		if !ok {
			t.Fatal("node-a's registration is not in the store")
		}
		be.put(t, prefix+nodesDir+"node-z", reg)
		be.put(t, prefix+drainDir+"node-b", []byte(`{"since":"2026-01-01T00:00:00Z","by":"test"}`))
		testenv.Eventually(t, 10*time.Second, func() (bool, string) {
			n, _ := b.Node("node-b")
			return n.Draining, "the drain mark of node-b not seen"
		})
		if n, _ := b.Node("node-z"); n.Live {
			t.Fatalf("a registration written without a lease counts as live: %+v", n)
		}
		waitLive(t, b, "node-a", "node-b")
	})
}

// TestKubeStoreForbidden: a gateway whose identity may not use Leases (a
// Role without them) is unhealthy, naming the refusal, instead of taking
// the refusals for answers.
func TestKubeStoreForbidden(t *testing.T) {
	be := kubeBackend(t)
	admin, err := k8sclient.NewForConfig(be.admin)
	if err != nil {
		t.Fatal(err)
	}
	ns := be.kube.Namespace
	ctx := ctxT(t)
	// A service account whose Role has everything but Leases.
	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "no-leases"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "no-leases"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "no-leases"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "no-leases"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "no-leases", Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tok, err := admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "no-leases", &authv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	limited := rest.AnonymousClientConfig(be.admin)
	limited.BearerToken = tok.Status.Token
	cli, err := k8sclient.NewForConfig(limited)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, testPrefix(), "node-a")
	cfg.Kubernetes = &KubeBackend{Client: cli, Namespace: ns, Server: be.admin.Host}
	c := startConfig(t, cfg, newMemSource(), nil)
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		err := c.Health()
		return errors.Is(err, ErrEtcd) && strings.Contains(err.Error(), "forbidden"),
			fmt.Sprintf("Health of a node whose Role has no leases: %v, want ErrEtcd naming the refusal", err)
	})
	if err := c.Reserve(ctx, "x", 0); !errors.Is(err, ErrEtcd) {
		t.Fatalf("Reserve with no leases in the Role: %v, want ErrEtcd (503 cluster_unavailable)", err)
	}
}

// TestKubeStoreLeavesForeignLeases: a Lease of the name a key would have
// but not the cluster's (no catalog label: someone else's) is neither
// overwritten nor deleted; the store says whose it is not.
func TestKubeStoreLeavesForeignLeases(t *testing.T) {
	be := kubeBackend(t)
	admin, err := k8sclient.NewForConfig(be.admin)
	if err != nil {
		t.Fatal(err)
	}
	prefix := testPrefix()
	s := newKubeStore(*be.kube, prefix, "node-a", testTTL)
	key := prefix + drainDir + "node-x"
	space, name, err := s.split(key)
	if err != nil {
		t.Fatal(err)
	}
	foreign := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: s.objectName(space, name), Labels: map[string]string{"app": "other"},
		Annotations: map[string]string{"owner": "someone else"}}}
	leases := admin.CoordinationV1().Leases(be.kube.Namespace)
	if _, err := leases.Create(ctxT(t), foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctxT(t), key, []byte(`{}`)); err == nil || !strings.Contains(err.Error(), "left alone") {
		t.Fatalf("Put over a foreign Lease: %v, want a refusal", err)
	}
	if err := s.Delete(ctxT(t), key); err == nil || !strings.Contains(err.Error(), "left alone") {
		t.Fatalf("Delete of a foreign Lease: %v, want a refusal", err)
	}
	got, err := leases.Get(ctxT(t), foreign.Name, metav1.GetOptions{})
	if err != nil || got.Annotations["owner"] != "someone else" || got.Labels[LabelCatalog] != "" {
		t.Fatalf("the foreign Lease after Put and Delete: %v %+v, want it as it was", err, got.ObjectMeta)
	}
	// The cluster's own key of that space: written and deleted.
	own := prefix + drainDir + "node-y"
	if err := s.Put(ctxT(t), own, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctxT(t), own); err != nil {
		t.Fatal(err)
	}
	if _, k, err := s.get(ctxT(t), own); err != nil || k.Rev != 0 {
		t.Fatalf("own key after Delete: %+v %v, want absent", k, err)
	}
}

// TestKubeStoreOutageKeepsNodes: while the API server is out of reach
// (every connection to it cut), a node keeps the others live (it cannot
// see their renewals, as they cannot make them: nobody expired), and so
// keeps routing to them; once it is back, both renew and stay live.
func TestKubeStoreOutageKeepsNodes(t *testing.T) {
	// Longer than client-go's retries of a watch that cannot connect
	// (10 s): it then hands back an empty watch, without an error.
	const outageTTL, outage = 3 * time.Second, 12 * time.Second
	be := kubeBackend(t)
	fwd := kubetest.Need(t).ForwardAPIServer(t)
	// The nodes reach the API server through the forward, as the pods do.
	via := rest.CopyConfig(be.admin)
	via.Host = "https://" + fwd.Addr.String()
	via.TLSClientConfig.ServerName = kubetest.APIServerName
	cli, err := k8sclient.NewForConfig(via)
	if err != nil {
		t.Fatal(err)
	}
	prefix := testPrefix()
	start := func(name string) *Cluster {
		cfg := testConfig(t, prefix, name)
		cfg.LeaseTTL = outageTTL
		cfg.Kubernetes = &KubeBackend{Client: cli, Namespace: be.kube.Namespace, Server: via.Host}
		return startConfig(t, cfg, newMemSource(), nil)
	}
	a, b := start("node-a"), start("node-b")
	bothLive := func() (bool, string) {
		na, _ := b.Node("node-a")
		nb, _ := a.Node("node-b")
		return na.Live && nb.Live, fmt.Sprintf("node-b sees node-a live: %v; node-a sees node-b live: %v", na.Live, nb.Live)
	}
	testenv.Eventually(t, 10*time.Second, bothLive)

	fwd.Cut(true)
	defer fwd.Cut(false)
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		return a.Health() != nil && b.Health() != nil, "both nodes see the API server gone"
	})
	// Four lease durations without a renewal seen: each keeps the other
	// live.
	for until := time.Now().Add(outage); time.Now().Before(until); {
		if ok, why := bothLive(); !ok {
			t.Fatalf("during the outage: %s, want both live (nobody can renew, nobody expired)", why)
		}
		time.Sleep(50 * time.Millisecond)
	}
	fwd.Cut(false)
	// From the end of the outage on, strictly: both live while each sees
	// the API server again (at its own time) and three durations after.
	var healthy time.Time
	for deadline := time.Now().Add(30 * time.Second); ; {
		if ok, why := bothLive(); !ok {
			t.Fatalf("after the outage: %s, want both live", why)
		}
		if healthy.IsZero() && a.Health() == nil && b.Health() == nil {
			healthy = time.Now()
		}
		if !healthy.IsZero() && time.Since(healthy) > 3*outageTTL {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s after the outage: health %v, %v", a.Health(), b.Health())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
