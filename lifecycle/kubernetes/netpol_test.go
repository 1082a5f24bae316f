package kubernetes

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/store"
)

// These tests check the NetworkPolicy objects against client-go's fake
// clientset. Nothing here (nor the test cluster, whose bridge plugin does
// not enforce NetworkPolicy) shows that a network plugin enforces them:
// what is tested is the objects sandwake makes, updates and deletes.

// newFakeEgress is newFake with egress options.
func newFakeEgress(t *testing.T, opts Options) (*Runtime, *fake.Clientset) {
	t.Helper()
	return startFake(t, fake.NewClientset(), opts)
}

// rule is an egress rule read back as strings: its peers and its ports.
type rule struct {
	to    []string // "cidr except a,b" or "ns k=v pods k=v"
	ports []string // "TCP/443", "UDP" (every port)
}

func readRules(rs []networkingv1.NetworkPolicyEgressRule) []rule {
	var out []rule
	for _, r := range rs {
		var x rule
		for _, p := range r.To {
			switch {
			case p.IPBlock != nil:
				s := p.IPBlock.CIDR
				if len(p.IPBlock.Except) > 0 {
					s += " except " + strings.Join(p.IPBlock.Except, ",")
				}
				x.to = append(x.to, s)
			default:
				x.to = append(x.to, "ns "+selector(p.NamespaceSelector)+" pods "+selector(p.PodSelector))
			}
		}
		for _, p := range r.Ports {
			s := string(*p.Protocol)
			if p.Port != nil {
				s += "/" + p.Port.String()
			}
			x.ports = append(x.ports, s)
		}
		out = append(out, x)
	}
	return out
}

func selector(s *metav1.LabelSelector) string {
	if s == nil {
		return "-"
	}
	var l []string
	for k, v := range s.MatchLabels {
		l = append(l, k+"="+v)
	}
	slices.Sort(l)
	return "{" + strings.Join(l, ",") + "}"
}

var dnsRule = rule{to: []string{"ns {kubernetes.io/metadata.name=kube-system} pods {k8s-app=kube-dns}"}, ports: []string{"UDP/53", "TCP/53"}}

