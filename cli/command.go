package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/lifecycle"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "sandwake",
		Usage: "<command> [flags]",
		Short: "Manages sandwake sandboxes through the management API",
		Long: `Manages sandboxes through sandwake's management API (the sandwake_api
handler) of a running Caddy.

The API is found at --api, else $SANDWAKE_API, else http://localhost:8081;
the bearer token is --token, else $SANDWAKE_TOKEN, else $SANDWAKE_API_TOKEN
(the variable the example Caddyfile and make run give the server).
--output table (the default) prints tables for people; --output json (-o
json) prints the API's JSON answer, pretty-printed, for scripts.`,
		CobraFunc: sandwakeCommand,
	})
}

// sandwakeExamples are the examples `caddy sandwake --help` shows.
const sandwakeExamples = `  caddy sandwake ls [--state running]
  caddy sandwake create --image app:latest --port 8080 [--id myapp]
  caddy sandwake create --template web
  caddy sandwake create --image app:latest --port 8080 --service db=postgres:17,ready=tcp:5432,env.POSTGRES_PASSWORD=dev
  caddy sandwake wake myapp
  caddy sandwake get myapp -o json
  caddy sandwake events --sandbox myapp
  caddy sandwake node drain node-b [--undo]
  caddy sandwake cluster ca --out /etc/sandwake/cluster-ca
  caddy sandwake uninstall --instance staging [--volumes]`

// defaultAPI is where the management API is looked for when neither --api
// nor $SANDWAKE_API says.
const defaultAPI = "http://localhost:8081"

// spinEvery is how often the wake spinner polls the sandbox's state.
const spinEvery = 200 * time.Millisecond

// session is one run of `caddy sandwake`: its global flags and where it writes.
type session struct {
	api, token string
	output     outputFormat
	json       bool // --json, the short form of --output json
	now        func() time.Time
}

// sandwakeCommand builds `caddy sandwake` and its subcommands on cmd.
func sandwakeCommand(cmd *cobra.Command) {
	c := &session{now: time.Now, output: outputTable}
	// The registered usage is for `caddy help`'s list; the command's own
	// help shows its commands.
	cmd.Use = "sandwake <command>"
	cmd.Example = sandwakeExamples
	setHelpTemplates(cmd)
	pf := cmd.PersistentFlags()
	pf.StringVar(&c.api, "api", "", "management API URL (default $SANDWAKE_API, else "+defaultAPI+")")
	pf.StringVar(&c.token, "token", "", "API bearer token (default $SANDWAKE_TOKEN, else $SANDWAKE_API_TOKEN)")
	pf.VarP(&c.output, "output", "o", "output format: table (for people) or json (the API's JSON, pretty-printed)")
	pf.BoolVar(&c.json, "json", false, "short for --output json")

	// Errors are printed once, as one line, by c.run and by the flag error
	// function; usage is for --help, not for a failed call.
	cmd.SilenceErrors, cmd.SilenceUsage = true, true
	cmd.SuggestionsMinimumDistance = 2
	cmd.SetFlagErrorFunc(func(sub *cobra.Command, err error) error {
		err = suggestFlag(sub, err)
		if sub != cmd {
			err = fmt.Errorf("%s: %w", sub.Name(), err)
		}
		return c.fail(sub, err)
	})
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 || args[0] == "help" {
			return cmd.Help()
		}
		err := fmt.Errorf("unknown command %q (commands: %s)", args[0], strings.Join(subcommandNames(cmd), ", "))
		if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
			err = fmt.Errorf("unknown command %q; did you mean %q?", args[0], s[0])
		}
		return c.fail(cmd, err)
	}

	for _, sub := range []*cobra.Command{
		c.lsCommand(), c.getCommand(), c.historyCommand(), c.createCommand(),
		c.actionCommand("wake", "Wakes a sandbox and waits until it is running", (*client.Client).Wake),
		c.actionCommand("pause", "Pauses a sandbox (it keeps its memory)", (*client.Client).Pause),
		c.actionCommand("stop", "Stops a sandbox (it keeps its disk)", (*client.Client).Stop),
		c.keepaliveCommand(), c.egressCommand(), c.destroyCommand(), c.purgeCommand(), c.eventsCommand(),
		c.whoamiCommand(), c.templatesCommand(), c.nodesCommand(), c.nodeCommand(), c.clusterCommand(),
		c.uninstallCommand(),
	} {
		sub.SilenceErrors, sub.SilenceUsage = true, true
		cmd.AddCommand(sub)
	}
}

