package main

import (
	"context"
	"fmt"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/egress"
)

// reset removes the demo sandbox `make run` made under id, whatever
// gateway instance made it: its container (s-<id>) and volume
// (s-<id>-data), both only when sandwake labelled them with that id, and
// the sandbox network (sandwake-<instance>) and egress firewall table of
// that instance when nothing else uses the network. With image, the demo
// image too. It answers what it removed.
func reset(ctx context.Context, cli *client.Client, id, repo string, image bool) ([]string, error) {
	var removed []string
	name := "s-" + id
	if res, err := cli.ContainerInspect(ctx, name, client.ContainerInspectOptions{}); err == nil {
		ci := res.Container
		labels := map[string]string{}
		if ci.Config != nil {
			labels = ci.Config.Labels
		}
		if labels["sandwake.managed"] != "true" || labels["sandwake.id"] != id {
			return removed, fmt.Errorf("container %s is not a sandwake sandbox of id %s: left alone", name, id)
		}
		if _, err := cli.ContainerRemove(ctx, ci.ID, client.ContainerRemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
			return removed, fmt.Errorf("removing container %s: %w", name, err)
		}
		removed = append(removed, "container "+name)
		if inst := labels["sandwake.instance"]; inst != "" {
			nwName := "sandwake-" + inst
			if nw, err := cli.NetworkInspect(ctx, nwName, client.NetworkInspectOptions{}); err == nil && nw.Network.Labels["sandwake.instance"] == inst && len(nw.Network.Containers) == 0 {
				if _, err := cli.NetworkRemove(ctx, nw.Network.ID, client.NetworkRemoveOptions{}); err == nil {
					removed = append(removed, "network "+nwName)
					// The tables go with their bridge (as uninstall's do).
					if br := nw.Network.Options["com.docker.network.bridge.name"]; br != "" {
						tables, _ := egress.RemoveTables(br)
						for _, t := range tables {
							removed = append(removed, "firewall table "+t)
						}
					}
				}
			}
		}
	} else if !cerrdefs.IsNotFound(err) {
		return removed, fmt.Errorf("inspecting container %s: %w", name, err)
	}
	vol := name + "-data"
	if res, err := cli.VolumeInspect(ctx, vol, client.VolumeInspectOptions{}); err == nil {
		if res.Volume.Labels["sandwake.managed"] == "true" && res.Volume.Labels["sandwake.id"] == id {
			if _, err := cli.VolumeRemove(ctx, vol, client.VolumeRemoveOptions{Force: true}); err != nil {
				return removed, fmt.Errorf("removing volume %s: %w", vol, err)
			}
			removed = append(removed, "volume "+vol)
		}
	}
	if image {
		imgs, err := cli.ImageList(ctx, client.ImageListOptions{All: true, Filters: make(client.Filters).Add("label", labelDemo+"="+repo)})
		if err != nil {
			return removed, fmt.Errorf("listing demo images: %w", err)
		}
		for _, im := range imgs.Items {
			if _, err := cli.ImageRemove(ctx, im.ID, client.ImageRemoveOptions{Force: true, PruneChildren: true}); err == nil {
				removed = append(removed, "image "+im.ID[:min(19, len(im.ID))])
			}
		}
	}
	return removed, nil
}
