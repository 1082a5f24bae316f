package cluster

import (
	"errors"
	"strings"
	"testing"
)

// withNodes is a cluster whose cache holds the given registrations.
func withNodes(t *testing.T, live []NodeInfo, draining ...string) *Cluster {
	t.Helper()
	c, err := New(Config{Endpoints: []string{"http://127.0.0.1:1"}, Node: "self", Secret: []byte("x")}, newMemSource())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range live {
		c.cache.live[n.Name] = n
	}
	for _, n := range draining {
		c.cache.drain[n] = true
	}
	return c
}

func capNode(name string, resident, maxResident int, free, minFree int64) NodeInfo {
	return NodeInfo{Name: name, Capacity: Capacity{Resident: resident, MaxResident: maxResident, FreeMemoryMB: free, MinFreeMemoryMB: minFree}}
}

func TestPlace(t *testing.T) {
	tests := []struct {
		name     string
		live     []NodeInfo
		draining []string
		memoryMB int64
		want     string
		wantErr  []string
	}{
		{name: "least resident share first", memoryMB: 256, want: "b",
			live: []NodeInfo{capNode("a", 5, 10, 4000, 0), capNode("b", 2, 10, 1000, 0), capNode("c", 3, 5, 9000, 0)}},
		{name: "equal share: more free memory", memoryMB: 256, want: "c",
			live: []NodeInfo{capNode("a", 2, 10, 4000, 0), capNode("c", 2, 10, 5000, 0)}},
		{name: "equal share and memory: name", memoryMB: 256, want: "a",
			live: []NodeInfo{capNode("b", 1, 10, 4000, 0), capNode("a", 1, 10, 4000, 0)}},
		{name: "full node skipped", memoryMB: 0, want: "b",
			live: []NodeInfo{capNode("a", 10, 10, 9000, 0), capNode("b", 9, 10, 100, 0)}},
		{name: "memory minimum respected", memoryMB: 512, want: "b",
			live: []NodeInfo{capNode("a", 0, 10, 1000, 600), capNode("b", 5, 10, 2000, 600)}},
		{name: "node that measures no memory is not checked", memoryMB: 512, want: "a",
			live: []NodeInfo{capNode("a", 0, 0, 0, 0)}},
		{name: "draining excluded", memoryMB: 0, want: "b", draining: []string{"a"},
			live: []NodeInfo{capNode("a", 0, 10, 1000, 0), capNode("b", 5, 10, 1000, 0)}},
		{name: "no room says why for each node", memoryMB: 512, draining: []string{"a", "gone"},
			live:    []NodeInfo{capNode("a", 0, 10, 1000, 0), capNode("b", 3, 3, 1000, 0), capNode("c", 0, 10, 800, 400)},
			wantErr: []string{"a: draining", "b: 3 of max_resident 3", "c: 800 MB free, needs 512 MB", "gone: not live"}},
		{name: "no nodes", memoryMB: 1, wantErr: []string{"no node is registered"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := withNodes(t, tt.live, tt.draining...)
			got, err := c.Place(tt.memoryMB)
			if tt.wantErr != nil {
				if !errors.Is(err, ErrNoRoom) {
					t.Fatalf("Place = %+v, %v; want ErrNoRoom", got, err)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Fatalf("error %q does not say %q", err, w)
					}
				}
				return
			}
			if err != nil || got.Name != tt.want {
				t.Fatalf("Place = %q, %v; want %q", got.Name, err, tt.want)
			}
		})
	}
}
