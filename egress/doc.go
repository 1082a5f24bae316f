// Package egress enforces sandboxes' egress policies in the kernel: one
// nftables table of sandwake's own per sandbox network, written through
// netlink (github.com/google/nftables) in atomic batches. It implements
// lifecycle.Firewall, and lifecycle.EgressObserver with what the kernel
// logs, bounding the refused egress it reports (denials.go).
//
// The table, for a sandbox bridge <br>:
//
//	table inet sandwake-<br> {
//	  set denied    { type ipv4_addr; flags interval }      # fixed ranges, egress_deny, the host's addresses
//	  map sandboxes { type ipv4_addr : verdict }             # address -> jump sb-<id>
//	  chain forward    { hook forward priority -10;    iifname <br> jump from_sandbox
//	                     oifname <br> iifname != <br> ct direction original ct state new drop }
//	  chain input      { hook input priority -10;      iifname <br> jump from_sandbox
//	                     iifname != <br> ip daddr <gateway> udp|tcp dport 53 counter drop }  # the forwarder hears the bridge only
//	  chain prerouting { hook prerouting priority -150; iifname <br> ip daddr 127.0.0.0/8 drop }
//	  set running   { type ipv4_addr }                       # addresses bound to a running sandbox
//	  chain output     { hook output priority -10;      oifname <br> ip daddr <subnet> ip daddr != @running
//	                     ip daddr != <gateway> reject }       # the host's dials to a stopped sandbox fail at once
//	  chain from_sandbox { ct direction reply accept; meta nfproto ipv6 drop
//	                       ip saddr vmap @sandboxes; drop }     # unknown source: dropped
//	  chain sb-<id> { fib daddr type local reject       # the host, by kind
//	                  …the sandbox's policy (see sandboxRules)… }
//	}
//
// and a table of the bridge family of the same name that ties each running
// sandbox's address to its bridge port and MAC (bindings.go), so that a
// sandbox given NET_RAW cannot send as another. Every rule of both tables
// is scoped to <br>: those of the bridge table to the set of its ports,
// kept from the kernel's link notifications (ports_watch.go), since the
// bridge family's hooks see every bridge of the host and this kernel
// cannot match a frame's bridge. No rule decides the fate of a frame or
// packet of another bridge or interface by its addresses, while the
// gateway runs or after it stopped; the one rule on other interfaces is
// input's, for the forwarder's own port on the gateway's address.
//
// It never accepts in a way that skips Docker's chains: an accept here ends
// only this table's evaluation, and Docker's own (isolation, published
// ports) still run after it. Only drops and rejects are final.
//
// Both tables die with their bridge (cleanup.go): every Setup, and every
// network removal the engine reports, removes the sandwake-<br> tables
// whose bridge is gone; RemoveTables removes one bridge's once its network
// is removed (caddy sandwake uninstall).
//
// It imports lifecycle for the interface it implements, and nothing of Caddy, Docker or the store.
package egress
