package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/internal/testenv"
)

// labelContent carries a digest of the image's layer and config: an image
// with the same digest under the tag is not imported again.
const labelContent = "sandwake.image.content"

func main() {
	tag := flag.String("tag", "sandwake:dev", "the image's tag")
	goCmd := flag.String("go", "go", "the go command that compiles cmd/caddy")
	caBundle := flag.String("ca-certificates", "/etc/ssl/certs/ca-certificates.crt", "the CA bundle copied into the image (PEM)")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: go run ./internal/image [--tag sandwake:dev] [--go go] [--ca-certificates file]")
		os.Exit(2)
	}
	if err := run(*tag, *goCmd, *caBundle); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(tag, goCmd, caBundle string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cli, err := client.New(client.FromEnv)
	if err != nil {
		return err
	}
	defer cli.Close()
	if _, err := cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		return fmt.Errorf("docker engine not reachable (is Docker running, and DOCKER_HOST right?): %w", err)
	}
	ver, err := cli.ServerVersion(ctx, client.ServerVersionOptions{})
	if err != nil {
		return fmt.Errorf("reading the engine's version: %w", err)
	}
	if ver.Os != "linux" {
		return fmt.Errorf("the engine runs %s containers; the gateway image is for linux", ver.Os)
	}

	in := layerInputs{}
	if in.CACertificate, err = os.ReadFile(caBundle); err != nil {
		return fmt.Errorf("reading the CA certificates (--ca-certificates names another PEM bundle): %w", err)
	}
	if in.Caddyfile, err = os.ReadFile("Caddyfile.example"); err != nil {
		return fmt.Errorf("reading the default configuration (run from the repository's root): %w", err)
	}
	dir, err := os.MkdirTemp("", "sandwake-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "caddy")
	build := exec.CommandContext(ctx, goCmd, "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "./cmd/caddy")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+ver.Arch)
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building cmd/caddy for linux/%s: %w\n%s", ver.Arch, err, out)
	}
	if in.Binary, err = os.ReadFile(bin); err != nil {
		return err
	}
	layer, err := buildLayer(in)
	if err != nil {
		return err
	}
	changes := imageConfig()
	sum := sha256.New()
	sum.Write(layer)
	sum.Write([]byte(strings.Join(changes, "\n")))
	content := hex.EncodeToString(sum.Sum(nil))[:16]

	old, err := cli.ImageInspect(ctx, tag)
	switch {
	case err == nil && old.Config != nil && old.Config.Labels[labelContent] == content:
		fmt.Printf("image %s: up to date (%s, %d MB)\n", tag, shortID(old.ID), old.Size>>20)
		return nil
	case err != nil && !cerrdefs.IsNotFound(err):
		return fmt.Errorf("inspecting %s: %w", tag, err)
	}
	changes = append(changes, fmt.Sprintf("LABEL %s=%q", labelContent, content))
	if err := testenv.ImportLayer(ctx, cli, bytes.NewReader(layer), tag, changes); err != nil {
		return err
	}
	img, err := cli.ImageInspect(ctx, tag)
	if err != nil {
		return fmt.Errorf("inspecting %s: %w", tag, err)
	}
	fmt.Printf("image %s: imported (%s, %d MB): cmd/caddy for linux/%s, Caddyfile.example, user %s (%d)\n",
		tag, shortID(img.ID), img.Size>>20, ver.Arch, userName, uid)
	// Only an image make image made (its content label) is replaced: another
	// image under the tag is someone else's.
	if old.ID != "" && old.ID != img.ID && old.Config != nil && old.Config.Labels[labelContent] != "" {
		// Not forced: an image a container uses stays until it is unused.
		if _, err := cli.ImageRemove(ctx, old.ID, client.ImageRemoveOptions{}); err == nil {
			fmt.Printf("removed the image %s named before (%s)\n", tag, shortID(old.ID))
		} else if cerrdefs.IsConflict(err) {
			fmt.Printf("kept the image %s named before (%s): a container uses it\n", tag, shortID(old.ID))
		} else if !cerrdefs.IsNotFound(err) {
			return fmt.Errorf("removing the image %s named before (%s): %w", tag, shortID(old.ID), err)
		}
	}
	return nil
}

// imageConfig is the image's config as Dockerfile instructions: caddy as
// the entrypoint (so that `docker run sandwake:dev sandwake ls` runs the
// CLI), the quick start's configuration as the command, the non-root user,
// Caddy's XDG directories, and /data as a volume.
func imageConfig() []string {
	return []string{
		fmt.Sprintf(`ENTRYPOINT [%q]`, binaryPath),
		fmt.Sprintf(`CMD ["run", "--config", %q, "--adapter", "caddyfile"]`, caddyfilePath),
		fmt.Sprintf("USER %d:%d", uid, gid),
		"WORKDIR /",
		"ENV XDG_DATA_HOME=" + dataDir,
		"ENV XDG_CONFIG_HOME=" + configDir,
		"VOLUME " + dataDir,
		"EXPOSE 8080 8081",
		`LABEL org.opencontainers.image.title="sandwake"`,
		`LABEL org.opencontainers.image.description="Caddy with sandwake: Docker sandboxes behind preview hosts, woken on demand"`,
		`LABEL org.opencontainers.image.source="https://github.com/sandwake/sandwake"`,
	}
}

// shortID is an image id as docker images shows it.
func shortID(id string) string {
	id = strings.TrimPrefix(id, "sha256:")
	return id[:min(12, len(id))]
}
