package cli

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	swclient "github.com/sandwake/sandwake/client"

	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/internal/web"
)

// cliBuffer is a bytes.Buffer safe for a command writing while the test
// reads (events).
type cliBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *cliBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *cliBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// cliResult is what one run of `caddy sandwake …` printed and returned.
type cliResult struct {
	out, errOut string
	err         error
}

// cliRoot builds `caddy` with the registered sandwake command, as
// caddycmd.Main does.
func cliRoot(t *testing.T, stdout, stderr *cliBuffer) *cobra.Command {
	t.Helper()
	reg, ok := caddycmd.Commands()["sandwake"]
	if !ok {
		t.Fatal("the sandwake command is not registered")
	}
	sw := &cobra.Command{Use: reg.Name + " " + reg.Usage, Short: reg.Short, Long: reg.Long}
	reg.CobraFunc(sw)
	root := &cobra.Command{Use: "caddy", SilenceUsage: true}
	root.AddCommand(sw)
	root.SetOut(stdout)
	root.SetErr(stderr)
	return root
}

// runCLI runs `caddy sandwake args…` in this process.
func runCLI(t *testing.T, ctx context.Context, args ...string) cliResult {
	t.Helper()
	var stdout, stderr cliBuffer
	root := cliRoot(t, &stdout, &stderr)
	root.SetArgs(append([]string{"sandwake"}, args...))
	err := root.ExecuteContext(ctx)
	return cliResult{out: stdout.String(), errOut: stderr.String(), err: err}
}

// ok checks that a run succeeded without writing to stderr.
func (r cliResult) ok(t *testing.T, what string) string {
	t.Helper()
	if r.err != nil || r.errOut != "" {
		t.Fatalf("%s: err %v, stderr %q, stdout %q", what, r.err, r.errOut, r.out)
	}
	return r.out
}

// failed checks that a run failed with one line on stderr that contains
// want, and nothing on stdout.
func (r cliResult) failed(t *testing.T, what, want string) {
	t.Helper()
	if r.err == nil {
		t.Fatalf("%s: succeeded, want an error; stdout %q", what, r.out)
	}
	if r.out != "" {
		t.Errorf("%s: stdout %q, want nothing", what, r.out)
	}
	lines := strings.Split(strings.TrimSuffix(r.errOut, "\n"), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "sandwake: ") || !strings.Contains(lines[0], want) {
		t.Fatalf("%s: stderr %q, want one line \"sandwake: …%s…\"", what, r.errOut, want)
	}
}

// parseTable reads an aligned table: each row as header → cell, the cells
// cut at the header's column offsets (so a cell may hold spaces).
func parseTable(t *testing.T, out string, headers ...string) []map[string]string {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	offs := make([]int, len(headers))
	for i, h := range headers {
		offs[i] = strings.Index(lines[0], h)
		if offs[i] < 0 || (i > 0 && offs[i] <= offs[i-1]) {
			t.Fatalf("table header %q: no column %q in order", lines[0], h)
		}
	}
	var rows []map[string]string
	for _, l := range lines[1:] {
		row := map[string]string{}
		for i, h := range headers {
			end := len(l)
			if i+1 < len(offs) {
				end = min(offs[i+1], len(l))
			}
			row[h] = strings.TrimSpace(l[min(offs[i], len(l)):end])
		}
		rows = append(rows, row)
	}
	return rows
}

var lsHeaders = []string{"ID", "STATE", "PORTS", "LAST ACTIVE", "URL"}

func rowOf(rows []map[string]string, id string) map[string]string {
	for _, r := range rows {
		if r["ID"] == id {
			return r
		}
	}
	return nil
}

