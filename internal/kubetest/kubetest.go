package kubetest

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sandwake/sandwake/internal/testenv"
)

// Cluster is a real cluster the tests may use: SANDWAKE_KUBECONFIG names
// its admin kubeconfig, SANDWAKE_K8S_CONTAINERD_SOCK the socket of the
// containerd its kubelet uses (the test image is imported there) and
// SANDWAKE_K8S_BRIDGE the CNI bridge pods are on. SANDWAKE_K8S_STORAGECLASS
// names the claims' class ("": the cluster's default).
// scripts/kubernetes/up.sh starts such a cluster and writes these values
// (KUBECONFIG as SANDWAKE_KUBECONFIG).
type Cluster struct {
	Kubeconfig, Sock, Bridge, StorageClass string
}

// FromEnv reads the cluster's facts from the environment; ok says whether
// the three needed (kubeconfig, containerd socket, bridge) are set.
func FromEnv() (c Cluster, ok bool) {
	c = Cluster{
		Kubeconfig:   os.Getenv("SANDWAKE_KUBECONFIG"),
		Sock:         os.Getenv("SANDWAKE_K8S_CONTAINERD_SOCK"),
		Bridge:       os.Getenv("SANDWAKE_K8S_BRIDGE"),
		StorageClass: os.Getenv("SANDWAKE_K8S_STORAGECLASS"),
	}
	return c, c.Kubeconfig != "" && c.Sock != "" && c.Bridge != ""
}

// Need returns the cluster, or skips the test without one (fails it under
// SANDWAKE_REQUIRE_KUBERNETES=1), and skips it under -short.
func Need(t testing.TB) Cluster {
	t.Helper()
	c, ok := FromEnv()
	if !ok {
		msg := "no cluster: SANDWAKE_KUBECONFIG, SANDWAKE_K8S_CONTAINERD_SOCK and SANDWAKE_K8S_BRIDGE are needed"
		if os.Getenv("SANDWAKE_REQUIRE_KUBERNETES") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	if testing.Short() {
		t.Skip("a real cluster is slow")
	}
	return c
}

// Suffix is a random suffix for names (8 hex digits).
func Suffix() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Image builds internal/testapp into a one-layer image, imports it into
// the cluster's containerd and removes it at the end of the test.
func (c Cluster) Image(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ref, err := c.ImportTestApp(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.RemoveImage(ref) })
	return ref
}

// ImportTestApp builds internal/testapp in dir into a one-layer image and
// imports it into the cluster's containerd under a new reference, which
// it returns; RemoveImage removes it.
func (c Cluster) ImportTestApp(ctx context.Context, dir string) (string, error) {
	bin, err := testenv.BuildTestApp(ctx, dir)
	if err != nil {
		return "", err
	}
	ref := "sandwake.local/testapp-k8s:" + Suffix()
	tarball := filepath.Join(dir, "image.tar")
	if err := writeImage(ref, bin, tarball); err != nil {
		return "", err
	}
	if err := c.ImportImage(ctx, tarball); err != nil {
		return "", err
	}
	return ref, nil
}

// ImportImage imports an image tarball (docker save's, or an OCI layout)
// into the cluster's containerd, where pods with imagePullPolicy Never
// find it under the tarball's references; RemoveImage removes one.
func (c Cluster) ImportImage(ctx context.Context, tarball string) error {
	if out, err := c.ctr(ctx, "images", "import", tarball); err != nil {
		return fmt.Errorf("importing %s: %v\n%s", tarball, err, out)
	}
	return nil
}

// RemoveImage removes ref from the cluster's containerd.
func (c Cluster) RemoveImage(ref string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := c.ctr(ctx, "images", "rm", ref); err != nil {
		return fmt.Errorf("removing %s: %v\n%s", ref, err, out)
	}
	return nil
}

// ctr runs containerd's ctr on the cluster's socket, in the kubelet's
// namespace.
func (c Cluster) ctr(ctx context.Context, args ...string) ([]byte, error) {
	return exec.CommandContext(ctx, "ctr", append([]string{"-a", c.Sock, "-n", "k8s.io"}, args...)...).CombinedOutput()
}

// writeImage writes a docker-archive tarball of one layer holding bin as
// /testapp (its entrypoint), an empty /workspace and a /tmp.
func writeImage(ref, bin, out string) error {
	data, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	mtime := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, d := range []struct {
		name string
		mode int64
	}{{"tmp/", 01777}, {"workspace/", 0755}} {
		tw.WriteHeader(&tar.Header{Name: d.name, Typeflag: tar.TypeDir, Mode: d.mode, ModTime: mtime})
	}
	tw.WriteHeader(&tar.Header{Name: "testapp", Typeflag: tar.TypeReg, Mode: 0755, Size: int64(len(data)), ModTime: mtime})
	tw.Write(data)
	if err := tw.Close(); err != nil {
		return err
	}
	lsum := sha256.Sum256(layer.Bytes())
	lhex := hex.EncodeToString(lsum[:])
	cfg, _ := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"Entrypoint": []string{"/testapp"}, "WorkingDir": "/"},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + lhex}},
	})
	csum := sha256.Sum256(cfg)
	chex := hex.EncodeToString(csum[:])
	manifest, _ := json.Marshal([]map[string]any{{"Config": chex + ".json", "RepoTags": []string{ref}, "Layers": []string{lhex + "/layer.tar"}}})
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	w := tar.NewWriter(f)
	for _, e := range []struct {
		name string
		data []byte
	}{{lhex + "/layer.tar", layer.Bytes()}, {chex + ".json", cfg}, {"manifest.json", manifest}} {
		if err := w.WriteHeader(&tar.Header{Name: e.name, Typeflag: tar.TypeReg, Mode: 0644, Size: int64(len(e.data)), ModTime: mtime}); err != nil {
			return err
		}
		w.Write(e.data)
	}
	return w.Close()
}

// OnBridge fails the test unless addr (an ip or ip:port) is on the
// cluster's CNI bridge: nothing is sent anywhere else.
func (c Cluster) OnBridge(t testing.TB, addr string) {
	t.Helper()
	if err := c.CheckOnBridge(addr); err != nil {
		t.Fatal(err)
	}
}

// CheckOnBridge returns an error unless addr (an ip or ip:port) is on the
// cluster's CNI bridge.
func (c Cluster) CheckOnBridge(addr string) error {
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		ap, err := netip.ParseAddrPort(addr)
		if err != nil {
			return err
		}
		ip = ap.Addr()
	}
	ifc, err := net.InterfaceByName(c.Bridge)
	if err != nil {
		return fmt.Errorf("CNI bridge %s: %w", c.Bridge, err)
	}
	addrs, _ := ifc.Addrs()
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Masked().Contains(ip) {
			return nil
		}
	}
	return fmt.Errorf("%s is not on the CNI bridge %s (%v): not dialled", addr, c.Bridge, addrs)
}

// PodReady reports whether p's Ready condition is true.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
