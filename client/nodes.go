package client

import (
	"context"
	"net/url"
	"time"
)

// Capacity is the room a cluster node registers.
type Capacity struct {
	Resident        int   `json:"resident"`
	MaxResident     int   `json:"max_resident"`
	FreeMemoryMB    int64 `json:"free_memory_mb"`
	MinFreeMemoryMB int64 `json:"min_free_memory_mb"`
	// Pools counts the node's idle warm pool containers by template.
	Pools map[string]int `json:"pools,omitempty"`
}

// Node is one cluster node as GET /v1/nodes shows it.
type Node struct {
	Name string `json:"name"`
	// Advertise is the node's peer listener (host:port) as the other
	// nodes dial it.
	Advertise string   `json:"advertise"`
	Capacity  Capacity `json:"capacity"`
	// Draining nodes get no new sandboxes.
	Draining bool `json:"draining"`
	// Live is whether the node holds its lease (false: lost).
	Live bool `json:"live"`
	// Sandboxes is how many sandboxes of the catalog the node owns.
	Sandboxes int       `json:"sandboxes"`
	UpdatedAt time.Time `json:"updated_at"`
}

// NodeList is the body of GET /v1/nodes: every node, and the name of the
// node that answered.
type NodeList struct {
	Self  string `json:"self"`
	Nodes []Node `json:"nodes"`
}

// Nodes lists the cluster's nodes (404 not_clustered on a single host).
func (c *Client) Nodes(ctx context.Context, co ...CallOption) (NodeList, error) {
	var out NodeList
	err := c.call(ctx, "GET", "/v1/nodes", nil, &out, co)
	return out, err
}

// DrainNode sets (on) or clears a node's draining mark.
func (c *Client) DrainNode(ctx context.Context, name string, on bool, co ...CallOption) (Node, error) {
	var out Node
	err := c.call(ctx, "POST", "/v1/nodes/"+url.PathEscape(name)+"/drain", map[string]bool{"draining": on}, &out, co)
	return out, err
}

// RemoveNode forgets a lost node and reports how many of its sandboxes were
// marked killed.
func (c *Client) RemoveNode(ctx context.Context, name string, co ...CallOption) (int, error) {
	var out struct {
		Killed int `json:"killed"`
	}
	err := c.call(ctx, "DELETE", "/v1/nodes/"+url.PathEscape(name), nil, &out, co)
	return out.Killed, err
}

// WhoAmI answers what the client's token may do (GET /v1/whoami).
func (c *Client) WhoAmI(ctx context.Context, co ...CallOption) (Identity, error) {
	var out Identity
	err := c.call(ctx, "GET", "/v1/whoami", nil, &out, co)
	return out, err
}
