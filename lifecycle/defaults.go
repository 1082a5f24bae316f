package lifecycle

import "time"

// Defaults the engine gives a zero Config or Webhook field. The gateway's
// configuration (caddymodule) documents and uses these same values.
const (
	// DefaultWakeTimeout bounds one wake: start plus readiness.
	DefaultWakeTimeout = 60 * time.Second
	// DefaultKeepaliveMax caps one keepalive.
	DefaultKeepaliveMax = 24 * time.Hour
	// DefaultStoreRetry is how often a store that refused a write is
	// tried again.
	DefaultStoreRetry = time.Second
	// DefaultWebhookRetryMin and DefaultWebhookRetryMax bound the delay
	// between attempts to deliver one event.
	DefaultWebhookRetryMin = time.Second
	DefaultWebhookRetryMax = 5 * time.Minute
	// DefaultWebhookMaxAge: an event still undelivered this long after it
	// happened is dropped.
	DefaultWebhookMaxAge = 24 * time.Hour
	// DefaultDiskInterval is how often the disk watchdog measures.
	DefaultDiskInterval = 30 * time.Second
)
