package sandwake

import (
	// The sandwake app, the http.handlers.sandwake and sandwake_api handlers,
	// the dynamic upstreams and tls.permission.sandwake.
	_ "github.com/sandwake/sandwake/caddymodule"
	// `caddy sandwake …`.
	_ "github.com/sandwake/sandwake/cli"
)
