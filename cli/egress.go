package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sandwake/sandwake/client"
)

// egressFlags are the flags of `caddy sandwake egress`.
type egressFlags struct {
	policy                string
	allow, deny           []string
	clearAllow, clearDeny bool
	log, lock             bool
}

// egressCommand is `caddy sandwake egress <id> [--policy p] [--allow e]…
// [--deny e]… | --log | --lock`: it shows a sandbox's egress policy, or
// changes it (in force on a running sandbox when the command returns),
// prints what the sandbox tried outbound (--log), or turns what a learning
// sandbox used into its allow list (--lock). --log and --lock are flags,
// not subcommands: "log" and "lock" are valid sandbox ids.
func (c *session) egressCommand() *cobra.Command {
	var f egressFlags
	cmd := &cobra.Command{
		Use:   "egress <id> [--policy public|none|learn] [--allow <dest>]... [--deny <dest>]... [--clear-allow] [--clear-deny] | <id> --log | <id> --lock",
		Short: "Shows or changes what a sandbox may connect to, shows what it tried, locks what it learned",
	}
	fl := cmd.Flags()
	fl.StringVar(&f.policy, "policy", "", "public (the internet, not the host or private networks), none (nothing but the allow list) or learn (public, recording what is used for --lock)")
	fl.StringArrayVar(&f.allow, "allow", nil, "replace the allow list with these: a DNS name name[:port][/tcp|/udp] (registry.npmjs.org, *.githubusercontent.com) or an address addr[/bits][:port][/tcp|/udp] (repeatable)")
	fl.StringArrayVar(&f.deny, "deny", nil, "replace the deny list with these (under public and learn), in the forms of --allow (repeatable)")
	fl.BoolVar(&f.clearAllow, "clear-allow", false, "empty the allow list")
	fl.BoolVar(&f.clearDeny, "clear-deny", false, "empty the deny list")
	fl.BoolVar(&f.log, "log", false, "print what the sandbox tried outbound: the names it looked up and its connections, allowed and denied")
	fl.BoolVar(&f.lock, "lock", false, "turn what a sandbox under learn used into its allow list under none")
	cmd.RunE = c.run(func(ctx context.Context, cmd *cobra.Command, api *client.Client, args []string) error {
		if err := wantArgs(cmd, args, "id"); err != nil {
			return err
		}
		if err := f.check(); err != nil {
			return err
		}
		id := args[0]
		var raw []byte
		switch {
		case f.log:
			l, err := api.EgressLog(ctx, id, client.Body(&raw))
			if err != nil {
				return err
			}
			if c.wantJSON() {
				return printJSON(cmd.OutOrStdout(), raw)
			}
			return writeEgressLog(cmd.OutOrStdout(), &l, c.now())
		case f.lock:
			rec, err := api.LockEgress(ctx, id, client.Body(&raw))
			if err != nil {
				return err
			}
			if c.wantJSON() {
				return printJSON(cmd.OutOrStdout(), raw)
			}
			if err := writeSummary(cmd.OutOrStdout(), &rec, "locked: "+egressText(rec.Egress)); err != nil {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), "in a template block: "+templateEgressLine(rec.Egress))
			return err
		}
		rec, err := api.Get(ctx, id, client.Body(&raw))
		if err != nil {
			return err
		}
		if f.changes() {
			e := f.apply(rec.Egress)
			if rec, err = api.Update(ctx, id, client.Patch{Egress: &e}, client.Body(&raw)); err != nil {
				return err
			}
		}
		if c.wantJSON() {
			return printJSON(cmd.OutOrStdout(), raw)
		}
		return writeSummary(cmd.OutOrStdout(), &rec, "egress "+egressText(rec.Egress))
	})
	return cmd
}

// check refuses flags that contradict each other.
func (f *egressFlags) check() error {
	if f.clearAllow && len(f.allow) > 0 {
		return errors.New("egress: --clear-allow and --allow together: give one")
	}
	if f.clearDeny && len(f.deny) > 0 {
		return errors.New("egress: --clear-deny and --deny together: give one")
	}
	if f.log && f.lock {
		return errors.New("egress: --log and --lock together: give one")
	}
	if (f.log || f.lock) && f.changes() {
		what := "--log"
		if f.lock {
			what = "--lock"
		}
		return fmt.Errorf("egress: %s does not change the policy: give it without --policy, --allow, --deny, --clear-allow or --clear-deny", what)
	}
	return nil
}

// changes reports whether the flags change the policy.
func (f *egressFlags) changes() bool {
	return f.policy != "" || len(f.allow) > 0 || len(f.deny) > 0 || f.clearAllow || f.clearDeny
}

// apply is the policy cur becomes with the flags: a PATCH replaces policy,
// allow and deny together, so what a flag does not name is carried over.
// A none policy drops the deny list unless --deny names one (none opens
// nothing to deny, and the API refuses deny entries under it).
func (f *egressFlags) apply(cur *client.Egress) client.Egress {
	e := client.Egress{}
	if cur != nil {
		e = *cur
	}
	if f.policy != "" {
		e.Policy = f.policy
	}
	if len(f.allow) > 0 || f.clearAllow {
		e.Allow = f.allow
	}
	if len(f.deny) > 0 || f.clearDeny {
		e.Deny = f.deny
	} else if f.policy == "none" {
		e.Deny = nil
	}
	return e
}

// templateEgressLine is a locked policy as the line of a Caddyfile template
// block, so that a template's next sandboxes start with what a run learned.
func templateEgressLine(e *client.Egress) string {
	line := []string{"egress", "none"}
	if e != nil {
		line = append(line, e.Allow...)
	}
	return strings.Join(line, " ")
}

// egressText is a policy in one line: "public allow a b deny c".
func egressText(e *client.Egress) string {
	if e == nil {
		return "-"
	}
	s := e.Policy
	if len(e.Allow) > 0 {
		s += " allow " + strings.Join(e.Allow, " ")
	}
	if len(e.Deny) > 0 {
		s += " deny " + strings.Join(e.Deny, " ")
	}
	return strings.TrimSpace(s)
}
