package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"

	"github.com/sandwake/sandwake/lifecycle"
)

// Labels every pod and claim sandwake makes carries (the same words as
// the Docker runtime's).
const (
	LabelManaged = "sandwake.managed"
	LabelID      = "sandwake.id"
	// LabelInstance names the gateway instance that owns the object: the
	// informers see only its objects, and the runtime acts on no other.
	LabelInstance = "sandwake.instance"
	// LabelPrefix+<key> carries a record's label on its pod where
	// Kubernetes takes it as a label.
	LabelPrefix = "sandwake.label."
)

// Annotations of pods and claims.
const (
	// AnnotationPod on a claim is the pod a start makes (JSON): the
	// sandbox's container while it runs no pod. A claim without it has
	// no container (made by a create, taken by Remove).
	AnnotationPod = "sandwake.pod"
	// AnnotationPolicy on a claim is the spec of the sandbox's
	// NetworkPolicy (JSON): a start makes the policy again from it when
	// it is missing.
	AnnotationPolicy = "sandwake.networkpolicy"
	// AnnotationLabelPrefix+<key> carries every record label on the pod.
	AnnotationLabelPrefix = "sandwake.label."
	// AnnotationPaused marks, in the informer's copy of a pod only, a pod
	// whose CPU is cut (pause.go).
	AnnotationPaused = "sandwake.paused"
	// AnnotationPool and AnnotationPoolKey mark a pool's sandbox.
	AnnotationPool    = "sandwake.pool"
	AnnotationPoolKey = "sandwake.pool.key"
	// AnnotationOwnerIncarnation and AnnotationOwnerPrefix+<key> record on
	// a claim whose its files are (lifecycle.VolumeOwner).
	AnnotationOwnerIncarnation = "sandwake.owner.incarnation"
	AnnotationOwnerPrefix      = "sandwake.owner.label."
)

// Image pull policies (the Docker runtime's words).
const (
	PullMissing = "missing"
	PullNever   = "never"
	PullAlways  = "always"
)

// Defaults of Options.
const (
	DefaultNamespace   = "sandwake"
	DefaultVolumeSize  = "1Gi"
	DefaultStopTimeout = 10 * time.Second
	DefaultTmpMB       = 64
)

// Options configure the runtime.
type Options struct {
	// Kubeconfig is the path of a kubeconfig file. Default: the pod's
	// service account when the gateway runs in the cluster, else
	// $KUBECONFIG, else ~/.kube/config.
	Kubeconfig string
	// Namespace holds every sandbox's pod and claim. Default: sandwake.
	Namespace string
	// Instance is the name of the gateway instance: every object the
	// runtime makes carries it (LabelInstance) and the informers select
	// on it. Required; a Kubernetes label value.
	Instance string
	// StorageClass is the workspace claims' storage class. Default: the
	// cluster's default class.
	StorageClass string
	// VolumeSize is the size each workspace claim asks for (a Kubernetes
	// quantity). Default: 1Gi.
	VolumeSize string
	// StopTimeout is the pods' termination grace period. Default: 10s.
	StopTimeout time.Duration
	// Pull is the image pull policy: PullMissing (IfNotPresent, default),
	// PullNever or PullAlways.
	Pull string
	// TmpMB bounds the memory-backed /tmp of a sandbox with a read-only
	// root filesystem, in MiB. Default: 64.
	TmpMB int64
	// NodeSelector places every sandbox's pod on nodes with these labels.
	NodeSelector map[string]string
	// Tolerations let sandbox pods onto nodes with matching taints (a
	// node pool kept for untrusted code).
	Tolerations []corev1.Toleration
	// RuntimeClass is the RuntimeClass of a pod whose spec names no
	// runtime (gVisor's runsc, Kata): the Docker runtime's `runtime`.
	RuntimeClass string
	// Egress is how sandboxes' egress policies are enforced:
	// EgressNetworkPolicy (default: a NetworkPolicy per sandbox, made
	// before its pod) or EgressUnenforced (none made).
	Egress string
	// ClusterCIDRs are the cluster's pod and service ranges (and any
	// other, such as the nodes', when outside the private ranges): a
	// public policy does not reach them and no allow entry opens them.
	// IPv4. Default: none beyond lifecycle.EgressDeniedRanges.
	ClusterCIDRs []netip.Prefix
	// GatewayCIDRs are the addresses of a gateway outside the cluster as
	// the pods see its traffic (the node's bridge address, say): they
	// may reach the sandboxes' ports. Default: none.
	GatewayCIDRs []netip.Prefix
	// GatewaySelector is the labels of the gateway's pods (in any
	// namespace), which may reach the sandboxes' ports. Default:
	// DefaultGatewaySelector.
	GatewaySelector map[string]string
	// Labels are put on every pod, claim and NetworkPolicy made, beside
	// sandwake's own (the Docker engine's configured labels). Keys and
	// values must be Kubernetes labels' (CheckLabels).
	Labels map[string]string
	// Client is the API client to use instead of one made from
	// Kubeconfig (tests give a fake one).
	Client kubernetes.Interface
}

