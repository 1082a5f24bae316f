package cli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/sandwake/sandwake/client"
)

// templatesCommand is `caddy sandwake templates`: the gateway's templates
// and their warm pools.
func (c *session) templatesCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "templates",
		Short: "Lists the gateway's templates and their warm pools",
	}
	cmd.RunE = c.run(func(ctx context.Context, cmd *cobra.Command, api *client.Client, args []string) error {
		if err := wantArgs(cmd, args); err != nil {
			return err
		}
		var raw []byte
		tl, err := api.Templates(ctx, client.Body(&raw))
		if err != nil {
			return err
		}
		if c.wantJSON() {
			return printJSON(cmd.OutOrStdout(), raw)
		}
		return writeTemplates(cmd.OutOrStdout(), tl.Templates)
	})
	return cmd
}

// writeTemplates prints templates as an aligned table.
func writeTemplates(w io.Writer, ts []client.Template) error {
	if len(ts) == 0 {
		_, err := fmt.Fprintln(w, "no templates (define them with template <name> { … } in the sandwake block)")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TEMPLATE\tIMAGE\tPORTS\tMEMORY\tPOOL IDLE\tHITS\tMISSES\tSTATE")
	for _, t := range ts {
		ports := make([]string, len(t.Ports))
		for i, p := range t.Ports {
			ports[i] = strconv.Itoa(p)
		}
		mem := "-"
		if t.MemoryMB > 0 {
			mem = fmt.Sprintf("%d MiB", t.MemoryMB)
		}
		if t.Pool == nil {
			// A tenant's token: the pool's figures are the gateway's.
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t-\t-\t-\t-\n", t.Name, t.Image, strings.Join(ports, ","), mem)
			continue
		}
		idle := "no pool"
		if t.Pool.MaxIdle > 0 {
			idle = fmt.Sprintf("%d/%d", t.Pool.Idle, t.Pool.MinIdle)
			if t.Pool.Filling > 0 {
				idle += fmt.Sprintf(" (+%d filling)", t.Pool.Filling)
			}
		}
		state := t.Pool.State
		if t.Pool.LastError != "" {
			state += " (failing: " + t.Pool.LastError + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", t.Name, t.Image, strings.Join(ports, ","), mem, idle, t.Pool.Hits, t.Pool.Misses, state)
	}
	return tw.Flush()
}