func subcommandNames(cmd *cobra.Command) []string {
	var names []string
	for _, s := range cmd.Commands() {
		if s.IsAvailableCommand() {
			names = append(names, s.Name())
		}
	}
	return names
}

// fail prints err as the command's one line on stderr and returns it, so
// that the process exits with caddy.ExitCodeFailedStartup (1).
func (c *session) fail(cmd *cobra.Command, err error) error {
	msg := strings.Join(strings.Fields(err.Error()), " ")
	fmt.Fprintf(cmd.ErrOrStderr(), "sandwake: %s\n", msg)
	return err
}

// run wraps a subcommand's body: it builds the API client, cancels the
// context on Ctrl-C and prints a failure as one line.
func (c *session) run(body func(ctx context.Context, cmd *cobra.Command, api *client.Client, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		if err := c.checkOutput(cmd); err != nil {
			return c.fail(cmd, err)
		}
		ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		token, from := c.tokenValue()
		base := c.apiURL()
		api, err := client.New(base, token, nil)
		if err != nil {
			err = fmt.Errorf("--api %q is not an http(s) URL like %s", base, defaultAPI)
		} else {
			err = body(ctx, cmd, api, args)
		}
		if err == nil {
			return nil
		}
		if client.StatusOf(err) == http.StatusUnauthorized {
			err = fmt.Errorf("%w; set --token, $SANDWAKE_TOKEN or $SANDWAKE_API_TOKEN (%s)", err, from)
		}
		if errors.Is(err, context.Canceled) && ctx.Err() != nil {
			err = errors.New("interrupted")
		}
		return c.fail(cmd, err)
	}
}

// checkOutput refuses --json with --output table: the two disagree.
func (c *session) checkOutput(cmd *cobra.Command) error {
	if c.json && c.output == outputTable && cmd.Flags().Changed("output") {
		return fmt.Errorf("%s: --json and --output table disagree: give one", cmd.Name())
	}
	return nil
}

// wantJSON reports whether the command prints the API's JSON.
func (c *session) wantJSON() bool { return c.json || c.output == outputJSON }

func (c *session) apiURL() string {
	if c.api != "" {
		return c.api
	}
	if v := os.Getenv("SANDWAKE_API"); v != "" {
		return v
	}
	return defaultAPI
}

// tokenEnv are the environment variables the bearer token is read from when
// --token is not given, first set first: the CLI's own, then the server's
// (so a shell set up for the gateway, like make run's, works as it is).
var tokenEnv = []string{"SANDWAKE_TOKEN", "SANDWAKE_API_TOKEN"}

// tokenValue is the bearer token to send and where it came from, said as
// the 401 hint shows it.
func (c *session) tokenValue() (token, from string) {
	if c.token != "" {
		return c.token, "the token sent came from --token"
	}
	for _, name := range tokenEnv {
		if v := os.Getenv(name); v != "" {
			return v, "the token sent came from $" + name
		}
	}
	return "", "no token was sent"
}

// wantArgs checks a subcommand's positional arguments.
func wantArgs(cmd *cobra.Command, args []string, names ...string) error {
	if len(args) == len(names) {
		for i, a := range args {
			if a == "" {
				return fmt.Errorf("%s: %s is empty", cmd.Name(), names[i])
			}
		}
		return nil
	}
	if len(names) == 0 {
		return fmt.Errorf("%s: takes no arguments, got %q", cmd.Name(), args)
	}
	want := "<" + strings.Join(names, "> <") + ">"
	return fmt.Errorf("%s: want %s, got %d argument(s) (usage: %s)", cmd.Name(), want, len(args), cmd.UseLine())
}

