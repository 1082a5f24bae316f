package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"golang.org/x/sync/singleflight"
)

// Config holds the Manager's settings. Zero values take the defaults.
type Config struct {
	// WakeTimeout bounds one wake (start + readiness). Default: 60s.
	WakeTimeout time.Duration
	// MaxResident caps running + paused sandboxes; 0 means no cap.
	MaxResident int
	// KeepaliveMax caps one keepalive. Default: 24h.
	KeepaliveMax time.Duration
	// CloseTimeout bounds how long Close waits for the work in flight it
	// cancelled (a wake, a pool fill, a webhook delivery stuck in a call
	// that ignores cancellation); past it Close returns ErrCloseTimeout
	// naming what still runs. Default: DefaultCloseTimeout.
	CloseTimeout time.Duration
	// Now is the clock. Default: time.Now.
	Now func() time.Time
	// Logger receives transition logs. Default: none.
	Logger *zap.Logger
	// ActivityFlush is how often in-memory activity is written to the store
	// in one batch; 0 turns the loop off (FlushActivity can still be
	// called). Default: off.
	ActivityFlush time.Duration

	// IdlePause: a running sandbox idle this long is paused; 0 = never.
	IdlePause time.Duration
	// Activity is the activity of a sandbox whose spec names none:
	// ActivityInbound (default) or ActivityAny.
	Activity string
	// ActiveMax bounds how long a sandbox under ActivityAny is kept
	// from idle pause and stop by its outbound work alone, counted from
	// its last preview request. Default: DefaultActiveMax.
	ActiveMax time.Duration
	// IdleStop: a running or paused sandbox idle this long is stopped;
	// 0 = never.
	IdleStop time.Duration
	// MaxLifetime: a sandbox this old is expired (container removed, volume
	// kept); 0 = never.
	MaxLifetime time.Duration
	// ExpiredWake is what a wake of an expired sandbox does: "recreate"
	// (default) or "refuse".
	ExpiredWake string
	// ReapInterval is how often the reaper (idle tiers, expiry, pressure)
	// runs; 0 turns the loop off (ReapOnce can still be called).
	ReapInterval time.Duration
	// MinResident: a sandbox active (or woken) this recently is not evicted
	// to make room for another (memory pressure excepted); 0 = no minimum.
	MinResident time.Duration
	// CapacityWait is how long a wake waits for room when every resident
	// sandbox is in use, before failing with ErrCapacity; 0 = no wait.
	CapacityWait time.Duration
	// MinFreeMemory is the host memory (bytes) to keep available; below
	// it, idle sandboxes are stopped and wakes evict first. 0 = no check.
	MinFreeMemory uint64
	// MemAvailable reports the host's available memory in bytes. Default:
	// HostMemAvailable.
	MemAvailable func() (uint64, error)

	// ReconcileInterval is how often the store is compared with the engine
	// in full; 0 turns the loop off (Reconcile can still be called).
	ReconcileInterval time.Duration
	// WatchEvents follows the engine's event stream (EventSource runtimes)
	// and reconciles each sandbox the moment its container changes.
	WatchEvents bool
	// OrphansRemove removes containers labelled as sandwake's that have no
	// record; otherwise they are only counted and logged.
	OrphansRemove bool
	// OnReconcile, when set, is called with every correction made.
	OnReconcile func(Correction)

	// Hooks. They are part of the configuration, not set afterwards, so
	// that the loops Start begins never race with their registration.
	//
	// OnEvent, when set, is called synchronously with every committed
	// event, in id order, before subscribers see it. It must be quick and
	// must not call the manager or the store (it runs under the store's
	// write lock).
	OnEvent func(Event)
	// OnChange, when set, is called with a sandbox's id whenever its record
	// changes: every event (as OnEvent) and every change without an event
	// (settings, token generation). Caches use it.
	OnChange func(id string)
	// OnWake, when set, is called after every wake that touched the engine
	// (not for sandboxes already running).
	OnWake func(WakeResult)
	// OnReap, when set, is called after every reaper pass of the loop.
	OnReap func(ReapStats)
	// OnDelivery, when set, is called after every webhook delivery attempt.
	OnDelivery func(DeliveryResult)
	// EventRetention: events older than this are pruned from the log by
	// the reaper loop; 0 keeps them forever.
	EventRetention time.Duration

	// DefaultMemoryMB is the memory limit of a sandbox whose spec gives
	// none; 0 leaves such sandboxes without a limit.
	DefaultMemoryMB int64
	// HostCPUs is the engine host's CPU count: a spec asking for more is
	// refused. 0: not known (only MaxCPUs bounds it).
	HostCPUs int
	// HostMemoryMB is the engine host's memory: a spec asking for more is
	// refused. 0: not known (only MaxMemoryMB bounds it).
	HostMemoryMB int64
	// AllowedImages, when not empty, are the image patterns creates may use
	// (path.Match globs on the reference as given and as normalised, e.g.
	// "registry.example.com/previews/*", "node:*").
	AllowedImages []string
	// Isolation holds the defaults of a sandbox's user, read-only root,
	// runtime, CPU limit and disk quota, and the engine's runtimes.
	Isolation Isolation
	// DiskInterval is how often the disk watchdog measures the running and
	// paused sandboxes that have a disk quota (the runtime must be a
	// DiskMeter). Default: 30s; negative turns it off.
	DiskInterval time.Duration
	// OnDiskQuota is called when the watchdog stops a sandbox over its
	// quota, with what it used and its quota, in bytes.
	OnDiskQuota func(id string, used, quota int64)
	// StoreRetry is how often a store that refused to record an engine
	// change is checked again; once it takes writes, each such sandbox is
	// reconciled. Default: 1s.
	StoreRetry time.Duration

	// Egress is the operator's egress settings: the default policy and
	// what allow entries may open.
	Egress EgressConfig
	// Templates are the named sandbox shapes creates may use, each with
	// its warm pool.
	Templates []Template
	// PoolMemoryMaxMB caps the memory (the memory_mb of their templates)
	// the warm pools' idle containers may hold together; 0: no cap.
	PoolMemoryMaxMB int64
	// PoolInterval is how often the pool refill looks at the pools when
	// nothing nudges it. Default: DefaultPoolInterval.
	PoolInterval time.Duration
	// OnPoolClaim, when set, is called after every create from a
	// template: whether it claimed a pool container, the reason when not,
	// and how long the claim took (hits).
	OnPoolClaim func(template string, out PoolOutcome, took time.Duration)

	// Firewall enforces egress policies; nil runs sandboxes without one
	// (egress unenforced). With a firewall, a sandbox whose rules cannot
	// be installed does not start (ErrEgressUnenforced).
	Firewall Firewall
}