func TestPolicyEgressRules(t *testing.T) {
	r, _ := newFakeEgress(t, Options{ClusterCIDRs: []netip.Prefix{
		netip.MustParsePrefix("10.96.0.0/12"),   // inside 10/8: no except of its own
		netip.MustParsePrefix("198.18.0.0/15"),  // outside the private ranges
		netip.MustParsePrefix("203.0.113.5/24"), // masked
	}})
	cluster := "0.0.0.0/8,10.0.0.0/8,100.64.0.0/10,127.0.0.0/8,169.254.0.0/16,172.16.0.0/12,192.168.0.0/16,198.18.0.0/15,203.0.113.0/24,224.0.0.0/4,240.0.0.0/4"
	tests := []struct {
		name string
		e    lifecycle.Egress
		want []rule
	}{
		{"none opens nothing, not even DNS", lifecycle.Egress{Policy: lifecycle.EgressNone}, nil},
		{"no policy given opens nothing", lifecycle.Egress{}, nil},
		{"public", lifecycle.Egress{Policy: lifecycle.EgressPublic},
			[]rule{{to: []string{"0.0.0.0/0 except " + cluster}}, dnsRule}},
		{"none with address allows", lifecycle.Egress{Policy: lifecycle.EgressNone, Allow: []string{"198.51.100.7:443/tcp", "203.1.113.0/24/udp"}},
			[]rule{{to: []string{"198.51.100.7/32"}, ports: []string{"TCP/443"}}, {to: []string{"203.1.113.0/24"}, ports: []string{"UDP"}}}},
		{"public with deny entries: holes in everything, deny wins over allow", lifecycle.Egress{Policy: lifecycle.EgressPublic,
			Allow: []string{"8.8.8.0/24:443/tcp", "9.9.9.9:443/tcp"}, Deny: []string{"8.8.8.8", "9.9.9.0/24", "10.1.2.3"}},
			[]rule{{to: []string{"0.0.0.0/0 except " + strings.Replace(cluster, "0.0.0.0/8,", "0.0.0.0/8,8.8.8.8/32,9.9.9.0/24,", 1)}}, dnsRule,
				{to: []string{"8.8.8.0/24 except 8.8.8.8/32"}, ports: []string{"TCP/443"}}}},
		{"a deny with a port inside a denied range carves nothing", lifecycle.Egress{Policy: lifecycle.EgressPublic, Deny: []string{"10.1.2.3:22/tcp"}},
			[]rule{{to: []string{"0.0.0.0/0 except " + cluster}}, dnsRule}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.e.Policy != "" {
				if err := lifecycle.NormalizeEgress(&tt.e, lifecycle.EgressConfig{}, nil); err != nil {
					t.Fatal(err)
				}
			}
			spec := testSpec()
			spec.Egress = tt.e
			pol, err := r.policyFor("abc", spec)
			if err != nil {
				t.Fatal(err)
			}
			if got := readRules(pol.Spec.Egress); !slices.EqualFunc(got, tt.want, func(a, b rule) bool {
				return slices.Equal(a.to, b.to) && slices.Equal(a.ports, b.ports)
			}) {
				t.Fatalf("egress rules\n got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestPolicyObject(t *testing.T) {
	r, _ := newFakeEgress(t, Options{GatewayCIDRs: []netip.Prefix{netip.MustParsePrefix("10.88.0.1/32")}})
	spec := testSpec()
	spec.Ports = []int{8080, 9090}
	spec.Egress = lifecycle.Egress{Policy: lifecycle.EgressNone}
	pol, err := r.policyFor("abc", spec)
	if err != nil {
		t.Fatal(err)
	}
	ps := pol.Spec
	in := ps.Ingress
	checks := []struct {
		what string
		ok   bool
	}{
		{"name s-abc", pol.Name == "s-abc" && pol.Namespace == testNS},
		{"the pod's labels", pol.Labels[LabelManaged] == "true" && pol.Labels[LabelInstance] == "t1" && pol.Labels[LabelID] == "abc"},
		{"selects the pod by instance and id", len(ps.PodSelector.MatchLabels) == 2 && ps.PodSelector.MatchLabels[LabelInstance] == "t1" && ps.PodSelector.MatchLabels[LabelID] == "abc"},
		{"ingress and egress", slices.Equal(ps.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress})},
		{"one ingress rule", len(in) == 1},
		{"from the gateway's pods in any namespace", len(in[0].From) == 2 && in[0].From[0].NamespaceSelector != nil && len(in[0].From[0].NamespaceSelector.MatchLabels) == 0 &&
			selector(in[0].From[0].PodSelector) == "{app.kubernetes.io/component=gateway,app.kubernetes.io/name=sandwake}"},
		{"from the gateway's address", in[0].From[1].IPBlock != nil && in[0].From[1].IPBlock.CIDR == "10.88.0.1/32"},
		{"on the sandbox's ports only", len(in[0].Ports) == 2 && in[0].Ports[0].Port.IntValue() == 8080 && in[0].Ports[1].Port.IntValue() == 9090 && *in[0].Ports[0].Protocol == corev1.ProtocolTCP},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("policy: %s: not so", c.what)
		}
	}
	// A pod of the sandbox matches its selector; another id's does not.
	pod, _ := r.podFor("abc", spec)
	other, _ := r.podFor("abd", spec)
	sel, _ := metav1.LabelSelectorAsSelector(&ps.PodSelector)
	if !sel.Matches(labels.Set(pod.Labels)) || sel.Matches(labels.Set(other.Labels)) {
		t.Fatal("the policy's selector does not pick exactly the sandbox's pod")
	}
}

func TestCheckEgressRefuses(t *testing.T) {
	r, _ := newFakeEgress(t, Options{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")}})
	tests := []struct {
		name string
		e    lifecycle.Egress
		want string
	}{
		{"learn", lifecycle.Egress{Policy: lifecycle.EgressLearn}, "names need a policy engine"},
		{"an allowed name", lifecycle.Egress{Policy: lifecycle.EgressNone, Allow: []string{"registry.npmjs.org"}}, `allow "registry.npmjs.org" is a name: a NetworkPolicy holds addresses only`},
		{"a wildcard name", lifecycle.Egress{Policy: lifecycle.EgressNone, Allow: []string{"*.github.com:443"}}, "Cilium's toFQDNs"},
		{"a denied name", lifecycle.Egress{Policy: lifecycle.EgressPublic, Deny: []string{"evil.example.com"}}, `deny "evil.example.com" is a name`},
		{"a deny on a port of a public address", lifecycle.Egress{Policy: lifecycle.EgressPublic, Deny: []string{"8.8.8.8:53/udp"}}, "cannot take one port"},
		{"a deny on a protocol", lifecycle.Egress{Policy: lifecycle.EgressPublic, Deny: []string{"8.8.8.8/udp"}}, "deny the address on every port (8.8.8.8/32)"},
		{"a deny on a port inside an allow", lifecycle.Egress{Policy: lifecycle.EgressPublic, Allow: []string{"10.0.0.0/8"}, Deny: []string{"10.1.1.1:22/tcp"}}, "cannot take one port"},
		{"an allow inside the cluster's range", lifecycle.Egress{Policy: lifecycle.EgressNone, Allow: []string{"198.18.0.10:443"}}, "inside the cluster's range 198.18.0.0/15"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// As the Manager has it: normalized (the private allow is let
			// through here as egress_allow_private would).
			cfg := lifecycle.EgressConfig{AllowPrivate: []lifecycle.AllowRule{{Prefix: netip.MustParsePrefix("10.0.0.0/8"), Proto: "tcp"}}}
			if err := lifecycle.NormalizeEgress(&tt.e, cfg, nil); err != nil {
				t.Fatal(err)
			}
			err := r.CheckEgress(tt.e)
			if !errors.Is(err, lifecycle.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("CheckEgress(%+v) = %v, want ErrInvalid saying %q", tt.e, err, tt.want)
			}
			spec := testSpec()
			spec.Egress = tt.e
			if _, err := r.Create(context.Background(), "abc", spec); !errors.Is(err, lifecycle.ErrInvalid) {
				t.Fatalf("create: %v, want ErrInvalid", err)
			}
		})
	}
	// Unenforced, nothing is refused (nothing is made).
	u, cs := newFakeEgress(t, Options{Egress: EgressUnenforced})
	e := lifecycle.Egress{Policy: lifecycle.EgressNone, Allow: []string{"registry.npmjs.org"}}
	if err := u.CheckEgress(e); err != nil || u.EnforcesEgress() {
		t.Fatalf("unenforced: CheckEgress = %v, EnforcesEgress = %v", err, u.EnforcesEgress())
	}
	spec := testSpec()
	spec.Egress = e
	if _, err := u.Create(context.Background(), "abc", spec); err != nil {
		t.Fatal(err)
	}
	if l, _ := cs.NetworkingV1().NetworkPolicies(testNS).List(context.Background(), metav1.ListOptions{}); len(l.Items) != 0 {
		t.Fatalf("unenforced made %d policies", len(l.Items))
	}
}

func TestPolicyLifecycle(t *testing.T) {
	r, cs := newFakeEgress(t, Options{})
	ctx := context.Background()
	pols := cs.NetworkingV1().NetworkPolicies(testNS)
	spec := testSpec()
	spec.Egress = lifecycle.Egress{Policy: lifecycle.EgressPublic}
	if _, err := r.Create(ctx, "abc", spec); err != nil {
		t.Fatal(err)
	}
	pol, err := pols.Get(ctx, "s-abc", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("no policy after create: %v", err)
	}
	if len(pol.Spec.Egress) != 2 {
		t.Fatalf("public policy: %d egress rules", len(pol.Spec.Egress))
	}
	// The policy was made before the claim (fails closed: see
	// TestCreateFailsClosed); a PATCH replaces its egress.
	spec.Egress = lifecycle.Egress{Policy: lifecycle.EgressNone, Allow: []string{"198.51.100.7:443/tcp"}}
	if err := r.ApplyEgress(ctx, "abc", spec); err != nil {
		t.Fatal(err)
	}
	pol, _ = pols.Get(ctx, "s-abc", metav1.GetOptions{})
	if got := readRules(pol.Spec.Egress); len(got) != 1 || got[0].to[0] != "198.51.100.7/32" {
		t.Fatalf("after ApplyEgress: %+v", got)
	}
	// A policy deleted by hand: its patch finds nothing, and it is made
	// again; the claim keeps what it was made from.
	if err := pols.Delete(ctx, "s-abc", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	spec.Egress = lifecycle.Egress{Policy: lifecycle.EgressNone, Allow: []string{"198.51.100.8:443/tcp"}}
	if err := r.ApplyEgress(ctx, "abc", spec); err != nil {
		t.Fatal(err)
	}
	pol, err = pols.Get(ctx, "s-abc", metav1.GetOptions{})
	if err != nil || len(pol.Spec.Egress) != 1 || !r.owns("abc", pol.Labels) {
		t.Fatalf("the policy deleted by hand, after ApplyEgress: %+v %v", pol, err)
	}
	claim, _ := cs.CoreV1().PersistentVolumeClaims(testNS).Get(ctx, ClaimName("abc"), metav1.GetOptions{})
	if !strings.Contains(claim.Annotations[AnnotationPolicy], "198.51.100.8/32") {
		t.Fatalf("the claim keeps %q", claim.Annotations[AnnotationPolicy])
	}
	// A recreate replaces it again.
	spec.Egress = lifecycle.Egress{Policy: lifecycle.EgressNone}
	if _, err := r.Create(ctx, "abc", spec); err != nil {
		t.Fatal(err)
	}
	if pol, _ = pols.Get(ctx, "s-abc", metav1.GetOptions{}); len(pol.Spec.Egress) != 0 {
		t.Fatalf("after recreate: %+v", pol.Spec.Egress)
	}
	eventually(t, "the claim in the cache", func() bool {
		_, err := r.claims.Get(ClaimName("abc"))
		return err == nil
	})
	// Remove (destroy) deletes it.
	if err := r.Remove(ctx, "abc"); err != nil {
		t.Fatal(err)
	}
	if _, err := pols.Get(ctx, "s-abc", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("policy after remove: %v", err)
	}
	if err := r.Remove(ctx, "abc"); err != nil {
		t.Fatalf("second remove: %v", err)
	}
}

// TestPolicyNotOurs: a NetworkPolicy under a sandbox's name that is
// another instance's (or no one's) stops a create with ErrIDTaken and is
// neither updated nor deleted.
func TestPolicyNotOurs(t *testing.T) {
	r, cs := newFakeEgress(t, Options{})
	ctx := context.Background()
	pols := cs.NetworkingV1().NetworkPolicies(testNS)
	for id, labels := range map[string]map[string]string{
		"abc": {LabelManaged: "true", LabelInstance: "t2", LabelID: "abc"},
		"def": {"app": "mine"},
	} {
		theirs := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: PolicyName(id), Namespace: testNS, Labels: labels},
			Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
		if _, err := pols.Create(ctx, theirs, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Create(ctx, id, testSpec()); !errors.Is(err, lifecycle.ErrIDTaken) {
			t.Errorf("create %s over another's policy: %v, want ErrIDTaken", id, err)
		}
		if err := r.ApplyEgress(ctx, id, testSpec()); !errors.Is(err, lifecycle.ErrIDTaken) {
			t.Errorf("ApplyEgress %s over another's policy: %v, want ErrIDTaken", id, err)
		}
		if err := r.Remove(ctx, id); err != nil {
			t.Errorf("remove %s: %v", id, err)
		}
		got, err := pols.Get(ctx, PolicyName(id), metav1.GetOptions{})
		if err != nil || len(got.Spec.PolicyTypes) != 1 || got.Spec.Egress != nil {
			t.Errorf("another's policy %s was touched: %+v, %v", id, got, err)
		}
		if _, err := cs.CoreV1().PersistentVolumeClaims(testNS).Get(ctx, ClaimName(id), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("a claim was made for %s: %v", id, err)
		}
	}
	// An id whose claim is another's gets no policy.
	claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: ClaimName("ghi"), Namespace: testNS,
		Labels: map[string]string{LabelManaged: "true", LabelInstance: "t2", LabelID: "ghi"}}}
	if _, err := cs.CoreV1().PersistentVolumeClaims(testNS).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Create(ctx, "ghi", testSpec()); !errors.Is(err, lifecycle.ErrIDTaken) {
		t.Fatalf("create over another's claim: %v, want ErrIDTaken", err)
	}
	if _, err := pols.Get(ctx, PolicyName("ghi"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a policy was made for an id whose claim is another's: %v", err)
	}
}

// TestCreateFailsClosed: when the policy cannot be made, the create fails
// and neither the claim nor a pod is made.
func TestCreateFailsClosed(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		want error
	}{
		{"forbidden", apierrors.NewForbidden(networkingv1.Resource("networkpolicies"), "s-abc", errors.New("no RBAC")), nil},
		{"unavailable", apierrors.NewServiceUnavailable("etcd down"), lifecycle.ErrUnavailable},
		{"invalid", apierrors.NewInvalid(networkingv1.SchemeGroupVersion.WithKind("NetworkPolicy").GroupKind(), "s-abc", nil), lifecycle.ErrInvalid},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r, cs := newFakeEgress(t, Options{})
			cs.PrependReactor("create", "networkpolicies", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, tt.err
			})
			ctx := context.Background()
			_, err := r.Create(ctx, "abc", testSpec())
			if err == nil || (tt.want != nil && !errors.Is(err, tt.want)) {
				t.Fatalf("create: %v, want an error (%v)", err, tt.want)
			}
			if tt.name == "forbidden" && !strings.Contains(err.Error(), "networkpolicies") {
				t.Errorf("a refusal by RBAC does not name the rule: %v", err)
			}
			if _, err := cs.CoreV1().PersistentVolumeClaims(testNS).Get(ctx, ClaimName("abc"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Fatalf("claim made although the policy was not: %v", err)
			}
			if l, _ := cs.CoreV1().Pods(testNS).List(ctx, metav1.ListOptions{}); len(l.Items) != 0 {
				t.Fatal("pod made although the policy was not")
			}
		})
	}
}