// parseRecordLines reads `get`'s "key: value" lines.
func parseRecordLines(out string) map[string]string {
	m := map[string]string{}
	for l := range strings.Lines(out) {
		k, v, ok := strings.Cut(l, ":")
		if ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

// cliEventsServed reports whether the API serves GET /v1/events (it may be
// missing from a build in progress: a 404).
func cliEventsServed(t *testing.T, h *harness) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, h.APIURL("/v1/events"), nil)
	req.Header.Set("Authorization", "Bearer "+gatewaytest.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("probing /v1/events: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode != http.StatusNotFound
}

// TestCommandLife drives one sandbox through its life with the CLI against
// a real Caddy and Docker: create, ls, pause, get, wake, stop, keepalive,
// events, destroy, purge.
func TestCommandLife(t *testing.T) {
	h := newHarness(t, "")
	id := testenv.UniqueID("cli")
	h.RemoveOnCleanup(id)
	ctx := context.Background()
	sw := func(args ...string) cliResult {
		r := runCLI(t, ctx, append(args, "--api", h.APIURL(""), "--token", gatewaytest.Token)...)
		t.Logf("$ caddy sandwake %s\n%s%s", strings.Join(args, " "), r.out, r.errOut)
		return r
	}
	summary := func(state string) *regexp.Regexp {
		return regexp.MustCompile(`^sandbox ` + id + ` ` + state + `  http://s-` + id + `-8080\.preview\.localhost:\d+/?(  .*)?\n$`)
	}

	out := sw("create", "--image", h.Image, "--port", "8080", "--id", id, "--env", "GREETING=hi", "--label", "team=cli", "--memory-mb", "128", "--idle-pause", "1h").ok(t, "create")
	if !summary("running").MatchString(out) {
		t.Fatalf("create printed %q", out)
	}

	out = sw("ls").ok(t, "ls")
	row := rowOf(parseTable(t, out, lsHeaders...), id)
	if row == nil || row["STATE"] != "running" || row["PORTS"] != "8080" || !strings.Contains(row["URL"], "s-"+id+"-8080.preview.localhost") || row["LAST ACTIVE"] == "" {
		t.Fatalf("ls row %v in:\n%s", row, out)
	}
	var list struct {
		Sandboxes []swclient.Sandbox `json:"sandboxes"`
	}
	if err := json.Unmarshal([]byte(sw("ls", "--json").ok(t, "ls --json")), &list); err != nil || len(list.Sandboxes) == 0 {
		t.Fatalf("ls --json: %v %+v", err, list)
	}
	if out := sw("ls", "--state", "paused").ok(t, "ls --state paused"); strings.Contains(out, id) {
		t.Fatalf("ls --state paused lists the running sandbox:\n%s", out)
	}

	if out := sw("pause", id).ok(t, "pause"); !summary("paused").MatchString(out) {
		t.Fatalf("pause printed %q", out)
	}
	out = sw("get", id).ok(t, "get")
	kv := parseRecordLines(out)
	if kv["id"] != id || kv["state"] != "paused" || kv["image"] != h.Image || kv["env"] != "GREETING" || kv["labels"] != "team=cli" || kv["memory"] != "128 MiB" || kv["idle pause"] != "1h0m0s" {
		t.Fatalf("get printed:\n%s", out)
	}
	var rec swclient.Sandbox
	if err := json.Unmarshal([]byte(sw("get", id, "--json").ok(t, "get --json")), &rec); err != nil || rec.ID != id || rec.State != "paused" {
		t.Fatalf("get --json: %v %+v", err, rec)
	}
	if out := sw("ls", "--state", "paused").ok(t, "ls --state paused"); rowOf(parseTable(t, out, lsHeaders...), id) == nil {
		t.Fatalf("ls --state paused misses the paused sandbox:\n%s", out)
	}

	if out := sw("wake", id).ok(t, "wake"); !summary("running").MatchString(out) {
		t.Fatalf("wake printed %q", out)
	}
	if out := sw("stop", id).ok(t, "stop"); !summary("stopped").MatchString(out) {
		t.Fatalf("stop printed %q", out)
	}
	out = sw("keepalive", id, "10m").ok(t, "keepalive")
	if !summary("stopped").MatchString(out) || !strings.Contains(out, "kept alive until ") {
		t.Fatalf("keepalive printed %q", out)
	}
	if err := json.Unmarshal([]byte(sw("keepalive", id, "5m", "--json").ok(t, "keepalive --json")), &rec); err != nil || rec.KeepaliveUntil == nil {
		t.Fatalf("keepalive --json: %v %+v", err, rec)
	}

	t.Run("events", func(t *testing.T) {
		if !cliEventsServed(t, h) {
			t.Skip("GET /v1/events is not served (404) by this build")
		}
		ectx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		var text, raw, textErr, rawErr cliBuffer
		var wg sync.WaitGroup
		var textRes, rawRes error
		for _, r := range []struct {
			out, errOut *cliBuffer
			res         *error
			args        []string
		}{
			{&text, &textErr, &textRes, []string{"events", "--sandbox", id}},
			{&raw, &rawErr, &rawRes, []string{"events", "-o", "json"}},
		} {
			root := cliRoot(t, r.out, r.errOut)
			root.SetArgs(append([]string{"sandwake"}, append(r.args, "--api", h.APIURL(""), "--token", gatewaytest.Token)...))
			wg.Go(func() { *r.res = root.ExecuteContext(ectx) })
		}
		// The streams start from "now" once connected: cycle the sandbox
		// until both have shown a pause of it.
		paused := regexp.MustCompile(`(?m)^\S+ ` + id + ` running → paused \(api\)$`)
		testenv.Eventually(t, 45*time.Second, func() (bool, string) {
			h.API("POST", "/v1/sandboxes/"+id+"/wake", nil, nil)
			h.API("POST", "/v1/sandboxes/"+id+"/pause", nil, nil)
			return paused.MatchString(text.String()) && strings.Contains(raw.String(), `"to":"paused"`),
				fmt.Sprintf("text %q, json %q", text.String(), raw.String())
		})
		cancel()
		wg.Wait()
		t.Logf("$ caddy sandwake events --sandbox %s\n%s", id, text.String())
		if textRes != nil || rawRes != nil || textErr.String() != "" || rawErr.String() != "" {
			t.Fatalf("events ended with %v / %v, stderr %q / %q", textRes, rawRes, textErr.String(), rawErr.String())
		}
		for l := range strings.Lines(raw.String()) {
			var ev swclient.Event
			if err := json.Unmarshal([]byte(l), &ev); err != nil || ev.ID == 0 || ev.Type == "" {
				t.Fatalf("events -o json line %q: %v", l, err)
			}
		}
		for l := range strings.Lines(text.String()) {
			if !strings.Contains(l, " "+id+" ") {
				t.Fatalf("events --sandbox %s printed another sandbox's event: %q", id, l)
			}
		}
	})

	if out := sw("destroy", id).ok(t, "destroy"); out != "destroyed "+id+"; its volume (workspace) is kept: caddy sandwake purge "+id+" removes it\n" {
		t.Fatalf("destroy printed %q", out)
	}
	sw("get", id).failed(t, "get after destroy", "sandbox "+id+": not found (404)")
	out = sw("purge", id).ok(t, "purge")
	if !regexp.MustCompile(`^purged ` + id + `: freed \d+(\.\d)? (B|KiB|MiB|GiB)\n$`).MatchString(out) {
		t.Fatalf("purge printed %q", out)
	}
	sw("purge", id).failed(t, "purge again", "not found (404)")
}

// prettyJSON checks that out is one JSON object printed as the API prints
// it (indented by two spaces, one final newline) and decodes it.
func prettyJSON(t *testing.T, what, out string) map[string]any {
	t.Helper()
	var compact, pretty bytes.Buffer
	if err := json.Compact(&compact, []byte(out)); err != nil {
		t.Fatalf("%s: not JSON (%v):\n%s", what, err, out)
	}
	if err := json.Indent(&pretty, compact.Bytes(), "", "  "); err != nil {
		t.Fatal(err)
	}
	if pretty.WriteByte('\n'); out != pretty.String() {
		t.Fatalf("%s: JSON not pretty-printed:\n%s", what, out)
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// apiDocument is the API's own answer to GET path, decoded.
func apiDocument(t *testing.T, h *harness, path string) map[string]any {
	t.Helper()
	var v map[string]any
	if status := h.API("GET", path, nil, &v); status != http.StatusOK {
		t.Fatalf("GET %s: %d", path, status)
	}
	return v
}

// sameDocument fails unless got and want are the same JSON document but
// for the fields that change by themselves between two reads (the
// gateway's verification and activity clocks, the disk watchdog).
func sameDocument(t *testing.T, what string, got, want map[string]any) {
	t.Helper()
	for _, k := range []string{"verified_at", "last_active_at", "open_connections", "disk_used_mb"} {
		delete(got, k)
		delete(want, k)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s printed\n%v\nthe API answers\n%v", what, got, want)
	}
}

// TestCommandOutput: every command that prints what the API answered takes
// --output json (-o json), the API's JSON document pretty-printed, and
// --output table, the default form for people.
func TestCommandOutput(t *testing.T) {
	h := newHarness(t, "")
	id := testenv.UniqueID("cli")
	h.RemoveOnCleanup(id)
	ctx := context.Background()
	sw := func(args ...string) cliResult {
		r := runCLI(t, ctx, append(args, "--api", h.APIURL(""), "--token", gatewaytest.Token)...)
		t.Logf("$ caddy sandwake %s\n%s%s", strings.Join(args, " "), r.out, r.errOut)
		return r
	}
	jsonOf := func(args ...string) map[string]any {
		t.Helper()
		what := strings.Join(args, " ")
		return prettyJSON(t, what, sw(args...).ok(t, what))
	}

	if v := jsonOf("create", "--image", h.Image, "--port", "8080", "--id", id, "-o", "json"); v["id"] != id || v["state"] != "running" {
		t.Fatalf("create -o json: %v", v)
	}
	list := jsonOf("ls", "--output", "json")
	if rows, _ := list["sandboxes"].([]any); len(rows) != 1 || rows[0].(map[string]any)["id"] != id {
		t.Fatalf("ls --output json: %v", list)
	}
	if v := jsonOf("pause", id, "-o", "json"); v["state"] != "paused" {
		t.Fatalf("pause -o json: %v", v)
	}
	sameDocument(t, "get -o json", jsonOf("get", id, "-o", "json"), apiDocument(t, h, "/v1/sandboxes/"+id))
	sameDocument(t, "egress -o json", jsonOf("egress", id, "-o", "json"), apiDocument(t, h, "/v1/sandboxes/"+id))
	if v := jsonOf("keepalive", id, "5m", "-o", "json"); v["keepalive_until"] == nil {
		t.Fatalf("keepalive -o json: %v", v)
	}
	if v := jsonOf("wake", id, "-o", "json"); v["state"] != "running" {
		t.Fatalf("wake -o json: %v", v)
	}
	if v := jsonOf("stop", id, "-o", "json"); v["state"] != "stopped" {
		t.Fatalf("stop -o json: %v", v)
	}
	history := jsonOf("history", id, "-o", "json")
	sameDocument(t, "history -o json", history, apiDocument(t, h, "/v1/sandboxes/"+id+"/history"))
	who := jsonOf("whoami", "-o", "json")
	sameDocument(t, "whoami -o json", who, apiDocument(t, h, "/v1/whoami"))

	// The table is the default, and --output table names it.
	for _, args := range [][]string{{"history", id}, {"whoami"}} {
		def := sw(args...).ok(t, strings.Join(args, " "))
		if table := sw(append(args, "-o", "table")...).ok(t, strings.Join(args, " ")+" -o table"); table != def || strings.HasPrefix(def, "{") {
			t.Fatalf("%s printed %q, with -o table %q: want the same table", strings.Join(args, " "), def, table)
		}
	}
	events, _ := history["events"].([]any)
	lines := strings.Split(strings.TrimSuffix(sw("history", id).out, "\n"), "\n")
	if len(events) == 0 || len(lines) != len(events) {
		t.Fatalf("history printed %d lines for %d events", len(lines), len(events))
	}
	for i, l := range lines {
		ev := events[i].(map[string]any)
		want := regexp.MustCompile(`^\S+ ` + id + ` ` + regexp.QuoteMeta(fmt.Sprint(ev["from"])) + ` → ` + regexp.QuoteMeta(fmt.Sprint(ev["to"])) + ` \(`)
		if ev["from"] != nil && ev["to"] != nil && !want.MatchString(l) {
			t.Errorf("history line %d %q, event %v", i, l, ev)
		}
	}
	if !strings.HasSuffix(lines[len(lines)-1], " running → stopped (api)") {
		t.Errorf("history's last line %q, want the stop", lines[len(lines)-1])
	}
	if kv := parseRecordLines(sw("whoami").out); kv["scope"] != who["scope"] || kv["labels"] != "-" {
		t.Errorf("whoami printed %v, the API says %v", kv, who)
	}
	if kv := parseRecordLines(sw("get", id, "--output", "table").out); kv["id"] != id || kv["state"] != "stopped" {
		t.Errorf("get --output table printed %v", kv)
	}
	if rows := parseTable(t, sw("ls", "-o", "table").out, lsHeaders...); rowOf(rows, id) == nil {
		t.Errorf("ls -o table misses %s: %v", id, rows)
	}
	sw("nodes", "-o", "json").failed(t, "nodes -o json on a single host", "(404)")

	// destroy answers 204: nothing to print. purge answers what it freed.
	if out := sw("destroy", id, "-o", "json").ok(t, "destroy -o json"); out != "" {
		t.Fatalf("destroy -o json printed %q, want nothing", out)
	}
	if v := jsonOf("purge", id, "-o", "json"); v["freed_bytes"] == nil {
		t.Fatalf("purge -o json: %v", v)
	}
}

// TestCommandUsageErrors: bad flags and arguments fail before any call, with
// one line on stderr and a non-zero exit.
func TestCommandUsageErrors(t *testing.T) {
	// Nothing listens here: a call made by mistake fails differently.
	api := fmt.Sprintf("http://127.0.0.1:%d", gatewaytest.FreePort(t))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"create", "--port", "8080"}, "create: --image is required"},
		{[]string{"create", "--image", "app"}, "create: --port is required"},
		{[]string{"create", "--image", "app", "--port", "http"}, `create: invalid argument "http" for "--port"`},
		{[]string{"create", "--image", "app", "--port", "8080", "--env", "NOVALUE"}, `create: --env "NOVALUE" is not KEY=VALUE`},
		{[]string{"create", "--image", "app", "--port", "8080", "--idle-stop", "soon"}, `create: --idle-stop: "soon" is not a duration`},
		{[]string{"create", "--image", "app", "--port", "8080", "sh"}, `create: unexpected argument "sh"`},
		{[]string{"create", "--bogus"}, "create: unknown flag: --bogus"},
		{[]string{"keepalive", "abc", "notaduration"}, `keepalive: "notaduration" is not a positive duration`},
		{[]string{"keepalive", "abc"}, "keepalive: want <id> <duration>, got 1 argument(s)"},
		{[]string{"get"}, "get: want <id>, got 0 argument(s)"},
		{[]string{"ls", "extra"}, `ls: takes no arguments, got ["extra"]`},
		{[]string{"ls", "--state", "asleep"}, `ls: --state "asleep" is not one of creating, running`},
		{[]string{"frob"}, `unknown command "frob" (commands: `},
		{[]string{"lss"}, `unknown command "lss"; did you mean "ls"?`},
		{[]string{"--nope"}, "unknown flag: --nope"},
		{[]string{"ls", "--output", "yaml"}, `ls: invalid argument "yaml" for "-o, --output" flag: want json or table`},
		{[]string{"get", "abc", "-o", "wide"}, `get: invalid argument "wide" for "-o, --output" flag: want json or table`},
		{[]string{"ls", "--json", "--output", "table"}, "ls: --json and --output table disagree"},
		{[]string{"cluster", "ca", "--out", "ca", "-o", "json"}, "cluster ca writes files and prints no API answer: --output json does not apply"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			runCLI(t, context.Background(), append(tc.args, "--api", api)...).failed(t, strings.Join(tc.args, " "), tc.want)
		})
	}
	runCLI(t, context.Background(), "ls", "--api", "ftp://example.com").failed(t, "--api ftp", `--api "ftp://example.com" is not an http(s) URL`)
	runCLI(t, context.Background(), "ls", "--api", api).failed(t, "no API", "cannot reach the API at "+api+": ")
	// Help is not an error.
	if r := runCLI(t, context.Background()); r.err != nil || !strings.Contains(r.out, "keepalive") {
		t.Fatalf("sandwake with no command: %v %q", r.err, r.out)
	}
}

