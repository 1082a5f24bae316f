package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/util/retry"

	"github.com/sandwake/sandwake/lifecycle"
)

// This file holds a sandbox's NetworkPolicy: its egress policy as a
// NetworkPolicy can say it (addresses only, allow rules only), and ingress
// from the gateway alone. It is made before the claim and the pod, so that
// the pod never runs without it, and deleted once the pod is gone.

// Values of Options.Egress.
const (
	// EgressNetworkPolicy enforces each sandbox's egress policy with a
	// NetworkPolicy of its own (where the cluster's network plugin
	// enforces NetworkPolicy).
	EgressNetworkPolicy = "networkpolicy"
	// EgressUnenforced makes no policy: the operator's explicit choice.
	EgressUnenforced = "unenforced"
)

// DefaultGatewaySelector is the labels of the gateway's pods, whose
// traffic alone a sandbox accepts (in any namespace).
var DefaultGatewaySelector = map[string]string{
	"app.kubernetes.io/name":      "sandwake",
	"app.kubernetes.io/component": "gateway",
}

// The cluster's resolver, the one destination on port 53 a public policy
// reaches: CoreDNS's pods as kubeadm and most distributions label them.
const (
	dnsNamespace = "kube-system"
	dnsApp       = "kube-dns"
	portDNS      = 53
)

// everywhere is what a public policy starts from. IPv6 is not opened at
// all: pods here have IPv4 only, and on a dual-stack cluster a policy
// with Egress and no IPv6 block denies every IPv6 destination.
var everywhere = netip.MustParsePrefix("0.0.0.0/0")

// errNames is why a name entry is refused.
const errNames = "a NetworkPolicy holds addresses only; names need a policy engine that resolves them " +
	"(Cilium's toFQDNs, Calico's domain policies), which sandwake does not drive yet"

// PolicyName is the name of sandbox id's NetworkPolicy (its pod's).
func PolicyName(id string) string { return "s-" + id }

// EnforcesEgress implements lifecycle.EgressEnforcer.
func (r *Runtime) EnforcesEgress() bool { return r.opts.Egress == EgressNetworkPolicy }

// CheckEgress implements lifecycle.EgressEnforcer: it refuses what a
// NetworkPolicy cannot say. Names (allow or deny) and learn need a policy
// engine that sees lookups; a deny entry with a port or protocol would
// take part of what an allow rule opens, which a NetworkPolicy (a union
// of allow rules) cannot, unless it takes nothing (inside a range already
// denied); an allow entry inside the cluster's ranges is refused as one
// inside a private range is.
func (r *Runtime) CheckEgress(e lifecycle.Egress) error {
	if !r.EnforcesEgress() {
		return nil
	}
	switch e.Policy {
	case "", lifecycle.EgressNone, lifecycle.EgressPublic:
	case lifecycle.EgressLearn:
		return fmt.Errorf("%w: policy learn records the names a sandbox looks up and the addresses it reaches, which the kubernetes engine does not see: %s", lifecycle.ErrInvalid, errNames)
	default:
		return fmt.Errorf("%w: policy %q is not public or none", lifecycle.ErrInvalid, e.Policy)
	}
	allow, deny := e.Rules(), e.DenyRules()
	for _, a := range allow {
		if a.IsName() {
			return fmt.Errorf("%w: allow %q is a name: %s", lifecycle.ErrInvalid, a.String(), errNames)
		}
		for _, c := range r.opts.ClusterCIDRs {
			if c.Overlaps(a.Prefix) {
				return fmt.Errorf("%w: allow %q is inside the cluster's range %s (cluster_cidrs), which sandboxes do not reach", lifecycle.ErrInvalid, a.String(), c)
			}
		}
	}
	everyPort := denyAll(deny)
	base := r.deniedBase()
	for _, d := range deny {
		if d.IsName() {
			return fmt.Errorf("%w: deny %q is a name: %s", lifecycle.ErrInvalid, d.String(), errNames)
		}
		if (d.Port == 0 && d.Proto == "") || covered(d.Prefix, everyPort) {
			continue
		}
		carves := e.Policy == lifecycle.EgressPublic && !covered(d.Prefix, base)
		for _, a := range allow {
			if carves {
				break
			}
			carves = a.Prefix.Overlaps(d.Prefix) && !covered(a.Prefix, everyPort) &&
				(d.Proto == "" || d.Proto == a.Proto) && (d.Port == 0 || a.Port == 0 || d.Port == a.Port)
		}
		if carves {
			return fmt.Errorf("%w: deny %q names a port or protocol: a NetworkPolicy only adds what it allows and cannot take one port or protocol of an address out of what the policy opens; deny the address on every port (%s)",
				lifecycle.ErrInvalid, d.String(), d.Prefix.Masked().String())
		}
	}
	return nil
}