// Runtime is a lifecycle.Runtime on a Kubernetes cluster. Build it with
// New, then StartInformers, and Close it.
type Runtime struct {
	cs   kubernetes.Interface
	opts Options

	factory informers.SharedInformerFactory
	pods    corelisters.PodNamespaceLister
	claims  corelisters.PersistentVolumeClaimNamespaceLister
	synced  []cache.InformerSynced
	stop    chan struct{}
	started bool
	runMu   sync.Mutex

	changes changes
	subs    subscribers
}

// New builds a runtime; nothing is asked of the API server and no
// goroutine runs until StartInformers.
func New(opts Options) (*Runtime, error) {
	if opts.Instance == "" {
		return nil, errors.New("kubernetes runtime: an instance name is required")
	}
	if errs := validation.IsValidLabelValue(opts.Instance); len(errs) > 0 || len(opts.Instance) == 0 {
		return nil, fmt.Errorf("kubernetes runtime: instance %q is not a Kubernetes label value: %v", opts.Instance, errs)
	}
	if opts.Namespace == "" {
		opts.Namespace = DefaultNamespace
	}
	if opts.VolumeSize == "" {
		opts.VolumeSize = DefaultVolumeSize
	}
	if _, err := resource.ParseQuantity(opts.VolumeSize); err != nil {
		return nil, fmt.Errorf("kubernetes runtime: volume size %q: %w", opts.VolumeSize, err)
	}
	if opts.StopTimeout <= 0 {
		opts.StopTimeout = DefaultStopTimeout
	}
	if opts.TmpMB <= 0 {
		opts.TmpMB = DefaultTmpMB
	}
	if err := CheckEgressOptions(&opts); err != nil {
		return nil, fmt.Errorf("kubernetes runtime: %w", err)
	}
	switch opts.Pull {
	case "":
		opts.Pull = PullMissing
	case PullMissing, PullNever, PullAlways:
	default:
		return nil, fmt.Errorf("kubernetes runtime: unknown pull policy %q (missing, never or always)", opts.Pull)
	}
	if err := CheckLabels(opts.Labels); err != nil {
		return nil, fmt.Errorf("kubernetes runtime: %w", err)
	}
	cs := opts.Client
	if cs == nil {
		var err error
		if cs, _, err = NewClient(opts.Kubeconfig); err != nil {
			return nil, fmt.Errorf("kubernetes runtime: %w", err)
		}
	}
	r := &Runtime{cs: cs, opts: opts, stop: make(chan struct{})}
	r.factory = informers.NewSharedInformerFactoryWithOptions(cs, 0,
		informers.WithNamespace(opts.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = LabelInstance + "=" + opts.Instance
		}),
		informers.WithTransform(dropManagedFields))
	pods := r.factory.Core().V1().Pods()
	claims := r.factory.Core().V1().PersistentVolumeClaims()
	r.pods = pods.Lister().Pods(opts.Namespace)
	r.claims = claims.Lister().PersistentVolumeClaims(opts.Namespace)
	if _, err := pods.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.podChanged(nil, obj) },
		UpdateFunc: func(old, obj any) { r.podChanged(old, obj) },
		DeleteFunc: r.podDeleted,
	}); err != nil {
		return nil, fmt.Errorf("kubernetes runtime: %w", err)
	}
	if _, err := claims.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.changes.fire(idOf(obj)) },
		UpdateFunc: func(_, obj any) { r.changes.fire(idOf(obj)) },
		DeleteFunc: func(obj any) { r.changes.fire(idOf(obj)) },
	}); err != nil {
		return nil, fmt.Errorf("kubernetes runtime: %w", err)
	}
	r.synced = []cache.InformerSynced{pods.Informer().HasSynced, claims.Informer().HasSynced}
	return r, nil
}

// NewClient is a client of the API server RESTConfig finds for path, with
// the server's URL for messages.
func NewClient(path string) (kubernetes.Interface, string, error) {
	cfg, err := RESTConfig(path)
	if err != nil {
		return nil, "", err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("a client of the Kubernetes API at %s: %w", cfg.Host, err)
	}
	return cs, cfg.Host, nil
}

// RESTConfig finds the API server: path, else in the cluster, else
// $KUBECONFIG or ~/.kube/config.
func RESTConfig(path string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if path != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", path)
	} else if cfg, err = rest.InClusterConfig(); errors.Is(err, rest.ErrNotInCluster) {
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	}
	if err != nil {
		return nil, err
	}
	// Wakes come in bursts; client-go's defaults (5/s) would queue them.
	cfg.QPS, cfg.Burst = 100, 200
	cfg.UserAgent = "sandwake"
	return cfg, nil
}

