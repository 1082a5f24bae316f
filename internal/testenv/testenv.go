package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moby/moby/client"
)

// LabelRun marks every container, volume and image a test binary creates,
// with the run's id as value, so that cleanup removes exactly those.
const LabelRun = "sandwake.test-run"

var runID = randomHex(6)

// RunID identifies this test binary's run.
func RunID() string { return runID }

// Labels are the labels to put on everything the run creates.
func Labels() map[string]string { return map[string]string{LabelRun: runID} }

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// UniqueID returns a sandbox id unique to this run: prefix, the run id and a
// random suffix, all lowercase alphanumerics.
func UniqueID(prefix string) string { return prefix + runID + randomHex(3) }

// Network is the sandbox network of this run's gateways (their
// sandbox_network option): made by the first gateway, labelled with the run,
// removed by Cleanup. A per-run name keeps parallel test binaries from
// removing a network another one still uses.
func Network() string { return "sw-test-" + runID }

// SandboxSubnet is a sandbox_subnet for one gateway of this run: the next
// /24 of a block of 10.128.0.0/9 drawn at random per test binary (256
// subnets), so that tests which need a subnet known in advance take none
// from the engine's address pools. Most tests leave the choice to the
// engine (no sandbox_subnet) and remove their network when done.
func SandboxSubnet() string {
	n := subnetSeq.Add(1) - 1
	block := subnetBlock + int(n/256)
	return fmt.Sprintf("10.%d.%d.0/24", 128+block%128, n%256)
}

var (
	subnetBlock = func() int {
		b := make([]byte, 1)
		rand.Read(b)
		return int(b[0] % 128)
	}()
	subnetSeq atomic.Int64
)

// RequireDocker reports whether a missing engine fails tests.
func RequireDocker() bool { return os.Getenv("SANDWAKE_REQUIRE_DOCKER") == "1" }

var (
	dockerOnce sync.Once
	dockerCli  *client.Client
	dockerErr  error
)

// Docker returns a client to the engine, or fails the test under
// SANDWAKE_REQUIRE_DOCKER=1 and skips it otherwise.
func Docker(t testing.TB) *client.Client {
	t.Helper()
	dockerOnce.Do(func() {
		dockerCli, dockerErr = client.New(client.FromEnv)
		if dockerErr != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, dockerErr = dockerCli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true})
	})
	if dockerErr != nil {
		if RequireDocker() {
			t.Fatalf("docker engine required (SANDWAKE_REQUIRE_DOCKER=1) but not usable: %v", dockerErr)
		}
		t.Skipf("docker engine not usable (set SANDWAKE_REQUIRE_DOCKER=1 to fail instead): %v", dockerErr)
	}
	return dockerCli
}

var (
	imageOnce sync.Once
	imageRef  string
	imageErr  error
)

// TestAppImage returns the reference of the testapp image, building and
// importing it on first use. It is removed by Main when the binary ends.
func TestAppImage(t testing.TB) string {
	t.Helper()
	cli := Docker(t)
	imageOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		dir, err := os.MkdirTemp("", "sandwake-testapp-")
		if err != nil {
			imageErr = err
			return
		}
		defer os.RemoveAll(dir)
		bin, err := BuildTestApp(ctx, dir)
		if err != nil {
			imageErr = err
			return
		}
		ref := "sandwake-testapp:" + runID
		if imageErr = ImportImage(ctx, cli, bin, ref, Labels()); imageErr == nil {
			imageRef = ref
		}
	})
	if imageErr != nil {
		t.Fatalf("testapp image: %v", imageErr)
	}
	return imageRef
}

// Main runs the tests of a package and then removes every container, volume
// and image this run labelled, whatever the outcome. Use it as TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if dockerCli != nil && dockerErr == nil { // nothing was made on an engine that never answered
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		if err := Cleanup(ctx, dockerCli); err != nil {
			fmt.Fprintln(os.Stderr, "testenv cleanup:", err)
			if code == 0 {
				code = 1
			}
		}
		cancel()
	}
	os.Exit(code)
}

// Cleanup removes this run's containers, volumes, networks and image from
// the engine.
func Cleanup(ctx context.Context, cli *client.Client) error {
	f := client.Filters{}.Add("label", LabelRun+"="+runID)
	var errs []string
	cs, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return err
	}
	for _, c := range cs.Items {
		if _, err := cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true}); err != nil {
			errs = append(errs, err.Error())
		}
	}
	vs, err := cli.VolumeList(ctx, client.VolumeListOptions{Filters: f})
	if err != nil {
		return err
	}
	for _, v := range vs.Items {
		if _, err := cli.VolumeRemove(ctx, v.Name, client.VolumeRemoveOptions{Force: true}); err != nil {
			errs = append(errs, err.Error())
		}
	}
	ns, err := cli.NetworkList(ctx, client.NetworkListOptions{Filters: f})
	if err != nil {
		return err
	}
	for _, n := range ns.Items {
		RemoveFirewall(n.Options)
		if _, err := cli.NetworkRemove(ctx, n.ID, client.NetworkRemoveOptions{}); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if imageRef != "" {
		if _, err := cli.ImageRemove(ctx, imageRef, client.ImageRemoveOptions{Force: true, PruneChildren: true}); err != nil {
			errs = append(errs, err.Error())
		}
	}
	// Images the run's gateways imported with its labels (a group's infra
	// image).
	if is, err := cli.ImageList(ctx, client.ImageListOptions{Filters: f}); err == nil {
		for _, im := range is.Items {
			if _, err := cli.ImageRemove(ctx, im.ID, client.ImageRemoveOptions{Force: true, PruneChildren: true}); err != nil && !strings.Contains(err.Error(), "No such image") {
				errs = append(errs, err.Error())
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// RemoveInstance removes the containers and the sandbox network (with its
// firewall table) of one gateway instance of this run, for a test whose
// gateway has stopped: each instance has a network of its own, and a long
// test binary must not hold dozens of them until Cleanup. Volumes are left
// to Cleanup. Best effort: what fails here, Cleanup removes.
func RemoveInstance(ctx context.Context, cli *client.Client, instance string) {
	if instance == "" {
		return
	}
	f := client.Filters{}.Add("label", LabelRun+"="+runID).Add("label", "sandwake.instance="+instance)
	if cs, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f}); err == nil {
		for _, c := range cs.Items {
			cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true})
		}
	}
	if ns, err := cli.NetworkList(ctx, client.NetworkListOptions{Filters: f}); err == nil {
		for _, n := range ns.Items {
			RemoveFirewall(n.Options)
			cli.NetworkRemove(ctx, n.ID, client.NetworkRemoveOptions{})
		}
	}
}

// RemoveFirewall deletes the egress firewall tables of a sandbox network
// the run made (the inet table of the policies and the bridge table of the
// port bindings; their name follows egress.TableName), if there are any.
func RemoveFirewall(opts map[string]string) {
	if br := opts["com.docker.network.bridge.name"]; br != "" {
		for _, family := range []string{"inet", "bridge"} {
			exec.Command("nft", "delete", "table", family, "sandwake-"+br).Run()
		}
	}
}

// Eventually polls cond every 20 ms until it returns true or timeout passes,
// then fails the test with cond's last description. It replaces sleeps: tests
// wait for a condition, never for a duration.
func Eventually(t testing.TB, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, what := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s: %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