// ApplyEgress implements lifecycle.EgressEnforcer: spec's egress is kept
// on sandbox id's claim for the starts to come, then its policy is made,
// or replaced, with it. Each write is one JSON patch whose first
// operations test that the object is this instance's sandbox's (a pool
// claim waits on them); anything a patch cannot settle (a missing
// annotation map, a policy deleted by hand, another's object, a Role
// without patch) takes the read-then-write way, which says why.
func (r *Runtime) ApplyEgress(ctx context.Context, id string, spec lifecycle.Spec) error {
	if !r.EnforcesEgress() {
		return nil
	}
	want, err := r.policyFor(id, spec)
	if err != nil {
		return err
	}
	b, err := json.Marshal(want.Spec)
	if err != nil {
		return fmt.Errorf("encoding NetworkPolicy %s: %w", want.Name, err)
	}
	// The claim first: should the policy's write fail, the next start
	// makes it from the claim, and a policy written while the claim's
	// write failed would be rolled back by that start.
	if err := r.keepPolicyPatched(ctx, id, want, b); err != nil {
		return err
	}
	pols := r.cs.NetworkingV1().NetworkPolicies(r.opts.Namespace)
	err = r.patchOwned(ctx, id, func(p []byte) error {
		_, err := pols.Patch(ctx, want.Name, types.JSONPatchType, p, metav1.PatchOptions{})
		return err
	}, jsonOp{Op: "replace", Path: "/spec", Value: want.Spec})
	if err != nil {
		_, err = r.ensurePolicy(ctx, id, want)
	}
	return err
}

// keepPolicyPatched keeps want's spec (b, its JSON) on sandbox id's
// claim: one patch, or the read-then-write way when the patch cannot.
func (r *Runtime) keepPolicyPatched(ctx context.Context, id string, want *networkingv1.NetworkPolicy, b []byte) error {
	claims := r.cs.CoreV1().PersistentVolumeClaims(r.opts.Namespace)
	err := r.patchOwned(ctx, id, func(p []byte) error {
		_, err := claims.Patch(ctx, ClaimName(id), types.JSONPatchType, p, metav1.PatchOptions{})
		return err
	}, jsonOp{Op: "add", Path: "/metadata/annotations/" + AnnotationPolicy, Value: string(b)})
	switch {
	case apierrors.IsNotFound(err):
		return nil // no workspace: the next create keeps the policy
	case err != nil:
		return r.keepPolicyOnClaim(ctx, id, want)
	}
	return nil
}

// jsonOp is one operation of a JSON patch (RFC 6902).
type jsonOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// patchOwned sends ops, after tests that the object carries sandbox id's
// labels of this instance, as one JSON patch through send.
func (r *Runtime) patchOwned(ctx context.Context, id string, send func([]byte) error, ops ...jsonOp) error {
	all := make([]jsonOp, 0, 3+len(ops))
	for _, k := range []string{LabelManaged, LabelInstance, LabelID} {
		all = append(all, jsonOp{Op: "test", Path: "/metadata/labels/" + k, Value: r.labels(id)[k]})
	}
	b, err := json.Marshal(append(all, ops...))
	if err != nil {
		return fmt.Errorf("encoding a patch of sandbox %s: %w", id, err)
	}
	return send(b)
}