// StartInformers starts the informers and waits, within ctx, for their
// first list. Until then every read fails with ErrUnavailable.
func (r *Runtime) StartInformers(ctx context.Context) error {
	r.runMu.Lock()
	defer r.runMu.Unlock()
	if !r.started {
		r.factory.Start(r.stop)
		r.started = true
	}
	if !cache.WaitForCacheSync(ctx.Done(), r.synced...) {
		return fmt.Errorf("kubernetes runtime: %w: the pod and claim informers of namespace %s did not sync: %v", lifecycle.ErrUnavailable, r.opts.Namespace, ctx.Err())
	}
	return nil
}

// Close stops the informers and waits for them, and ends every event
// stream.
func (r *Runtime) Close() error {
	r.runMu.Lock()
	defer r.runMu.Unlock()
	select {
	case <-r.stop:
		return nil
	default:
	}
	close(r.stop)
	r.factory.Shutdown()
	r.subs.closeAll(errors.New("kubernetes runtime closed"))
	return nil
}

// PodName is the name of sandbox id's pod.
func PodName(id string) string { return "s-" + id }

// ClaimName is the name of sandbox id's workspace claim.
func ClaimName(id string) string { return "s-" + id + "-data" }

// labels are the labels of every object made for sandbox id: the
// configured ones and sandwake's.
func (r *Runtime) labels(id string) map[string]string {
	l := make(map[string]string, len(r.opts.Labels)+3)
	maps.Copy(l, r.opts.Labels)
	l[LabelManaged], l[LabelInstance], l[LabelID] = "true", r.opts.Instance, id
	return l
}

// CheckLabels refuses configured labels (Options.Labels) that are not
// Kubernetes labels, or that take a name of sandwake's own ("sandwake."
// keys).
func CheckLabels(labels map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return fmt.Errorf("label key %q is not a Kubernetes label key: %s", k, strings.Join(errs, "; "))
		}
		if strings.HasPrefix(k, "sandwake.") {
			return fmt.Errorf("label key %q: keys starting with sandwake. are sandwake's own", k)
		}
		if errs := validation.IsValidLabelValue(labels[k]); len(errs) > 0 {
			return fmt.Errorf("label %s value %q is not a Kubernetes label value: %s", k, labels[k], strings.Join(errs, "; "))
		}
	}
	return nil
}

// owns reports whether an object of sandbox id with these labels is this
// instance's.
func (r *Runtime) owns(id string, labels map[string]string) bool {
	return labels[LabelManaged] == "true" && labels[LabelID] == id && labels[LabelInstance] == r.opts.Instance
}

// notOurs is the error for a name held by an object this instance does not
// own.
func notOurs(kind, name string, labels map[string]string, sentinel error) error {
	owner := "no sandwake labels"
	if labels[LabelManaged] == "true" {
		owner = "sandwake instance " + strconv.Quote(labels[LabelInstance])
	}
	return fmt.Errorf("%w: %s %s exists and is not this gateway's (it has %s); nothing of it was touched", sentinel, kind, name, owner)
}

// ready reports whether the informers serve reads.
func (r *Runtime) ready() error {
	for _, s := range r.synced {
		if !s() {
			return fmt.Errorf("%w: the kubernetes runtime's informers are not synced (not started, or the API server is unreachable)", lifecycle.ErrUnavailable)
		}
	}
	return nil
}

