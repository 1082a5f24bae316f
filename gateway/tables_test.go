package gateway_test

import (
	"context"
	"os/exec"
	"testing"
	"time"

	dockerclient "github.com/moby/moby/client"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandwake/sandwake/egress"
	"github.com/sandwake/sandwake/gateway"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle/docker"
)

// TestNetworkRemovedTablesRemoved: the gateway's sandbox network removed
// behind its back while it runs (docker network rm) takes the firewall's
// two tables of its bridge with it, as the engine reports the removal; the
// next create makes the network and its tables again.
func TestNetworkRemovedTablesRemoved(t *testing.T) {
	// No periodic reconcile: it would make the network (and the tables)
	// again while the test looks.
	h := newHarness(t, "reconcile_interval 1h")
	network := docker.DefaultSandboxNetwork + "-" + h.Instance()
	table := egress.TableName(docker.BridgeName(network))
	has := func(family string) bool { return exec.Command("nft", "list", "table", family, table).Run() == nil }
	t.Cleanup(func() {
		// Left without their network should the test fail (the harness
		// removes the tables of the network it finds).
		for _, family := range []string{"inet", "bridge"} {
			exec.Command("nft", "delete", "table", family, table).Run()
		}
	})
	// The boot's firewall sync made the network and both tables.
	if !has("inet") || !has("bridge") {
		t.Fatalf("tables inet/bridge %s missing after the gateway started (inet %v, bridge %v)", table, has("inet"), has("bridge"))
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := h.Docker.NetworkRemove(ctx, network, dockerclient.NetworkRemoveOptions{}); err != nil {
		t.Fatalf("removing network %s: %v", network, err)
	}
	testenv.Eventually(t, 15*time.Second, func() (bool, string) {
		return !has("inet") && !has("bridge"), "tables of the removed network's bridge still there: " + table
	})

	// The removals are counted on the metrics endpoint. (Not how many:
	// another gateway on the host, told of the removal too, may have
	// removed them first.)
	reg := prometheus.NewRegistry()
	reg.MustRegister(gateway.Collectors()...)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := false
	for _, f := range families {
		exported = exported || f.GetName() == "caddy_sandwake_egress_tables_removed_total"
	}
	if !exported {
		t.Error("caddy_sandwake_egress_tables_removed_total is not exported")
	}

	// A create makes the network again, and the firewall its tables.
	rec := h.Create(nil)
	if !has("inet") || !has("bridge") {
		t.Fatalf("after create %s the tables of %s are not back (inet %v, bridge %v)", rec.ID, table, has("inet"), has("bridge"))
	}
}
