package docker

import (
	"context"
	"errors"

	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/lifecycle"
)

// NetworkRemovals implements lifecycle.NetworkEventSource: the engine's
// network destroy events, every network's. The engine sends them once the
// bridge is deleted, and without the network's labels, so they are not
// narrowed to sandwake's: the firewall tells its tables by their bridge.
func (r *Runtime) NetworkRemovals(ctx context.Context) (<-chan string, <-chan error) {
	f := client.Filters{}.Add("type", "network").Add("event", "destroy")
	res := r.cli.Events(ctx, client.EventsListOptions{Filters: f})
	out := make(chan string)
	errs := make(chan error, 1)
	go func() {
		defer close(out)
		for {
			select {
			case <-ctx.Done():
				return
			case err := <-res.Err:
				if err == nil {
					err = errors.New("docker event stream ended")
				}
				errs <- classify("following docker network events", err, lifecycle.ErrUnavailable)
				return
			case msg := <-res.Messages:
				select {
				case out <- msg.Actor.Attributes["name"]:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, errs
}

// Interface guard.
var _ lifecycle.NetworkEventSource = (*Runtime)(nil)
