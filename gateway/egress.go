package gateway

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/sandwake/sandwake/lifecycle"
)

// EgressCountersMaxAge is how old the denied counters shown may be:
// reading them dumps the firewall's counters, once for every sandbox.
const EgressCountersMaxAge = 2 * time.Second

// EgressCheck is readyz's egress check: "ok" when the firewall is in
// place, a flag (still ready) when the operator turned it off, and why
// sandboxes cannot start otherwise.
func EgressCheck(ctx context.Context, e *Gateway) (string, bool) {
	if e.EgressUnenforced {
		return "unenforced (egress unenforced is set: sandboxes can reach the host and private networks)", true
	}
	if err := e.Mgr.EgressStatus(ctx); err != nil {
		msg := err.Error()
		if i := strings.Index(msg, ": "); i >= 0 && errors.Is(err, lifecycle.ErrEgressUnenforced) {
			msg = "not enforced, sandboxes do not start:" + msg[i+1:]
		}
		return msg, false
	}
	if e.EgressCaveat != "" {
		return "ok (" + e.EgressCaveat + ")", true
	}
	return "ok", true
}
