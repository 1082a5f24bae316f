package cli

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	swclient "github.com/sandwake/sandwake/client"

	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
)

// TestEgressFlagsApply: `egress` builds the whole policy a PATCH sends from
// the sandbox's and the flags: what a flag does not name is kept, and a
// none policy drops the deny list unless --deny names one.
func TestEgressFlagsApply(t *testing.T) {
	cur := &swclient.Egress{Policy: "public", Allow: []string{"registry.npmjs.org"}, Deny: []string{"pastebin.com"}}
	for _, tc := range []struct {
		name string
		f    egressFlags
		cur  *swclient.Egress
		want swclient.Egress
	}{
		{"policy only", egressFlags{policy: "learn"}, cur, swclient.Egress{Policy: "learn", Allow: []string{"registry.npmjs.org"}, Deny: []string{"pastebin.com"}}},
		{"none drops deny", egressFlags{policy: "none"}, cur, swclient.Egress{Policy: "none", Allow: []string{"registry.npmjs.org"}}},
		{"none with deny keeps it", egressFlags{policy: "none", deny: []string{"x.example"}}, cur, swclient.Egress{Policy: "none", Allow: []string{"registry.npmjs.org"}, Deny: []string{"x.example"}}},
		{"allow replaces", egressFlags{allow: []string{"*.githubusercontent.com", "api.example.com:443"}}, cur, swclient.Egress{Policy: "public", Allow: []string{"*.githubusercontent.com", "api.example.com:443"}, Deny: []string{"pastebin.com"}}},
		{"clear deny", egressFlags{clearDeny: true}, cur, swclient.Egress{Policy: "public", Allow: []string{"registry.npmjs.org"}}},
		{"clear allow", egressFlags{clearAllow: true}, cur, swclient.Egress{Policy: "public", Deny: []string{"pastebin.com"}}},
		{"no policy yet", egressFlags{deny: []string{"pastebin.com"}}, nil, swclient.Egress{Deny: []string{"pastebin.com"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.f.check(); err != nil {
				t.Fatalf("check: %v", err)
			}
			if got := tc.f.apply(tc.cur); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("apply: %+v, want %+v", got, tc.want)
			}
		})
	}
	if cur.Policy != "public" || len(cur.Deny) != 1 {
		t.Errorf("apply changed the sandbox's policy it was given: %+v", cur)
	}
}

// TestWriteEgressLog: `egress --log` prints the lookups, then the
// connections, each a table newest first with allowed or denied, and the
// learned list of a learning sandbox.
func TestWriteEgressLog(t *testing.T) {
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	l := swclient.EgressLog{
		ID: "abc", Policy: "learn",
		Lookups: []swclient.EgressLookup{
			{Name: "pastebin.com", Allowed: false, Count: 2, Last: now.Add(-5 * time.Second)},
			{Name: "registry.npmjs.org", Addrs: []string{"104.16.1.34", "104.16.0.34"}, Allowed: true, Count: 7, Last: now.Add(-2 * time.Minute)},
		},
		Decisions: []swclient.EgressDecision{
			{Addr: "104.16.1.34", Port: 443, Proto: "tcp", Name: "registry.npmjs.org", Allowed: true, Count: 3, Last: now.Add(-time.Minute)},
			{Addr: "203.0.113.7", Proto: "icmp", Allowed: false, Count: 1, Last: now.Add(-time.Hour)},
		},
		Learned: []string{"registry.npmjs.org"},
	}
	var b bytes.Buffer
	if err := writeEgressLog(&b, &l, now); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	parts := strings.Split(out, "\n\n")
	if len(parts) != 3 || parts[0][:strings.Index(parts[0], "\n")] != "sandbox abc egress learn" {
		t.Fatalf("egress log printed %q, want a heading, the lookups, the connections and the learned list, apart", out)
	}
	lookups := parseTable(t, strings.SplitN(parts[0], "\n", 2)[1], "LOOKUP", "VERDICT", "COUNT", "LAST", "ADDRESSES")
	if len(lookups) != 2 || lookups[0]["LOOKUP"] != "pastebin.com" || lookups[0]["VERDICT"] != "denied" || lookups[0]["ADDRESSES"] != "-" ||
		lookups[1]["VERDICT"] != "allowed" || lookups[1]["COUNT"] != "7" || lookups[1]["LAST"] != "2m ago" || lookups[1]["ADDRESSES"] != "104.16.1.34,104.16.0.34" {
		t.Errorf("lookups: %+v", lookups)
	}
	conns := parseTable(t, parts[1], "DESTINATION", "NAME", "VERDICT", "COUNT", "LAST")
	if len(conns) != 2 || conns[0]["DESTINATION"] != "104.16.1.34:443/tcp" || conns[0]["NAME"] != "registry.npmjs.org" || conns[0]["VERDICT"] != "allowed" ||
		conns[1]["DESTINATION"] != "203.0.113.7/icmp" || conns[1]["NAME"] != "-" || conns[1]["VERDICT"] != "denied" || conns[1]["LAST"] != "1h ago" {
		t.Errorf("connections: %+v", conns)
	}
	if !strings.HasPrefix(parts[2], "learned: registry.npmjs.org (caddy sandwake egress abc --lock") {
		t.Errorf("learned line %q", parts[2])
	}

	b.Reset()
	if err := writeEgressLog(&b, &swclient.EgressLog{ID: "abc", Policy: "public", Lookups: []swclient.EgressLookup{}, Decisions: []swclient.EgressDecision{}}, now); err != nil {
		t.Fatal(err)
	}
	if got, want := b.String(), "sandbox abc egress public\nno lookups\n\nno connections\n"; got != want {
		t.Errorf("empty log of a public sandbox: %q, want %q", got, want)
	}
}

