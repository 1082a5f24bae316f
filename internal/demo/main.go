// Command demo imports the demo sandbox image (internal/testapp, compiled
// static and imported through the Docker API: nothing is pulled) as
// sandwake-demo:latest. `make run` calls it.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/internal/testenv"
)

// Image is the demo image's reference.
const Image = "sandwake-demo:latest"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo image:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cli, err := client.New(client.FromEnv)
	if err != nil {
		return err
	}
	defer cli.Close()
	if _, err := cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		return fmt.Errorf("docker engine not reachable (is Docker running, and DOCKER_HOST right?): %w", err)
	}
	dir, err := os.MkdirTemp("", "sandwake-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin, err := testenv.BuildTestApp(ctx, dir)
	if err != nil {
		return err
	}
	old, _ := cli.ImageInspect(ctx, Image)
	if err := testenv.ImportImage(ctx, cli, bin, Image, map[string]string{"sandwake.demo": "true"}); err != nil {
		return err
	}
	// The previous import, now untagged, is removed unless a sandbox still
	// runs it (then the engine refuses, and it goes with that container).
	if old.ID != "" {
		cli.ImageRemove(ctx, old.ID, client.ImageRemoveOptions{})
	}
	fmt.Println("imported", Image)
	return nil
}
