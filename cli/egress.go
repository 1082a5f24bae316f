package cli

import (
	"context"
	"errors"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sandwake/sandwake/client"
)

// egressCommand is `caddy sandwake egress <id> [--policy p] [--allow e]…`:
// it shows a sandbox's egress policy, or changes it (in force on a running
// sandbox when the command returns).
func (c *session) egressCommand() *cobra.Command {
	var (
		policy string
		allow  []string
		clear  bool
	)
	cmd := &cobra.Command{
		Use:   "egress <id> [--policy public|none] [--allow <dest>]... [--clear-allow]",
		Short: "Shows or changes what a sandbox may connect to",
	}
	fl := cmd.Flags()
	fl.StringVar(&policy, "policy", "", "public (the internet, not the host or private networks) or none (no outbound connection)")
	fl.StringArrayVar(&allow, "allow", nil, "replace the allow list with these: addr[/bits][:port][/tcp|/udp] (repeatable)")
	fl.BoolVar(&clear, "clear-allow", false, "empty the allow list")
	cmd.RunE = c.run(func(ctx context.Context, cmd *cobra.Command, api *client.Client, args []string) error {
		if err := wantArgs(cmd, args, "id"); err != nil {
			return err
		}
		if clear && len(allow) > 0 {
			return errors.New("egress: --clear-allow and --allow together: give one")
		}
		var raw []byte
		rec, err := api.Get(ctx, args[0], client.Body(&raw))
		if err != nil {
			return err
		}
		if policy != "" || len(allow) > 0 || clear {
			e := client.Egress{}
			if rec.Egress != nil {
				e = *rec.Egress
			}
			if policy != "" {
				e.Policy = policy
			}
			if len(allow) > 0 || clear {
				e.Allow = allow
			}
			if rec, err = api.Update(ctx, args[0], client.Patch{Egress: &e}, client.Body(&raw)); err != nil {
				return err
			}
		}
		if c.wantJSON() {
			return printJSON(cmd.OutOrStdout(), raw)
		}
		extra := "egress "
		if rec.Egress != nil {
			extra += strings.TrimSpace(rec.Egress.Policy + " " + strings.Join(rec.Egress.Allow, " "))
		}
		return writeSummary(cmd.OutOrStdout(), &rec, extra)
	})
	return cmd
}