// TestEgressUsageErrors: contradicting egress and create flags fail before
// any call, with one line.
func TestEgressUsageErrors(t *testing.T) {
	api := fmt.Sprintf("http://127.0.0.1:%d", gatewaytest.FreePort(t))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"egress", "abc", "--deny", "x.example", "--clear-deny"}, "egress: --clear-deny and --deny together: give one"},
		{[]string{"egress", "abc", "--log", "--lock"}, "egress: --log and --lock together: give one"},
		{[]string{"egress", "abc", "--lock", "--policy", "none"}, "egress: --lock does not change the policy"},
		{[]string{"egress", "abc", "--log", "--allow", "x.example"}, "egress: --log does not change the policy"},
		{[]string{"egress", "--log"}, "egress: want <id>, got 0 argument(s)"},
		{[]string{"create", "--image", "app", "--port", "8080", "--activity", "sometimes"}, `create: --activity "sometimes" is not inbound or any`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			runCLI(t, context.Background(), append(tc.args, "--api", api)...).failed(t, strings.Join(tc.args, " "), tc.want)
		})
	}
}

// TestEgressCLI drives names, deny lists, activity, the egress log and
// learn-then-lock with the CLI against a real Caddy and Docker.
func TestEgressCLI(t *testing.T) {
	h := newHarness(t, "")
	id := testenv.UniqueID("cli")
	h.RemoveOnCleanup(id)
	ctx := context.Background()
	sw := func(args ...string) cliResult {
		r := runCLI(t, ctx, append(args, "--api", h.APIURL(""), "--token", gatewaytest.Token)...)
		t.Logf("$ caddy sandwake %s\n%s%s", strings.Join(args, " "), r.out, r.errOut)
		return r
	}

	sw("create", "--image", h.Image, "--port", "8080", "--id", id, "--egress", "learn", "--allow", "Registry.npmjs.org",
		"--deny", "pastebin.com", "--deny", "203.0.113.0/24", "--activity", "any").ok(t, "create --egress learn")
	kv := parseRecordLines(sw("get", id).ok(t, "get"))
	if kv["egress"] != "learn allow registry.npmjs.org deny pastebin.com 203.0.113.0/24" || kv["activity"] != "any" {
		t.Fatalf("get printed egress %q activity %q", kv["egress"], kv["activity"])
	}

	out := sw("egress", id, "--log").ok(t, "egress --log")
	if want := "sandbox " + id + " egress learn\nno lookups\n\nno connections\n\nlearned: - (caddy sandwake egress " + id + " --lock makes it the allow list under none)\n"; out != want {
		t.Errorf("egress --log of a sandbox that did nothing printed %q, want %q", out, want)
	}
	sameDocument(t, "egress --log -o json", prettyJSON(t, "egress --log -o json", sw("egress", id, "--log", "-o", "json").ok(t, "egress --log -o json")),
		apiDocument(t, h, "/v1/sandboxes/"+id+"/egress"))

	// Deny entries are replaced, then dropped by a none policy.
	if out := sw("egress", id, "--policy", "public", "--deny", "*.pastebin.com").ok(t, "egress --deny"); !strings.HasSuffix(out, "  egress public allow registry.npmjs.org deny *.pastebin.com\n") {
		t.Errorf("egress --deny printed %q", out)
	}
	sw("egress", id, "--policy", "none", "--deny", "x.example").failed(t, "egress --policy none --deny", "egress.deny: a none policy opens nothing to deny")
	if out := sw("egress", id, "--policy", "none").ok(t, "egress --policy none"); !strings.HasSuffix(out, "  egress none allow registry.npmjs.org\n") {
		t.Errorf("egress --policy none printed %q, want the deny list dropped", out)
	}
	sw("egress", id, "--allow", "bad name.example").failed(t, "egress --allow with a bad name", `"bad name.example"`)

	// Lock: not while it is not learning; then learn, and lock.
	sw("egress", id, "--lock").failed(t, "egress --lock under none", "(409)")
	sw("egress", id, "--policy", "learn", "--clear-allow").ok(t, "egress --policy learn")
	if out := sw("egress", id, "--lock").ok(t, "egress --lock"); !strings.HasSuffix(out, "  locked: none\nin a template block: egress none\n") {
		t.Errorf("egress --lock printed %q", out)
	}
	if kv := parseRecordLines(sw("get", id).ok(t, "get")); kv["egress"] != "none" {
		t.Errorf("after the lock, get printed egress %q", kv["egress"])
	}
	sw("egress", testenv.UniqueID("nx"), "--log").failed(t, "egress --log of an unknown sandbox", "not found (404)")
}

// TestTemplateEgressLine: a locked list as a template block's line
// (egress <policy> [allow…], as the Caddyfile's template block takes it).
func TestTemplateEgressLine(t *testing.T) {
	for _, tc := range []struct {
		e    *swclient.Egress
		want string
	}{
		{nil, "egress none"},
		{&swclient.Egress{Policy: "none"}, "egress none"},
		{&swclient.Egress{Policy: "none", Allow: []string{"registry.npmjs.org", "*.githubusercontent.com:443", "198.51.100.7:443/tcp"}},
			"egress none registry.npmjs.org *.githubusercontent.com:443 198.51.100.7:443/tcp"},
	} {
		if got := templateEgressLine(tc.e); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.e, got, tc.want)
		}
	}
}
