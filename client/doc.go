// Package client is a Go client of sandwake's management API (the
// sandwake_api handler) and the owner of its wire types. It imports neither
// Caddy nor the engine, so programs that drive sandwake need only this
// package.
//
//	c, err := client.New("http://localhost:8081", token, nil)
//	sb, err := c.Create(ctx, client.CreateRequest{Image: "app:latest", Ports: []int{8080}})
//
// Every error the API answers is an *APIError with its status, code and
// message.
//
// It must not import Caddy, the engine or any package that serves requests.
package client
