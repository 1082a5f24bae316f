// Package dnswire is the DNS on the wire of sandwake's DNS forwarder
// (package egress): which queries it takes, how it asks the operator's
// resolvers, and what addresses an answer gives. It knows nothing of
// sandboxes, policies or the firewall; egress decides what an answer
// opens. It imports github.com/miekg/dns and nothing of the project.
package dnswire
