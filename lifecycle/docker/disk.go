package docker

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/lifecycle"
)

// diskDirs are the host directories a sandbox writes to: its container's
// writable layer (the storage driver's UpperDir) and its workspace
// volume's data, for the container cid they were read from.
type diskDirs struct {
	cid    string
	upper  string
	volume string
	// members are a group's services' writable layers and volumes.
	members []memberDirs
}

// memberDirs are the directories one service of a group writes to.
type memberDirs struct {
	name string
	dirs []string
}

// DiskUsage implements lifecycle.DiskMeter: the bytes on disk (allocated
// blocks, each hard-linked file once) under the sandbox's writable layer
// and workspace volume, and its services', walked on the host. When those
// directories are not reachable from here (a remote engine, a driver
// without an UpperDir) it falls back to the engine's size of the writable
// layer alone.
func (r *Runtime) DiskUsage(ctx context.Context, id string) (int64, error) {
	total, _, err := r.GroupDiskUsage(ctx, id)
	return total, err
}

// GroupDiskUsage implements lifecycle.GroupDiskMeter: DiskUsage's total,
// and the part of it each service of a group wrote (its writable layer and
// volume), by name; services is nil for a single container, and when the
// directories are not reachable from here.
func (r *Runtime) GroupDiskUsage(ctx context.Context, id string) (total int64, services map[string]int64, err error) {
	cid, err := r.resolve(ctx, id)
	if err != nil {
		return 0, nil, err
	}
	var dirs diskDirs
	if v, ok := r.disk.Load(id); ok && v.(diskDirs).cid == cid {
		dirs = v.(diskDirs)
	} else {
		res, err := r.cli.ContainerInspect(ctx, cid, client.ContainerInspectOptions{})
		if err != nil {
			return 0, nil, classify("inspecting container "+ContainerName(id), err, lifecycle.ErrContainerNotFound)
		}
		dirs = diskDirs{cid: cid}
		if gd := res.Container.GraphDriver; gd != nil {
			dirs.upper = gd.Data["UpperDir"]
		}
		for _, m := range res.Container.Mounts {
			if m.Name == VolumeName(id) {
				dirs.volume = m.Source
			}
		}
		if containerLabels(&res.Container)[LabelGroup] == "true" {
			// Every service's writable layer and volume count too.
			ms, err := r.members(ctx, id)
			if err != nil {
				return 0, nil, err
			}
			for _, m := range ms {
				if m.name == infraMember {
					continue
				}
				mi, err := r.cli.ContainerInspect(ctx, m.cid, client.ContainerInspectOptions{})
				if err != nil {
					return 0, nil, classify("inspecting container "+MemberName(id, m.name), err, lifecycle.ErrContainerNotFound)
				}
				md := memberDirs{name: m.name}
				if gd := mi.Container.GraphDriver; gd != nil && gd.Data["UpperDir"] != "" {
					md.dirs = append(md.dirs, gd.Data["UpperDir"])
				}
				for _, mt := range mi.Container.Mounts {
					if mt.Name == MemberVolumeName(id, m.name) {
						md.dirs = append(md.dirs, mt.Source)
					}
				}
				dirs.members = append(dirs.members, md)
			}
		}
		r.disk.Store(id, dirs)
	}
	if dirs.reachable() {
		total, err := DirUsage(ctx, dirs.upper, dirs.volume)
		if err != nil || len(dirs.members) == 0 {
			return total, nil, err
		}
		services = make(map[string]int64, len(dirs.members))
		for _, m := range dirs.members {
			used, err := DirUsage(ctx, m.dirs...)
			if err != nil {
				return total, nil, err
			}
			services[m.name] = used
			total += used
		}
		return total, services, nil
	}
	res, err := r.cli.ContainerInspect(ctx, cid, client.ContainerInspectOptions{Size: true})
	if err != nil {
		return 0, nil, classify("inspecting container "+ContainerName(id), err, lifecycle.ErrContainerNotFound)
	}
	if res.Container.SizeRw == nil {
		return 0, nil, errors.New("docker: the engine reported no size for container " + ContainerName(id))
	}
	return *res.Container.SizeRw, nil, nil
}

// reachable reports whether every directory of the sandbox can be walked
// from here.
func (d diskDirs) reachable() bool {
	if d.upper == "" || d.volume == "" || !reachable(d.upper) || !reachable(d.volume) {
		return false
	}
	for _, m := range d.members {
		if slices.ContainsFunc(m.dirs, func(dir string) bool { return !reachable(dir) }) {
			return false
		}
	}
	return true
}

func reachable(dir string) bool {
	fi, err := os.Stat(dir)
	return err == nil && fi.IsDir()
}

// DirUsage is the bytes on disk under dirs: allocated blocks, so that
// sparse files count what they hold, each inode once (hard links), not
// following symbolic links or crossing into anything the walk cannot read.
func DirUsage(ctx context.Context, dirs ...string) (int64, error) {
	var total int64
	seen := map[[2]uint64]bool{}
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil // removed meanwhile
				}
				return err
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			info, err := d.Info()
			if err != nil {
				return nil // removed meanwhile
			}
			st, ok := info.Sys().(*syscall.Stat_t)
			if !ok {
				total += info.Size()
				return nil
			}
			if st.Nlink > 1 && !d.IsDir() {
				key := [2]uint64{uint64(st.Dev), st.Ino}
				if seen[key] {
					return nil
				}
				seen[key] = true
			}
			total += st.Blocks * 512
			return nil
		})
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return total, err
		}
	}
	return total, nil
}

// WorkspaceEmpty implements lifecycle.WorkspaceChecker: the volume's
// directory on this host holds no entry. A volume whose directory cannot
// be read from here (a remote engine) is not known to be empty.
func (r *Runtime) WorkspaceEmpty(ctx context.Context, id string) (bool, error) {
	vol, err := r.cli.VolumeInspect(ctx, VolumeName(id), client.VolumeInspectOptions{})
	if err != nil {
		return false, classify("inspecting volume "+VolumeName(id), err, lifecycle.ErrNotFound)
	}
	if !r.owns(id, vol.Volume.Labels) || !reachable(vol.Volume.Mountpoint) {
		return false, nil
	}
	entries, err := os.ReadDir(vol.Volume.Mountpoint)
	if err != nil {
		return false, nil
	}
	return len(entries) == 0, nil
}

// Interface guards.
var (
	_ lifecycle.DiskMeter        = (*Runtime)(nil)
	_ lifecycle.GroupDiskMeter   = (*Runtime)(nil)
	_ lifecycle.WorkspaceChecker = (*Runtime)(nil)
)