// TestCommandAPIErrors: what the API refuses is one clear line, non-zero.
func TestCommandAPIErrors(t *testing.T) {
	h := newHarness(t, "")
	ctx := context.Background()
	api := h.APIURL("")
	missing := testenv.UniqueID("nx")
	runCLI(t, ctx, "get", missing, "--api", api, "--token", gatewaytest.Token).failed(t, "get unknown", "sandbox "+missing+": not found (404)")
	runCLI(t, ctx, "get", "Not_An_ID", "--api", api, "--token", gatewaytest.Token).failed(t, "get bad id", `sandbox "Not_An_ID": not found`)
	runCLI(t, ctx, "wake", missing, "--api", api, "--token", gatewaytest.Token).failed(t, "wake unknown", "not found (404)")
	runCLI(t, ctx, "ls", "--api", api, "--token", "wrong").failed(t, "wrong token", "wrong bearer token: it is none of this API's tokens (401); set --token, $SANDWAKE_TOKEN or $SANDWAKE_API_TOKEN (the token sent came from --token)")
	runCLI(t, ctx, "create", "--image", h.Image, "--port", "8080", "--id", "UPPER_case!", "--api", api, "--token", gatewaytest.Token).failed(t, "create bad id", "(400)")

	// The event stream gives up on a 4xx rather than retrying for ever.
	ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if cliEventsServed(t, h) {
		runCLI(t, ectx, "events", "--api", api, "--token", "wrong").failed(t, "events wrong token", "(401)")
	}
	if ectx.Err() != nil {
		t.Fatal("events with a wrong token kept retrying")
	}

	// $SANDWAKE_API and $SANDWAKE_TOKEN stand in for the flags.
	t.Setenv("SANDWAKE_API", api)
	t.Setenv("SANDWAKE_TOKEN", gatewaytest.Token)
	if out := runCLI(t, ctx, "ls").ok(t, "ls from the environment"); !strings.HasPrefix(out, "ID ") {
		t.Fatalf("ls printed %q", out)
	}
	// So does $SANDWAKE_API_TOKEN, the server's variable (make run's shell).
	t.Setenv("SANDWAKE_TOKEN", "")
	t.Setenv("SANDWAKE_API_TOKEN", gatewaytest.Token)
	if out := runCLI(t, ctx, "ls").ok(t, "ls with $SANDWAKE_API_TOKEN"); !strings.HasPrefix(out, "ID ") {
		t.Fatalf("ls printed %q", out)
	}
}

