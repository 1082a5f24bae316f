package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"go.uber.org/zap"

	"github.com/sandwake/sandwake/egress"
	core "github.com/sandwake/sandwake/engine"
	"github.com/sandwake/sandwake/lifecycle"
)

// egressSettings are the App's egress options, parsed by Provision.
type egressSettings struct {
	config    lifecycle.EgressConfig
	resolvers []netip.Addr
	subnet    netip.Prefix
}

// provisionEgress parses the egress options and sandbox_subnet.
func (a *App) provisionEgress() error {
	s := egressSettings{config: lifecycle.EgressConfig{Default: a.Egress, Unenforced: a.EgressUnenforced}}
	switch a.Egress {
	case "":
		s.config.Default = lifecycle.EgressPublic
	case lifecycle.EgressPublic, lifecycle.EgressNone, lifecycle.EgressLearn:
	default:
		return fmt.Errorf("sandwake: egress %q is not public, none or learn", a.Egress)
	}
	switch a.Activity {
	case "", lifecycle.ActivityInbound, lifecycle.ActivityAny:
	default:
		return fmt.Errorf("sandwake: activity %q is not inbound or any", a.Activity)
	}
	if a.ActiveMax < 0 {
		return fmt.Errorf("sandwake: active_max %s is negative", time.Duration(a.ActiveMax))
	}
	for _, c := range a.EgressDeny {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			a, aerr := netip.ParseAddr(c)
			if aerr != nil || !a.Is4() {
				return fmt.Errorf("sandwake: egress_deny %q is not an IPv4 CIDR or address", c)
			}
			p = netip.PrefixFrom(a, 32)
		}
		if !p.Addr().Is4() {
			return fmt.Errorf("sandwake: egress_deny %q: only IPv4 (sandbox networks have no IPv6)", c)
		}
		s.config.Deny = append(s.config.Deny, p.Masked())
	}
	for _, e := range a.EgressAllowPrivate {
		r, err := lifecycle.ParseAllowRule(e)
		if err != nil {
			return fmt.Errorf("sandwake: egress_allow_private: %w", err)
		}
		if r.IsName() {
			return fmt.Errorf("sandwake: egress_allow_private %q: a name; give the private addresses or ranges it may open (an allowed name's answer inside them then opens them)", e)
		}
		s.config.AllowPrivate = append(s.config.AllowPrivate, r)
	}
	if len(a.EgressAllow) > 0 {
		// Checked as a create's allow list would be, now rather than at
		// every create.
		e := lifecycle.Egress{Policy: s.config.Default, Allow: a.EgressAllow}
		if err := lifecycle.NormalizeEgress(&e, s.config, nil); err != nil {
			return fmt.Errorf("sandwake: egress_allow: %w", err)
		}
		s.config.DefaultAllow = e.Allow
	}
	for _, d := range a.EgressDNS {
		ip, err := netip.ParseAddr(d)
		if err != nil || !ip.Is4() {
			return fmt.Errorf("sandwake: egress_dns %q is not an IPv4 address", d)
		}
		s.resolvers = append(s.resolvers, ip)
	}
	if a.SandboxSubnet != "" {
		p, err := netip.ParsePrefix(a.SandboxSubnet)
		if err != nil || !p.Addr().Is4() || p.Bits() > 24 || p.Bits() < 8 {
			return fmt.Errorf("sandwake: sandbox_subnet %q: want an IPv4 CIDR from /8 to /24, like 10.99.0.0/16", a.SandboxSubnet)
		}
		s.subnet = p.Masked()
	}
	a.egress = s
	return nil
}

// firewall is the engine's egress firewall: nil when the operator wrote
// egress unenforced.
func (s egressSettings) firewall(log *zap.Logger) lifecycle.Firewall {
	if s.config.Unenforced {
		return nil
	}
	return egress.New(egress.Options{Deny: s.config.Deny, Resolvers: s.resolvers, AllowPrivate: s.config.AllowPrivate, Logger: log})
}

// reportEgress says at start whether sandboxes' egress is enforced: a
// warning when the operator turned it off, an error with the fix when it
// cannot be installed (sandboxes then do not start).
func (e *engine) reportEgress(a *App) {
	if e.Core.Kind() == core.KindKubernetes {
		if a.EgressUnenforced {
			e.Log.Warn("egress unenforced (engine kubernetes: no NetworkPolicy is made for sandboxes): sandboxes can reach other pods, the cluster's services and API server, the nodes, cloud metadata (169.254.169.254) and the internet, as far as the cluster's own NetworkPolicies let them; " +
				"remove `egress unenforced` from the sandwake block to give each sandbox a NetworkPolicy")
			return
		}
		e.Log.Warn("egress policies are NetworkPolicies (one per sandbox, made before its pod): they are enforced only where the cluster's network plugin enforces NetworkPolicy (Calico, Cilium, …; the plain bridge plugin does not), which sandwake cannot see from the API",
			zap.String("default_policy", a.egress.config.Default))
		return
	}
	if a.EgressUnenforced {
		e.Log.Warn("egress unenforced: sandboxes can reach the host, cloud metadata (169.254.169.254), the private network and, in a cluster, etcd; " +
			"remove `egress unenforced` from the sandwake block to enforce egress policies")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Mgr.EgressStatus(ctx); err != nil {
		if errors.Is(err, lifecycle.ErrEgressUnenforced) {
			e.Log.Error("egress firewall cannot be installed: sandboxes will not start (503 egress_unenforced)", zap.Error(err))
			return
		}
		e.Log.Warn("egress firewall not installed yet (docker unreachable?): retried at every create, wake and reconcile", zap.Error(err))
		return
	}
	e.Log.Info("egress firewall installed", zap.String("default_policy", a.egress.config.Default))
}