func (c *Config) setDefaults() {
	if c.PoolInterval <= 0 {
		c.PoolInterval = DefaultPoolInterval
	}
	if c.WakeTimeout <= 0 {
		c.WakeTimeout = DefaultWakeTimeout
	}
	if c.KeepaliveMax <= 0 {
		c.KeepaliveMax = DefaultKeepaliveMax
	}
	if c.ActiveMax <= 0 {
		c.ActiveMax = DefaultActiveMax
	}
	if c.Activity == "" {
		c.Activity = ActivityInbound
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.ExpiredWake == "" {
		c.ExpiredWake = ExpiredWakeRecreate
	}
	if c.MemAvailable == nil {
		c.MemAvailable = HostMemAvailable
	}
	if c.StoreRetry <= 0 {
		c.StoreRetry = DefaultStoreRetry
	}
	if c.DiskInterval == 0 {
		c.DiskInterval = DefaultDiskInterval
	}
}

// What a wake of an expired sandbox does.
const (
	ExpiredWakeRecreate = "recreate"
	ExpiredWakeRefuse   = "refuse"
)

// Manager creates, wakes, pauses, stops and removes sandboxes, keeping the
// store and the container engine in step. All methods are safe for
// concurrent use; operations on one sandbox are serialised.
type Manager struct {
	store   Store
	runtime Runtime // the engine behind the circuit breaker
	raw     Runtime // the engine as given
	breaker *breaker
	disk    diskUsage
	cfg     Config
	log     *zap.Logger

	locks idLocks
	wakes singleflight.Group
	// events queues the sandboxes engine events name, for the workers that
	// reconcile them.
	events *workQueue
	// built is the configuration as built: its hook functions are read
	// without a lock (they never change), unlike cfg, which Reconfigure
	// changes under mu.
	built    Config
	bus      bus
	activity activities
	flushMu  sync.Mutex
	// learnPending are the learned lists of sandboxes under learn that
	// the next activity flush writes (under flushMu; see takeLearning).
	learnPending map[string][]string

	// ctx is the parent of every wake and create: it outlives the requests
	// that trigger them and ends only at Close.
	ctx    context.Context
	cancel context.CancelFunc
	// tasks are the goroutines doing the manager's work (Close waits
	// for them, within CloseTimeout).
	tasks tasks

	mu       sync.Mutex
	closed   bool
	states   map[string]State // every sandbox's current state, mirrored from the store
	resident int              // running + paused, from states
	// residents are the ids of those sandboxes: the loops that only act on
	// running and paused sandboxes (idle tiers, pressure, disk) read their
	// records alone, not the whole store.
	residents map[string]struct{}
	// directAdopted: the running sandboxes made with published ports were
	// moved to their own addresses (see adoptDirect).
	directAdopted atomic.Bool
	// pauseCollapsed logs, once, that idle_pause stops sandboxes on a
	// runtime that cannot pause (see canPause).
	pauseCollapsed sync.Once
	// reapPasses counts the reaper loop's passes (see reapPass).
	reapPasses int
	reserved   int // admissions granted to wakes and creates in flight
	waking     map[string]time.Time
	cards      cards
	// lastWakes are the phases of each sandbox's last wake (LastWake).
	lastWakes map[string]WakePhases
	// wakeSpans holds the span of each traced wake's leader while its
	// flight runs, for the spans of requests that join it to link to.
	wakeSpans map[string]trace.SpanContext
	room      chan struct{} // closed when a resident place is freed; see roomFreed

	started bool

	webhookState

	memoryRelief bool      // memory pressure seen: relieve with hysteresis
	reconciledAt time.Time // last successful full reconcile

	unrecorded unrecorded // engine changes the store refused to record

	netMu sync.Mutex
	net   *SandboxNet // the sandbox network once made and its firewall set up
	// fwMu orders record+entry changes (shared) against SyncFirewall
	// (exclusive); see firewallShared.
	fwMu sync.RWMutex
	// addrs maps each address held by a sandbox (from create to destroy)
	// to its id; under mu.
	addrs map[netip.Addr]string
	// pool is the templates' warm pools.
	pool *pool
	// denied holds each sandbox's refused packets as last read from the
	// firewall, deniedGone those of sandboxes since removed; under mu.
	denied     map[string]uint64
	deniedGone uint64
	deniedAt   time.Time
}

// NewManager returns a Manager over an open store and a runtime, complete
// with its hooks (Config). It reads every record once to know the resident
// count, and starts nothing: Start begins the loops.
func NewManager(st Store, rt Runtime, cfg Config) (*Manager, error) {
	cfg.setDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	br := &breaker{rt: rt, now: cfg.Now, log: cfg.Logger}
	m := &Manager{
		store:     st,
		runtime:   br,
		raw:       rt,
		breaker:   br,
		cfg:       cfg,
		log:       cfg.Logger,
		ctx:       ctx,
		cancel:    cancel,
		states:    make(map[string]State),
		residents: make(map[string]struct{}),
		addrs:     make(map[netip.Addr]string),
		events:    newWorkQueue(),
		built:     cfg,
		pool:      newPool(),
	}
	m.pool.egress = m.effectiveEgress
	if o, ok := cfg.Firewall.(EgressObserver); ok {
		o.OnDenied(m.egressDenied)
	}
	m.pool.setTemplates(cfg.Templates, false)
	m.activity.clock = cfg.Now
	recs, err := st.List(nil)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("loading sandboxes: %w", err)
	}
	for i := range recs {
		m.setState(recs[i].ID, recs[i].State)
		if a := recs[i].Address; a.IsValid() {
			m.addrs[a] = recs[i].ID
		}
	}
	st.OnCommit(m.publish)
	st.SetOutboxTargets(m.webhookTargets)
	return m, nil
}