func (c *session) lsCommand() *cobra.Command {
	var state, cursor string
	var labels []string
	var limit int
	cmd := &cobra.Command{
		Use:   "ls [--state <state>] [--label k=v] [--limit <n> [--cursor <next>]]",
		Short: "Lists sandboxes",
	}
	cmd.Flags().StringVar(&state, "state", "", "only sandboxes in this state ("+statesList()+")")
	cmd.Flags().StringArrayVar(&labels, "label", nil, "only sandboxes with this label KEY=VALUE (repeatable)")
	cmd.Flags().IntVar(&limit, "limit", 0, "a page of at most this many sandboxes (1-1000; default: all)")
	cmd.Flags().StringVar(&cursor, "cursor", "", "the page after this cursor (the next a paged ls printed)")
	cmd.RunE = c.run(func(ctx context.Context, cmd *cobra.Command, api *client.Client, args []string) error {
		if err := wantArgs(cmd, args); err != nil {
			return err
		}
		if state != "" && !lifecycle.ValidState(lifecycle.State(state)) {
			return fmt.Errorf("ls: --state %q is not one of %s", state, statesList())
		}
		if cmd.Flags().Changed("limit") && (limit < 1 || limit > lifecycle.MaxPageLimit) {
			return fmt.Errorf("ls: --limit %d is not from 1 to %d", limit, lifecycle.MaxPageLimit)
		}
		want, err := keyValues("label", labels)
		if err != nil {
			return fmt.Errorf("ls: %w", err)
		}
		var raw []byte
		page, err := api.ListPage(ctx, client.ListOptions{State: state, Labels: want, Limit: limit, Cursor: cursor}, client.Body(&raw))
		if err != nil {
			return err
		}
		if c.wantJSON() {
			return printJSON(cmd.OutOrStdout(), raw)
		}
		if err := writeTable(cmd.OutOrStdout(), page.Sandboxes, c.now()); err != nil {
			return err
		}
		if page.Next != "" {
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "more: --cursor %s\n", page.Next)
		}
		return err
	})
	return cmd
}

func statesList() string {
	s := make([]string, len(lifecycle.States))
	for i, st := range lifecycle.States {
		s[i] = string(st)
	}
	return strings.Join(s, ", ")
}

func (c *session) getCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "get <id>",
		Short: "Shows one sandbox",
	}
	cmd.RunE = c.run(func(ctx context.Context, cmd *cobra.Command, api *client.Client, args []string) error {
		if err := wantArgs(cmd, args, "id"); err != nil {
			return err
		}
		var raw []byte
		rec, err := api.Get(ctx, args[0], client.Body(&raw))
		if err != nil {
			return err
		}
		if c.wantJSON() {
			return printJSON(cmd.OutOrStdout(), raw)
		}
		return writeRecord(cmd.OutOrStdout(), &rec, c.now())
	})
	return cmd
}

func (c *session) historyCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "history <id>",
		Short: "Shows the state changes the log keeps of a sandbox, oldest first",
	}
	cmd.RunE = c.run(func(ctx context.Context, cmd *cobra.Command, api *client.Client, args []string) error {
		if err := wantArgs(cmd, args, "id"); err != nil {
			return err
		}
		var raw []byte
		evs, err := api.History(ctx, args[0], client.Body(&raw))
		if err != nil {
			return err
		}
		if c.wantJSON() {
			return printJSON(cmd.OutOrStdout(), raw)
		}
		for _, ev := range evs {
			if err := writeEventLine(cmd.OutOrStdout(), ev); err != nil {
				return err
			}
		}
		return nil
	})
	return cmd
}

