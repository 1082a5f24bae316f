package lifecycle

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"
)

// This file holds whose a workspace volume is. Destroy keeps a sandbox's
// volume, so an id's past outlives its record: a create of the same id by
// another tenant must not mount the files of the one before.

// VolumeOwner is whom a sandbox's workspace volume belongs to: the
// incarnation and labels of the record that made it.
type VolumeOwner struct {
	Incarnation string            `json:"incarnation"`
	Labels      map[string]string `json:"labels,omitempty"`
}

// VolumeInspector is implemented by runtimes that can tell whether a
// sandbox's workspace volume exists and whose it is by its own labels (a
// volume made by a cold create records its owner there; one made by a warm
// pool, or before owners were recorded, does not).
type VolumeInspector interface {
	// VolumeOwner returns the owner sandbox id's volume records (recorded
	// false when it records none) and whether the volume exists at all.
	VolumeOwner(ctx context.Context, id string) (o VolumeOwner, recorded, exists bool, err error)
}

// ownerOf is whose sandbox id's kept volume is: the store's word (kept
// with every record that made a volume), else the volume's own labels;
// known false when neither says.
func (m *Manager) ownerOf(ctx context.Context, id string) (o VolumeOwner, known, exists bool, err error) {
	vi, ok := m.raw.(VolumeInspector)
	if !ok {
		return VolumeOwner{}, false, false, nil
	}
	labelled, recorded, exists, err := vi.VolumeOwner(ctx, id)
	m.logEngineError("reading the owner of sandbox "+id+"'s volume", err)
	if err != nil || !exists {
		return VolumeOwner{}, false, exists, err
	}
	if stored, err := m.store.VolumeOwner(id); err == nil {
		return stored, true, true, nil
	} else if !errors.Is(err, ErrNotFound) {
		return VolumeOwner{}, false, true, err
	}
	return labelled, recorded, true, nil
}

// takeVolume decides whether a create of id by a caller bound to tenant
// (nil: an unscoped caller) may use id's kept volume, and reports whether
// the create makes a new one (then its record is the owner). A volume
// another tenant's record made, or one whose owner nobody recorded (made
// before owners were), is refused exactly as a taken id is, so the caller
// learns nothing of it; an unscoped caller may take any.
func (m *Manager) takeVolume(ctx context.Context, id string, tenant map[string]string) (fresh bool, err error) {
	o, known, exists, err := m.ownerOf(ctx, id)
	if err != nil {
		return false, fmt.Errorf("creating sandbox %s: reading its kept volume: %w", id, err)
	}
	if !exists {
		return true, nil
	}
	if len(tenant) > 0 && (!known || !HasLabels(o.Labels, tenant)) {
		m.log.Info("create refused: the id's kept volume is another tenant's", zap.String("id", id))
		return false, fmt.Errorf("creating sandbox %s: %w", id, ErrExists)
	}
	return false, nil
}

// recordOwner records rec as the owner of the volume its create made.
func (m *Manager) recordOwner(rec *Record) {
	if err := m.store.SetVolumeOwner(rec.ID, VolumeOwner{Incarnation: rec.Incarnation, Labels: rec.Spec.Labels}); err != nil {
		// The volume's own labels still say it (a cold create), or
		// nobody does and only an unscoped caller may take it again.
		m.log.Warn("recording the owner of a workspace volume", zap.String("id", rec.ID), zap.Error(err))
	}
}

// VolumeOwner returns whose the kept volume of sandbox id is, from the
// store alone (ErrNotFound when it does not say): the API shows a tenant
// its own destroyed sandboxes' history and lets it purge their volumes.
func (m *Manager) VolumeOwner(id string) (VolumeOwner, error) {
	return m.store.VolumeOwner(id)
}
