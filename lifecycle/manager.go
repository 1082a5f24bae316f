// Package lifecycle is sandwake's engine: the sandbox state machine, waking,
// admission and (later) the background loops. It owns no container engine of
// its own (see Runtime) and imports nothing of Caddy.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/singleflight"

	"github.com/sandwake/sandwake/store"
)

// Config holds the Manager's settings. Zero values take the defaults.
type Config struct {
	// WakeTimeout bounds one wake (start + readiness). Default: 60s.
	WakeTimeout time.Duration
	// MaxResident caps running + paused sandboxes; 0 means no cap.
	MaxResident int
	// KeepaliveMax caps one keepalive. Default: 24h.
	KeepaliveMax time.Duration
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
	// StoreRetry is how often a store that refused to record an engine
	// change is checked again; once it takes writes, each such sandbox is
	// reconciled. Default: 1s.
	StoreRetry time.Duration
}

func (c *Config) setDefaults() {
	if c.WakeTimeout <= 0 {
		c.WakeTimeout = 60 * time.Second
	}
	if c.KeepaliveMax <= 0 {
		c.KeepaliveMax = 24 * time.Hour
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
		c.StoreRetry = time.Second
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
	store   *store.Store
	runtime Runtime // the engine behind the circuit breaker
	raw     Runtime // the engine as given
	breaker *breaker
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

	// ctx is the parent of every wake and create: it outlives the requests
	// that trigger them and ends only at Close.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	closed   bool
	states   map[string]State // every sandbox's current state, mirrored from the store
	resident int              // running + paused, from states
	reserved int              // admissions granted to wakes and creates in flight
	waking   map[string]time.Time
	room     chan struct{} // closed when a resident place is freed; see roomFreed

	started bool

	webhookState

	memoryRelief bool      // memory pressure seen: relieve with hysteresis
	reconciledAt time.Time // last successful full reconcile

	unrecorded unrecorded // engine changes the store refused to record
}

// NewManager returns a Manager over an open store and a runtime, complete
// with its hooks (Config). It reads every record once to know the resident
// count, and starts nothing: Start begins the loops.
func NewManager(st *store.Store, rt Runtime, cfg Config) (*Manager, error) {
	cfg.setDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	br := &breaker{rt: rt, now: cfg.Now}
	m := &Manager{
		store:   st,
		runtime: br,
		raw:     rt,
		breaker: br,
		cfg:     cfg,
		log:     cfg.Logger,
		ctx:     ctx,
		cancel:  cancel,
		states:  make(map[string]State),
		events:  newWorkQueue(),
		built:   cfg,
	}
	m.activity.clock = cfg.Now
	recs, err := st.List(nil)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("loading sandboxes: %w", err)
	}
	for i := range recs {
		m.setState(recs[i].ID, recs[i].State)
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
	m.every(cfg.ActivityFlush, m.flushActivityLogged, true)
	m.every(cfg.ReapInterval, m.reapPass, false)
	m.every(cfg.ReconcileInterval, m.reconcilePass, false)
	if src, ok := m.raw.(EventSource); ok && cfg.WatchEvents {
		m.wg.Add(1 + eventWorkers)
		go m.runEvents(src)
		for range eventWorkers {
			go m.runEventWorker()
		}
	}
	return nil
}

// Close cancels wakes and creates in flight, waits for them and ends every
// subscription. It does not close the store or the runtime.
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
	m.wg.Wait()
	m.bus.closeAll()
	return nil
}

// every runs fn every interval (nothing when interval <= 0) in a goroutine
// the manager owns, until it closes; with atClose, once more on the way out.
func (m *Manager) every(interval time.Duration, fn func(), atClose bool) {
	if interval <= 0 {
		return
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
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
	}()
}

// track registers a goroutine doing work for the manager, so Close waits for
// it; it fails once the manager is closed.
func (m *Manager) track() (done func(), err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	m.wg.Add(1)
	return m.wg.Done, nil
}