func (c *session) whoamiCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "whoami",
		Short: "Shows what the token may do: its scope and tenant labels",
	}
	cmd.RunE = c.run(func(ctx context.Context, cmd *cobra.Command, api *client.Client, args []string) error {
		if err := wantArgs(cmd, args); err != nil {
			return err
		}
		var raw []byte
		id, err := api.WhoAmI(ctx, client.Body(&raw))
		if err != nil {
			return err
		}
		if c.wantJSON() {
			return printJSON(cmd.OutOrStdout(), raw)
		}
		return writeIdentity(cmd.OutOrStdout(), id)
	})
	return cmd
}

// createFlags are the flags of `caddy sandwake create`.
type createFlags struct {
	image, id, readyPath             string
	idlePause, idleStop, maxLifetime string
	ports                            []int
	env, labels                      []string
	memoryMB                         int64
	cpus                             float64
	egress, activity                 string
	allow, deny                      []string
	user, runtime                    string
	readonly                         bool
	capAdd                           []string
	diskMB                           int64
	template, pool                   string
	services                         []string
}

func (c *session) createCommand() *cobra.Command {
	var f createFlags
	cmd := &cobra.Command{
		Use:   "create (--image <image> --port <port> | --template <name>) [flags] [-- <cmd> <arg>...]",
		Short: "Creates a sandbox and waits until it is running",
	}
	fl := cmd.Flags()
	fl.StringVar(&f.template, "template", "", "create from this template of the gateway (see `caddy sandwake templates`), claiming a warm pool container when one is idle")
	fl.StringVar(&f.pool, "pool", "", "with --template: prefer (default: claim, else create cold), require (claim, else fail) or bypass (create cold)")
	fl.StringVar(&f.image, "image", "", "container image (required)")
	fl.IntSliceVar(&f.ports, "port", nil, "container port to serve (repeatable; at least one)")
	fl.StringVar(&f.id, "id", "", "sandbox id, 1-40 characters of [0-9a-z] (default: a new ULID)")
	fl.StringArrayVar(&f.env, "env", nil, "environment variable KEY=VALUE (repeatable)")
	fl.Int64Var(&f.memoryMB, "memory-mb", 0, "memory limit in MiB")
	fl.Float64Var(&f.cpus, "cpus", 0, "CPU limit, in cores")
	fl.StringVar(&f.readyPath, "ready-path", "", "HTTP path that answers once the app is ready, like /healthz")
	fl.StringVar(&f.idlePause, "idle-pause", "", "pause after this long idle, like 3m (0: never)")
	fl.StringVar(&f.idleStop, "idle-stop", "", "stop after this long idle, like 30m (0: never)")
	fl.StringVar(&f.maxLifetime, "max-lifetime", "", "remove the container this long after creation (0: never)")
	fl.StringArrayVar(&f.labels, "label", nil, "label KEY=VALUE (repeatable)")
	fl.StringVar(&f.egress, "egress", "", "egress policy: public (the internet only), none (nothing but --allow) or learn (public, recording what is used for `egress --lock`) (default: the gateway's)")
	fl.StringArrayVar(&f.allow, "allow", nil, "open this destination on top of the policy: a DNS name name[:port][/tcp|/udp] (registry.npmjs.org, *.githubusercontent.com; every port over tcp and udp when bare) or an address addr[/bits][:port][/tcp|/udp] (repeatable)")
	fl.StringArrayVar(&f.deny, "deny", nil, "under public or learn, refuse this destination, in the forms of --allow (repeatable)")
	fl.StringVar(&f.activity, "activity", "", "what keeps the sandbox awake: inbound (preview requests) or any (also its own outbound connections and lookups) (default: the gateway's)")
	fl.StringVar(&f.user, "user", "", "run as uid[:gid] or a user of the image (default: the gateway's user, else the image's)")
	fl.BoolVar(&f.readonly, "readonly-rootfs", false, "read-only root filesystem (the workspace and /tmp stay writable)")
	fl.StringArrayVar(&f.capAdd, "cap-add", nil, "give back a capability sandboxes drop: AUDIT_WRITE, MKNOD, NET_RAW, SETFCAP, SETPCAP, SYS_CHROOT (repeatable)")
	fl.StringVar(&f.runtime, "runtime", "", "OCI runtime the engine has, e.g. runsc (default: the gateway's)")
	fl.Int64Var(&f.diskMB, "disk-mb", 0, "disk quota in MiB, workspace and writable layer (default: the gateway's default_disk)")
	fl.StringArrayVar(&f.services, "service", nil, "a service beside the app, sharing its localhost: NAME=IMAGE[,ready=tcp:5432|http:8080/path][,memory_mb=256][,cpus=0.5][,disk_mb=500][,workspace_path=/x][,depends_on=a+b][,cmd=prog arg…][,env.KEY=VALUE…] (repeatable)")
	// The API's names (ports, memory_mb, ready_path, …) and the familiar
	// ones (--ports, --memory) are the same flags.
	fl.SetNormalizeFunc(apiFlagNames)
	cmd.RunE = c.run(func(ctx context.Context, cmd *cobra.Command, api *client.Client, args []string) error {
		body, err := f.body(cmd, args)
		if err != nil {
			return err
		}
		var raw []byte
		rec, err := api.Create(ctx, body, client.Body(&raw))
		if err != nil {
			return err
		}
		if c.wantJSON() {
			return printJSON(cmd.OutOrStdout(), raw)
		}
		extra := ""
		if p := rec.Pool; p != nil && p.Hit {
			extra = "(from the " + rec.Template + " pool)"
		} else if p != nil {
			extra = "(created cold: " + poolMissText(p.Reason) + ")"
		}
		return writeSummary(cmd.OutOrStdout(), &rec, extra)
	})
	return cmd
}

