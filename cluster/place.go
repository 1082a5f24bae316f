package cluster

import (
	"cmp"
	"fmt"
	"math/rand/v2"
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
	// recent are the times of this node's placements on each node in the
	// last inflightWindow: creates on their way, which the catalog may
	// not show yet.
	recent map[string][]time.Time
}

// inflightWindow is how long a placement counts as in flight: a create's
// entry reaches every node's catalog well within it.
const inflightWindow = 5 * time.Second

// arrived forgets the oldest placement in flight on node: an entry of a
// new sandbox there reached the catalog (most likely that placement's; if
// another gateway's, this node's own arrives in its turn).
func (p *placements) arrived(node string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ts := p.recent[node]; len(ts) > 0 {
		p.recent[node] = ts[1:]
	}
}

// inflight counts this node's placements on node in the last
// inflightWindow (and forgets older ones).
func (p *placements) inflight(node string, now time.Time) int {
	ts := p.recent[node]
	i := 0
	for i < len(ts) && now.Sub(ts[i]) > inflightWindow {
		i++
	}
	if i > 0 {
		ts = ts[i:]
		if len(ts) == 0 {
			delete(p.recent, node)
		} else {
			p.recent[node] = ts
		}
	}
	return len(ts)
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
	if p.recent == nil {
		p.recent = map[string][]time.Time{}
	}
	p.recent[n.Name] = append(p.recent[n.Name], time.Now())
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
// plus memoryMB; least loaded first (resident/max_resident, then the
// resident count, then free memory where it differs by more than 5%),
// ties broken at random; past powerOfTwoFrom nodes, the better of two at
// random. ErrNoRoom names why each node was passed over.
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
	// What is known now of each node's load: its registered resident
	// count or the catalog's entries naming it, whichever is more (the
	// registration is refreshed only every lease_ttl/3; the catalog as
	// soon as a node publishes), plus the creates this node sent it that
	// the catalog does not show yet. Every gateway reads the same catalog,
	// so they agree on it where their registrations and own placements
	// would not.
	now := time.Now()
	known := make(map[string]int, len(nodes))
	for _, n := range nodes {
		known[n.Name] = max(n.Capacity.Resident, n.Sandboxes) + c.placed.inflight(n.Name, now)
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
	load := func(n NodeInfo) float64 {
		if n.Capacity.MaxResident <= 0 {
			return 0
		}
		return float64(known[n.Name]) / float64(n.Capacity.MaxResident)
	}
	better := func(a, b NodeInfo) int {
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
		if d := cmp.Compare(known[a.Name], known[b.Name]); d != 0 {
			return d
		}
		// Free memory decides only when it differs by more than noise
		// (nodes on one host report the same memory, read at other times).
		if fa, fb := a.Capacity.FreeMemoryMB, b.Capacity.FreeMemoryMB; fa > 0 && fb > 0 && absDiff(fa, fb) > max(fa, fb)/20 {
			return cmp.Compare(fb, fa)
		}
		return 0
	}
	var pick NodeInfo
	if len(fit) > powerOfTwoFrom {
		// Many nodes: the better of two at random (the power of two
		// choices), which spreads a burst through any number of gateways
		// without every gateway sorting the same stale figures the same
		// way. Nodes with an idle pool container of the template come
		// first: the two are drawn from them when there are any.
		from := fit
		if template != "" {
			pooled := slices.DeleteFunc(slices.Clone(fit), func(n NodeInfo) bool { return n.Capacity.Pools[template] == 0 })
			if len(pooled) > 0 {
				from = pooled
			}
		}
		a, b := from[rand.IntN(len(from))], from[rand.IntN(len(from))]
		pick = a
		if better(b, a) < 0 {
			pick = b
		}
	} else {
		// Few nodes: the least loaded, ties broken at random (two
		// gateways with the same view do not send the same node a burst).
		rand.Shuffle(len(fit), func(i, j int) { fit[i], fit[j] = fit[j], fit[i] })
		slices.SortStableFunc(fit, better)
		pick = fit[0]
	}
	pooled := ""
	if template != "" && pick.Capacity.Pools[template] > 0 {
		pooled = template
	}
	c.placed.add(pick, memoryMB, pooled)
	return pick, nil
}

// powerOfTwoFrom is the number of nodes with room past which placement
// compares two random nodes instead of sorting them all.
const powerOfTwoFrom = 32

func absDiff(a, b int64) int64 {
	if a > b {
		return a - b
	}
	return b - a
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