// Start begins the manager's loops: activity flush, reaper, periodic
// reconcile and, with WatchEvents, the engine's event stream and the
// workers that reconcile what it reports. Later calls do nothing; after
// Close it fails with ErrClosed.
func (m *Manager) Start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	if m.started {
		return nil
	}
	m.started = true
	cfg := m.cfg
	m.every("activity flush", cfg.ActivityFlush, m.flushActivityLogged, true)
	m.every("reaper", cfg.ReapInterval, m.reapPass, false)
	m.every("periodic reconcile", cfg.ReconcileInterval, m.reconcilePass, false)
	m.goTask("pool refill loop", func() { m.runPool(cfg.PoolInterval) })
	if _, ok := m.raw.(DiskMeter); ok {
		m.every("disk check", cfg.DiskInterval, m.diskPass, false)
	}
	if src, ok := m.raw.(EventSource); ok && cfg.WatchEvents {
		m.goTask("engine events", func() { m.runEvents(src) })
		for range eventWorkers {
			m.goTask("engine event reconcile", m.runEventWorker)
		}
	}
	if src, ok := m.raw.(NetworkEventSource); ok && cfg.WatchEvents {
		m.goTask("engine network events", func() { m.runNetworkEvents(src) })
	}
	return nil
}

// Close cancels wakes and creates in flight, waits for them and ends every
// subscription, and stops the firewall's services (its DNS forwarder) when
// it has any. It does not close the store or the runtime.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.mu.Unlock()
	m.cancel()
	m.events.close()
	bound := m.cfg.CloseTimeout
	if bound <= 0 {
		bound = DefaultCloseTimeout
	}
	ended := m.tasks.wait(time.Second, bound, func(names string) {
		m.log.Info("stopping: waiting for work in flight (at most "+bound.String()+")", zap.String("waiting_for", names))
	})
	m.bus.closeAll()
	if c, ok := m.built.Firewall.(io.Closer); ok {
		// The forwarder and the log reader; the kernel's rules stay.
		if err := c.Close(); err != nil {
			m.log.Warn("stopping the egress firewall's services", zap.Error(err))
		}
	}
	if !ended {
		names := m.tasks.names()
		m.log.Error("stopped without waiting any longer for work in flight", zap.Duration("waited", bound), zap.String("still_running", names))
		return fmt.Errorf("%w: after %s still running: %s", ErrCloseTimeout, bound, names)
	}
	return nil
}

