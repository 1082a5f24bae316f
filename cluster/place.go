package cluster

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Place picks the node a new sandbox of memoryMB goes to: live, not
// draining, resident below max_resident, free memory above its minimum
// plus memoryMB; least loaded first (resident/max_resident, then free
// memory, then name). ErrNoRoom names why each node was passed over.
//
// A node without max_resident has no resident cap (load 0); a node that
// reports neither free memory nor a minimum does not measure memory and
// is not checked for it.
func (c *Cluster) Place(memoryMB int64) (NodeInfo, error) {
	nodes := c.Nodes()
	var fit []NodeInfo
	var why []string
	for _, n := range nodes {
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