// poolMissText says why a create from a template was cold.
func poolMissText(reason string) string {
	switch reason {
	case lifecycle.PoolMissEmpty:
		return "no idle container in the pool"
	case lifecycle.PoolMissBypass:
		return "--pool bypass"
	case lifecycle.PoolMissID:
		return "an --id was given; pool containers come with theirs"
	case lifecycle.PoolMissEnv:
		return "--env was given; a container's env is fixed when it is made"
	case lifecycle.PoolMissNone:
		return "the template has no pool"
	default:
		return reason
	}
}

// body checks the create flags and builds the request body; arguments after
// "--" are the container's command.
func (f *createFlags) body(cmd *cobra.Command, args []string) (client.CreateRequest, error) {
	b := client.CreateRequest{ID: f.id, Image: f.image, Ports: f.ports, MemoryMB: f.memoryMB, CPUs: f.cpus, ReadyPath: f.readyPath,
		Template: f.template, Pool: f.pool}
	if dash := cmd.ArgsLenAtDash(); len(args) > 0 && dash != 0 {
		return b, fmt.Errorf("create: unexpected argument %q (the container's command goes after --)", args[0])
	}
	b.Cmd = args
	if f.pool != "" && f.template == "" {
		return b, errors.New("create: --pool needs --template")
	}
	if f.image == "" && f.template == "" {
		return b, errors.New("create: --image is required (or --template <name>)")
	}
	if len(f.ports) == 0 && f.template == "" {
		return b, errors.New("create: --port is required")
	}
	if f.egress != "" || len(f.allow) > 0 || len(f.deny) > 0 {
		b.Egress = &client.Egress{Policy: f.egress, Allow: f.allow, Deny: f.deny}
	}
	switch f.activity {
	case "", lifecycle.ActivityInbound, lifecycle.ActivityAny:
		b.Activity = f.activity
	default:
		return b, fmt.Errorf("create: --activity %q is not %s or %s", f.activity, lifecycle.ActivityInbound, lifecycle.ActivityAny)
	}
	b.User, b.CapAdd, b.Runtime, b.DiskMB = f.user, f.capAdd, f.runtime, f.diskMB
	if cmd.Flags().Changed("readonly-rootfs") {
		b.ReadonlyRootfs = &f.readonly
	}
	var err error
	if b.Env, err = keyValues("env", f.env); err != nil {
		return b, fmt.Errorf("create: %w", err)
	}
	if b.Labels, err = keyValues("label", f.labels); err != nil {
		return b, fmt.Errorf("create: %w", err)
	}
	if b.Services, err = parseServices(f.services); err != nil {
		return b, fmt.Errorf("create: %w", err)
	}
	for _, d := range []struct {
		name string
		val  string
		dst  **string
	}{{"idle-pause", f.idlePause, &b.IdlePause}, {"idle-stop", f.idleStop, &b.IdleStop}, {"max-lifetime", f.maxLifetime, &b.MaxLifetime}} {
		if !cmd.Flags().Changed(d.name) {
			continue
		}
		if _, err := caddy.ParseDuration(d.val); err != nil {
			return b, fmt.Errorf("create: --%s: %q is not a duration like 90s or 30m", d.name, d.val)
		}
		*d.dst = &d.val
	}
	return b, nil
}

