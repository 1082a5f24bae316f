package egress

// What the forwarder's tests read of it.

func (f *Firewall) forwarderOf() *forwarder {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fwd
}

// ForeignQueries is how many datagrams the forwarder dropped for arriving
// on another interface than the sandbox bridge.
func ForeignQueries(f *Firewall) uint64 { return f.forwarderOf().foreign.Load() }

// Inflight is sandbox id's queries being forwarded and the shared slots
// taken in all.
func Inflight(f *Firewall, id string) (sandbox, shared int32) {
	f.smu.RLock()
	sb := f.byID[id]
	f.smu.RUnlock()
	if sb != nil {
		sandbox = sb.inflight.Load()
	}
	return sandbox, f.forwarderOf().inflight.Load()
}
