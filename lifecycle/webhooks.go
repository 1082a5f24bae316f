package lifecycle

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/sandwake/sandwake/webhook"
)

// Webhook is one receiver of events.
type Webhook struct {
	// URL receives one POST per event.
	URL string
	// Secret signs each delivery (see package webhook).
	Secret []byte
	// Events limits deliveries to these event types (sandbox.killed, …);
	// empty means every event.
	Events []string
	// RetryMin is the first retry delay; it doubles (with jitter) up to
	// RetryMax. Defaults: 1s, 5m.
	RetryMin, RetryMax time.Duration
	// MaxAge: an event still undelivered this long after it happened is
	// dropped (and logged). Default: 24h.
	MaxAge time.Duration
}

// wants reports whether the webhook subscribes to an event type.
func (w *Webhook) wants(typ string) bool { return len(w.Events) == 0 || slices.Contains(w.Events, typ) }

// DeliveryResult is reported after each delivery attempt.
type DeliveryResult struct {
	URL     string
	EventID uint64
	Status  int // HTTP status, 0 when no answer
	Err     error
	Dropped bool // given up after MaxAge
}

// webhookWorker delivers one target's outbox in event-id order: a failing
// event is retried before any later one is sent, so receivers see each
// sandbox's events in order.
type webhookWorker struct {
	hook   Webhook
	wake   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
}

// SetWebhooks replaces the webhook receivers: new ones start delivering
// (including anything already in their outbox from an earlier run), removed
// ones stop. Events are queued for a receiver in the same transaction that
// records them, so deliveries survive restarts.
func (m *Manager) SetWebhooks(hooks []Webhook) {
	m.hooksMu.Lock()
	defer m.hooksMu.Unlock()
	next := make(map[string]*webhookWorker, len(hooks))
	for _, h := range hooks {
		if h.RetryMin <= 0 {
			h.RetryMin = DefaultWebhookRetryMin
		}
		if h.RetryMax <= 0 {
			h.RetryMax = DefaultWebhookRetryMax
		}
		if h.MaxAge <= 0 {
			h.MaxAge = DefaultWebhookMaxAge
		}
		if w, ok := m.hooks[h.URL]; ok {
			w.cancel()
			<-w.done
		}
		ctx, cancel := context.WithCancel(m.ctx)
		w := &webhookWorker{hook: h, wake: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
		next[h.URL] = w
		m.goTask("webhook delivery to "+RedactURL(h.URL), func() { m.deliverLoop(ctx, w) })
	}
	for url, w := range m.hooks {
		if _, ok := next[url]; !ok {
			w.cancel()
			<-w.done
		}
	}
	m.hooks = next
}

// webhookTargets names the receivers an event is queued for (store hook).
func (m *Manager) webhookTargets(ev Event) []string {
	m.hooksMu.Lock()
	defer m.hooksMu.Unlock()
	var out []string
	for url, w := range m.hooks {
		if w.hook.wants(ev.Type) {
			out = append(out, url)
		}
	}
	return out
}

// nudgeWebhooks tells every worker new events are queued (commit hook).
func (m *Manager) nudgeWebhooks() {
	m.hooksMu.Lock()
	defer m.hooksMu.Unlock()
	for _, w := range m.hooks {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// webhookPoll is how often a worker looks at its outbox without a nudge.
const webhookPoll = 5 * time.Second

// webhookClient never follows a redirect: a 307 would send the body and
// its signature to wherever the receiver (or whoever took over its name)
// points. A 3xx is a failed delivery, retried like any other.
var webhookClient = &http.Client{
	Timeout:       10 * time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// RedactURL is what logs and errors show of a webhook URL: its scheme and
// host. Receivers such as Slack's carry their secret in the path.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "(webhook URL)"
	}
	return u.Scheme + "://" + u.Host + "/…"
}

func (m *Manager) deliverLoop(ctx context.Context, w *webhookWorker) {
	defer close(w.done)
	target, shown := w.hook.URL, RedactURL(w.hook.URL)
	attempt := 0
	for ctx.Err() == nil {
		pending, err := m.store.OutboxPending(target, 100)
		if err != nil {
			m.log.Warn("reading webhook outbox", zap.String("url", shown), zap.Error(err))
		}
		progressed := false
		for _, ev := range pending {
			if ctx.Err() != nil {
				return
			}
			res := m.deliverOne(ctx, &w.hook, ev)
			if fn := m.built.OnDelivery; fn != nil {
				fn(res)
			}
			if res.Err != nil && !res.Dropped {
				attempt++
				delay := retryDelay(w.hook.RetryMin, w.hook.RetryMax, attempt)
				m.log.Info("webhook delivery failed; retrying", zap.String("url", shown), zap.Uint64("event", ev.ID),
					zap.Int("status", res.Status), zap.Error(res.Err), zap.Duration("in", delay))
				if !sleepCtx(ctx, delay) {
					return
				}
				break // start again from the oldest pending event
			}
			attempt = 0
			progressed = true
			if err := m.store.OutboxAck(target, ev.ID); err != nil {
				m.log.Warn("acknowledging webhook delivery", zap.String("url", shown), zap.Error(err))
			}
		}
		if progressed || (len(pending) > 0 && attempt > 0) {
			continue
		}
		t := time.NewTimer(webhookPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-w.wake:
			t.Stop()
		case <-t.C:
		}
	}
}

// deliverOne POSTs one event, signed.
func (m *Manager) deliverOne(ctx context.Context, h *Webhook, ev Event) DeliveryResult {
	res := DeliveryResult{URL: h.URL, EventID: ev.ID}
	if age := m.cfg.Now().Sub(ev.At); age > h.MaxAge {
		res.Dropped = true
		res.Err = fmt.Errorf("undelivered for %s (max age %s): dropped", age.Round(time.Second), h.MaxAge)
		m.log.Warn("webhook event dropped", zap.String("url", RedactURL(h.URL)), zap.Uint64("event", ev.ID), zap.Error(res.Err))
		return res
	}
	body, err := json.Marshal(ev)
	if err != nil {
		res.Err = err
		return res
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.URL, bytes.NewReader(body))
	if err != nil {
		res.Err = err
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "sandwake-webhook")
	req.Header.Set(webhook.HeaderDelivery, strconv.FormatUint(ev.ID, 10))
	req.Header.Set(webhook.HeaderSignature, webhook.Sign(h.Secret, time.Now(), body))
	resp, err := webhookClient.Do(req)
	if err != nil {
		if uerr, ok := errors.AsType[*url.Error](err); ok {
			uerr.URL = RedactURL(h.URL) // the error is logged
		}
		res.Err = err
		return res
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	res.Status = resp.StatusCode
	switch {
	case resp.StatusCode >= 300 && resp.StatusCode <= 399:
		res.Err = fmt.Errorf("receiver answered %d (a redirect, not followed: configure the URL it points to)", resp.StatusCode)
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		res.Err = fmt.Errorf("receiver answered %d", resp.StatusCode)
	}
	return res
}

// retryDelay is min·2^(attempt-1), capped at max, with ±20% jitter so that
// many gateways do not retry in step.
func retryDelay(lo, hi time.Duration, attempt int) time.Duration {
	d := lo
	for i := 1; i < attempt && d < hi; i++ {
		d *= 2
	}
	return time.Duration(float64(min(d, hi)) * (0.8 + 0.4*rand.Float64()))
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// webhookState is the manager's set of receivers.
type webhookState struct {
	hooksMu sync.Mutex
	hooks   map[string]*webhookWorker
}
