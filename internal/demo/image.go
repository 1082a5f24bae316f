package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/internal/testenv"
)

// labelDemo marks a demo image; its value is the image's repository.
const labelDemo = "sandwake.demo"

// imageResult is what ensureImage did.
type imageResult struct {
	Ref      string   // repo:<hash>, the image now tagged repo:latest
	Imported bool     // false: that binary's image was already there
	Removed  []string // images of earlier binaries removed (tags, or ids of untagged ones)
	Kept     []string // earlier images still used by a container, kept with their tag
}

// ensureImage makes repo:latest the image of binary. The image is tagged
// repo:<first 12 hex of the binary's sha256> and imported only when that tag
// is missing, so an unchanged binary imports nothing. Earlier demo images of
// repo (its other tags, and untagged ones with the demo label) are removed;
// one a container still uses is kept under its own tag, never left untagged,
// and goes on a later call once unused. labels are added to an imported
// image's.
func ensureImage(ctx context.Context, cli *client.Client, binary, repo string, labels map[string]string) (imageResult, error) {
	sum, err := fileSHA256(binary)
	if err != nil {
		return imageResult{}, err
	}
	res := imageResult{Ref: repo + ":" + sum[:12]}
	img, err := cli.ImageInspect(ctx, res.Ref)
	if cerrdefs.IsNotFound(err) {
		all := maps.Clone(labels)
		if all == nil {
			all = map[string]string{}
		}
		all[labelDemo] = repo
		if err := testenv.ImportImage(ctx, cli, binary, res.Ref, all); err != nil {
			return res, err
		}
		res.Imported = true
		img, err = cli.ImageInspect(ctx, res.Ref)
	}
	if err != nil {
		return res, fmt.Errorf("inspecting %s: %w", res.Ref, err)
	}
	if _, err := cli.ImageTag(ctx, client.ImageTagOptions{Source: res.Ref, Target: repo + ":latest"}); err != nil {
		return res, fmt.Errorf("tagging %s as %s:latest: %w", res.Ref, repo, err)
	}
	old, err := earlierImages(ctx, cli, repo, img.ID)
	if err != nil {
		return res, err
	}
	for _, o := range old {
		// Not forced: the engine refuses to untag the last reference of an
		// image a container uses, so such an image keeps its tag.
		_, err := cli.ImageRemove(ctx, o, client.ImageRemoveOptions{PruneChildren: true})
		switch {
		case err == nil:
			res.Removed = append(res.Removed, o)
		case cerrdefs.IsConflict(err):
			res.Kept = append(res.Kept, o)
		case !cerrdefs.IsNotFound(err):
			return res, fmt.Errorf("removing the earlier demo image %s: %w", o, err)
		}
	}
	return res, nil
}

// earlierImages lists the demo images of repo other than image id: their
// repo tags, or their id when they have none (left by an earlier version).
func earlierImages(ctx context.Context, cli *client.Client, repo, id string) ([]string, error) {
	byRef, err := cli.ImageList(ctx, client.ImageListOptions{Filters: make(client.Filters).Add("reference", repo)})
	if err != nil {
		return nil, fmt.Errorf("listing %s images: %w", repo, err)
	}
	values := []string{repo}
	if repo == defaultRepo {
		values = append(values, "true") // the label's value before it named the repository
	}
	items := byRef.Items
	for _, v := range values {
		byLabel, err := cli.ImageList(ctx, client.ImageListOptions{Filters: make(client.Filters).Add("label", labelDemo+"="+v)})
		if err != nil {
			return nil, fmt.Errorf("listing demo images: %w", err)
		}
		items = append(items, byLabel.Items...)
	}
	var out []string
	for _, im := range items {
		if im.ID == id {
			continue
		}
		var tags []string
		for _, t := range im.RepoTags {
			if strings.HasPrefix(t, repo+":") {
				tags = append(tags, t)
			}
		}
		switch {
		case len(tags) > 0:
			out = append(out, tags...)
		case len(im.RepoTags) == 0 || slices.Equal(im.RepoTags, []string{"<none>:<none>"}):
			out = append(out, im.ID)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// fileSHA256 is the hex sha256 of a file's content.
func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hashing %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