// Store returns the store the manager writes to.
func (m *Manager) Store() *store.Store { return m.store }

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
	WakeTimeout   time.Duration
	KeepaliveMax  time.Duration
	MaxResident   int
	IdlePause     time.Duration
	IdleStop      time.Duration
	MaxLifetime   time.Duration
	ExpiredWake   string
	MinFreeMemory uint64
	MinResident   time.Duration
	CapacityWait  time.Duration
	// EventRetention: 0 keeps the current value.
	EventRetention time.Duration
}

// Reconfigure applies new settings; zero durations for WakeTimeout and
// KeepaliveMax keep the current ones.
func (m *Manager) Reconfigure(s Settings) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.WakeTimeout > 0 {
		m.cfg.WakeTimeout = s.WakeTimeout
	}
	if s.KeepaliveMax > 0 {
		m.cfg.KeepaliveMax = s.KeepaliveMax
	}
	if s.ExpiredWake != "" {
		m.cfg.ExpiredWake = s.ExpiredWake
	}
	m.cfg.MaxResident = s.MaxResident
	m.cfg.IdlePause = s.IdlePause
	m.cfg.IdleStop = s.IdleStop
	m.cfg.MaxLifetime = s.MaxLifetime
	m.cfg.MinFreeMemory = s.MinFreeMemory
	m.cfg.MinResident = s.MinResident
	m.cfg.CapacityWait = s.CapacityWait
	if s.EventRetention > 0 {
		m.cfg.EventRetention = s.EventRetention
	}
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
		m.freeRoomLocked()
	}
	if to == "" {
		delete(m.states, id)
		return
	}
	m.states[id] = to
	if Resident(to) {
		m.resident++
	}
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

// admit reserves room for one more resident sandbox, evicting idle ones to
// make it (see evictOne). When every resident sandbox is in use (open
// requests, a keepalive, active within MinResident), it waits up to
// CapacityWait for room (a sandbox going to sleep, a wake failing, the first
// MinResident lapsing), then fails with ErrCapacity. Reservations count
// wakes in flight, so concurrent wakes never overshoot max_resident. The
// returned function releases the reservation; call it once the sandbox is
// resident (or failed).
func (m *Manager) admit(ctx context.Context, id string) (release func(), err error) {
	cfg := m.config()
	if cfg.MinFreeMemory > 0 {
		if avail, err := cfg.MemAvailable(); err == nil && avail < cfg.MinFreeMemory {
			if _, _, err := m.evictOne(ctx, id, "evicted_memory", 0); err != nil {
				return nil, fmt.Errorf("waking sandbox %s: %w: %d MiB available, %d MiB to keep free", id, ErrCapacity, avail>>20, cfg.MinFreeMemory>>20)
			}
		}
	}
	var waited <-chan time.Time
	for range 20 {
		room := m.roomFreed()
		m.mu.Lock()
		limit := m.cfg.MaxResident
		if limit <= 0 || m.resident+m.reserved < limit {
			m.reserved++
			m.mu.Unlock()
			var once sync.Once
			return func() {
				once.Do(func() {
					m.mu.Lock()
					m.reserved--
					m.freeRoomLocked()
					m.mu.Unlock()
				})
			}, nil
		}
		resident, reserved := m.resident, m.reserved
		m.mu.Unlock()
		_, next, err := m.evictOne(ctx, id, "evicted", cfg.MinResident)
		if err == nil {
			continue
		}
		if !errors.Is(err, ErrCapacity) {
			return nil, fmt.Errorf("waking sandbox %s: making room: %w", id, err)
		}
		if waited == nil {
			if cfg.CapacityWait <= 0 {
				return nil, capacityError(id, limit, resident, reserved, cfg)
			}
			t := time.NewTimer(cfg.CapacityWait)
			defer t.Stop()
			waited = t.C
		}
		var lapse <-chan time.Time
		if !next.IsZero() {
			t := time.NewTimer(max(next.Sub(cfg.Now()), 10*time.Millisecond))
			defer t.Stop()
			lapse = t.C
		}
		select {
		case <-room:
		case <-lapse:
		case <-waited:
			return nil, capacityError(id, limit, resident, reserved, cfg)
		case <-ctx.Done():
			return nil, fmt.Errorf("waking sandbox %s: waiting for room: %w", id, ctx.Err())
		}
	}
	return nil, fmt.Errorf("waking sandbox %s: %w: the room made was taken by other wakes; retry", id, ErrCapacity)
}

