package caddymodule

import (
	"sync"

	"github.com/sandwake/sandwake/cluster"
	"github.com/sandwake/sandwake/lifecycle"
)

// clusterSource is what the cluster reads of its own node: the manager's
// records and the node's room.
type clusterSource struct {
	e *engine
}

func (s clusterSource) Get(id string) (lifecycle.Record, error) { return s.e.mgr.Get(id) }

func (s clusterSource) List(state lifecycle.State) ([]lifecycle.Record, error) {
	return s.e.mgr.List(state)
}

func (s clusterSource) Capacity() cluster.Capacity {
	resident, reserved := s.e.mgr.Resident()
	c := cluster.Capacity{
		Resident:        resident + reserved,
		MaxResident:     int(s.e.maxResident.Load()),
		MinFreeMemoryMB: int64(s.e.minFreeBytes.Load() >> 20),
	}
	if avail, err := lifecycle.HostMemAvailable(); err == nil {
		c.FreeMemoryMB = int64(avail >> 20)
	}
	for _, t := range s.e.mgr.Templates() {
		if t.Idle > 0 {
			if c.Pools == nil {
				c.Pools = map[string]int{}
			}
			c.Pools[t.Template.Name] = t.Idle
		}
	}
	return c
}

// clusterState is the engine's part in a cluster; nil in single-host mode.
type clusterState struct {
	c *cluster.Cluster
	// remote fans the catalog changes of other nodes' sandboxes out to
	// the API's event streams.
	remote *remoteEvents
	// peers are the node's certificate and the cluster CA, replaced at
	// each config load.
	peers *cluster.PeerTLS
	// listener is the peer listener: the other nodes' forwarded requests.
	listener *peerListener
	// transports carry forwarded requests to the other nodes, one per
	// node and address (node + "\x00" + host:port → *http.Transport): a
	// connection is only ever reused for the node it was verified as.
	transports sync.Map
}
