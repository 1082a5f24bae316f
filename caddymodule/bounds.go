package caddymodule

import (
	"fmt"
	"math"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// durationOptions are the App's plain duration settings by option name:
// the Caddyfile parser sets them through it and checkBounds checks them.
func (a *App) durationOptions() map[string]*caddy.Duration {
	return map[string]*caddy.Duration{
		"wake_timeout": &a.WakeTimeout, "hold_timeout": &a.HoldTimeout, "keepalive_max": &a.KeepaliveMax,
		"activity_flush": &a.ActivityFlush, "stop_timeout": &a.StopTimeout,
		"max_lifetime": &a.MaxLifetime, "reap_interval": &a.ReapInterval, "reconcile_interval": &a.ReconcileInterval,
		"webhook_max_age": &a.WebhookMaxAge, "event_retention": &a.EventRetention,
		"disk_check_interval": &a.DiskCheckInterval,
	}
}

// checkBounds is the one check of the App's numbers: no negative duration
// or count, and a finite wake rate. Settings not given (nil) pass. Validate
// runs it on the provisioned App, and the Caddyfile parser after each
// option, so that `caddy adapt` refuses what loading would.
func (a *App) checkBounds() error {
	for name, d := range a.durationOptions() {
		if *d < 0 {
			return fmt.Errorf("%s must not be negative (got %s)", name, time.Duration(*d))
		}
	}
	for _, o := range []struct {
		name string
		d    *caddy.Duration
	}{{"idle_pause", a.IdlePause}, {"idle_stop", a.IdleStop}, {"min_resident", a.MinResident}, {"capacity_wait", a.CapacityWait}} {
		if o.d != nil && *o.d < 0 {
			return fmt.Errorf("%s must not be negative (got %s)", o.name, time.Duration(*o.d))
		}
	}
	for _, o := range []struct {
		name string
		n    *int
	}{{"max_resident", a.MaxResident}, {"max_event_streams", a.MaxEventStreams}, {"max_event_streams_per_client", a.MaxEventStreamsPerClient}} {
		if o.n != nil && *o.n < 0 {
			return fmt.Errorf("%s must not be negative (got %d)", o.name, *o.n)
		}
	}
	// NaN and ±Inf also make json.Marshal fail, which would turn the
	// adapted Caddyfile's whole sandwake app into null.
	if r := a.WakeRate; r != nil && (!(*r >= 0) || math.IsInf(*r, 0)) {
		return fmt.Errorf("wake_rate %v is not a number of wakes per second >= 0", *r)
	}
	if a.WakeBurst < 0 {
		return fmt.Errorf("wake_burst must not be negative (got %d)", a.WakeBurst)
	}
	if r := a.WakeRatePerClient; r != nil && (!(*r >= 0) || math.IsInf(*r, 0) || *r > 1e6) {
		return fmt.Errorf("wake_rate_per_client %v is not a number of wakes per second from 0 to 1e6", *r)
	}
	if n := a.MaxOpenPerSandbox; n != nil && *n < 0 {
		return fmt.Errorf("max_open_per_sandbox must not be negative (got %d)", *n)
	}
	if n := a.MaxHeldPerClient; n != nil && *n < 0 {
		return fmt.Errorf("max_held_per_client must not be negative (got %d)", *n)
	}
	for _, w := range a.Webhooks {
		if w.RetryMin < 0 {
			return fmt.Errorf("webhook %s: retry_min must not be negative (got %s)", webhookName(w.URL, caddy.NewReplacer().ReplaceKnown(w.URL, "")), time.Duration(w.RetryMin))
		}
	}
	return nil
}
