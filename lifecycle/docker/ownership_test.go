package docker_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/lifecycle/docker"
)

// legacySandbox makes what a gateway from before instance labels left: a
// stopped container and a volume labelled sandwake.managed and sandwake.id
// but no instance, and a record of it (with the given incarnation).
func legacySandbox(t *testing.T, f *fixture, incarnation string) (id, containerID string) {
	return foreignSandbox(t, f, incarnation, "")
}

// foreignSandbox is legacySandbox with the container and volume labelled as
// instance's ("" for none).
func foreignSandbox(t *testing.T, f *fixture, incarnation, instance string) (id, containerID string) {
	t.Helper()
	ctx := context.Background()
	id = testenv.UniqueID("l")
	labels := testenv.Labels()
	labels[docker.LabelManaged] = "true"
	labels[docker.LabelID] = id
	if instance != "" {
		labels[docker.LabelInstance] = instance
	}
	t.Cleanup(func() {
		f.cli.ContainerRemove(context.Background(), docker.ContainerName(id), client.ContainerRemoveOptions{Force: true})
		f.cli.VolumeRemove(context.Background(), docker.VolumeName(id), client.VolumeRemoveOptions{Force: true})
	})
	if _, err := f.cli.VolumeCreate(ctx, client.VolumeCreateOptions{Name: docker.VolumeName(id), Labels: labels}); err != nil {
		t.Fatal(err)
	}
	port, _ := network.PortFrom(8080, network.TCP)
	res, err := f.cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Name:   docker.ContainerName(id),
		Config: &container.Config{Image: f.image, Labels: labels, ExposedPorts: network.PortSet{port: {}}},
		HostConfig: &container.HostConfig{
			PortBindings: network.PortMap{port: {{HostIP: netip.MustParseAddr("127.0.0.1")}}},
			Mounts:       []mount.Mount{{Type: mount.TypeVolume, Source: docker.VolumeName(id), Target: "/workspace"}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	rec := lifecycle.Record{
		ID: id, State: lifecycle.Stopped, Incarnation: incarnation, ContainerID: res.ID,
		Spec:      lifecycle.Spec{Image: f.image, Ports: []int{8080}, WorkspacePath: "/workspace", ReadyMode: lifecycle.ReadyHTTP, Access: lifecycle.AccessPublic},
		CreatedAt: now, LastActiveAt: now, StateSince: now,
	}
	if _, _, err := f.store.Create(rec, "test"); err != nil {
		t.Fatal(err)
	}
	return id, res.ID
}

// TestLegacyRecordsKeepWorking: a sandbox made before instance labels (its
// record has no incarnation) is adopted: it wakes, stops and is destroyed
// as before the upgrade.
func TestLegacyRecordsKeepWorking(t *testing.T) {
	f := newFixture(t, lifecycle.Config{WakeTimeout: 30 * time.Second})
	id, cid := legacySandbox(t, f, "")
	ctx := context.Background()
	rec, err := f.m.Wake(ctx, id)
	if err != nil {
		t.Fatalf("waking a legacy sandbox: %v", err)
	}
	if rec.State != lifecycle.Running || rec.ContainerID != cid {
		t.Fatalf("legacy sandbox: state %s container %s, want running on %s (the same container)", rec.State, rec.ContainerID, cid)
	}
	if code, body := get(t, upstream(t, rec), "/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("legacy sandbox answers %d %q", code, body)
	}
	if _, err := f.m.Stop(ctx, id, "api"); err != nil {
		t.Fatalf("stopping a legacy sandbox: %v", err)
	}
	if _, err := f.m.Purge(ctx, id, "api"); err != nil {
		t.Fatalf("purging a legacy sandbox: %v", err)
	}
	if _, err := f.cli.VolumeInspect(ctx, docker.VolumeName(id), client.VolumeInspectOptions{}); err == nil {
		t.Fatal("legacy volume left after purge")
	}
}

// TestUnlabelledContainerUnderANewRecordIsNotAdopted: a record made with
// instance labels (it has an incarnation) never adopts a container without
// them: the wake fails with id_taken and the container is not touched.
func TestUnlabelledContainerUnderANewRecordIsNotAdopted(t *testing.T) {
	f := newFixture(t, lifecycle.Config{WakeTimeout: 30 * time.Second})
	id, cid := legacySandbox(t, f, lifecycle.NewIncarnation())
	ctx := context.Background()
	if _, err := f.m.Wake(ctx, id); err == nil {
		t.Fatal("a new record adopted a container without instance labels")
	}
	rec, err := f.store.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != lifecycle.Error || rec.Reason != "id_taken" {
		t.Fatalf("record %s (%s: %s), want error id_taken", rec.State, rec.Reason, rec.Error)
	}
	res, err := f.cli.ContainerInspect(ctx, docker.ContainerName(id), client.ContainerInspectOptions{})
	if err != nil || res.Container.ID != cid || res.Container.State.Status != "created" {
		t.Fatalf("the container was touched: %v %+v", err, res.Container.State)
	}
	if _, err := f.cli.VolumeInspect(ctx, docker.VolumeName(id), client.VolumeInspectOptions{}); err != nil {
		t.Fatalf("the volume was touched: %v", err)
	}
}

// TestAnotherInstancesContainerIsLeftAlone: a record whose container and
// volume names are held by another instance's objects: stop, destroy and
// purge act on the record only; the other instance's container and volume
// are not touched.
func TestAnotherInstancesContainerIsLeftAlone(t *testing.T) {
	f := newFixture(t, lifecycle.Config{WakeTimeout: 30 * time.Second})
	ctx := context.Background()
	for _, op := range []string{"stop", "destroy", "purge"} {
		t.Run(op, func(t *testing.T) {
			id, cid := foreignSandbox(t, f, lifecycle.NewIncarnation(), "other"+testenv.RunID())
			if _, _, err := f.store.Transition(id, []lifecycle.State{lifecycle.Stopped}, lifecycle.Running, "test", nil); err != nil {
				t.Fatal(err)
			}
			var err error
			switch op {
			case "stop":
				_, err = f.m.Stop(ctx, id, "api")
			case "destroy":
				err = f.m.Destroy(ctx, id, "api")
			case "purge":
				_, err = f.m.Purge(ctx, id, "api")
			}
			if err != nil {
				t.Fatalf("%s: %v", op, err)
			}
			res, err := f.cli.ContainerInspect(ctx, docker.ContainerName(id), client.ContainerInspectOptions{})
			if err != nil || res.Container.ID != cid {
				t.Fatalf("%s touched the other instance's container: %v", op, err)
			}
			if _, err := f.cli.VolumeInspect(ctx, docker.VolumeName(id), client.VolumeInspectOptions{}); err != nil {
				t.Fatalf("%s touched the other instance's volume: %v", op, err)
			}
		})
	}
}