// goTask runs fn in a goroutine Close waits for, named what.
func (m *Manager) goTask(what string, fn func()) {
	done := m.tasks.add(what)
	go func() {
		defer done()
		fn()
	}()
}

// every runs fn every interval (nothing when interval <= 0) in a goroutine
// the manager owns, until it closes; with atClose, once more on the way out.
func (m *Manager) every(what string, interval time.Duration, fn func(), atClose bool) {
	if interval <= 0 {
		return
	}
	m.goTask(what, func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-m.ctx.Done():
				if atClose {
					fn()
				}
				return
			case <-t.C:
				fn()
			}
		}
	})
}

// track registers a goroutine doing work for the manager, so Close waits for
// it; it fails once the manager is closed.
func (m *Manager) track(what string) (done func(), err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	return m.tasks.add(what), nil
}

// Runtime returns the container engine the manager drives.
func (m *Manager) Runtime() Runtime { return m.raw }

// Ping checks the engine through the circuit breaker (a success closes it).
func (m *Manager) Ping(ctx context.Context) error { return m.runtime.Ping(ctx) }

// Now returns the manager's clock reading.
func (m *Manager) Now() time.Time { return m.cfg.Now() }

func (m *Manager) changed(id string) {
	if fn := m.built.OnChange; fn != nil {
		fn(id)
	}
}

func (m *Manager) publish(ev Event) {
	m.changed(ev.SandboxID)
	if fn := m.built.OnEvent; fn != nil {
		fn(ev)
	}
	m.bus.publish(ev)
	m.nudgeWebhooks()
}

// Settings are the values a config reload may change on a running manager.
type Settings struct {
	WakeTimeout  time.Duration
	KeepaliveMax time.Duration
	MaxResident  int
	IdlePause    time.Duration
	IdleStop     time.Duration
	MaxLifetime  time.Duration
	ExpiredWake  string
	// Activity and ActiveMax: see Config; zero values keep c's.
	Activity      string
	ActiveMax     time.Duration
	MinFreeMemory uint64
	MinResident   time.Duration
	CapacityWait  time.Duration
	// EventRetention: 0 keeps the current value.
	EventRetention time.Duration
	// Isolation: the defaults for new sandboxes; its Runtimes are the
	// engine's and kept.
	Isolation Isolation
	// Templates and PoolMemoryMaxMB: see Config.
	Templates       []Template
	PoolMemoryMaxMB int64
}