// TestCommandTokenSources: the token sent is --token, else $SANDWAKE_TOKEN,
// else $SANDWAKE_API_TOKEN; a refused one says where it came from.
func TestCommandTokenSources(t *testing.T) {
	var mu sync.Mutex
	var sent []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		sent = append(sent, r.Header.Get("Authorization"))
		mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer right" {
			web.WriteError(w, http.StatusUnauthorized, "unauthorized", "missing or wrong bearer token", 0)
			return
		}
		web.WriteJSON(w, http.StatusOK, map[string]any{"sandboxes": []any{}})
	}))
	defer srv.Close()
	for _, tc := range []struct {
		name                string
		flag, swToken, apiT string
		wantSent, wantErr   string
	}{
		{name: "flag", flag: "right", wantSent: "Bearer right"},
		{name: "SANDWAKE_TOKEN", swToken: "right", wantSent: "Bearer right"},
		{name: "SANDWAKE_API_TOKEN", apiT: "right", wantSent: "Bearer right"},
		{name: "both variables: SANDWAKE_TOKEN first", swToken: "right", apiT: "other", wantSent: "Bearer right"},
		{name: "the flag over both", flag: "right", swToken: "a", apiT: "b", wantSent: "Bearer right"},
		{name: "refused from SANDWAKE_TOKEN", swToken: "stale", apiT: "right", wantSent: "Bearer stale",
			wantErr: "missing or wrong bearer token (401); set --token, $SANDWAKE_TOKEN or $SANDWAKE_API_TOKEN (the token sent came from $SANDWAKE_TOKEN)"},
		{name: "refused from SANDWAKE_API_TOKEN", apiT: "stale", wantSent: "Bearer stale", wantErr: "(the token sent came from $SANDWAKE_API_TOKEN)"},
		{name: "none", wantSent: "", wantErr: "(401); set --token, $SANDWAKE_TOKEN or $SANDWAKE_API_TOKEN (no token was sent)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("SANDWAKE_TOKEN", tc.swToken)
			t.Setenv("SANDWAKE_API_TOKEN", tc.apiT)
			mu.Lock()
			sent = nil
			mu.Unlock()
			args := []string{"ls", "--api", srv.URL}
			if tc.flag != "" {
				args = append(args, "--token", tc.flag)
			}
			r := runCLI(t, context.Background(), args...)
			if tc.wantErr == "" {
				r.ok(t, tc.name)
			} else {
				r.failed(t, tc.name, tc.wantErr)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(sent) != 1 || sent[0] != tc.wantSent {
				t.Errorf("Authorization headers sent %q, want [%q]", sent, tc.wantSent)
			}
		})
	}
}

