// Command image builds the gateway's container image (`make image`)
// without pulling or building from a base image: cmd/caddy compiled
// static, one tar layer assembled here (see buildLayer) and imported
// through the Docker API under the tag given, sandwake:dev by default.
//
// The image runs Caddyfile.example, the quick start's configuration, from
// /: its store ./data/sandwake is /data/sandwake, on the /data volume. It
// runs as the non-root user sandwake (65532), which needs the Docker
// socket's group (group_add) and NET_ADMIN (cap_add) for the egress
// firewall; deploy/compose.yaml and docs/image.md show how.
//
// An image whose content (layer and config) is already under the tag is
// not imported again; the image the tag named before is removed unless a
// container uses it.
package main