// Apply copies the reloadable settings s into c; zero WakeTimeout,
// KeepaliveMax and EventRetention and an empty ExpiredWake keep c's (at
// construction: the defaults NewManager fills in).
func (c *Config) Apply(s Settings) {
	if s.WakeTimeout > 0 {
		c.WakeTimeout = s.WakeTimeout
	}
	if s.KeepaliveMax > 0 {
		c.KeepaliveMax = s.KeepaliveMax
	}
	if s.ExpiredWake != "" {
		c.ExpiredWake = s.ExpiredWake
	}
	c.MaxResident = s.MaxResident
	c.IdlePause = s.IdlePause
	c.IdleStop = s.IdleStop
	if s.Activity != "" {
		c.Activity = s.Activity
	}
	if s.ActiveMax > 0 {
		c.ActiveMax = s.ActiveMax
	}
	c.MaxLifetime = s.MaxLifetime
	c.MinFreeMemory = s.MinFreeMemory
	c.MinResident = s.MinResident
	c.CapacityWait = s.CapacityWait
	if s.EventRetention > 0 {
		c.EventRetention = s.EventRetention
	}
	c.Templates = s.Templates
	c.PoolMemoryMaxMB = s.PoolMemoryMaxMB
	runtimes := c.Isolation.Runtimes
	c.Isolation = s.Isolation
	c.Isolation.Runtimes = runtimes
}

// Reconfigure applies new settings (see Config.Apply).
func (m *Manager) Reconfigure(s Settings) {
	// The pools first: their shapes are worked out again (the defaults
	// that fill a template in may have changed) before a create can read
	// the new templates, so that none claims a container of another shape.
	m.pool.setTemplates(s.Templates, true)
	m.mu.Lock()
	m.cfg.Apply(s)
	m.mu.Unlock()
}

// config returns a copy of the current configuration.
func (m *Manager) config() Config {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cfg
}

// limits reads the settings Reconfigure changes that wakes use.
func (m *Manager) limits() (wakeTimeout, keepaliveMax time.Duration) {
	c := m.config()
	return c.WakeTimeout, c.KeepaliveMax
}

// Subscribe returns a subscription to every event committed from now on.
func (m *Manager) Subscribe() *Subscription { return m.bus.subscribe() }

// setState mirrors a sandbox's state (to == "" when it is gone) and keeps the
// resident count. Callers hold no lock.
func (m *Manager) setState(id string, to State) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if from, ok := m.states[id]; ok && Resident(from) {
		m.resident--
		delete(m.residents, id)
		// Room is freed only by leaving residency (running → paused
		// is not room): a wake waiting for room is woken only for it.
		if !Resident(to) {
			m.freeRoomLocked()
		}
	}
	if to == "" {
		delete(m.states, id)
		m.forgetCards(id)
		// A sandbox made again under the id starts a denial window of its
		// own: the gone one's budget and destinations are not carried over.
		if o, ok := m.built.Firewall.(EgressObserver); ok {
			o.ForgetDenials(id)
		}
		return
	}
	m.states[id] = to
	if Resident(to) {
		m.resident++
		m.residents[id] = struct{}{}
	}
}

// residentRecords returns the records of the running and paused sandboxes
// that keep: a read of each, not a scan of the store. A sandbox that left
// residency or was deleted since the ids were taken is left out if its
// record says so (keep sees the record as stored).
func (m *Manager) residentRecords(keep func(*Record) bool) ([]Record, error) {
	m.mu.Lock()
	ids := make([]string, 0, len(m.residents))
	for id := range m.residents {
		ids = append(ids, id)
	}
	m.mu.Unlock()
	slices.Sort(ids)
	var out []Record
	for _, id := range ids {
		r, err := m.store.Get(id)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if keep == nil || keep(&r) {
			out = append(out, r)
		}
	}
	return out, nil
}