// TestCommandEventsReconnect: a dropped stream is reopened with
// Last-Event-ID, after a 5xx too, and no event is lost or repeated.
func TestCommandEventsReconnect(t *testing.T) {
	var mu sync.Mutex
	var seen []string // Last-Event-ID of each connection
	ev := func(id int, from, to string) string {
		return fmt.Sprintf(`{"id":%d,"type":"sandbox.%s","sandbox_id":"abc","from":"%s","to":"%s","reason":"api","at":"2025-01-02T03:04:05Z"}`, id, to, from, to)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/events" || r.Header.Get("Authorization") != "Bearer tok" || r.URL.Query().Get("sandbox") != "abc" {
			http.Error(w, "unexpected request "+r.URL.String(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		seen = append(seen, r.Header.Get("Last-Event-ID"))
		n := len(seen)
		mu.Unlock()
		switch n {
		case 2:
			web.WriteError(w, http.StatusServiceUnavailable, "unavailable", "sandwake is starting", 1)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		switch n {
		case 1: // two events (one in two data lines), then the stream drops
			fmt.Fprint(w, ": hello\n\nid: 1\ndata: "+ev(1, "running", "paused")+"\n\nid: 2\r\ndata: "+ev(2, "paused", "running")[:8]+"\ndata: "+ev(2, "paused", "running")[8:]+"\r\n\r\n")
		case 3:
			fmt.Fprint(w, "retry: 50\n\nid: 3\ndata: "+ev(3, "running", "")+"\n\n")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}
	}))
	defer srv.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errOut cliBuffer
	root := cliRoot(t, &out, &errOut)
	root.SetArgs([]string{"sandwake", "events", "--sandbox", "abc", "--api", srv.URL, "--token", "tok"})
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		return strings.Count(out.String(), "\n") >= 3, out.String()
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("events: %v", err)
	}
	want := "2025-01-02T03:04:05Z abc running → paused (api)\n" +
		"2025-01-02T03:04:05Z abc paused → running (api)\n" +
		"2025-01-02T03:04:05Z abc running → - (api)\n"
	if out.String() != want {
		t.Fatalf("events printed:\n%s\nwant:\n%s", out.String(), want)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(seen) != "[ 2 2]" {
		t.Fatalf("Last-Event-ID of the connections: %q, want [\"\" 2 2]", seen)
	}
	// Each reconnection is one line on stderr.
	if n := strings.Count(errOut.String(), "sandwake: events: "); n != 2 {
		t.Fatalf("stderr: %q", errOut.String())
	}
}

// TestCommandSSEParse: the stream parser follows the SSE rules the API uses.
func TestCommandSSEParse(t *testing.T) {
	stream := ": comment\n\nid: 7\nevent: x\ndata: {\"a\":1}\n\ndata:no-space\r\n\r\nid: 9\ndata: a\ndata: b\n\nid: 10\n\nretry: 1500\ndata: last\n"
	var got []swclient.Message
	var retry time.Duration
	err := swclient.ReadSSE(strings.NewReader(stream), func(ev swclient.Message) error {
		got = append(got, ev)
		return nil
	}, func(d time.Duration) { retry = d })
	want := []swclient.Message{{ID: "7", Data: `{"a":1}`}, {Data: "no-space"}, {ID: "9", Data: "a\nb"}}
	if err != nil || fmt.Sprint(got) != fmt.Sprint(want) || retry != 1500*time.Millisecond {
		t.Fatalf("readSSE: %v %q retry %v, want %q", err, got, retry, want)
	}
	stop := errors.New("stop")
	if err := swclient.ReadSSE(strings.NewReader(stream), func(swclient.Message) error { return stop }, nil); err != stop {
		t.Fatalf("an emit error: %v", err)
	}
}

// TestCommandSpinner: the wake spinner shows the polled state and clears its
// line when the wake returns.
func TestCommandSpinner(t *testing.T) {
	var w cliBuffer
	ctx, cancel := context.WithCancel(context.Background())
	states := []string{"stopped", "stopped", "running"}
	polls := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		spin(ctx, &w, "waking abc", time.Millisecond, func(context.Context) (string, error) {
			polls++
			if polls > len(states) {
				return "", errors.New("gone")
			}
			return states[polls-1], nil
		})
	}()
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		return strings.Contains(w.String(), "waking abc: running"), w.String()
	})
	cancel()
	<-done
	out := w.String()
	if !strings.Contains(out, "waking abc: stopped") || !strings.HasSuffix(out, "\r\x1b[K") || strings.Contains(out, "\n") {
		t.Fatalf("spinner drew %q", out)
	}
	if isTerminal(&w) {
		t.Fatal("a buffer is a terminal")
	}
}