// TestStartMakesThePolicy: a start makes no pod without its policy: one
// deleted by hand is made again from the claim first; a sandbox whose
// claim keeps none (made while egress was unenforced) does not start
// until an egress PATCH gives it one.
func TestStartMakesThePolicy(t *testing.T) {
	r, cs := newFakeEgress(t, Options{})
	ctx := context.Background()
	pols := cs.NetworkingV1().NetworkPolicies(testNS)
	claims := cs.CoreV1().PersistentVolumeClaims(testNS)
	spec := testSpec()
	spec.Egress = lifecycle.Egress{Policy: lifecycle.EgressNone, Allow: []string{"198.51.100.7:443/tcp"}}
	if _, err := r.Create(ctx, "abc", spec); err != nil {
		t.Fatal(err)
	}
	if err := pols.Delete(ctx, "s-abc", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	start := func() <-chan error {
		done := make(chan error, 1)
		go func() {
			_, err := r.Start(ctx, "abc")
			done <- err
		}()
		return done
	}
	done := start()
	eventually(t, "the pod", func() bool {
		_, err := cs.CoreV1().Pods(testNS).Get(ctx, "s-abc", metav1.GetOptions{})
		return err == nil
	})
	pol, err := pols.Get(ctx, "s-abc", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the pod was made without its policy: %v", err)
	}
	if got := readRules(pol.Spec.Egress); len(got) != 1 || got[0].to[0] != "198.51.100.7/32" {
		t.Fatalf("policy made again: %+v", got)
	}
	setPodStatus(t, cs, "abc", running("10.244.0.7"))
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := r.Stop(ctx, "abc"); err != nil {
		t.Fatal(err)
	}
	// A claim that keeps no policy: no start.
	c, _ := claims.Get(ctx, "s-abc-data", metav1.GetOptions{})
	delete(c.Annotations, AnnotationPolicy)
	if _, err := claims.Update(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the claim without its policy in the cache", func() bool {
		c, err := r.claims.Get("s-abc-data")
		_, kept := c.Annotations[AnnotationPolicy]
		return err == nil && !kept
	})
	if _, err := r.Start(ctx, "abc"); !errors.Is(err, lifecycle.ErrEgressUnenforced) || !strings.Contains(err.Error(), "PATCH") {
		t.Fatalf("start of a sandbox without a policy: %v, want ErrEgressUnenforced with the fix", err)
	}
	if _, err := cs.CoreV1().Pods(testNS).Get(ctx, "s-abc", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a pod was made without a policy: %v", err)
	}
	// An egress PATCH keeps the policy on the claim again.
	spec.Egress = lifecycle.Egress{Policy: lifecycle.EgressPublic}
	if err := r.ApplyEgress(ctx, "abc", spec); err != nil {
		t.Fatal(err)
	}
	c, _ = claims.Get(ctx, "s-abc-data", metav1.GetOptions{})
	if !strings.Contains(c.Annotations[AnnotationPolicy], "0.0.0.0/0") {
		t.Fatalf("the PATCH's policy is not kept on the claim: %q", c.Annotations[AnnotationPolicy])
	}
}

