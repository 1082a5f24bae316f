package api

import (
	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/lifecycle"
)

// The management API's JSON types are the client package's, so the
// handlers and `caddy sandwake` read and write the same shapes. These are
// the names the handlers use for them.
type (
	// recordView is a sandbox as the API shows it (see engine.view).
	recordView = client.Sandbox
	// patchBody is the body of PATCH /v1/sandboxes/{id}.
	patchBody = client.Patch
)

// createBody is the body of POST /v1/sandboxes: the client's type, with
// the conversion to an engine spec.
type createBody client.CreateRequest

// Spec is the engine's spec of a create request, read as POST /v1/sandboxes
// reads it (the config's templates are read the same way).
func Spec(req client.CreateRequest) (lifecycle.Spec, error) {
	b := createBody(req)
	return b.spec()
}