// TestCommandFormats: the table, bytes, times and event lines.
func TestCommandFormats(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1258291: "1.2 MiB", 5 << 30: "5.0 GiB"} {
		if got := formatBytes(n); got != want {
			t.Errorf("formatBytes(%d) = %q, want %q", n, got, want)
		}
	}
	now := time.Date(2025, 1, 2, 12, 0, 0, 0, time.UTC)
	for d, want := range map[time.Duration]string{0: "just now", 12 * time.Second: "12s ago", 3 * time.Minute: "3m ago", 5 * time.Hour: "5h ago", 72 * time.Hour: "3d ago", -10 * time.Minute: "in 10m"} {
		if got := relTime(now.Add(-d), now); got != want {
			t.Errorf("relTime(-%s) = %q, want %q", d, got, want)
		}
	}
	if relTime(time.Time{}, now) != "-" {
		t.Error("relTime of zero time")
	}
	var b bytes.Buffer
	recs := []swclient.Sandbox{
		{ID: "a1", State: "running", Ports: []int{8080, 3000}, URLs: map[string]string{"8080": "http://s-a1-8080.x/", "3000": "http://s-a1-3000.x/"}, LastActiveAt: now.Add(-90 * time.Second)},
		{ID: "longer-id", State: "stopped"},
	}
	if err := writeTable(&b, recs, now); err != nil {
		t.Fatal(err)
	}
	want := "ID         STATE    PORTS      LAST ACTIVE  URL\n" +
		"a1         running  8080,3000  1m ago       http://s-a1-8080.x/\n" +
		"longer-id  stopped  -          -            -\n"
	if b.String() != want {
		t.Fatalf("table:\n%s\nwant:\n%s", b.String(), want)
	}
	// Sandboxes on two nodes (a cluster): a NODE column.
	b.Reset()
	recs[0].Node, recs[1].Node = "node-a", "node-b"
	if err := writeTable(&b, recs, now); err != nil {
		t.Fatal(err)
	}
	want = "ID         STATE    NODE    PORTS      LAST ACTIVE  URL\n" +
		"a1         running  node-a  8080,3000  1m ago       http://s-a1-8080.x/\n" +
		"longer-id  stopped  node-b  -          -            -\n"
	if b.String() != want {
		t.Fatalf("cluster table:\n%s\nwant:\n%s", b.String(), want)
	}
	b.Reset()
	if err := writeEvent(&b, `{"id":4,"type":"sandbox.destroyed","sandbox_id":"a1","from":"stopped","reason":"api","at":"2025-01-02T03:04:05Z"}`); err != nil || b.String() != "2025-01-02T03:04:05Z a1 stopped → destroyed (api)\n" {
		t.Fatalf("writeEvent: %v %q", err, b.String())
	}
	if err := writeEvent(&b, `not json`); err == nil {
		t.Fatal("writeEvent accepted not JSON")
	}
}