// keyValues parses repeated KEY=VALUE flags.
func keyValues(flag string, kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--%s %q is not KEY=VALUE", flag, kv)
		}
		m[k] = v
	}
	return m, nil
}

// sandboxOp is a client method that runs an operation on one sandbox and
// answers it.
type sandboxOp func(api *client.Client, ctx context.Context, id string, opts ...client.CallOption) (client.Sandbox, error)

// actionCommand builds wake, pause and stop: POST /v1/sandboxes/{id}/<op>.
func (c *session) actionCommand(op, short string, do sandboxOp) *cobra.Command {
	cmd := &cobra.Command{Use: op + " <id>", Short: short}
	cmd.RunE = c.run(func(ctx context.Context, cmd *cobra.Command, api *client.Client, args []string) error {
		if err := wantArgs(cmd, args, "id"); err != nil {
			return err
		}
		var rec client.Sandbox
		var raw []byte
		var err error
		if op == "wake" && !c.wantJSON() && isTerminal(cmd.ErrOrStderr()) {
			rec, err = wakeWithSpinner(ctx, api, args[0], cmd.ErrOrStderr())
		} else {
			rec, err = do(api, ctx, args[0], client.Body(&raw))
		}
		if err != nil {
			return err
		}
		if c.wantJSON() {
			return printJSON(cmd.OutOrStdout(), raw)
		}
		return writeSummary(cmd.OutOrStdout(), &rec, "")
	})
	return cmd
}

// isTerminal reports whether w is a terminal (the spinner is for people).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// wakeWithSpinner wakes sandbox id while a spinner on w shows its state.
func wakeWithSpinner(ctx context.Context, api *client.Client, id string, w io.Writer) (client.Sandbox, error) {
	spinCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		spin(spinCtx, w, "waking "+id, spinEvery, func(ctx context.Context) (string, error) {
			rec, err := api.Get(ctx, id)
			return rec.State, err
		})
	})
	rec, err := api.Wake(ctx, id)
	stop()
	wg.Wait()
	return rec, err
}

// spin draws a spinner with what poll answers and the time spent on one
// line of w every interval until ctx ends, then clears the line. The first poll is made at
// once. A failed poll keeps the last state.
func spin(ctx context.Context, w io.Writer, what string, every time.Duration, poll func(context.Context) (string, error)) {
	frames := []rune("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏")
	state := "…"
	start := time.Now()
	t := time.NewTicker(every)
	defer t.Stop()
	for i := 0; ; i++ {
		pctx, cancel := context.WithTimeout(ctx, 2*every)
		if s, err := poll(pctx); err == nil && s != "" {
			state = s
		}
		cancel()
		if ctx.Err() == nil {
			fmt.Fprintf(w, "\r\x1b[K%c %s: %s (%.1fs)", frames[i%len(frames)], what, state, time.Since(start).Seconds())
		}
		select {
		case <-ctx.Done():
			fmt.Fprint(w, "\r\x1b[K")
			return
		case <-t.C:
		}
	}
}

