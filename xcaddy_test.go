package sandwake_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// xcaddyMain is the main.go xcaddy v0.4.5 writes (environment.go's
// mainModuleTemplate) for `xcaddy build --with github.com/sandwake/sandwake`.
const xcaddyMain = `package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	// plug in Caddy modules here
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/sandwake/sandwake"
)

func main() {
	caddycmd.Main()
}
`

// sandwakeModules are the module IDs an xcaddy build must register.
var sandwakeModules = []string{
	"sandwake",
	"http.handlers.sandwake",
	"http.handlers.sandwake_api",
	"http.reverse_proxy.upstreams.sandwake",
	"tls.permission.sandwake",
}

// sandwakeCommands are commands `caddy sandwake --help` must list.
var sandwakeCommands = []string{
	"ls", "get", "create", "wake", "pause", "stop", "keepalive", "destroy",
	"purge", "events", "history", "egress", "templates", "nodes", "node", "cluster",
}

// TestXcaddyBuild builds Caddy the way `xcaddy build <xcaddy.json's version>
// --with github.com/sandwake/sandwake=.` does: a main module of its own that
// blank-imports the module root, with this checkout as the replacement. It
// works offline (the module cache only) and checks that every sandwake module
// and command is registered in the binary it makes.
func TestXcaddyBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a whole Caddy: not in -short")
	}
	manifest, err := os.ReadFile("xcaddy.json")
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		CaddyVersion string `json:"caddy_version"`
		Plugins      []struct {
			Module string `json:"module"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(manifest, &m); err != nil {
		t.Fatalf("xcaddy.json: %v", err)
	}
	if len(m.Plugins) != 1 || m.Plugins[0].Module != "github.com/sandwake/sandwake" {
		t.Fatalf("xcaddy.json names plugins %+v, want the module root github.com/sandwake/sandwake", m.Plugins)
	}
	checkout, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	// xcaddy's `go get` of the plugin leaves the main module requiring what
	// the plugin's go.mod requires (MVS); offline, the build must start from
	// that complete list, since the module cache holds no other go.mod files.
	own, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	want := "github.com/caddyserver/caddy/v2 " + m.CaddyVersion + "\n"
	if !strings.Contains(string(own), want) {
		t.Fatalf("go.mod does not require Caddy %s, the version xcaddy.json builds and the docs name", m.CaddyVersion)
	}
	_, requires, ok := strings.Cut(string(own), "\nrequire")
	if !ok {
		t.Fatal("go.mod has no require block")
	}
	dir := t.TempDir()
	goMod := fmt.Sprintf(`module caddy

go 1.26.8

require github.com/sandwake/sandwake v0.0.0-00010101000000-000000000000

replace github.com/sandwake/sandwake => %s

require%s`, checkout, requires)
	sum, err := os.ReadFile("go.sum")
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string][]byte{
		"main.go": []byte(xcaddyMain), "go.mod": []byte(goMod), "go.sum": sum,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// A cold build of Caddy and every module (its own build cache:
	// CGO_ENABLED=0), beside the other packages' tests: 10 minutes was
	// too short on a slow 2-core machine. The bound only stops a hung
	// build; make test's own is 60 minutes.
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	bin := filepath.Join(dir, "caddy")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "GOPROXY=off", "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("an xcaddy-style build of github.com/sandwake/sandwake failed: %v\n%s", err, out)
	}

	out, err := exec.CommandContext(ctx, bin, "list-modules").CombinedOutput()
	if err != nil {
		t.Fatalf("caddy list-modules: %v\n%s", err, out)
	}
	listed := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		listed[strings.TrimSpace(line)] = true
	}
	for _, id := range sandwakeModules {
		if !listed[id] {
			t.Errorf("caddy list-modules does not list %s:\n%s", id, out)
		}
	}

	out, err = exec.CommandContext(ctx, bin, "sandwake", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("caddy sandwake --help: %v\n%s", err, out)
	}
	commands := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			commands[f[0]] = true
		}
	}
	for _, c := range sandwakeCommands {
		if !commands[c] {
			t.Errorf("caddy sandwake --help does not list the command %q:\n%s", c, out)
		}
	}
}
