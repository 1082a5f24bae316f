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
	// pools counts the creates from each template sent there to claim
	// an idle pool container.
	pools map[string]int
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
	if len(pl.pools) > 0 && len(n.Capacity.Pools) > 0 {
		pools := make(map[string]int, len(n.Capacity.Pools))
		for t, idle := range n.Capacity.Pools {
			pools[t] = max(idle-pl.pools[t], 0)
		}
		n.Capacity.Pools = pools
	}
	return n
}

// add records a sandbox of memoryMB placed on n (from template's pool,
// when template is not "").
func (p *placements) add(n NodeInfo, memoryMB int64, template string) {
	if p.by == nil {
		p.by = map[string]placed{}
	}
	pl := p.by[n.Name]
	pl.base = n.UpdatedAt
	pl.count++
	pl.memoryMB += memoryMB
	if template != "" {
		if pl.pools == nil {
			pl.pools = map[string]int{}
		}
		pl.pools[template]++
	}
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
	return c.PlaceFrom("", memoryMB, unreachable...)
}

// PlaceFrom is Place for a create from template: among the nodes with
// room, one that advertises an idle pool container of the template (less
// those this node sent creates to since) comes first.
func (c *Cluster) PlaceFrom(template string, memoryMB int64, unreachable ...string) (NodeInfo, error) {
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
		if template != "" {
			pa, pb := a.Capacity.Pools[template] > 0, b.Capacity.Pools[template] > 0
			if pa != pb {
				if pa {
					return -1
				}
				return 1
			}
		}
		if d := cmp.Compare(load(a), load(b)); d != 0 {
			return d
		}
		if d := cmp.Compare(b.Capacity.FreeMemoryMB, a.Capacity.FreeMemoryMB); d != 0 {
			return d
		}
		return strings.Compare(a.Name, b.Name)
	})
	pooled := ""
	if template != "" && fit[0].Capacity.Pools[template] > 0 {
		pooled = template
	}
	c.placed.add(fit[0], memoryMB, pooled)
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