// capacityError explains a refused admission.
func capacityError(id string, limit, resident, reserved int, cfg Config) error {
	msg := fmt.Sprintf("all %d places of max_resident are taken (%d sandboxes running or paused, %d waking) and each is in use", limit, resident, reserved)
	if cfg.MinResident > 0 {
		msg += fmt.Sprintf(" or was active in the last %s (min_resident)", cfg.MinResident)
	}
	if cfg.CapacityWait > 0 {
		msg += fmt.Sprintf("; waited %s for room", cfg.CapacityWait)
	}
	return fmt.Errorf("waking sandbox %s: %w: %s; retry later", id, ErrCapacity, msg)
}

// roomFreed returns a channel closed the next time a resident place is freed
// (a sandbox leaves running or paused, a reservation is released).
func (m *Manager) roomFreed() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.room == nil {
		m.room = make(chan struct{})
	}
	return m.room
}

// freeRoomLocked wakes the admissions waiting for room; m.mu is held.
func (m *Manager) freeRoomLocked() {
	if m.room != nil {
		close(m.room)
		m.room = nil
	}
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

// CreateRequest asks for a new sandbox.
type CreateRequest struct {
	// ID is the sandbox id; empty means a new lowercase ULID. Upper case is
	// folded to lower case.
	ID   string
	Spec Spec
}

// Create validates req, stores the sandbox as creating, creates and starts its
// container and waits for readiness. It returns the running record, or an
// error with the record left in error (the record is kept so the failure can
// be read and the sandbox retried with Wake). The work runs on the manager's
// context bounded by WakeTimeout: a caller that gives up does not leave a
// half-made sandbox.
func (m *Manager) Create(ctx context.Context, req CreateRequest) (Record, error) {
	done, err := m.track()
	if err != nil {
		return Record{}, err
	}
	defer done()
	id := req.ID
	if id == "" {
		id = NewID(m.cfg.Now())
	}
	// Fold only ASCII: strings.ToLower would turn the Kelvin sign into k.
	if !ValidID(asciiLower(id)) {
		return Record{}, invalid("id %q must be 1-%d characters of [0-9a-z]", req.ID, MaxIDLen)
	}
	id = asciiLower(id)
	spec := req.Spec
	if err := m.checkSpec(&spec); err != nil {
		return Record{}, err
	}
	// An image that cannot be had is refused before anything is written.
	if ic, ok := m.raw.(ImageChecker); ok {
		wakeTimeout, _ := m.limits()
		ictx, cancel := context.WithTimeout(m.ctx, wakeTimeout)
		err := ic.CheckImage(ictx, spec.Image)
		cancel()
		if err != nil {
			return Record{}, fmt.Errorf("creating sandbox %s: %w", id, err)
		}
	}
	release, err := m.admit(m.ctx, id)
	if err != nil {
		return Record{}, err
	}
	defer release()

	unlock := m.locks.lock(id)
	defer unlock()
	now := m.cfg.Now().UTC()
	rec := Record{ID: id, Spec: spec, State: Creating, CreatedAt: now, LastActiveAt: now, StateSince: now, Incarnation: NewIncarnation()}
	if life := durationOr(spec.MaxLifetime, m.config().MaxLifetime); life > 0 {
		rec.ExpiresAt = now.Add(life)
	}
	if _, _, err := m.store.Create(rec, "create"); err != nil {
		return Record{}, err
	}
	m.setState(id, Creating)

	wakeTimeout, _ := m.limits()
	wctx, cancel := context.WithTimeout(m.ctx, wakeTimeout)
	defer cancel()
	c, err := m.runtime.Create(wctx, id, spec)
	if err == nil {
		c, err = m.runtime.Start(wctx, id)
	}
	if err == nil {
		err = m.waitReady(wctx, id, &spec, c.Upstreams)
	}
	if err != nil && (errors.Is(err, ErrIDTaken) || errors.Is(err, ErrInvalid) || errors.Is(err, ErrImageNotFound)) {
		// Nothing was made (the runtime undoes its part): the id stays
		// free and no record is left of a sandbox that never existed.
		m.discard(id, err)
		return Record{}, fmt.Errorf("creating sandbox %s: %w", id, err)
	}
	if err != nil {
		// Whatever the cause, a failed create leaves creating: a record
		// stuck there could be neither woken nor retried.
		m.fail(id, err, true)
		return Record{}, fmt.Errorf("creating sandbox %s: %w", id, err)
	}
	return m.transition(id, Running, "create", func(r *Record) error {
		m.adopt(r, c)
		return nil
	})
}

// checkSpec normalises spec and checks it against this host and the
// operator's policy: everything Docker would refuse is refused here, before
// anything is written.
func (m *Manager) checkSpec(spec *Spec) error {
	if err := NormalizeSpec(spec); err != nil {
		return err
	}
	cfg := m.config()
	if spec.MemoryMB == 0 {
		spec.MemoryMB = cfg.DefaultMemoryMB
	}
	if cfg.HostCPUs > 0 && spec.CPUs > float64(cfg.HostCPUs) {
		return invalid("cpus: %g is more than the host's %d CPUs", spec.CPUs, cfg.HostCPUs)
	}
	if cfg.HostMemoryMB > 0 && spec.MemoryMB > cfg.HostMemoryMB {
		return invalid("memory_mb: %d is more than the host's %d MiB", spec.MemoryMB, cfg.HostMemoryMB)
	}
	if len(cfg.AllowedImages) > 0 && !ImageAllowed(cfg.AllowedImages, spec.Image) {
		return invalid("image %q is not allowed here (allowed_images: %s)", spec.Image, strings.Join(cfg.AllowedImages, " "))
	}
	return nil
}

// discard removes the record of a create that made nothing.
func (m *Manager) discard(id string, cause error) {
	if _, err := m.store.Delete(id, store.EventDestroyed, "create_refused"); err != nil {
		m.log.Error("removing the record of a refused create", zap.String("id", id), zap.Error(err), zap.NamedError("cause", cause))
		return
	}
	m.setState(id, "")
	m.log.Info("create refused", zap.String("id", id), zap.Error(cause))
}

// adopt copies what the engine reported of a running container into r.
func (m *Manager) adopt(r *Record, c Container) {
	now := m.cfg.Now().UTC()
	r.ContainerID = c.ID
	r.Upstreams = c.Upstreams
	r.Error = ""
	r.VerifiedAt = now
	r.LastActiveAt = now
}

// waitReady waits for the sandbox's first declared port. Meanwhile it
// watches the container: one that exits while its app should be coming up
// (a bad command, a crash at start) fails the wake at once with its exit
// code instead of after wake_timeout.
func (m *Manager) waitReady(ctx context.Context, id string, spec *Spec, upstreams map[int]string) error {
	addr, ok := upstreams[spec.Ports[0]]
	if !ok {
		// Docker reports no port for a container that already exited.
		if c, err := m.runtime.Inspect(ctx, id); err == nil && (c.State == ContainerExited || c.State == ContainerDead) {
			return fmt.Errorf("%w: the container exited with code %d while starting", ErrNotReady, c.ExitCode)
		}
		return fmt.Errorf("sandbox %s: no upstream for port %d", id, spec.Ports[0])
	}
	ctx, cancel := context.WithCancelCause(ctx)
	watched := make(chan struct{})
	defer func() {
		cancel(nil)
		<-watched
	}()
	go func() {
		defer close(watched)
		t := time.NewTicker(exitWatch)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				c, err := m.runtime.Inspect(ctx, id)
				if err == nil && (c.State == ContainerExited || c.State == ContainerDead) {
					cause := fmt.Errorf("%w: the container exited with code %d while starting", ErrNotReady, c.ExitCode)
					if c.OOMKilled {
						cause = fmt.Errorf("%w: the container ran out of memory while starting", ErrNotReady)
					}
					cancel(cause)
					return
				}
			}
		}
	}()
	err := WaitReady(ctx, addr, spec)
	if err != nil && context.Cause(ctx) != nil && !errors.Is(context.Cause(ctx), context.Canceled) && !errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
		return context.Cause(ctx)
	}
	return err
}