// keepPolicyOnClaim keeps want's spec on sandbox id's claim by reading
// it and writing it back (ApplyEgress's way when its patch could not).
func (r *Runtime) keepPolicyOnClaim(ctx context.Context, id string, want *networkingv1.NetworkPolicy) error {
	claims := r.cs.CoreV1().PersistentVolumeClaims(r.opts.Namespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c, err := claims.Get(ctx, ClaimName(id), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil // no workspace: the next create keeps it
		}
		if err != nil {
			return err
		}
		if !r.owns(id, c.Labels) {
			return notOurs("claim", ClaimName(id), c.Labels, lifecycle.ErrIDTaken)
		}
		c = c.DeepCopy()
		if err := keepPolicy(c, want); err != nil {
			return err
		}
		_, err = claims.Update(ctx, c, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return classify("keeping the NetworkPolicy on claim "+ClaimName(id), err, lifecycle.ErrNotFound)
	}
	return nil
}

// keepPolicy keeps policy's spec on claim c (AnnotationPolicy); nil (egress
// unenforced) keeps none.
func keepPolicy(c *corev1.PersistentVolumeClaim, policy *networkingv1.NetworkPolicy) error {
	if policy == nil {
		delete(c.Annotations, AnnotationPolicy)
		return nil
	}
	b, err := json.Marshal(policy.Spec)
	if err != nil {
		return fmt.Errorf("encoding NetworkPolicy %s: %w", policy.Name, err)
	}
	if c.Annotations == nil {
		c.Annotations = map[string]string{}
	}
	c.Annotations[AnnotationPolicy] = string(b)
	return nil
}

// startPolicy makes sure sandbox id's policy is in place before a start
// makes its pod: one deleted (or changed) behind sandwake's back is made
// again from its claim, and a sandbox made while egress was unenforced,
// which has none, does not start (ErrEgressUnenforced, with the fix).
func (r *Runtime) startPolicy(ctx context.Context, id string, claim *corev1.PersistentVolumeClaim) error {
	if !r.EnforcesEgress() {
		return nil
	}
	s, kept := claim.Annotations[AnnotationPolicy]
	if !kept {
		return fmt.Errorf("starting sandbox %s: %w: it was made while egress was unenforced and has no NetworkPolicy; change its egress (PATCH) or make it again (destroy and create) to give it one",
			id, lifecycle.ErrEgressUnenforced)
	}
	want := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: PolicyName(id), Namespace: r.opts.Namespace, Labels: r.labels(id)}}
	if err := json.Unmarshal([]byte(s), &want.Spec); err != nil {
		return fmt.Errorf("starting sandbox %s: decoding the NetworkPolicy kept on claim %s: %w", id, claim.Name, err)
	}
	_, err := r.ensurePolicy(ctx, id, want)
	return err
}

// deniedBase is what a public policy never reaches: lifecycle's fixed
// ranges and the cluster's.
func (r *Runtime) deniedBase() []netip.Prefix {
	return slices.Concat(lifecycle.EgressDeniedRanges, r.opts.ClusterCIDRs)
}

// denyAll are the deny entries on every port and protocol: the only ones
// a NetworkPolicy expresses, as holes (except) in what it allows.
func denyAll(deny []lifecycle.AllowRule) []netip.Prefix {
	var out []netip.Prefix
	for _, d := range deny {
		if !d.IsName() && d.Port == 0 && d.Proto == "" {
			out = append(out, d.Prefix.Masked())
		}
	}
	return out
}

// covered reports whether one of ps holds all of p.
func covered(p netip.Prefix, ps []netip.Prefix) bool {
	return slices.ContainsFunc(ps, func(c netip.Prefix) bool { return c.Bits() <= p.Bits() && c.Contains(p.Addr()) })
}