// Create implements lifecycle.Runtime: the sandbox's NetworkPolicy (made
// or replaced first: no pod runs without it), then the claim (when
// missing) with the pod to start kept on it. An old pod of the sandbox (a
// recreate) is deleted; a pod, claim or policy under its names that is not
// this instance's stops the create with ErrIDTaken, untouched.
func (r *Runtime) Create(ctx context.Context, id string, spec lifecycle.Spec) (_ lifecycle.Container, err error) {
	pod, err := r.podFor(id, spec)
	if err != nil {
		return lifecycle.Container{}, err
	}
	var policy *networkingv1.NetworkPolicy
	if r.EnforcesEgress() {
		if policy, err = r.policyFor(id, spec); err != nil {
			return lifecycle.Container{}, err
		}
	}
	old, err := r.cs.CoreV1().Pods(r.opts.Namespace).Get(ctx, PodName(id), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		old = nil
	case err != nil:
		return lifecycle.Container{}, classify("reading pod "+PodName(id), err, lifecycle.ErrContainerNotFound)
	case !r.owns(id, old.Labels):
		return lifecycle.Container{}, notOurs("pod", PodName(id), old.Labels, lifecycle.ErrIDTaken)
	}
	claims := r.cs.CoreV1().PersistentVolumeClaims(r.opts.Namespace)
	madePolicy := false
	if policy != nil {
		// An id whose claim is another's is refused before the policy is
		// written (the claim's write checks again).
		if cur, err := claims.Get(ctx, ClaimName(id), metav1.GetOptions{}); err == nil && !r.owns(id, cur.Labels) {
			return lifecycle.Container{}, notOurs("claim", ClaimName(id), cur.Labels, lifecycle.ErrIDTaken)
		}
		// Fails closed: no policy, no pod.
		if madePolicy, err = r.ensurePolicy(ctx, id, policy); err != nil {
			return lifecycle.Container{}, err
		}
	}
	defer func() {
		if err != nil && madePolicy {
			// No sandbox: the policy made for it goes too (a failure to
			// delete it leaves a policy selecting no pod).
			if derr := r.deletePolicy(context.WithoutCancel(ctx), id); derr != nil {
				err = fmt.Errorf("%w (and its new NetworkPolicy is left: %v)", err, derr)
			}
		}
	}()
	if old != nil {
		if err := r.deletePod(ctx, id, old); err != nil {
			return lifecycle.Container{}, err
		}
	}
	want, err := r.claimFor(id, spec, pod)
	if err == nil {
		err = keepPolicy(want, policy)
	}
	if err != nil {
		return lifecycle.Container{}, err
	}
	madeServiceClaims, err := r.ensureServiceClaims(ctx, id, spec)
	if err != nil {
		return lifecycle.Container{}, err
	}
	var made *corev1.PersistentVolumeClaim
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := claims.Get(ctx, ClaimName(id), metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			made, err = claims.Create(ctx, want, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(corev1.Resource("persistentvolumeclaims"), ClaimName(id), err)
			}
			return err
		case err != nil:
			return err
		case !r.owns(id, cur.Labels):
			return notOurs("claim", ClaimName(id), cur.Labels, lifecycle.ErrIDTaken)
		case cur.DeletionTimestamp != nil:
			// A purge of this id not yet done: its files are going, and
			// the create waits for the claim to be gone.
			if err := r.waitFor(ctx, id, "claim "+ClaimName(id)+" to be deleted", func() (bool, error) {
				_, err := r.claims.Get(ClaimName(id))
				return apierrors.IsNotFound(err), nil
			}); err != nil {
				return err
			}
			return apierrors.NewConflict(corev1.Resource("persistentvolumeclaims"), ClaimName(id), errors.New("deleted meanwhile"))
		}
		// The workspace is kept; the pod to start is the new spec's.
		cur = cur.DeepCopy()
		if err := setPod(cur, pod); err != nil {
			return err
		}
		if err := keepPolicy(cur, policy); err != nil {
			return err
		}
		made, err = claims.Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		r.deleteClaims(context.WithoutCancel(ctx), madeServiceClaims)
		if errors.Is(err, lifecycle.ErrIDTaken) || errors.Is(err, lifecycle.ErrUnavailable) {
			return lifecycle.Container{}, err
		}
		if apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) {
			return lifecycle.Container{}, fmt.Errorf("%w: kubernetes refused the sandbox's claim: %w", lifecycle.ErrInvalid, lifecycle.EngineFailure(err))
		}
		return lifecycle.Container{}, classify("creating claim "+ClaimName(id), err, lifecycle.ErrNotFound)
	}
	// Inspect and List read the claim from the cache, which must have
	// seen this write first (the sandbox has a container from now on).
	if err := r.waitClaimSeen(ctx, id, func(c *corev1.PersistentVolumeClaim) bool {
		return c.UID == made.UID && keptSame(c, made, AnnotationPod) && keptSame(c, made, AnnotationPolicy)
	}); err != nil {
		return lifecycle.Container{}, err
	}
	return lifecycle.Container{ID: string(made.UID), SandboxID: id, State: lifecycle.ContainerCreated}, nil
}

// waitClaimSeen waits for the cache to hold sandbox id's claim as seen
// says (a write of this runtime arriving through the informer).
func (r *Runtime) waitClaimSeen(ctx context.Context, id string, seen func(*corev1.PersistentVolumeClaim) bool) error {
	if err := r.ready(); err != nil {
		return err
	}
	err := r.waitFor(ctx, id, "claim "+ClaimName(id)+" in the informer's cache", func() (bool, error) {
		c, err := r.claims.Get(ClaimName(id))
		return err == nil && seen(c), nil
	})
	return classify("creating claim "+ClaimName(id), err, lifecycle.ErrNotFound)
}

