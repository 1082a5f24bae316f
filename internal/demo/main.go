package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/internal/testenv"
)

// defaultRepo is the demo image's repository unless $SANDWAKE_DEMO_IMAGE
// names another.
const defaultRepo = "sandwake-demo"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo image:", err)
		os.Exit(1)
	}
}

func run() error {
	repo := os.Getenv("SANDWAKE_DEMO_IMAGE")
	if repo == "" {
		repo = defaultRepo
	}
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
	if len(os.Args) == 3 && (os.Args[1] == "leftover" || os.Args[1] == "clean") {
		removed, err := reset(ctx, cli, os.Args[2], repo, os.Args[1] == "clean")
		for _, r := range removed {
			fmt.Println("removed", r)
		}
		if err == nil && len(removed) == 0 {
			fmt.Println("nothing of the demo to remove")
		}
		return err
	}
	if len(os.Args) > 1 {
		return fmt.Errorf("usage: demo [leftover <id> | clean <id>]")
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
	res, err := ensureImage(ctx, cli, bin, repo, nil)
	if err != nil {
		return err
	}
	how := "up to date"
	if res.Imported {
		how = "imported"
	}
	fmt.Printf("demo image %s:latest: %s (%s)\n", repo, how, res.Ref)
	if len(res.Removed) > 0 {
		fmt.Printf("removed the earlier demo image(s) %s\n", strings.Join(res.Removed, ", "))
	}
	if len(res.Kept) > 0 {
		fmt.Printf("kept %s: a container still uses it (removed by a later run once unused)\n", strings.Join(res.Kept, ", "))
	}
	return nil
}