// carve is cidr with holes at denied, as an ipBlock's except list (each
// strictly inside cidr, none inside another); ok is false when one of
// denied holds all of cidr.
func carve(cidr netip.Prefix, denied []netip.Prefix) (except []string, ok bool) {
	if covered(cidr, denied) {
		return nil, false
	}
	var in []netip.Prefix
	for _, d := range denied {
		if d.Bits() > cidr.Bits() && cidr.Contains(d.Addr()) {
			in = append(in, d.Masked())
		}
	}
	slices.SortFunc(in, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	for i, d := range in {
		if !covered(d, in[:i]) {
			except = append(except, d.String())
		}
	}
	return except, true
}

// policyFor is sandbox id's NetworkPolicy for spec: its pod reaches what
// spec.Egress opens, and only the gateway reaches its ports.
func (r *Runtime) policyFor(id string, spec lifecycle.Spec) (*networkingv1.NetworkPolicy, error) {
	egress, err := r.egressRules(spec.Egress)
	if err != nil {
		return nil, err
	}
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: PolicyName(id), Namespace: r.opts.Namespace, Labels: r.labels(id)},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelInstance: r.opts.Instance, LabelID: id}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{r.ingressRule(spec.Ports)},
			Egress:      egress,
		},
	}, nil
}

// ingressRule lets the gateway's pods (any namespace) and the gateway's
// addresses outside the cluster reach the sandbox's ports, and nothing
// else reach the pod.
func (r *Runtime) ingressRule(ports []int) networkingv1.NetworkPolicyIngressRule {
	rule := networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{
		NamespaceSelector: &metav1.LabelSelector{},
		PodSelector:       &metav1.LabelSelector{MatchLabels: maps.Clone(r.opts.GatewaySelector)},
	}}}
	for _, c := range r.opts.GatewayCIDRs {
		rule.From = append(rule.From, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: c.String()}})
	}
	for _, p := range ports {
		rule.Ports = append(rule.Ports, policyPort(corev1.ProtocolTCP, p))
	}
	return rule
}

// egressRules are e's egress rules: none opens nothing (no DNS either);
// public opens every IPv4 address but the denied ranges, the cluster's
// and the deny entries, and the cluster's resolver on port 53; each
// address allow entry opens its address and port, less the deny entries
// inside it (deny wins). A policy "" (none given) opens nothing.
func (r *Runtime) egressRules(e lifecycle.Egress) ([]networkingv1.NetworkPolicyEgressRule, error) {
	if err := r.CheckEgress(e); err != nil {
		return nil, err
	}
	everyPort := denyAll(e.DenyRules())
	rules := []networkingv1.NetworkPolicyEgressRule{}
	if e.Policy == lifecycle.EgressPublic {
		if except, ok := carve(everywhere, slices.Concat(r.deniedBase(), everyPort)); ok {
			rules = append(rules, networkingv1.NetworkPolicyEgressRule{To: []networkingv1.NetworkPolicyPeer{{
				IPBlock: &networkingv1.IPBlock{CIDR: everywhere.String(), Except: except},
			}}})
		}
		rules = append(rules, networkingv1.NetworkPolicyEgressRule{
			To: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: dnsNamespace}},
				PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": dnsApp}},
			}},
			Ports: []networkingv1.NetworkPolicyPort{policyPort(corev1.ProtocolUDP, portDNS), policyPort(corev1.ProtocolTCP, portDNS)},
		})
	}
	for _, a := range e.Rules() {
		except, ok := carve(a.Prefix.Masked(), everyPort)
		if !ok {
			continue // denied whole
		}
		proto := corev1.ProtocolTCP
		if a.Proto == "udp" {
			proto = corev1.ProtocolUDP
		}
		port := networkingv1.NetworkPolicyPort{Protocol: &proto}
		if a.Port != 0 {
			port = policyPort(proto, int(a.Port))
		}
		rules = append(rules, networkingv1.NetworkPolicyEgressRule{
			To:    []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: a.Prefix.Masked().String(), Except: except}}},
			Ports: []networkingv1.NetworkPolicyPort{port},
		})
	}
	return rules, nil
}

func policyPort(proto corev1.Protocol, port int) networkingv1.NetworkPolicyPort {
	p := intstr.FromInt32(int32(port))
	return networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &p}
}

