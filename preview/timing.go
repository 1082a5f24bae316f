package preview

import (
	"strconv"
	"strings"
	"time"

	"github.com/sandwake/sandwake/lifecycle"
)

// This file tells clients where a cold start went: a response that waited
// for a wake carries a Server-Timing header (hold: the whole wait; wake:
// this request's wait for the wake it started or joined; admission,
// engine and ready: the phases of that wake), which browsers' devtools and
// API clients show; the warming page's event stream gets the same phases
// (a sandbox.wake_timing message after the running state). A request that
// did not wait gets no header: the hot path is not touched.

// serverTiming is the header's value.
func serverTiming(hold, wake time.Duration, ph *lifecycle.WakePhases) string {
	var b strings.Builder
	b.Grow(96)
	metric := func(name string, d time.Duration) {
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteString(name)
		b.WriteString(";dur=")
		b.WriteString(strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64))
	}
	metric("hold", hold)
	metric("wake", wake)
	if ph != nil {
		metric("admission", ph.Admission)
		metric("engine", ph.Engine)
		metric("ready", ph.Ready)
	}
	return b.String()
}

// wakeTiming is the warming page's message of a wake's phases, in
// milliseconds.
type wakeTiming struct {
	Type      string  `json:"type"`
	SandboxID string  `json:"sandbox_id"`
	WakeMS    float64 `json:"wake_ms"`
	Admission float64 `json:"admission_ms"`
	Engine    float64 `json:"engine_ms"`
	Ready     float64 `json:"ready_ms"`
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func newWakeTiming(id string, ph lifecycle.WakePhases) wakeTiming {
	return wakeTiming{Type: "sandbox.wake_timing", SandboxID: id, WakeMS: ms(ph.Total), Admission: ms(ph.Admission), Engine: ms(ph.Engine), Ready: ms(ph.Ready)}
}