// exitWatch is how often a starting container is checked for an early exit.
const exitWatch = 500 * time.Millisecond

// fail records a failed create or wake as state error. A failed wake whose
// cause was a transient engine error or the manager shutting down leaves the
// record as it was; a failed create (always) goes to error.
func (m *Manager) fail(id string, cause error, creating bool) {
	if !creating && (errors.Is(cause, ErrUnavailable) || m.ctx.Err() != nil) {
		return
	}
	msg := cause.Error()
	_, err := m.transition(id, Error, reasonOf(cause), func(r *Record) error {
		r.Error = msg
		return nil
	})
	if err != nil {
		m.log.Error("recording failure", zap.String("id", id), zap.Error(err), zap.NamedError("cause", cause))
	}
	// A container left running without a ready app only holds memory.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := m.runtime.Stop(ctx, id); err != nil && !errors.Is(err, ErrContainerNotFound) {
		m.log.Warn("stopping failed sandbox", zap.String("id", id), zap.Error(err))
	}
}

// reasonOf gives the short reason recorded with an error transition.
func reasonOf(err error) string {
	switch {
	case errors.Is(err, ErrUnavailable):
		return "engine_unavailable"
	case errors.Is(err, ErrImageNotFound):
		return "image_missing"
	case errors.Is(err, ErrIDTaken):
		return "id_taken"
	case errors.Is(err, ErrNotReady), errors.Is(err, context.DeadlineExceeded):
		return "not_ready"
	default:
		return "start_failed"
	}
}