// ensurePolicy makes sandbox id's NetworkPolicy want, or replaces the
// spec of the one there when this instance owns it; one that is not its
// own stops it with ErrIDTaken, untouched. made reports a new policy.
func (r *Runtime) ensurePolicy(ctx context.Context, id string, want *networkingv1.NetworkPolicy) (made bool, err error) {
	pols := r.cs.NetworkingV1().NetworkPolicies(r.opts.Namespace)
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := pols.Get(ctx, want.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = pols.Create(ctx, want, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(networkingv1.Resource("networkpolicies"), want.Name, err)
			}
			made = err == nil
			return err
		case err != nil:
			return err
		case !r.owns(id, cur.Labels):
			return notOurs("NetworkPolicy", want.Name, cur.Labels, lifecycle.ErrIDTaken)
		}
		if apiequality.Semantic.DeepEqual(cur.Spec, want.Spec) {
			return nil // a start's check: nothing to write
		}
		cur = cur.DeepCopy()
		cur.Spec = want.Spec
		_, err = pols.Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	return made, r.policyError("making NetworkPolicy "+want.Name, err)
}

// deletePolicy deletes sandbox id's NetworkPolicy when this instance owns
// it (one that is not its own is left alone), that very one (its UID is a
// precondition). A policy already gone is not an error.
func (r *Runtime) deletePolicy(ctx context.Context, id string) error {
	if !r.EnforcesEgress() {
		return nil
	}
	pols := r.cs.NetworkingV1().NetworkPolicies(r.opts.Namespace)
	cur, err := pols.Get(ctx, PolicyName(id), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return r.policyError("reading NetworkPolicy "+PolicyName(id), err)
	}
	if !r.owns(id, cur.Labels) {
		return nil
	}
	err = pols.Delete(ctx, cur.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &cur.UID}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return r.policyError("deleting NetworkPolicy "+cur.Name, err)
}

// policyError wraps a failure of a NetworkPolicy call; a refusal by RBAC
// names the rule the gateway's Role lacks.
func (r *Runtime) policyError(doing string, err error) error {
	switch {
	case err == nil:
		return nil
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%s: %w (the gateway's Role in namespace %s needs networkpolicies: get, create, update, delete; see docs/kubernetes.md)",
			doing, lifecycle.EngineFailure(err), r.opts.Namespace)
	case apierrors.IsInvalid(err) || apierrors.IsBadRequest(err):
		return fmt.Errorf("%s: %w: kubernetes refused it: %w", doing, lifecycle.ErrInvalid, lifecycle.EngineFailure(err))
	}
	return classify(doing, err, lifecycle.ErrNotFound)
}

// CheckEgressOptions checks the egress options of opts and fills their
// defaults (New calls it; a configuration checks with it before anything
// is opened).
func CheckEgressOptions(opts *Options) error {
	switch opts.Egress {
	case "":
		opts.Egress = EgressNetworkPolicy
	case EgressNetworkPolicy, EgressUnenforced:
	default:
		return fmt.Errorf("unknown egress mode %q (networkpolicy or unenforced)", opts.Egress)
	}
	cluster := make([]netip.Prefix, 0, len(opts.ClusterCIDRs))
	for _, c := range opts.ClusterCIDRs {
		if !c.IsValid() || !c.Addr().Is4() {
			return fmt.Errorf("cluster range %s: want an IPv4 CIDR (pods here have IPv4 only)", c)
		}
		cluster = append(cluster, c.Masked())
	}
	gateway := make([]netip.Prefix, 0, len(opts.GatewayCIDRs))
	for _, c := range opts.GatewayCIDRs {
		if !c.IsValid() {
			return fmt.Errorf("gateway range %s is not a CIDR", c)
		}
		gateway = append(gateway, c.Masked())
	}
	opts.ClusterCIDRs, opts.GatewayCIDRs = cluster, gateway
	if opts.GatewaySelector == nil {
		opts.GatewaySelector = DefaultGatewaySelector
	}
	if len(opts.GatewaySelector) == 0 {
		return fmt.Errorf("gateway selector: at least one label (an empty one would let every pod in the cluster reach the sandboxes)")
	}
	for k, v := range opts.GatewaySelector {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return fmt.Errorf("gateway selector: %q is not a label key: %s", k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return fmt.Errorf("gateway selector: %q is not a label value: %s", v, strings.Join(errs, "; "))
		}
	}
	return nil
}

// Interface guard.
var _ lifecycle.EgressEnforcer = (*Runtime)(nil)
