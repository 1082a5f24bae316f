package cli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandwake/sandwake/client"
)

// nodesCommand is `caddy sandwake nodes`.
func (c *session) nodesCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "nodes",
		Short: "Lists the cluster's nodes",
	}
	cmd.RunE = c.run(func(ctx context.Context, cmd *cobra.Command, api *client.Client, args []string) error {
		if err := wantArgs(cmd, args); err != nil {
			return err
		}
		var raw []byte
		nv, err := api.Nodes(ctx, client.Body(&raw))
		if err != nil {
			return err
		}
		if c.wantJSON() {
			return printJSON(cmd.OutOrStdout(), raw)
		}
		return writeNodes(cmd.OutOrStdout(), nv, c.now())
	})
	return cmd
}

// writeNodes prints nodes as an aligned table; the node answering is marked
// with a star.
func writeNodes(w io.Writer, nv client.NodeList, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATUS\tSANDBOXES\tRESIDENT\tFREE MEMORY\tADVERTISE\tUPDATED")
	for _, n := range nv.Nodes {
		status := "live"
		if !n.Live {
			status = "lost"
		}
		if n.Draining {
			status += ",draining"
		}
		name := n.Name
		if name == nv.Self {
			name += " *"
		}
		resident := fmt.Sprintf("%d", n.Capacity.Resident)
		if n.Capacity.MaxResident > 0 {
			resident += fmt.Sprintf("/%d", n.Capacity.MaxResident)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", name, status, n.Sandboxes, resident,
			formatBytes(n.Capacity.FreeMemoryMB<<20), orDash(n.Advertise), relTime(n.UpdatedAt, now))
	}
	return tw.Flush()
}

// nodeCommand is `caddy sandwake node drain|remove <name>`.
func (c *session) nodeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node <drain|remove> <name>",
		Short: "Drains or removes a cluster node",
		Args:  cobra.NoArgs,
	}
	var undo bool
	drain := &cobra.Command{
		Use:   "drain <name> [--undo]",
		Short: "Stops placing new sandboxes on a node (--undo places them again)",
	}
	drain.Flags().BoolVar(&undo, "undo", false, "clear the draining mark")
	drain.RunE = c.run(func(ctx context.Context, cmd *cobra.Command, api *client.Client, args []string) error {
		if err := wantArgs(cmd, args, "name"); err != nil {
			return err
		}
		var raw []byte
		_, err := api.DrainNode(ctx, args[0], !undo, client.Body(&raw))
		if err != nil {
			return err
		}
		if c.wantJSON() {
			return printJSON(cmd.OutOrStdout(), raw)
		}
		if undo {
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "node %s takes new sandboxes again\n", args[0])
		} else {
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "node %s is draining: no new sandboxes are placed on it; its own keep running\n", args[0])
		}
		return err
	})
	remove := &cobra.Command{
		Use:   "remove <name>",
		Short: "Forgets a node that is gone for good; its sandboxes are marked killed (their files went with the host)",
	}
	remove.RunE = c.run(func(ctx context.Context, cmd *cobra.Command, api *client.Client, args []string) error {
		if err := wantArgs(cmd, args, "name"); err != nil {
			return err
		}
		var raw []byte
		killed, err := api.RemoveNode(ctx, args[0], client.Body(&raw))
		if err != nil {
			return err
		}
		if c.wantJSON() {
			return printJSON(cmd.OutOrStdout(), raw)
		}
		_, err = fmt.Fprintf(cmd.OutOrStdout(), "removed node %s: %d sandbox(es) marked killed\n", args[0], killed)
		return err
	})
	for _, sub := range []*cobra.Command{drain, remove} {
		sub.SilenceErrors, sub.SilenceUsage = true, true
		cmd.AddCommand(sub)
	}
	return cmd
}