// buildCaddy builds cmd/caddy, the caddy a user runs, into a temporary
// directory.
func buildCaddy(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "caddy")
	build := exec.Command("go", "build", "-o", bin, "./cmd/caddy")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/caddy: %v\n%s", err, out)
	}
	return bin
}

// TestCLIHelp: in the built caddy, `caddy sandwake --help` and the help of
// every command under it end with the command's flags (one final newline,
// no blank line, none of the footer Caddy's root command gives its own
// commands), and a command with commands lists each one with its one-line
// summary.
func TestCLIHelp(t *testing.T) {
	bin := buildCaddy(t)
	run := func(args ...string) string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil || stderr.Len() != 0 {
			t.Fatalf("caddy %s: %v\nstderr: %s", strings.Join(args, " "), err, stderr.String())
		}
		return stdout.String()
	}
	// The in-process tree says which commands there are.
	var out, errOut cliBuffer
	sw, _, err := cliRoot(t, &out, &errOut).Find([]string{"sandwake"})
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	var visit func(c *cobra.Command)
	visit = func(c *cobra.Command) {
		path := strings.Fields(c.CommandPath())[1:] // without "caddy"
		help := run(append(path, "--help")...)
		name := "caddy " + strings.Join(path, " ") + " --help"
		if !strings.HasSuffix(help, "\n") || strings.HasSuffix(help, "\n\n") || strings.HasPrefix(help, "\n") {
			t.Errorf("%s starts or ends with a blank line:\n%q", name, help)
		}
		for _, footer := range []string{"Full documentation", "caddyserver.com", "for more information about a command", "[command] --help"} {
			if strings.Contains(help, footer) {
				t.Errorf("%s has Caddy's footer (%q):\n%s", name, footer, help)
			}
		}
		if desc := cmp.Or(c.Long, c.Short); !strings.HasPrefix(help, desc+"\n\nUsage:\n  caddy "+strings.Join(path, " ")) {
			t.Errorf("%s does not start with what the command does and its usage:\n%s", name, help)
		}
		checked++
		if !c.HasAvailableSubCommands() {
			return
		}
		// "Commands:", then one line per command: name, summary.
		_, list, ok := strings.Cut(help, "\nCommands:\n")
		list, _, _ = strings.Cut(list, "\n\n")
		listed := map[string]string{}
		for l := range strings.Lines(list) {
			name, summary, _ := strings.Cut(strings.TrimSpace(l), " ")
			listed[name] = strings.TrimSpace(summary)
		}
		var want []string
		for _, sub := range c.Commands() {
			if !sub.IsAvailableCommand() {
				continue
			}
			want = append(want, sub.Name())
			if strings.Contains(sub.Short, "\n") || listed[sub.Name()] != sub.Short || sub.Short == "" {
				t.Errorf("%s lists %s as %q, want its one-line summary %q", name, sub.Name(), listed[sub.Name()], sub.Short)
			}
			visit(sub)
		}
		if !ok || len(listed) != len(want) {
			t.Errorf("%s lists %d commands %v, want %v:\n%s", name, len(listed), listed, want, help)
		}
	}
	visit(sw)
	if checked < 17 {
		t.Fatalf("checked the help of %d commands", checked)
	}
	// `caddy help sandwake` is the same help.
	if a, b := run("help", "sandwake"), run("sandwake", "--help"); a != b {
		t.Errorf("caddy help sandwake:\n%s\ndiffers from caddy sandwake --help:\n%s", a, b)
	}
}