// VolumeOwner implements lifecycle.VolumeInspector from the claim's
// annotations. A claim that is not this instance's is reported missing.
func (r *Runtime) VolumeOwner(ctx context.Context, id string) (o lifecycle.VolumeOwner, recorded, exists bool, err error) {
	c, err := r.cs.CoreV1().PersistentVolumeClaims(r.opts.Namespace).Get(ctx, ClaimName(id), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return o, false, false, nil
	}
	if err != nil {
		return o, false, false, classify("reading claim "+ClaimName(id), err, lifecycle.ErrNotFound)
	}
	if !r.owns(id, c.Labels) {
		return o, false, false, nil
	}
	o.Incarnation, recorded = c.Annotations[AnnotationOwnerIncarnation]
	for k, v := range c.Annotations {
		if key, ok := strings.CutPrefix(k, AnnotationOwnerPrefix); ok {
			if o.Labels == nil {
				o.Labels = map[string]string{}
			}
			o.Labels[key] = v
		}
	}
	return o, recorded, true, nil
}

// Start implements lifecycle.Runtime: it makes the pod the claim keeps and
// returns once the pod has its address and its app runs (or has exited),
// within ctx. A pod of the sandbox still terminating is waited out first.
func (r *Runtime) Start(ctx context.Context, id string) (lifecycle.Container, error) {
	if err := r.ready(); err != nil {
		return lifecycle.Container{}, err
	}
	// The pod and policy to make are on the claim, which the cache keeps
	// only digests of (slimClaim): one read of the API server per start.
	claim, err := r.cs.CoreV1().PersistentVolumeClaims(r.opts.Namespace).Get(ctx, ClaimName(id), metav1.GetOptions{})
	if apierrors.IsNotFound(err) || (err == nil && !r.owns(id, claim.Labels)) {
		return lifecycle.Container{}, fmt.Errorf("starting sandbox %s: %w: it has no claim %s", id, lifecycle.ErrContainerNotFound, ClaimName(id))
	}
	if err != nil {
		return lifecycle.Container{}, classify("reading claim "+ClaimName(id), err, lifecycle.ErrContainerNotFound)
	}
	want, err := podOf(claim)
	if err != nil {
		return lifecycle.Container{}, err
	}
	if want == nil {
		return lifecycle.Container{}, fmt.Errorf("starting sandbox %s: %w: claim %s keeps no pod (removed)", id, lifecycle.ErrContainerNotFound, ClaimName(id))
	}
	if cur, err := r.pods.Get(PodName(id)); err == nil {
		switch c := r.fromPod(id, cur); {
		case cur.DeletionTimestamp == nil && (c.State == lifecycle.ContainerRunning || c.State == lifecycle.ContainerCreated):
			// Already made (a start whose answer was lost): wait for it.
			return r.waitRunning(ctx, id)
		case cur.DeletionTimestamp == nil:
			if err := r.deletePod(ctx, id, cur); err != nil {
				return lifecycle.Container{}, err
			}
		}
		if err := r.waitPodGone(ctx, id); err != nil {
			return lifecycle.Container{}, err
		}
	}
	// Fails closed: the pod is made only behind its policy (made again
	// here when it went behind sandwake's back).
	if err := r.startPolicy(ctx, id, claim); err != nil {
		return lifecycle.Container{}, err
	}
	want.ResourceVersion = ""
	_, err = r.cs.CoreV1().Pods(r.opts.Namespace).Create(ctx, want, metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err):
		got, gerr := r.cs.CoreV1().Pods(r.opts.Namespace).Get(ctx, PodName(id), metav1.GetOptions{})
		if gerr == nil && !r.owns(id, got.Labels) {
			return lifecycle.Container{}, notOurs("pod", PodName(id), got.Labels, lifecycle.ErrContainerNotFound)
		}
	case apierrors.IsInvalid(err) || apierrors.IsForbidden(err):
		return lifecycle.Container{}, fmt.Errorf("starting sandbox %s: %w: kubernetes refused its pod: %w", id, lifecycle.ErrInvalid, lifecycle.EngineFailure(err))
	case err != nil:
		return lifecycle.Container{}, classify("creating pod "+PodName(id), err, lifecycle.ErrContainerNotFound)
	}
	return r.waitRunning(ctx, id)
}

// waitRunning waits for sandbox id's pod to have an address and a running
// app, or to have exited (the Manager's readiness check reports that).
func (r *Runtime) waitRunning(ctx context.Context, id string) (lifecycle.Container, error) {
	var c lifecycle.Container
	err := r.waitFor(ctx, id, "pod "+PodName(id)+" to run", func() (bool, error) {
		pod, err := r.pods.Get(PodName(id))
		if err != nil {
			return false, nil // not in the cache yet
		}
		if err := imageProblem(pod); err != nil {
			return false, err
		}
		if err := serviceProblem(pod); err != nil {
			return false, err
		}
		c = r.fromPod(id, pod)
		switch c.State {
		case lifecycle.ContainerRunning:
			return len(c.Upstreams) > 0, nil
		case lifecycle.ContainerExited, lifecycle.ContainerDead:
			return true, nil
		}
		return false, nil
	})
	if err != nil && ctx.Err() != nil {
		err = r.serviceNotReady(id, err)
	}
	return c, err
}

