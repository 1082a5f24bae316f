package lifecycle

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
)

// This file holds what the Manager does with what sandboxes try outbound
// (the firewall's EgressObserver): the egress log, learn-then-lock, the
// sandbox.egress_denied events the firewall reports (bounded by it), and
// outbound work counted as activity.

// Activities: what keeps a sandbox from idle pause and stop.
const (
	// ActivityInbound: preview requests only (the default).
	ActivityInbound = "inbound"
	// ActivityAny: also the sandbox's own established outbound
	// connections and lookups, up to ActiveMax past its last request.
	ActivityAny = "any"
)

// DefaultActiveMax bounds how long outbound work alone keeps a sandbox
// under ActivityAny awake.
const DefaultActiveMax = time.Hour

// activityOf is the activity setting of r: its own or the gateway's.
func (m *Manager) activityOf(r *Record, cfg *Config) string {
	if r.Spec.Activity != "" {
		return r.Spec.Activity
	}
	return cfg.Activity
}

// outboundIdle is how long r has been idle counting its outbound work:
// the inbound idle time, shortened to the time since its last outbound
// work while its last request is less than ActiveMax ago.
func (m *Manager) outboundIdle(r *Record, cfg *Config, now time.Time, idle time.Duration) time.Duration {
	o, ok := m.built.Firewall.(EgressObserver)
	if !ok || !r.Address.IsValid() || idle >= cfg.ActiveMax {
		return idle
	}
	t := o.Outbound(r.Address)
	if t.IsZero() {
		return idle
	}
	if d := now.Sub(t); d < idle {
		return max(d, 0)
	}
	return idle
}

// EgressLog reports what sandbox id tried outbound: its connections,
// allowed and denied, and the names it looked up. Empty when the firewall
// sees nothing (egress unenforced).
func (m *Manager) EgressLog(id string) (EgressLog, error) {
	if _, err := m.store.Get(id); err != nil {
		return EgressLog{}, err
	}
	o, ok := m.built.Firewall.(EgressObserver)
	if !ok {
		return EgressLog{Decisions: []EgressDecision{}, Lookups: []EgressLookup{}}, nil
	}
	l := o.EgressLog(id)
	if l.Decisions == nil {
		l.Decisions = []EgressDecision{}
	}
	if l.Lookups == nil {
		l.Lookups = []EgressLookup{}
	}
	return l, nil
}

// Learned is the allow list that what a sandbox did makes: every name it
// looked up that resolved to addresses it was let reach, exact
// (LearnableName: never a '*' label), sorted, then every address
// it connected to and was let through that no lookup gave (as
// addr:port/proto), sorted. What its deny list refused is left out: a lock
// under none has no deny list to refuse it again.
func Learned(l EgressLog) []string {
	var names, addrs []string
	add := func(s string) {
		if !slices.Contains(names, s) {
			names = append(names, s)
		}
	}
	looked := map[netip.Addr]bool{}
	for _, lk := range l.Lookups {
		if len(lk.Addrs) == 0 || !lk.Allowed || !LearnableName(lk.Name) {
			continue
		}
		add(lk.Name)
		for _, a := range lk.Addrs {
			looked[a] = true
		}
	}
	for _, d := range l.Decisions {
		if d.Name != "" || looked[d.Addr] || !d.Allowed || d.Port == 0 || (d.Proto != "tcp" && d.Proto != "udp") || !d.Addr.Is4() {
			continue // (allow rules are IPv4: sandbox networks have no IPv6)
		}
		if e := d.Addr.String() + ":" + strconv.Itoa(int(d.Port)) + "/" + d.Proto; !slices.Contains(addrs, e) {
			addrs = append(addrs, e)
		}
	}
	slices.Sort(names)
	slices.Sort(addrs)
	return append(names, addrs...)
}

// maxLearned bounds the learned list a record keeps: more than an allow
// list holds (a lock of more is refused anyway, naming the count).
const maxLearned = 4 * MaxAllowRules

// MergeLearned is the union of two learned lists (see Learned), in
// Learned's order: names sorted, then addresses sorted; at most maxLearned.
// A name LearnableName refuses (a '*' label a record of an earlier release
// kept) is dropped.
func MergeLearned(a, b []string) []string {
	if len(b) == 0 && !slices.ContainsFunc(a, func(e string) bool { return strings.Contains(e, "*") }) {
		return a
	}
	var names, addrs []string
	for _, e := range slices.Concat(a, b) {
		list := &addrs
		if host := strings.SplitN(e, ":", 2)[0]; isNameLike(host) {
			if !LearnableName(host) {
				continue
			}
			list = &names
		}
		if !slices.Contains(*list, e) {
			*list = append(*list, e)
		}
	}
	slices.Sort(names)
	slices.Sort(addrs)
	out := append(names, addrs...)
	return out[:min(len(out), maxLearned)]
}

// takeLearning moves what the sandboxes under learn logged since the last
// flush into the pending lists the flush writes (flushMu held).
func (m *Manager) takeLearning() {
	o, ok := m.built.Firewall.(LearningObserver)
	if !ok {
		return
	}
	for id, l := range o.TakeLearning() {
		if entries := Learned(l); len(entries) > 0 {
			if m.learnPending == nil {
				m.learnPending = map[string][]string{}
			}
			m.learnPending[id] = MergeLearned(m.learnPending[id], entries)
		}
	}
}

// LockEgress turns what sandbox id learned under the learn policy into
// an allow list under none (Learned), in force when it returns. A sandbox
// not learning is a conflict; a learned list the operator's settings
// refuse (an address in a denied range) is invalid, naming the entry.
func (m *Manager) LockEgress(id string) (Record, error) {
	rec, err := m.store.Get(id)
	if err != nil {
		return Record{}, err
	}
	if p := rec.Spec.Egress.Policy; p != EgressLearn {
		return Record{}, fmt.Errorf("%w: sandbox %s is not learning (its egress policy is %q); set the policy learn, let it run, then lock", ErrConflict, id, p)
	}
	l, err := m.EgressLog(id)
	if err != nil {
		return Record{}, err
	}
	allow := LockList(&rec, l)
	if len(allow) > MaxAllowRules {
		return Record{}, invalid("egress lock: sandbox %s used %d names and addresses, more than an allow list holds (%d); give it an allow list by hand", id, len(allow), MaxAllowRules)
	}
	return m.Update(id, Patch{Egress: &Egress{Policy: EgressNone, Allow: allow}})
}

// LockList is the allow list a lock of r would make from its log l: what
// its record kept of earlier runs, with what l adds (never nil).
func LockList(r *Record, l EgressLog) []string {
	allow := MergeLearned(r.EgressLearned, Learned(l))
	if allow == nil {
		allow = []string{}
	}
	return allow
}

// egressDenied records an event of refused egress the firewall reported,
// already bounded (its OnDenied), as its sandbox's, with the record's
// incarnation and labels; false when the sandbox has no record.
func (m *Manager) egressDenied(ev Event) bool {
	rec, err := m.store.Get(ev.SandboxID)
	if err != nil {
		return false
	}
	ev.Incarnation, ev.Labels = rec.Incarnation, rec.Spec.Labels
	if _, err := m.store.AppendEvent(ev); err != nil {
		m.log.Warn("recording denied egress", zap.String("id", ev.SandboxID), zap.String("type", ev.Type), zap.Error(err))
	}
	return true
}
