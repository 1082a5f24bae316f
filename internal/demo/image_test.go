package main

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// demoImages lists the images carrying the demo label of repo, tagged or not,
// as "id tag,tag" strings.
func demoImages(t *testing.T, cli *client.Client, repo string) []string {
	t.Helper()
	res, err := cli.ImageList(context.Background(), client.ImageListOptions{All: true, Filters: make(client.Filters).Add("label", labelDemo+"="+repo)})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, im := range res.Items {
		out = append(out, im.ID+" "+strings.Join(im.RepoTags, ","))
	}
	return out
}

// TestEnsureImage: an unchanged binary imports nothing; a changed one is
// imported and replaces the earlier image, which is never left untagged
// (dangling): kept under its own tag while a container uses it, removed by
// the next call once unused.
func TestEnsureImage(t *testing.T) {
	cli := testenv.Docker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	repo := "sandwake-demo-test-" + testenv.RunID()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, _ := cli.ImageList(ctx, client.ImageListOptions{All: true, Filters: make(client.Filters).Add("label", labelDemo+"="+repo)})
		for _, im := range res.Items {
			cli.ImageRemove(ctx, im.ID, client.ImageRemoveOptions{Force: true})
		}
	})
	dir := t.TempDir()
	bin1, err := testenv.BuildTestApp(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	// A changed binary: the same program with a byte more at the end.
	b, err := os.ReadFile(bin1)
	if err != nil {
		t.Fatal(err)
	}
	bin2 := bin1 + "-2"
	if err := os.WriteFile(bin2, append(b, 0), 0o755); err != nil {
		t.Fatal(err)
	}
	labels := testenv.Labels()
	latestID := func() string {
		img, err := cli.ImageInspect(ctx, repo+":latest")
		if err != nil {
			t.Fatal(err)
		}
		return img.ID
	}
	checkTagged := func(step string, want int) []string {
		imgs := demoImages(t, cli, repo)
		if len(imgs) != want {
			t.Fatalf("%s: %d demo images %q, want %d", step, len(imgs), imgs, want)
		}
		for _, im := range imgs {
			if !strings.Contains(im, " "+repo+":") {
				t.Fatalf("%s: image %s has no %s tag (dangling)", step, im, repo)
			}
		}
		return imgs
	}

	r1, err := ensureImage(ctx, cli, bin1, repo, labels)
	if err != nil || !r1.Imported || len(r1.Removed)+len(r1.Kept) != 0 || !strings.HasPrefix(r1.Ref, repo+":") {
		t.Fatalf("first call: %+v %v, want an import", r1, err)
	}
	first := checkTagged("after the first import", 1)
	id1 := latestID()

	r2, err := ensureImage(ctx, cli, bin1, repo, labels)
	if err != nil || r2.Imported || r2.Ref != r1.Ref || len(r2.Removed)+len(r2.Kept) != 0 {
		t.Fatalf("same binary again: %+v %v, want nothing done", r2, err)
	}
	if again := checkTagged("after the same binary", 1); !slices.Equal(again, first) || latestID() != id1 {
		t.Fatalf("same binary again changed the images: %q, was %q", again, first)
	}

	// A container (the demo sandbox's) uses the first image.
	ctr, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config: &container.Config{Image: repo + ":latest", Labels: labels},
		Name:   "sandwake-demo-test-" + testenv.RunID(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cli.ContainerRemove(context.Background(), ctr.ID, client.ContainerRemoveOptions{Force: true})
	})
	r3, err := ensureImage(ctx, cli, bin2, repo, labels)
	if err != nil || !r3.Imported || r3.Ref == r1.Ref || len(r3.Removed) != 0 || !slices.Equal(r3.Kept, []string{r1.Ref}) {
		t.Fatalf("changed binary, old image in use: %+v %v, want an import keeping %s", r3, err, r1.Ref)
	}
	checkTagged("with the old image in use", 2)
	if latestID() == id1 {
		t.Fatalf("%s:latest still the first image", repo)
	}

	if _, err := cli.ContainerRemove(ctx, ctr.ID, client.ContainerRemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	r4, err := ensureImage(ctx, cli, bin2, repo, labels)
	if err != nil || r4.Imported || !slices.Equal(r4.Removed, []string{r1.Ref}) || len(r4.Kept) != 0 {
		t.Fatalf("once unused: %+v %v, want %s removed", r4, err, r1.Ref)
	}
	checkTagged("once the old image is unused", 1)
	if _, err := cli.ImageInspect(ctx, id1); err == nil {
		t.Fatalf("first image %s still on the engine", id1)
	}
}
