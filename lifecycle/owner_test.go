package lifecycle_test

import (
	"context"
	"errors"
	"testing"

	"github.com/sandwake/sandwake/lifecycle"
)

// TestKeptVolumeBelongsToItsTenant: a kept volume is taken again only by a
// caller whose labels match those of the record that made it, or by an
// unscoped one; a volume whose owner nobody recorded (made before owners
// were) fails closed for every bound caller; the refusal is ErrExists, as
// for an id that is taken; a purge forgets the owner and logs its
// incarnation and labels.
func TestKeptVolumeBelongsToItsTenant(t *testing.T) {
	ctx := context.Background()
	acme := map[string]string{"tenant": "acme"}
	beta := map[string]string{"tenant": "beta"}
	create := func(e *testEnv, id string, tenant map[string]string) (lifecycle.Record, error) {
		spec := testSpec()
		spec.Labels = tenant
		return e.m.Create(ctx, lifecycle.CreateRequest{ID: id, Spec: spec, Tenant: tenant})
	}

	t.Run("recorded owner", func(t *testing.T) {
		e := newTestEnv(t, lifecycle.Config{})
		first, err := create(e, "x", acme)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.m.Destroy(ctx, "x", "api"); err != nil {
			t.Fatal(err)
		}
		o, err := e.m.VolumeOwner("x")
		if err != nil || o.Incarnation != first.Incarnation || o.Labels["tenant"] != "acme" {
			t.Fatalf("owner after destroy = %+v, %v; want acme's incarnation %s", o, err, first.Incarnation)
		}
		if _, err := create(e, "x", beta); !errors.Is(err, lifecycle.ErrExists) {
			t.Fatalf("beta taking acme's kept volume: %v, want ErrExists", err)
		}
		if e.rt.Count("Create") != 1 {
			t.Fatalf("the refused create reached the engine: %d creates", e.rt.Count("Create"))
		}
		// An unscoped caller may, and the volume stays acme's.
		spec := testSpec()
		if _, err := e.m.Create(ctx, lifecycle.CreateRequest{ID: "x", Spec: spec}); err != nil {
			t.Fatalf("unscoped re-create: %v", err)
		}
		if o, _ := e.m.VolumeOwner("x"); o.Incarnation != first.Incarnation {
			t.Fatalf("an unscoped re-create took the volume's ownership: %+v", o)
		}
		if _, err := e.m.Purge(ctx, "x", "api"); err != nil {
			t.Fatal(err)
		}
		if _, err := e.m.VolumeOwner("x"); !errors.Is(err, lifecycle.ErrNotFound) {
			t.Fatalf("owner after purge: %v, want ErrNotFound", err)
		}
		if _, err := create(e, "x", beta); err != nil {
			t.Fatalf("beta creating the purged id: %v", err)
		}
	})

	t.Run("purge of a destroyed sandbox's volume", func(t *testing.T) {
		e := newTestEnv(t, lifecycle.Config{})
		rec, err := create(e, "x", acme)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.m.Destroy(ctx, "x", "api"); err != nil {
			t.Fatal(err)
		}
		if _, err := e.m.Purge(ctx, "x", "api"); err != nil {
			t.Fatal(err)
		}
		evs := e.history(t, "x")
		last := evs[len(evs)-1]
		if last.Type != lifecycle.EventPurged || last.Incarnation != rec.Incarnation || last.Labels["tenant"] != "acme" {
			t.Fatalf("the purge's event = %+v, want acme's incarnation and labels", last)
		}
		for _, ev := range evs {
			if ev.Incarnation != rec.Incarnation {
				t.Errorf("event without the incarnation: %+v", ev)
			}
		}
	})

	t.Run("owner not recorded fails closed", func(t *testing.T) {
		e := newTestEnv(t, lifecycle.Config{})
		e.rt.Put("old", "") // a volume from before owners were recorded
		if _, err := create(e, "old", acme); !errors.Is(err, lifecycle.ErrExists) {
			t.Fatalf("a bound caller taking a volume of unknown owner: %v, want ErrExists", err)
		}
		if _, err := e.m.Create(ctx, lifecycle.CreateRequest{ID: "old", Spec: testSpec()}); err != nil {
			t.Fatalf("an unscoped caller: %v", err)
		}
	})
}