// Pause freezes running sandbox id. Pausing a paused sandbox is a no-op;
// any other state is ErrConflict.
func (m *Manager) Pause(ctx context.Context, id, reason string) (Record, error) {
	done, err := m.track()
	if err != nil {
		return Record{}, err
	}
	defer done()
	unlock := m.locks.lock(id)
	defer unlock()
	rec, err := m.store.Get(id)
	if err != nil {
		return Record{}, err
	}
	return m.goDown(id, true, func() (Record, error) { return m.pauseLocked(ctx, rec, reason) })
}

// pauseLocked pauses rec's sandbox; the caller holds its lock.
func (m *Manager) pauseLocked(ctx context.Context, rec Record, reason string) (Record, error) {
	switch rec.State {
	case Paused:
		return rec, nil
	case Running:
	default:
		return Record{}, fmt.Errorf("pausing sandbox %s: %w: it is %s", rec.ID, ErrConflict, rec.State)
	}
	if err := m.runtime.Pause(ctx, rec.ID); err != nil {
		return Record{}, fmt.Errorf("pausing sandbox %s: %w", rec.ID, err)
	}
	out, err := m.transition(rec.ID, Paused, reason, func(r *Record) error {
		r.VerifiedAt = m.cfg.Now().UTC()
		return nil
	})
	if errors.Is(err, ErrStoreUnavailable) {
		return Record{}, unrecordedError(rec.ID, "paused", err)
	}
	return out, err
}

// Stop stops running or paused sandbox id, keeping its container and volume.
// Stopping a stopped sandbox is a no-op; any other state is ErrConflict.
func (m *Manager) Stop(ctx context.Context, id, reason string) (Record, error) {
	done, err := m.track()
	if err != nil {
		return Record{}, err
	}
	defer done()
	unlock := m.locks.lock(id)
	defer unlock()
	rec, err := m.store.Get(id)
	if err != nil {
		return Record{}, err
	}
	return m.goDown(id, true, func() (Record, error) { return m.stopLocked(ctx, rec, reason) })
}

// errInUse: a pause or stop that yields to traffic backed off because a
// request was registered first.
var errInUse = errors.New("in use")

