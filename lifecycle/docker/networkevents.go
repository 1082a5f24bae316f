package docker

import (
	"context"
	"errors"

	"github.com/moby/moby/api/types/events"
	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/lifecycle"
)

// NetworkRemovals implements lifecycle.NetworkEventSource: the engine's
// network destroy events, every network's. The engine sends them once the
// bridge is deleted, and without the network's labels, so they are not
// narrowed to sandwake's: the firewall tells its tables by their bridge.
func (r *Runtime) NetworkRemovals(ctx context.Context) (<-chan string, <-chan error) {
	f := client.Filters{}.Add("type", "network").Add("event", "destroy")
	return follow(ctx, r.cli, f, "following docker network events", func(msg events.Message) (string, bool) {
		return msg.Actor.Attributes["name"], true
	})
}

// follow streams the engine's events that f selects, each converted by
// conv (false: skipped), until ctx ends (out closes) or the stream
// breaks (its error, classified unavailable, on errs).
func follow[T any](ctx context.Context, cli *client.Client, f client.Filters, doing string, conv func(events.Message) (T, bool)) (<-chan T, <-chan error) {
	res := cli.Events(ctx, client.EventsListOptions{Filters: f})
	out := make(chan T)
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
				errs <- classify(doing, err, lifecycle.ErrUnavailable)
				return
			case msg := <-res.Messages:
				v, ok := conv(msg)
				if !ok {
					continue
				}
				select {
				case out <- v:
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