// TestClaimRefusedTakesThePolicy: a create whose claim is refused leaves
// no policy it made behind.
func TestClaimRefusedTakesThePolicy(t *testing.T) {
	r, cs := newFakeEgress(t, Options{})
	cs.PrependReactor("create", "persistentvolumeclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("PersistentVolumeClaim").GroupKind(), "s-abc-data", nil)
	})
	ctx := context.Background()
	if _, err := r.Create(ctx, "abc", testSpec()); !errors.Is(err, lifecycle.ErrInvalid) {
		t.Fatalf("create with its claim refused: %v, want ErrInvalid", err)
	}
	if _, err := cs.NetworkingV1().NetworkPolicies(testNS).Get(ctx, "s-abc", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("policy left by a refused create: %v", err)
	}
}

// TestServiceClaimRefusedTakesThePolicy: a create refused before the
// app's claim (a service's claim held by another instance) leaves no
// policy it made behind either.
func TestServiceClaimRefusedTakesThePolicy(t *testing.T) {
	r, cs := newFakeEgress(t, Options{})
	ctx := context.Background()
	spec := servicesSpec()
	var name string
	for n := range spec.Services {
		name = n
		break
	}
	other := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: ServiceClaimName("abc", name), Namespace: testNS,
		Labels: map[string]string{LabelManaged: "true", LabelInstance: "another", LabelID: "abc"}}}
	if _, err := cs.CoreV1().PersistentVolumeClaims(testNS).Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Create(ctx, "abc", spec); !errors.Is(err, lifecycle.ErrIDTaken) {
		t.Fatalf("create with a service's claim another's: %v, want ErrIDTaken", err)
	}
	if _, err := cs.NetworkingV1().NetworkPolicies(testNS).Get(ctx, "s-abc", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("policy left by a refused create: %v", err)
	}
}