func (c *session) keepaliveCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keepalive <id> <duration>",
		Short: "Keeps a sandbox from idling out for a while (capped by keepalive_max)",
	}
	cmd.RunE = c.run(func(ctx context.Context, cmd *cobra.Command, api *client.Client, args []string) error {
		if err := wantArgs(cmd, args, "id", "duration"); err != nil {
			return err
		}
		if d, err := caddy.ParseDuration(args[1]); err != nil || d <= 0 {
			return fmt.Errorf("keepalive: %q is not a positive duration like 10m or 2h", args[1])
		}
		var raw []byte
		rec, err := api.Keepalive(ctx, args[0], args[1], client.Body(&raw))
		if err != nil {
			return err
		}
		if c.wantJSON() {
			return printJSON(cmd.OutOrStdout(), raw)
		}
		extra := ""
		if rec.KeepaliveUntil != nil {
			extra = "kept alive until " + rec.KeepaliveUntil.Local().Format(time.RFC3339)
		}
		return writeSummary(cmd.OutOrStdout(), &rec, extra)
	})
	return cmd
}

func (c *session) destroyCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "destroy <id>",
		Short: "Removes a sandbox's container and record; its volume is kept (see purge)",
	}
	cmd.RunE = c.run(func(ctx context.Context, cmd *cobra.Command, api *client.Client, args []string) error {
		if err := wantArgs(cmd, args, "id"); err != nil {
			return err
		}
		var raw []byte
		err := api.Destroy(ctx, args[0], client.Body(&raw))
		if err != nil {
			return err
		}
		if c.wantJSON() {
			// The API answers 204 with no body: there is nothing to print.
			return printJSON(cmd.OutOrStdout(), raw)
		}
		_, err = fmt.Fprintf(cmd.OutOrStdout(), "destroyed %s; its volume (workspace) is kept: caddy sandwake purge %s removes it\n", args[0], args[0])
		return err
	})
	return cmd
}

func (c *session) purgeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "purge <id>",
		Short: "Removes a sandbox with its volume (also the volume of a destroyed one)",
	}
	cmd.RunE = c.run(func(ctx context.Context, cmd *cobra.Command, api *client.Client, args []string) error {
		if err := wantArgs(cmd, args, "id"); err != nil {
			return err
		}
		var raw []byte
		freed, err := api.Purge(ctx, args[0], client.Body(&raw))
		if err != nil {
			return err
		}
		if c.wantJSON() {
			return printJSON(cmd.OutOrStdout(), raw)
		}
		_, err = fmt.Fprintf(cmd.OutOrStdout(), "purged %s: freed %s\n", args[0], formatBytes(freed))
		return err
	})
	return cmd
}

func (c *session) eventsCommand() *cobra.Command {
	var sandbox string
	cmd := &cobra.Command{
		Use:   "events [--sandbox <id>]",
		Short: "Follows sandbox state changes until interrupted",
	}
	cmd.Flags().StringVar(&sandbox, "sandbox", "", "only this sandbox's events")
	cmd.RunE = c.run(func(ctx context.Context, cmd *cobra.Command, api *client.Client, args []string) error {
		if err := wantArgs(cmd, args); err != nil {
			return err
		}
		out, errw := cmd.OutOrStdout(), cmd.ErrOrStderr()
		return api.FollowEvents(ctx, sandbox, func(m client.Message) error {
			if c.wantJSON() {
				// One event per line (JSON Lines), as a stream is read.
				_, err := fmt.Fprintln(out, m.Data)
				return err
			}
			return writeEvent(out, m.Data)
		}, func(err error, delay time.Duration) {
			fmt.Fprintf(errw, "sandwake: events: %s; reconnecting in %s\n", strings.Join(strings.Fields(err.Error()), " "), delay)
		})
	})
	return cmd
}