// imageProblem reports an app container waiting for an image it cannot
// have, as ErrImageNotFound.
func imageProblem(pod *corev1.Pod) error {
	for _, s := range pod.Status.ContainerStatuses {
		if w := s.State.Waiting; w != nil {
			switch w.Reason {
			case "ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff", "InvalidImageName":
				return fmt.Errorf("%w: pod %s: %s: %s", lifecycle.ErrImageNotFound, pod.Name, w.Reason, w.Message)
			}
		}
	}
	return nil
}

// Stop implements lifecycle.Runtime: the pod is deleted (its app gets the
// grace period) and gone when Stop returns; the claim, and the pod it
// keeps, stay.
func (r *Runtime) Stop(ctx context.Context, id string) error {
	if err := r.ready(); err != nil {
		return err
	}
	pod, err := r.pods.Get(PodName(id))
	if apierrors.IsNotFound(err) {
		if _, err := r.Inspect(ctx, id); err != nil {
			return fmt.Errorf("stopping sandbox %s: %w", id, err)
		}
		return nil // stopped already
	}
	if err != nil {
		return classify("reading pod "+PodName(id), err, lifecycle.ErrContainerNotFound)
	}
	if pod.DeletionTimestamp == nil {
		if err := r.deletePod(ctx, id, pod); err != nil {
			return err
		}
	}
	return r.waitPodGone(ctx, id)
}

// deletePod deletes pod, sandbox id's, when this instance owns it (the
// cache selects the instance's label only: a pod of that name without
// sandwake's labels, or of another id, is refused untouched), and that
// very pod: its UID is a precondition.
func (r *Runtime) deletePod(ctx context.Context, id string, pod *corev1.Pod) error {
	if !r.owns(id, pod.Labels) {
		return notOurs("pod", pod.Name, pod.Labels, lifecycle.ErrIDTaken)
	}
	grace := int64(r.opts.StopTimeout.Seconds())
	err := r.cs.CoreV1().Pods(r.opts.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &grace,
		Preconditions:      &metav1.Preconditions{UID: &pod.UID},
	})
	if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil // gone, or another pod already (the wait sees it)
	}
	return classify("deleting pod "+pod.Name, err, lifecycle.ErrContainerNotFound)
}

// waitPodGone waits, within ctx and the grace period and a margin, for
// sandbox id's pod to leave the cache.
func (r *Runtime) waitPodGone(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, r.opts.StopTimeout+30*time.Second)
	defer cancel()
	return r.waitFor(ctx, id, "pod "+PodName(id)+" to be gone", func() (bool, error) {
		_, err := r.pods.Get(PodName(id))
		return apierrors.IsNotFound(err), nil
	})
}

// Remove implements lifecycle.Runtime: the pod goes, then its
// NetworkPolicy, and the claim keeps no pod, so the sandbox has no
// container; the claim (the workspace) stays. A sandbox without them is
// not an error.
func (r *Runtime) Remove(ctx context.Context, id string) error {
	if err := r.ready(); err != nil {
		return err
	}
	if pod, err := r.pods.Get(PodName(id)); err == nil {
		if pod.DeletionTimestamp == nil {
			if err := r.deletePod(ctx, id, pod); err != nil {
				return err
			}
		}
		if err := r.waitPodGone(ctx, id); err != nil {
			return err
		}
	}
	// The pod is gone: its policy goes too (a create makes it again). The
	// API server, not the cache, says so: a pod made by a start whose
	// answer was lost may not have reached the cache yet, and must not run
	// without its policy.
	if live, err := r.cs.CoreV1().Pods(r.opts.Namespace).Get(ctx, PodName(id), metav1.GetOptions{}); err == nil {
		if r.owns(id, live.Labels) {
			if live.DeletionTimestamp == nil {
				if err := r.deletePod(ctx, id, live); err != nil {
					return err
				}
			}
			if err := r.waitPodGone(ctx, id); err != nil {
				return err
			}
		}
	} else if !apierrors.IsNotFound(err) {
		return classify("reading pod "+PodName(id), err, lifecycle.ErrContainerNotFound)
	}
	if err := r.deletePolicy(ctx, id); err != nil {
		return err
	}
	claims := r.cs.CoreV1().PersistentVolumeClaims(r.opts.Namespace)
	var uid types.UID
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c, err := claims.Get(ctx, ClaimName(id), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if !r.owns(id, c.Labels) {
			return nil // not ours: left alone
		}
		if _, ok := c.Annotations[AnnotationPod]; !ok {
			return nil
		}
		c = c.DeepCopy()
		delete(c.Annotations, AnnotationPod)
		updated, err := claims.Update(ctx, c, metav1.UpdateOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err == nil {
			uid = updated.UID
		}
		return err
	})
	if err == nil && uid != "" {
		// Inspect, from the cache, must say the container is gone.
		err = r.waitClaimSeen(ctx, id, func(c *corev1.PersistentVolumeClaim) bool {
			_, kept := c.Annotations[AnnotationPod]
			return c.UID != uid || !kept
		})
	}
	return classify("removing the pod kept on claim "+ClaimName(id), err, lifecycle.ErrContainerNotFound)
}

