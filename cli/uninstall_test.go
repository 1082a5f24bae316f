package cli

import (
	"context"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	dockerclient "github.com/moby/moby/client"

	"github.com/sandwake/sandwake/egress"
	"github.com/sandwake/sandwake/engine"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/lifecycle/docker"
)

// uninstallInstance is a gateway instance's engine (store, Docker runtime,
// egress firewall) with one sandbox made through its Manager.
type uninstallInstance struct {
	name, id string
	eng      *engine.Engine
	closed   sync.Once
}

func (i *uninstallInstance) close() { i.closed.Do(func() { i.eng.Close() }) }

func (i *uninstallInstance) network() string { return docker.DefaultSandboxNetwork + "-" + i.name }

func (i *uninstallInstance) table() string {
	return egress.TableName(docker.BridgeName(i.network()))
}

// openUninstallInstance opens an instance and creates a sandbox in it;
// everything it made is removed when the test ends, whatever uninstall did.
func openUninstallInstance(t *testing.T, prefix string) *uninstallInstance {
	t.Helper()
	cli := testenv.Docker(t)
	image := testenv.TestAppImage(t)
	i := &uninstallInstance{name: testenv.UniqueID(prefix), id: testenv.UniqueID("un")}
	eng, err := engine.Open(engine.Options{
		Dir: t.TempDir(), Instance: i.name, Labels: testenv.Labels(),
		SandboxSubnet: netip.MustParsePrefix(testenv.SandboxSubnet()), StopTimeout: 2 * time.Second,
		Manager: lifecycle.Config{Firewall: egress.New(egress.Options{})},
	})
	if err != nil {
		t.Fatal(err)
	}
	i.eng = eng
	t.Cleanup(func() {
		i.close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		testenv.RemoveInstance(ctx, cli, i.name) // containers, network, tables
		cli.VolumeRemove(ctx, docker.VolumeName(i.id), dockerclient.VolumeRemoveOptions{Force: true})
		for _, family := range []string{"inet", "bridge"} { // left without their network, should uninstall fail
			exec.Command("nft", "delete", "table", family, i.table()).Run()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := eng.Manager.Create(ctx, lifecycle.CreateRequest{ID: i.id, Spec: lifecycle.Spec{Image: image, Ports: []int{8080}}}); err != nil {
		t.Fatalf("create in instance %s: %v", i.name, err)
	}
	return i
}

// present reports which of instance i's objects the engine and the kernel
// hold: container, volume, network, inet table, bridge table.
func (i *uninstallInstance) present(t *testing.T) [5]bool {
	t.Helper()
	cli := testenv.Docker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	exists := func(err error) bool {
		if err != nil && !cerrdefs.IsNotFound(err) {
			t.Fatal(err)
		}
		return err == nil
	}
	_, cerr := cli.ContainerInspect(ctx, docker.ContainerName(i.id), dockerclient.ContainerInspectOptions{})
	_, verr := cli.VolumeInspect(ctx, docker.VolumeName(i.id), dockerclient.VolumeInspectOptions{})
	_, nerr := cli.NetworkInspect(ctx, i.network(), dockerclient.NetworkInspectOptions{})
	return [5]bool{exists(cerr), exists(verr), exists(nerr),
		exec.Command("nft", "list", "table", "inet", i.table()).Run() == nil,
		exec.Command("nft", "list", "table", "bridge", i.table()).Run() == nil}
}

// TestUninstallCLI: `caddy sandwake uninstall --instance a --volumes`
// removes instance a's container, volume, network and both tables of its
// bridge, and leaves instance b's; it refuses while a's gateway runs.
func TestUninstallCLI(t *testing.T) {
	a := openUninstallInstance(t, "una")
	b := openUninstallInstance(t, "unb")
	all := [5]bool{true, true, true, true, true}
	if got := a.present(t); got != all {
		t.Fatalf("instance a before uninstall: container, volume, network, inet, bridge table = %v, want all", got)
	}
	ctx := context.Background()

	runCLI(t, ctx, "uninstall").failed(t, "uninstall without --instance", "--instance <name> is required")
	// a's gateway runs (its firewall's forwarder answers): refused.
	runCLI(t, ctx, "uninstall", "--instance", a.name, "--volumes").failed(t, "uninstall of a running instance", "is running")
	if got := a.present(t); got != all {
		t.Fatalf("a refused uninstall removed something: %v", got)
	}

	a.close()
	out := runCLI(t, ctx, "uninstall", "--instance", a.name, "--volumes").ok(t, "uninstall")
	t.Logf("$ caddy sandwake uninstall --instance %s --volumes\n%s", a.name, out)
	// The tables' lines are not checked: a gateway elsewhere on the host
	// may have removed them first, on the engine's report of the network
	// removed.
	for _, want := range []string{"removed container " + docker.ContainerName(a.id) + "\n", "removed volume " + docker.VolumeName(a.id) + "\n", "removed network " + a.network() + "\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("uninstall printed %q, want a line %q", out, want)
		}
	}
	if strings.Contains(out, b.name) || strings.Contains(out, b.id) {
		t.Errorf("uninstall of %s printed objects of instance %s: %q", a.name, b.name, out)
	}
	if got := a.present(t); got != [5]bool{} {
		t.Errorf("after uninstall, instance a's container, volume, network, inet, bridge table = %v, want none", got)
	}
	if got := b.present(t); got != all {
		t.Errorf("after uninstall of a, instance b's container, volume, network, inet, bridge table = %v, want all", got)
	}

	// Again: nothing left.
	if out := runCLI(t, ctx, "uninstall", "--instance", a.name).ok(t, "uninstall again"); out != "nothing of instance "+a.name+" to remove\n" {
		t.Errorf("a second uninstall printed %q", out)
	}
}