// Counts returns how many sandboxes are in each state.
func (m *Manager) Counts() map[State]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[State]int, len(States))
	for _, s := range m.states {
		out[s]++
	}
	return out
}

// Resident returns how many sandboxes hold memory (running + paused) and how
// many admissions are reserved by wakes in flight.
func (m *Manager) Resident() (resident, reserved int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.resident, m.reserved
}

// transition moves id to state to through the store (compare-and-set against
// the transition table), mirrors the new state and logs it.
func (m *Manager) transition(id string, to State, reason string, mutate func(*Record) error) (Record, error) {
	var since time.Time
	rec, ev, err := m.store.Transition(id, AllowedFrom(to), to, reason, func(r *Record) error {
		since = r.StateSince
		if mutate != nil {
			return mutate(r)
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, ErrStoreUnavailable) {
			// The engine may have changed already: re-read it once the
			// store takes writes again.
			m.markUnrecorded(id)
		}
		return Record{}, err
	}
	m.setState(id, to)
	m.log.Info("sandbox transition",
		zap.String("id", id), zap.String("from", string(ev.From)), zap.String("to", string(to)),
		zap.String("reason", reason), zap.Duration("after", ev.At.Sub(since)))
	return rec, nil
}

// asciiLower lowercases ASCII letters only.
func asciiLower(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if b[j] >= 'A' && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

// Get returns the record of sandbox id.
func (m *Manager) Get(id string) (Record, error) { return m.store.Get(id) }

// List returns the sandboxes in state (all when state is "").
func (m *Manager) List(state State) ([]Record, error) {
	if state != "" && !ValidState(state) {
		return nil, invalid("state %q is not one of %v", state, States)
	}
	return m.store.List(func(r *Record) bool { return state == "" || r.State == state })
}

// MaxPageLimit bounds a page of ListPage.
const MaxPageLimit = 1000

// PageOptions select a page of sandboxes.
type PageOptions struct {
	// After is the cursor: the page starts past this id ("" : at the
	// first). Ids only grow in order (ULIDs, or the caller's), so a sandbox
	// created or destroyed meanwhile never puts another on two pages.
	After string
	// Limit is the most records of the page (1 to MaxPageLimit).
	Limit int
	// State and Labels filter (a record must carry every label).
	State  State
	Labels map[string]string
	// Keep, when set, filters further (a tenant's visibility).
	Keep func(*Record) bool
}

// ListPage returns a page of sandboxes in id order and the cursor of the
// next page ("" on the last).
func (m *Manager) ListPage(o PageOptions) ([]Record, string, error) {
	if o.State != "" && !ValidState(o.State) {
		return nil, "", invalid("state %q is not one of %v", o.State, States)
	}
	if o.Limit < 1 || o.Limit > MaxPageLimit {
		return nil, "", invalid("limit: %d is not between 1 and %d", o.Limit, MaxPageLimit)
	}
	if o.After != "" && !ValidID(o.After) {
		return nil, "", invalid("cursor %q is not one this API gave", o.After)
	}
	keep := func(r *Record) bool {
		if o.State != "" && r.State != o.State {
			return false
		}
		return HasLabels(r.Spec.Labels, o.Labels) && (o.Keep == nil || o.Keep(r))
	}
	recs, err := m.store.Page(o.After, o.Limit+1, keep)
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(recs) > o.Limit {
		recs = recs[:o.Limit]
		next = recs[len(recs)-1].ID
	}
	return recs, next, nil
}

// History returns the events of sandbox id, oldest first.
func (m *Manager) History(id string) ([]Event, error) { return m.store.History(id) }

// LastEventID returns the id of the newest event in the log (0: none).
func (m *Manager) LastEventID() (uint64, error) { return m.store.LastEventID() }

// EventsAfter returns up to limit events with ids above after, oldest first:
// how a reader resumes the event stream from the log.
func (m *Manager) EventsAfter(after uint64, limit int) ([]Event, error) {
	return m.store.EventsAfter(after, limit)
}

// CheckStore reports whether the store takes writes (see store.Check): nil,
// or an error naming the store and what is wrong.
func (m *Manager) CheckStore() error { return m.store.Check() }

// errInUse: a pause or stop that yields to traffic backed off because a
// request was registered first.
var errInUse = errors.New("in use")