// RemoveVolume implements lifecycle.Runtime: the services' claims, then
// the app's, are deleted (what their volumes then become is their storage
// class's reclaim policy). The app's goes last, as on Docker: it is what a
// create asks whose the id's past is, so a purge cut short leaves it. The
// bytes freed are not known to the API: 0 is reported. A claim that is not
// this instance's wraps ErrNotFound and is left alone.
func (r *Runtime) RemoveVolume(ctx context.Context, id string) (int64, error) {
	claims := r.cs.CoreV1().PersistentVolumeClaims(r.opts.Namespace)
	c, err := claims.Get(ctx, ClaimName(id), metav1.GetOptions{})
	appGone := apierrors.IsNotFound(err)
	if err != nil && !appGone {
		return 0, classify("reading claim "+ClaimName(id), err, lifecycle.ErrNotFound)
	}
	if !appGone && !r.owns(id, c.Labels) {
		return 0, notOurs("claim", ClaimName(id), c.Labels, lifecycle.ErrNotFound)
	}
	// With the app's claim gone (a purge cut short) the services' still go.
	if n, serr := r.removeServiceClaims(ctx, id); serr != nil || appGone {
		if serr == nil && n == 0 {
			serr = classify("reading claim "+ClaimName(id), err, lifecycle.ErrNotFound)
		}
		return 0, serr
	}
	err = claims.Delete(ctx, c.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &c.UID}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return 0, fmt.Errorf("removing claim %s: %w: deleted meanwhile", c.Name, lifecycle.ErrNotFound)
	}
	return 0, classify("removing claim "+c.Name, err, lifecycle.ErrNotFound)
}

// Inspect implements lifecycle.Runtime from the informers' cache: the pod
// while there is one, else the claim's kept pod as an exited container.
func (r *Runtime) Inspect(ctx context.Context, id string) (lifecycle.Container, error) {
	if err := r.ready(); err != nil {
		return lifecycle.Container{}, err
	}
	if pod, err := r.pods.Get(PodName(id)); err == nil && r.owns(id, pod.Labels) {
		return r.fromPod(id, pod), nil
	}
	claim, err := r.claims.Get(ClaimName(id))
	if err == nil && r.owns(id, claim.Labels) {
		if _, kept := claim.Annotations[AnnotationPod]; kept {
			return stoppedFrom(id, claim), nil
		}
	}
	return lifecycle.Container{}, fmt.Errorf("inspecting sandbox %s: %w", id, lifecycle.ErrContainerNotFound)
}

// stoppedFrom is the container of a sandbox that runs no pod.
func stoppedFrom(id string, claim *corev1.PersistentVolumeClaim) lifecycle.Container {
	return lifecycle.Container{ID: string(claim.UID), SandboxID: id, State: lifecycle.ContainerExited}
}

// fromPod reads a pod as the container the Manager knows: a pod being
// deleted is exited already (nothing may be sent to it), a pending one
// created, a finished one exited with its app's exit.
func (r *Runtime) fromPod(id string, pod *corev1.Pod) lifecycle.Container {
	c := lifecycle.Container{ID: string(pod.UID), SandboxID: id, Pool: pod.Annotations[AnnotationPool], PoolKey: pod.Annotations[AnnotationPoolKey]}
	var st *corev1.ContainerStatus
	for i := range pod.Status.ContainerStatuses {
		if pod.Status.ContainerStatuses[i].Name == appContainer {
			st = &pod.Status.ContainerStatuses[i]
		}
	}
	if st != nil {
		if s := st.State.Running; s != nil {
			c.StartedAt = s.StartedAt.Time
		}
		if s := st.State.Terminated; s != nil {
			c.ExitCode = int(s.ExitCode)
			c.OOMKilled = s.Reason == "OOMKilled"
			c.StartedAt, c.FinishedAt = s.StartedAt.Time, s.FinishedAt.Time
		}
	}
	switch {
	case pod.DeletionTimestamp != nil:
		c.State = lifecycle.ContainerExited
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		c.State = lifecycle.ContainerExited
	case pod.Status.Phase == corev1.PodUnknown:
		c.State = lifecycle.ContainerDead
	case st != nil && st.State.Terminated != nil:
		c.State = lifecycle.ContainerExited
	case pod.Status.Phase == corev1.PodRunning && st != nil && st.State.Running != nil && paused(pod):
		c.State = lifecycle.ContainerPaused // its CPU cut (pause.go)
	case pod.Status.Phase == corev1.PodRunning && st != nil && st.State.Running != nil:
		c.State = lifecycle.ContainerRunning
	default:
		c.State = lifecycle.ContainerCreated
	}
	serviceStates(pod, &c)
	if c.State == lifecycle.ContainerRunning {
		c.Upstreams = upstreams(pod)
	}
	return c
}