// goDown runs op, a pause, stop or expiry of sandbox id under its lock, with
// the sandbox marked as going down, so that no request is sent to it
// meanwhile (see Activity). Unless force, it backs off with errInUse when an
// exchange is open. A forced one (the API, expiry) cuts open exchanges.
func (m *Manager) goDown(id string, force bool, op func() (Record, error)) (Record, error) {
	a := m.activity.get(id)
	if !a.beginDown(force) {
		return Record{}, errInUse
	}
	defer a.endDown()
	rec, err := op()
	if err != nil {
		// Routes read while it was going down are stale (Downs moved on)
		// though the record did not change: have them read again.
		m.changed(id)
	}
	return rec, err
}

// stopLocked stops rec's sandbox; the caller holds its lock.
func (m *Manager) stopLocked(ctx context.Context, rec Record, reason string) (Record, error) {
	switch rec.State {
	case Stopped:
		return rec, nil
	case Running, Paused:
	default:
		return Record{}, fmt.Errorf("stopping sandbox %s: %w: it is %s", rec.ID, ErrConflict, rec.State)
	}
	if err := m.runtime.Stop(ctx, rec.ID); err != nil && !errors.Is(err, ErrContainerNotFound) {
		return Record{}, fmt.Errorf("stopping sandbox %s: %w", rec.ID, err)
	}
	out, err := m.transition(rec.ID, Stopped, reason, func(r *Record) error {
		now := m.cfg.Now().UTC()
		r.StoppedAt = now
		r.VerifiedAt = now
		return nil
	})
	if errors.Is(err, ErrStoreUnavailable) {
		return Record{}, unrecordedError(rec.ID, "stopped", err)
	}
	return out, err
}

// expireLocked removes rec's container at the end of its lifetime, keeping
// the volume; the caller holds its lock.
func (m *Manager) expireLocked(ctx context.Context, rec Record) (Record, error) {
	if err := m.runtime.Remove(ctx, rec.ID); err != nil {
		return Record{}, fmt.Errorf("expiring sandbox %s: %w", rec.ID, err)
	}
	return m.transition(rec.ID, Expired, "max_lifetime", func(r *Record) error {
		r.ContainerID = ""
		r.Upstreams = nil
		r.VerifiedAt = m.cfg.Now().UTC()
		return nil
	})
}

// Keepalive keeps sandbox id from idling out for d (capped at KeepaliveMax)
// and counts as activity.
func (m *Manager) Keepalive(id string, d time.Duration) (Record, error) {
	if d <= 0 {
		return Record{}, invalid("keepalive duration %s must be positive", d)
	}
	_, keepaliveMax := m.limits()
	d = min(d, keepaliveMax)
	now := m.cfg.Now().UTC()
	return m.store.Update(id, func(r *Record) error {
		r.KeepaliveUntil = now.Add(d)
		r.LastActiveAt = now
		return nil
	})
}

// Patch is a change of a sandbox's settings (nil fields stay as they are).
type Patch struct {
	Access      *string
	IdlePause   *time.Duration
	IdleStop    *time.Duration
	MaxLifetime *time.Duration
}

// Update changes sandbox id's settings. A new max_lifetime counts from the
// sandbox's creation; a change of access revokes every preview token.
func (m *Manager) Update(id string, p Patch) (Record, error) {
	if p.Access != nil && *p.Access != AccessPublic && *p.Access != AccessPrivate {
		return Record{}, invalid("access: %q is not public or private", *p.Access)
	}
	for name, d := range map[string]*time.Duration{"idle_pause": p.IdlePause, "idle_stop": p.IdleStop, "max_lifetime": p.MaxLifetime} {
		if d != nil && (*d < 0 || *d > MaxDuration) {
			return Record{}, invalid("%s: %s is out of range (0 to 10 years)", name, *d)
		}
	}
	unlock := m.locks.lock(id)
	defer unlock()
	rec, err := m.store.Update(id, func(r *Record) error {
		if p.Access != nil {
			if *p.Access != effectiveAccess(r.Spec.Access) {
				// Tokens given out under one access level do not carry
				// over to the next: a sandbox made private again is
				// closed to every token minted before.
				r.TokenGeneration++
			}
			r.Spec.Access = *p.Access
		}
		if p.IdlePause != nil {
			r.Spec.IdlePause = p.IdlePause
		}
		if p.IdleStop != nil {
			r.Spec.IdleStop = p.IdleStop
		}
		if p.MaxLifetime != nil {
			r.Spec.MaxLifetime = p.MaxLifetime
			r.ExpiresAt = time.Time{}
			if *p.MaxLifetime > 0 {
				r.ExpiresAt = r.CreatedAt.Add(*p.MaxLifetime)
			}
		}
		return nil
	})
	if err != nil {
		return Record{}, err
	}
	m.changed(id)
	return rec, nil
}

