package caddymodule

import "github.com/sandwake/sandwake/client"

// The management API's JSON types are the client package's, so the
// handlers and `caddy sandwake` read and write the same shapes. These are
// the names the handlers use for them.
type (
	// recordView is a sandbox as the API shows it (see engine.view).
	recordView = client.Sandbox
	// patchBody is the body of PATCH /v1/sandboxes/{id}.
	patchBody = client.Patch
	// apiError is the JSON body of every error sandwake answers.
	apiError = client.ErrorResponse
	// apiErrorBody is the inside of an apiError.
	apiErrorBody = client.ErrorBody
)

// createBody is the body of POST /v1/sandboxes: the client's type, with
// the conversion to an engine spec.
type createBody client.CreateRequest
