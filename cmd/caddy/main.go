package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	// Caddy's standard modules.
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	// sandwake: the module root, as xcaddy's main.go imports it.
	_ "github.com/sandwake/sandwake"
)

func main() {
	caddycmd.Main()
}