// TestCLIBinary: the built caddy has the sandwake command; its ls table
// lists a sandbox, and a refused call exits non-zero with one line.
func TestCLIBinary(t *testing.T) {
	h := newHarness(t, "")
	rec := h.Create(nil)
	bin := buildCaddy(t)

	var stdout, stderr bytes.Buffer
	ls := exec.Command(bin, "sandwake", "ls", "--api", h.APIURL(""), "--token", gatewaytest.Token)
	ls.Stdout, ls.Stderr = &stdout, &stderr
	if err := ls.Run(); err != nil || stderr.Len() != 0 {
		t.Fatalf("caddy sandwake ls: %v\nstderr: %s", err, stderr.String())
	}
	row := rowOf(parseTable(t, stdout.String(), lsHeaders...), rec.ID)
	if row == nil || row["STATE"] != "running" || row["URL"] != rec.URLs["8080"] {
		t.Fatalf("caddy sandwake ls: row %v in:\n%s", row, stdout.String())
	}

	stdout.Reset()
	stderr.Reset()
	get := exec.Command(bin, "sandwake", "get", "nosuchsandbox", "--api", h.APIURL(""), "--token", gatewaytest.Token)
	get.Stdout, get.Stderr = &stdout, &stderr
	err := get.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("caddy sandwake get nosuchsandbox: %v, want exit status 1", err)
	}
	if stdout.Len() != 0 || stderr.String() != "sandwake: sandbox nosuchsandbox: not found (404)\n" {
		t.Fatalf("caddy sandwake get nosuchsandbox: stdout %q, stderr %q", stdout.String(), stderr.String())
	}
}

// TestListPagesCLI: `ls --limit` prints a page and the cursor of the next
// one; `ls --cursor` prints the page after it (the API's pages:
// TestListPages).
func TestListPagesCLI(t *testing.T) {
	h := newHarness(t, "")
	var ids []string
	for range 6 {
		ids = append(ids, h.Create(nil).ID)
	}
	slices.Sort(ids)
	api := []string{"--api", h.APIURL(""), "--token", gatewaytest.Token}
	out := runCLI(t, context.Background(), append([]string{"ls", "--limit", "4"}, api...)...).ok(t, "ls --limit 4")
	if !strings.HasSuffix(out, "more: --cursor "+ids[3]+"\n") {
		t.Fatalf("ls --limit 4 printed %q", out)
	}
	out = runCLI(t, context.Background(), append([]string{"ls", "--limit", "4", "--cursor", ids[3]}, api...)...).ok(t, "ls --cursor")
	if strings.Contains(out, "more:") || !strings.Contains(out, ids[4]) || !strings.Contains(out, ids[5]) || strings.Contains(out, ids[3]) {
		t.Fatalf("ls --cursor printed %q", out)
	}
}

// TestTemplatesCLI: `templates` is a table of the templates and their
// pools; `create --template` claims from the pool (and says so), creates
// cold with --env (and says why); --pool needs --template (the API's
// templates: TestTemplatesAPI).
func TestTemplatesCLI(t *testing.T) {
	h := newHarness(t, fmt.Sprintf("template web {\n\t\t\timage %s\n\t\t\tports 8080\n\t\t\tmemory_mb 64\n\t\t\tpool {\n\t\t\t\tmin_idle 1\n\t\t\t}\n\t\t}",
		testenv.TestAppImage(t)))
	testenv.Eventually(t, 60*time.Second, func() (bool, string) {
		var list swclient.TemplateList
		h.API("GET", "/v1/templates", nil, &list)
		return len(list.Templates) == 1 && list.Templates[0].Pool != nil && list.Templates[0].Pool.Idle == 1, fmt.Sprintf("%+v", list)
	})
	sw := func(args ...string) cliResult {
		return runCLI(t, context.Background(), append(args, "--api", h.APIURL(""), "--token", gatewaytest.Token)...)
	}
	rows := parseTable(t, sw("templates").ok(t, "templates"), "TEMPLATE", "IMAGE", "PORTS", "MEMORY", "POOL IDLE", "HITS", "MISSES", "STATE")
	if len(rows) != 1 || rows[0]["TEMPLATE"] != "web" || rows[0]["POOL IDLE"] != "1/1" || rows[0]["HITS"] != "0" || rows[0]["STATE"] != "paused" {
		t.Fatalf("templates table: %+v", rows)
	}
	out := sw("create", "--template", "web").ok(t, "create --template")
	if !regexp.MustCompile(`^sandbox [0-9a-z]+ running  http://\S+  \(from the web pool\)\n$`).MatchString(out) {
		t.Fatalf("create --template printed %q", out)
	}
	h.RemoveOnCleanup(strings.Fields(out)[1])
	out = sw("create", "--template", "web", "--env", "K=v").ok(t, "create --template --env")
	if !strings.Contains(out, "created cold: --env was given") {
		t.Fatalf("create --template --env printed %q", out)
	}
	h.RemoveOnCleanup(strings.Fields(out)[1])
	sw("create", "--pool", "require").failed(t, "create --pool without --template", "--pool needs --template")
}