// effectiveAccess is a stored access level, "" (records made before access
// levels) being public.
func effectiveAccess(a string) string {
	if a == "" {
		return AccessPublic
	}
	return a
}

// RotateTokens revokes every preview token of sandbox id by moving to a new
// token generation.
func (m *Manager) RotateTokens(id string) (Record, error) {
	unlock := m.locks.lock(id)
	defer unlock()
	rec, err := m.store.Update(id, func(r *Record) error {
		r.TokenGeneration++
		return nil
	})
	if err != nil {
		return Record{}, err
	}
	m.changed(id)
	return rec, nil
}

// Destroy removes sandbox id's container and record. The volume is kept (see
// Purge). A transient engine error leaves everything as it was.
func (m *Manager) Destroy(ctx context.Context, id, reason string) error {
	done, err := m.track()
	if err != nil {
		return err
	}
	defer done()
	unlock := m.locks.lock(id)
	defer unlock()
	if _, err := m.store.Get(id); err != nil {
		return err
	}
	if err := m.runtime.Remove(ctx, id); err != nil {
		return fmt.Errorf("destroying sandbox %s: %w", id, err)
	}
	if _, err := m.store.Delete(id, store.EventDestroyed, reason); err != nil {
		if errors.Is(err, ErrStoreUnavailable) {
			// Reconcile can only record the container as missing
			// (killed): the deletion itself needs the DELETE again.
			return fmt.Errorf("sandbox %s: the container was removed, but the store could not delete the record (%w); "+
				"send the DELETE again once the store takes writes", id, err)
		}
		return err
	}
	m.setState(id, "")
	m.activity.m.Delete(id)
	return nil
}

// Purge removes sandbox id's container, volume and record and reports the
// bytes the volume held. It also purges the volume of a sandbox destroyed
// earlier; ErrNotFound when there is neither record nor volume.
func (m *Manager) Purge(ctx context.Context, id, reason string) (freed int64, err error) {
	done, err := m.track()
	if err != nil {
		return 0, err
	}
	defer done()
	if !ValidID(id) {
		return 0, fmt.Errorf("sandbox %s: %w", id, ErrNotFound)
	}
	unlock := m.locks.lock(id)
	defer unlock()
	_, err = m.store.Get(id)
	hasRecord := err == nil
	if err != nil && !errors.Is(err, ErrNotFound) {
		return 0, err
	}
	// Without a record only the volume of a sandbox destroyed earlier is
	// purged (the runtime removes nothing that is not this instance's).
	if hasRecord {
		if err := m.runtime.Remove(ctx, id); err != nil {
			return 0, fmt.Errorf("purging sandbox %s: %w", id, err)
		}
	}
	freed, err = m.runtime.RemoveVolume(ctx, id)
	if errors.Is(err, ErrNotFound) {
		if !hasRecord {
			return 0, fmt.Errorf("sandbox %s: %w", id, ErrNotFound)
		}
		err = nil // the record's volume was already gone
	}
	if err != nil {
		return 0, fmt.Errorf("purging sandbox %s: %w", id, err)
	}
	if hasRecord {
		if _, err = m.store.Delete(id, store.EventPurged, reason); err == nil {
			m.setState(id, "")
			m.activity.m.Delete(id)
		}
	} else {
		_, err = m.store.AppendEvent(Event{Type: store.EventPurged, SandboxID: id, Reason: reason})
	}
	return freed, err
}
