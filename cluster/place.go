package cluster

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// placements counts the sandboxes this node placed on each node since that
// node last registered its figures: a node's resident count and free
// memory are refreshed only every lease_ttl/3, and without this a burst of
// creates would all go to the node that looked least loaded at the start
// of it.
type placements struct {
	mu sync.Mutex
	by map[string]placed
}

// placed is what was placed on one node since its registration of base.
type placed struct {
	base     time.Time
	count    int
	memoryMB int64
}

// adjust returns n's figures counting what was placed on it since its
// registration (and forgets placements older than it).
func (p *placements) adjust(n NodeInfo) NodeInfo {
	pl, ok := p.by[n.Name]
	if !ok {
		return n
	}
	if n.UpdatedAt.After(pl.base) {
		delete(p.by, n.Name) // fresh figures count them (reserved or resident)
		return n
	}
	n.Capacity.Resident += pl.count
	if n.Capacity.FreeMemoryMB > 0 {
		n.Capacity.FreeMemoryMB -= pl.memoryMB
	}
	return n
}

// add records a sandbox of memoryMB placed on n.
func (p *placements) add(n NodeInfo, memoryMB int64) {
	if p.by == nil {
		p.by = map[string]placed{}
	}
	pl := p.by[n.Name]
	pl.base = n.UpdatedAt
	pl.count++
	pl.memoryMB += memoryMB
	p.by[n.Name] = pl
}

// Place picks the node a new sandbox of memoryMB goes to: live, not
// draining, resident below max_resident, free memory above its minimum
// plus memoryMB; least loaded first (resident/max_resident, then free
// memory, then name). ErrNoRoom names why each node was passed over.
//
// A node without max_resident has no resident cap (load 0); a node that
// reports neither free memory nor a minimum does not measure memory and
// is not checked for it. Sandboxes this node placed since a node last
// registered its figures count as resident there (and their memory as
// used), so concurrent creates spread out. Nodes named in unreachable
// (which did not answer a create placed on them) are passed over.
func (c *Cluster) Place(memoryMB int64, unreachable ...string) (NodeInfo, error) {
	nodes := c.Nodes()
	c.placed.mu.Lock()
	defer c.placed.mu.Unlock()
	var fit []NodeInfo
	var why []string
	for _, n := range nodes {
		n = c.placed.adjust(n)
		if slices.Contains(unreachable, n.Name) {
			why = append(why, n.Name+": did not answer the create (connection failed)")
			continue
		}
		if reason := passOver(n, memoryMB); reason != "" {
			why = append(why, n.Name+": "+reason)
			continue
		}
		fit = append(fit, n)
	}
	if len(fit) == 0 {
		if len(why) == 0 {
			why = append(why, "no node is registered")
		}
		return NodeInfo{}, fmt.Errorf("placing a sandbox of %d MB: %w: %s", memoryMB, ErrNoRoom, strings.Join(why, "; "))
	}
	slices.SortFunc(fit, func(a, b NodeInfo) int {
		if d := cmp.Compare(load(a), load(b)); d != 0 {
			return d
		}
		if d := cmp.Compare(b.Capacity.FreeMemoryMB, a.Capacity.FreeMemoryMB); d != 0 {
			return d
		}
		return strings.Compare(a.Name, b.Name)
	})
	c.placed.add(fit[0], memoryMB)
	return fit[0], nil
}

// passOver says why n cannot take a sandbox of memoryMB ("" if it can).
func passOver(n NodeInfo, memoryMB int64) string {
	capa := n.Capacity
	switch {
	case !n.Live:
		return "not live (lease expired)"
	case n.Draining:
		return "draining"
	case capa.MaxResident > 0 && capa.Resident >= capa.MaxResident:
		return fmt.Sprintf("%d of max_resident %d sandboxes resident", capa.Resident, capa.MaxResident)
	case (capa.FreeMemoryMB > 0 || capa.MinFreeMemoryMB > 0) && capa.FreeMemoryMB-memoryMB < capa.MinFreeMemoryMB:
		return fmt.Sprintf("%d MB free, needs %d MB for the sandbox plus min_free_memory %d MB", capa.FreeMemoryMB, memoryMB, capa.MinFreeMemoryMB)
	}
	return ""
}

// load is the share of a node's resident slots in use.
func load(n NodeInfo) float64 {
	if n.Capacity.MaxResident <= 0 {
		return 0
	}
	return float64(n.Capacity.Resident) / float64(n.Capacity.MaxResident)
}
