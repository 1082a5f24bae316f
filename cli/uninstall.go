package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandwake/sandwake/egress"
	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/lifecycle/docker"
)

// uninstallTimeout bounds an uninstall: a few engine calls per object.
const uninstallTimeout = 5 * time.Minute

// uninstalled is what `caddy sandwake uninstall` removed (its JSON).
type uninstalled struct {
	Instance   string   `json:"instance"`
	Containers []string `json:"containers"`
	Volumes    []string `json:"volumes"`
	Networks   []string `json:"networks"`
	Tables     []string `json:"tables"`
}

// uninstallCommand is `caddy sandwake uninstall --instance <name>
// [--volumes]`: it removes from the Docker engine (DOCKER_HOST, else the
// local socket) and this host's kernel what one gateway instance made —
// containers, with --volumes volumes, its network and the egress
// firewall's tables of its bridge — talking to the engine and the kernel,
// not to a gateway (there is none running, or it refuses).
func (c *session) uninstallCommand() *cobra.Command {
	var instance string
	var volumes bool
	cmd := &cobra.Command{
		Use:   "uninstall --instance <name> [--volumes]",
		Short: "Removes what a stopped gateway instance made on this host: containers, network, firewall tables (and with --volumes, volumes)",
		Long: `Removes what one gateway instance made on this host's Docker engine
(DOCKER_HOST, else the local socket) and kernel: every container labelled
sandwake.instance=<name> (sandboxes, their services, warm pool
containers), its sandbox network and the egress firewall's two nftables
tables of its bridge; with --volumes, its volumes too (the sandboxes'
disks). Other instances' objects are left alone.

Stop the gateway first: it refuses while a gateway of that instance
answers on its network (one with egress unenforced is not seen). The
instance's name is the instance option, or the one a gateway generated
(docker inspect a sandbox's container: label sandwake.instance). Run as
root (the tables need CAP_NET_ADMIN), in the engine host's network
namespace: it refuses where the instance's network's bridge is not seen.`,
		Args: cobra.NoArgs,
	}
	cmd.Flags().StringVar(&instance, "instance", "", "the gateway instance to remove (required)")
	cmd.Flags().BoolVar(&volumes, "volumes", false, "remove the instance's volumes too: the sandboxes' disks are lost")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := c.checkOutput(cmd); err != nil {
			return c.fail(cmd, err)
		}
		ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		ctx, cancel := context.WithTimeout(ctx, uninstallTimeout)
		defer cancel()
		out, err := uninstall(ctx, instance, volumes)
		if err == nil {
			err = c.printUninstalled(cmd.OutOrStdout(), out)
		} else {
			// What went before the failure, as lines.
			printRemoved(cmd.OutOrStdout(), out)
		}
		if err != nil {
			if errors.Is(err, context.Canceled) && ctx.Err() != nil {
				err = errors.New("interrupted")
			}
			return c.fail(cmd, err)
		}
		return nil
	}
	return cmd
}

// uninstall removes instance's objects from the engine, then the tables of
// the bridges that went with its networks; what it removed is answered
// with a failure too.
func uninstall(ctx context.Context, instance string, volumes bool) (uninstalled, error) {
	out := uninstalled{Instance: instance}
	if instance == "" {
		return out, errors.New("uninstall: --instance <name> is required (the gateway's instance option, or the sandwake.instance label of its containers)")
	}
	if !lifecycle.ValidInstance(instance) {
		return out, fmt.Errorf("uninstall: --instance %q: want 1-63 characters of [a-z0-9_.-] starting with a letter or digit", instance)
	}
	rt, err := docker.New(docker.Options{Instance: instance})
	if err != nil {
		return out, err
	}
	defer rt.Close()
	res, err := rt.Uninstall(ctx, docker.UninstallOptions{Volumes: volumes, Check: bridgeVisible(instance), Running: func(n lifecycle.SandboxNet) bool { return egress.Serving(n.Gateway) }})
	out.Containers, out.Volumes, out.Networks = res.Containers, res.Volumes, res.Networks
	if err != nil {
		return out, err
	}
	var errs []error
	for _, br := range res.Bridges {
		tables, err := egress.RemoveTables(br)
		out.Tables = append(out.Tables, tables...)
		errs = append(errs, err)
	}
	return out, errors.Join(errs...)
}

// bridgeVisible refuses a network whose bridge is not in this network
// namespace: whether a gateway serves it is read from this namespace's
// sockets (egress.Serving), which then cannot show it, and its tables are
// not here either. That is a container without the host's network, or a
// remote DOCKER_HOST.
func bridgeVisible(instance string) func(lifecycle.SandboxNet) error {
	return func(n lifecycle.SandboxNet) error {
		if _, err := net.InterfaceByName(n.Bridge); err != nil {
			return fmt.Errorf("uninstall: the bridge %s of instance %s's network %s is not in this network namespace (%v), so whether its gateway runs cannot be told: "+
				"run uninstall in the Docker engine host's network namespace (on that host, or in a container with network_mode: host)", n.Bridge, instance, n.Name, err)
		}
		return nil
	}
}

// printUninstalled prints what was removed: a line per object, or the JSON.
func (c *session) printUninstalled(w io.Writer, out uninstalled) error {
	if c.wantJSON() {
		for _, l := range []*[]string{&out.Containers, &out.Volumes, &out.Networks, &out.Tables} {
			if *l == nil {
				*l = []string{}
			}
		}
		b, err := json.Marshal(out)
		if err != nil {
			return err
		}
		return printJSON(w, b)
	}
	n, err := printRemoved(w, out)
	if err == nil && n == 0 {
		_, err = fmt.Fprintf(w, "nothing of instance %s to remove\n", out.Instance)
	}
	return err
}

// printRemoved prints a line per object removed, and counts them.
func printRemoved(w io.Writer, out uninstalled) (int, error) {
	n := 0
	for _, group := range []struct {
		kind  string
		names []string
	}{{"container", out.Containers}, {"volume", out.Volumes}, {"network", out.Networks}, {"firewall table", out.Tables}} {
		for _, name := range group.names {
			if _, err := fmt.Fprintf(w, "removed %s %s\n", group.kind, name); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}