// upstreams are the pod's address at each declared port.
func upstreams(pod *corev1.Pod) map[int]string {
	ip, err := netip.ParseAddr(pod.Status.PodIP)
	if err != nil {
		return nil
	}
	ups := map[int]string{}
	for _, ctr := range pod.Spec.Containers {
		if ctr.Name != appContainer {
			continue
		}
		for _, p := range ctr.Ports {
			ups[int(p.ContainerPort)] = netip.AddrPortFrom(ip, uint16(p.ContainerPort)).String()
		}
	}
	return ups
}

// List implements lifecycle.Runtime from the cache: every sandbox of the
// instance with a pod or a kept pod.
func (r *Runtime) List(ctx context.Context) ([]lifecycle.Container, error) {
	if err := r.ready(); err != nil {
		return nil, err
	}
	pods, err := r.pods.List(everything)
	if err != nil {
		return nil, classify("listing pods", err, lifecycle.ErrContainerNotFound)
	}
	claims, err := r.claims.List(everything)
	if err != nil {
		return nil, classify("listing claims", err, lifecycle.ErrContainerNotFound)
	}
	out := make([]lifecycle.Container, 0, len(claims))
	seen := make(map[string]bool, len(pods))
	for _, p := range pods {
		id := p.Labels[LabelID]
		if !r.owns(id, p.Labels) || p.Name != PodName(id) {
			continue
		}
		seen[id] = true
		out = append(out, r.fromPod(id, p))
	}
	for _, c := range claims {
		id := c.Labels[LabelID]
		if seen[id] || !r.owns(id, c.Labels) || c.Name != ClaimName(id) {
			continue
		}
		if _, kept := c.Annotations[AnnotationPod]; kept {
			out = append(out, stoppedFrom(id, c))
		}
	}
	return out, nil
}

// Ping implements lifecycle.Runtime: the API server answers.
func (r *Runtime) Ping(ctx context.Context) error {
	res := r.cs.Discovery().RESTClient()
	if res == nil { // the fake clientset has none
		_, err := r.cs.Discovery().ServerVersion()
		return classify("pinging the kubernetes API server", err, lifecycle.ErrUnavailable)
	}
	err := res.Get().AbsPath("/readyz").Do(ctx).Error()
	return classify("pinging the kubernetes API server", err, lifecycle.ErrUnavailable)
}

// Direct implements lifecycle.DirectUpstreams: the gateway dials pod
// addresses, and a TCP accept there means the app listens.
func (r *Runtime) Direct() bool { return true }

// isTransient tells API failures worth retrying from answers about the
// sandbox.
func isTransient(err error) bool {
	var netErr net.Error
	return apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
		apierrors.IsTooManyRequests(err) || apierrors.IsServiceUnavailable(err) ||
		apierrors.IsInternalError(err) || apierrors.IsUnexpectedServerError(err) ||
		errors.Is(err, context.DeadlineExceeded) || errors.As(err, &netErr)
}

// classify wraps an API error with what was being done and the lifecycle
// sentinel that decides what the Manager does next.
func classify(doing string, err, notFound error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, lifecycle.ErrUnavailable), errors.Is(err, lifecycle.ErrIDTaken):
		return fmt.Errorf("%s: %w", doing, err)
	case isTransient(err):
		return fmt.Errorf("%s: %w: %w", doing, lifecycle.ErrUnavailable, lifecycle.EngineFailure(err))
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%s: %w: %w", doing, notFound, lifecycle.EngineFailure(err))
	default:
		return fmt.Errorf("%s: %w", doing, lifecycle.EngineFailure(err))
	}
}

// Interface guards.
var (
	_ lifecycle.Runtime         = (*Runtime)(nil)
	_ lifecycle.EventSource     = (*Runtime)(nil)
	_ lifecycle.Pauser          = (*Runtime)(nil)
	_ lifecycle.DirectUpstreams = (*Runtime)(nil)
	_ lifecycle.VolumeInspector = (*Runtime)(nil)
)