func TestEgressOptions(t *testing.T) {
	for _, o := range []Options{
		{Egress: "cilium"},
		{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("fd00::/8")}},
		{GatewaySelector: map[string]string{}},
		{GatewaySelector: map[string]string{"bad key!": "x"}},
		{GatewaySelector: map[string]string{"app": "not a value"}},
	} {
		o.Client, o.Instance = fake.NewClientset(), "t1"
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
}

// TestManagerRefusesWhatAPolicyCannotSay: through the Manager (as the API
// creates, 400 for ErrInvalid), a create with a name entry or learn on
// this runtime is refused before anything is stored or made, a PATCH
// likewise, and egress counts as enforced without a Firewall.
func TestManagerRefusesWhatAPolicyCannotSay(t *testing.T) {
	r, cs := newFakeEgress(t, Options{})
	st, err := store.Open(store.Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	m, err := lifecycle.NewManager(st, r, lifecycle.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := m.EgressStatus(ctx); err != nil {
		t.Fatalf("EgressStatus on a runtime that enforces egress: %v", err)
	}
	for _, e := range []lifecycle.Egress{
		{Policy: lifecycle.EgressNone, Allow: []string{"registry.npmjs.org:443"}},
		{Policy: lifecycle.EgressPublic, Deny: []string{"*.example.com"}},
		{Policy: lifecycle.EgressLearn},
	} {
		_, err := m.Create(ctx, lifecycle.CreateRequest{ID: "abc", Spec: lifecycle.Spec{Image: "sandwake/testapp:1", Ports: []int{8080}, Egress: e}})
		if !errors.Is(err, lifecycle.ErrInvalid) || !strings.Contains(err.Error(), "policy engine") {
			t.Fatalf("create with %+v: %v, want ErrInvalid naming why", e, err)
		}
		if _, err := st.Get("abc"); !errors.Is(err, lifecycle.ErrNotFound) {
			t.Fatalf("a refused create left a record: %v", err)
		}
		if _, err := m.Update("abc", lifecycle.Patch{Egress: &e}); !errors.Is(err, lifecycle.ErrInvalid) {
			t.Fatalf("PATCH with %+v: %v, want ErrInvalid", e, err)
		}
	}
	if l, _ := cs.NetworkingV1().NetworkPolicies(testNS).List(ctx, metav1.ListOptions{}); len(l.Items) != 0 {
		t.Fatalf("refused creates made %d policies", len(l.Items))
	}
	if l, _ := cs.CoreV1().PersistentVolumeClaims(testNS).List(ctx, metav1.ListOptions{}); len(l.Items) != 0 {
		t.Fatalf("refused creates made %d claims", len(l.Items))
	}
	// A PATCH of a stored sandbox's egress puts its policy in force.
	rec := lifecycle.Record{ID: "def", Spec: lifecycle.Spec{Image: "sandwake/testapp:1", Ports: []int{8080}, Egress: lifecycle.Egress{Policy: lifecycle.EgressPublic}},
		State: lifecycle.Stopped, Incarnation: "i1"}
	if _, _, err := st.Create(rec, "test"); err != nil {
		t.Fatal(err)
	}
	none := lifecycle.Egress{Policy: lifecycle.EgressNone, Allow: []string{"198.51.100.7:443"}}
	if _, err := m.Update("def", lifecycle.Patch{Egress: &none}); err != nil {
		t.Fatal(err)
	}
	pol, err := cs.NetworkingV1().NetworkPolicies(testNS).Get(ctx, "s-def", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("no policy after a PATCH: %v", err)
	}
	if got := readRules(pol.Spec.Egress); len(got) != 1 || got[0].to[0] != "198.51.100.7/32" || got[0].ports[0] != "TCP/443" {
		t.Fatalf("policy after a PATCH to none: %+v", got)
	}
	// Unenforced, the Manager says so.
	u, _ := newFakeEgress(t, Options{Egress: EgressUnenforced})
	st2, err := store.Open(store.Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st2.Close() })
	m2, err := lifecycle.NewManager(st2, u, lifecycle.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m2.Close() })
	if err := m2.EgressStatus(ctx); !errors.Is(err, lifecycle.ErrEgressUnenforced) {
		t.Fatalf("EgressStatus unenforced: %v", err)
	}
}
