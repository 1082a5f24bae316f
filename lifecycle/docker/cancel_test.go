package docker_test

import (
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/lifecycle/docker"
)

// TestCancelledCreateLeavesNoStrayVolume: a caller that gives up while the
// engine makes the container (here: the engine's answer to the create is
// held until the caller's context is done) must not leave the container
// with a volume Docker made again, unlabelled, after the runtime removed
// its own. The create runs to its end; its volume is the labelled one.
func TestCancelledCreateLeavesNoStrayVolume(t *testing.T) {
	cli := testenv.Docker(t)
	image := testenv.TestAppImage(t)
	target := "/var/run/docker.sock"
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		p, ok := strings.CutPrefix(h, "unix://")
		if !ok {
			t.Fatalf("DOCKER_HOST %q is not a unix socket", h)
		}
		target = p
	}
	// A proxy to the engine that holds the answer of POST …/containers/create
	// until the test says (after the caller's context is cancelled).
	release := make(chan struct{})
	var d net.Dialer
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) { r.Out.URL.Scheme, r.Out.URL.Host = "http", "docker" },
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", target)
		}},
		ModifyResponse: func(res *http.Response) error {
			if res.Request.Method == http.MethodPost && strings.HasSuffix(res.Request.URL.Path, "/containers/create") {
				<-release
			}
			return nil
		},
		ErrorLog: log.New(io.Discard, "", 0),
	}
	sock := filepath.Join(t.TempDir(), "docker.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The engine gets the request whatever the caller does.
		rp.ServeHTTP(w, r.WithContext(context.WithoutCancel(r.Context())))
	}), ErrorLog: log.New(io.Discard, "", 0)}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	instance := testenv.UniqueID("c")
	rt, err := docker.New(docker.Options{Host: "unix://" + sock, Labels: testenv.Labels(), Instance: instance, StopTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	id := testenv.UniqueID("c")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cli.ContainerRemove(ctx, docker.ContainerName(id), client.ContainerRemoveOptions{Force: true})
		cli.VolumeRemove(ctx, docker.VolumeName(id), client.VolumeRemoveOptions{Force: true})
		testenv.RemoveInstance(ctx, cli, instance)
	})
	spec := lifecycle.Spec{Image: image, Ports: []int{8080}}
	if err := lifecycle.NormalizeSpec(&spec); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := rt.Create(ctx, id, spec)
		done <- err
	}()
	// The create reached the engine (its volume exists): give up, then let
	// the engine's answer through.
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		_, err := cli.VolumeInspect(context.Background(), docker.VolumeName(id), client.VolumeInspectOptions{})
		return err == nil, "the create's volume is not there yet"
	})
	cancel()
	time.AfterFunc(200*time.Millisecond, func() { close(release) })
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("create: %v", err)
	}
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		_, err := cli.ContainerInspect(context.Background(), docker.ContainerName(id), client.ContainerInspectOptions{})
		return err == nil, "the engine has not made the container yet"
	})
	vol, err := cli.VolumeInspect(context.Background(), docker.VolumeName(id), client.VolumeInspectOptions{})
	if err != nil {
		t.Fatalf("the container's volume: %v", err)
	}
	if vol.Volume.Labels[docker.LabelID] != id || vol.Volume.Labels[docker.LabelInstance] != instance {
		t.Fatalf("the container's volume is not the runtime's (labels %v): it was removed and made again by Docker", vol.Volume.Labels)
	}
}
