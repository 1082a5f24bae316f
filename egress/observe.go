package egress

import (
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/sandwake/sandwake/lifecycle"
)

// This file holds what the firewall tells of what sandboxes tried
// (lifecycle.EgressObserver): each sandbox's bounded log of connections
// (from the kernel's log group, nflog.go) and lookups (from the
// forwarder) and outbound activity; the denied-destination callback,
// bounded, is denials.go's.

// maxLogLines bounds each of a sandbox's two logs; the line seen longest
// ago goes first.
const maxLogLines = 256

// deniedEvery is how often one destination of one sandbox is reported
// denied (OnDenied).
const deniedEvery = time.Second

// decisionKey is one destination, judged one way.
type decisionKey struct {
	addr    netip.Addr
	port    uint16
	proto   string
	allowed bool
}

type decisionLine struct {
	d        lifecycle.EgressDecision
	reported time.Time
}

// activityLog is one sandbox's log.
type activityLog struct {
	mu        sync.Mutex
	decisions map[decisionKey]*decisionLine
	lookups   map[string]*lifecycle.EgressLookup
	// grew: since the last TakeLearning, a line a lock could learn from
	// was added: an allowed connection to a port, or a lookup's first
	// addresses.
	grew bool
}

func newActivityLog() *activityLog {
	return &activityLog{decisions: map[decisionKey]*decisionLine{}, lookups: map[string]*lifecycle.EgressLookup{}}
}

// decision counts one connection (or refused packet); it reports whether
// the caller should report it denied (reportDenied: a denied destination
// not reported in the last deniedEvery).
func (l *activityLog) decision(k decisionKey, name string, now time.Time) (lifecycle.EgressDecision, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	line := l.decisions[k]
	if line == nil {
		if len(l.decisions) >= maxLogLines {
			var oldest decisionKey
			first := true
			for k2, v := range l.decisions {
				if first || v.d.Last.Before(l.decisions[oldest].d.Last) {
					oldest, first = k2, false
				}
			}
			delete(l.decisions, oldest)
		}
		line = &decisionLine{d: lifecycle.EgressDecision{First: now, Addr: k.addr, Port: k.port, Proto: k.proto, Allowed: k.allowed}}
		l.decisions[k] = line
		// Only what a lock could learn from (lifecycle.Learned takes
		// allowed connections to a port) makes the flush write.
		l.grew = l.grew || (k.allowed && k.port != 0)
	}
	line.d.Last = now
	line.d.Count++
	if name != "" {
		line.d.Name = name
	}
	report := !k.allowed && now.Sub(line.reported) >= deniedEvery
	if report {
		line.reported = now
	}
	return line.d, report
}

// lookup records one answered lookup.
func (l *activityLog) lookup(name string, addrs []netip.Addr, allowed bool, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lk := l.lookups[name]
	if lk == nil {
		if len(l.lookups) >= maxLogLines {
			oldest := ""
			for n, v := range l.lookups {
				if oldest == "" || v.Last.Before(l.lookups[oldest].Last) {
					oldest = n
				}
			}
			delete(l.lookups, oldest)
		}
		lk = &lifecycle.EgressLookup{Name: name}
		l.lookups[name] = lk
	}
	if len(lk.Addrs) == 0 && len(addrs) > 0 { // a name a lock could learn
		l.grew = true
	}
	lk.Count++
	lk.Last = now
	lk.Allowed = allowed
	if len(addrs) > 0 || !allowed {
		lk.Addrs = addrs
	}
}

// snapshot is the log, newest first.
func (l *activityLog) snapshot() lifecycle.EgressLog {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := lifecycle.EgressLog{
		Decisions: make([]lifecycle.EgressDecision, 0, len(l.decisions)),
		Lookups:   make([]lifecycle.EgressLookup, 0, len(l.lookups)),
	}
	for _, v := range l.decisions {
		out.Decisions = append(out.Decisions, v.d)
	}
	for _, v := range l.lookups {
		lk := *v
		lk.Addrs = slices.Clone(v.Addrs)
		out.Lookups = append(out.Lookups, lk)
	}
	slices.SortFunc(out.Decisions, func(a, b lifecycle.EgressDecision) int { return b.Last.Compare(a.Last) })
	slices.SortFunc(out.Lookups, func(a, b lifecycle.EgressLookup) int { return b.Last.Compare(a.Last) })
	return out
}

// EgressLog implements lifecycle.EgressObserver.
func (f *Firewall) EgressLog(id string) lifecycle.EgressLog {
	f.smu.RLock()
	sb := f.byID[id]
	f.smu.RUnlock()
	if sb == nil {
		return lifecycle.EgressLog{}
	}
	return sb.log.snapshot()
}

// TakeLearning implements lifecycle.LearningObserver: the logs of the
// sandboxes under the learn policy that grew since the last call.
func (f *Firewall) TakeLearning() map[string]lifecycle.EgressLog {
	f.smu.RLock()
	sbs := make([]*sandbox, 0, len(f.byID))
	for _, sb := range f.byID {
		sbs = append(sbs, sb)
	}
	f.smu.RUnlock()
	var out map[string]lifecycle.EgressLog
	for _, sb := range sbs {
		sb.rmu.RLock()
		learning := sb.egress.Policy == lifecycle.EgressLearn
		sb.rmu.RUnlock()
		if !learning {
			continue
		}
		sb.log.mu.Lock()
		grew := sb.log.grew
		sb.log.grew = false
		sb.log.mu.Unlock()
		if grew {
			if out == nil {
				out = map[string]lifecycle.EgressLog{}
			}
			out[sb.id] = sb.log.snapshot()
		}
	}
	return out
}

// Outbound implements lifecycle.EgressObserver: now while the sandbox at
// addr holds an established connection it opened (the kernel's connection
// table, read at most once a second for every sandbox), else the later of
// its last lookup and its last new connection.
func (f *Firewall) Outbound(addr netip.Addr) time.Time {
	f.smu.RLock()
	sb := f.byAddr[addr]
	f.smu.RUnlock()
	if sb == nil {
		return time.Time{}
	}
	now := time.Now()
	if f.conns.open(addr, now) {
		return now
	}
	t := max(sb.lastLookup.Load(), sb.lastConnect.Load())
	if t == 0 {
		return time.Time{}
	}
	return time.Unix(0, t)
}

// Interface guard.
var (
	_ lifecycle.EgressObserver   = (*Firewall)(nil)
	_ lifecycle.LearningObserver = (*Firewall)(nil)
)
