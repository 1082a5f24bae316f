package preview

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sandwake/sandwake/gateway"
	"github.com/sandwake/sandwake/internal/web"
	"github.com/sandwake/sandwake/lifecycle"
)

// VarUpstream is the request variable through which the gate hands the
// chosen upstream (an *gateway.UpstreamSet) to the dynamic upstream source.
const VarUpstream = "sandwake.upstream"

// Reserved paths on every preview host, answered by the gate, never the app.
const (
	reservedPrefix = "/.well-known/sandwake/"
	pathStatus     = reservedPrefix + "status"
	pathEvents     = reservedPrefix + "events"
	pathWake       = reservedPrefix + "wake"
)

// Handler is the preview-host handler, the gate (the Caddy module
// http.handlers.sandwake hands it its requests). For a running sandbox it
// picks the upstream, counts the exchange as activity and passes the
// request on to reverse_proxy (next); for a sleeping one it wakes it,
// showing browsers the warming page and holding other requests until it is
// ready.
type Handler struct {
	gateway func() *gateway.Gateway
	logger  *zap.Logger
	// stopping is closed when the server the gate serves in shuts down:
	// its event streams end (see Shutdown).
	stopping chan struct{}
	stopOnce sync.Once
	// exiting is cancelled when that shutdown is the process's exit: the
	// requests held for a wake are answered then.
	exiting context.Context
	exit    context.CancelFunc
	// cardImages are og:images of sandboxes' own hosts, for unfurl bots.
	cardImages cardImages
	// peerProxies are the reverse proxies to other nodes' peer listeners,
	// by node name (see peerProxy); remoteWakes the
	// forwards leading a wake on another node, by sandbox id (see
	// waitRemoteWake).
	peerProxies sync.Map
	remoteWakes sync.Map
}

// New is a gate over the gateway gw returns (nil before it starts: the gate
// answers 503 until then).
func New(gw func() *gateway.Gateway, logger *zap.Logger) *Handler {
	exiting, exit := context.WithCancel(context.Background())
	return &Handler{gateway: gw, logger: logger, stopping: make(chan struct{}), exiting: exiting, exit: exit}
}

// Shutdown ends the gate's event streams: the server it serves in is
// shutting down, and a stream, which would otherwise last as long as its
// page, must not hold that server's shutdown (the warming page reconnects
// to the server that follows). When the process is exiting, the requests
// held for a wake are answered too (503, retry): after a reload they keep
// waiting, for the wake goes on in the same engine and hold_timeout bounds
// them.
func (g *Handler) Shutdown(exiting bool) {
	g.stopOnce.Do(func() { close(g.stopping) })
	if exiting {
		g.exit()
	}
}

// ServeHTTP serves a request to a preview host; next is reverse_proxy with
// the sandwake upstream source (caddyhttp.MiddlewareHandler).
func (g *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	e := g.gateway()
	if e == nil || !e.Ready.Load() {
		select {
		case <-g.stopping:
			// The server is shutting down (a gateway's pod replaced):
			// its successor, or another node, serves the retry.
			return g.unavailable(w, r, "sandwake is stopping")
		default:
		}
		return g.unavailable(w, r, "sandwake is starting")
	}
	s := e.Current.Load()
	id, port, ok := ParseHost(r.Host, s.Domain)
	if !ok {
		return g.notFound(w, r, "", 0, "This is not a preview address. Preview addresses look like s-<id>-<port>.preview."+s.Domain+".")
	}
	if e.Cluster != nil {
		if done, err := g.serveCluster(w, r, e, s, id, port); done {
			return err
		}
	}
	if s.XRobotsTag != nil {
		// Assigned, not Set: the slice is shared and full (len == cap), so
		// an append by reverse_proxy copies it; no allocation here.
		w.Header()["X-Robots-Tag"] = s.XRobotsTag
	}
	if s.RobotsTxt && r.URL.Path == "/robots.txt" {
		countRequest(outcomeRobots)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "public, max-age=86400")
		io.WriteString(w, "User-agent: *\nDisallow: /\n")
		return nil
	}
	rt, err := e.Routes.Get(id)
	if errors.Is(err, lifecycle.ErrNotFound) {
		return g.notFound(w, r, id, port, "There is no sandbox with this id.")
	}
	if err != nil {
		g.logger.Error("reading sandbox", zap.String("id", id), zap.Error(err))
		return g.unavailable(w, r, "the sandbox store could not be read")
	}
	if !rt.Declares(port) {
		return g.notFound(w, r, id, port, fmt.Sprintf("Sandbox %s does not serve port %d.", id, port))
	}
	if rt.Access == lifecycle.AccessPrivate && !g.authorize(w, r, s, e, rt, port) {
		return nil
	}
	if strings.HasPrefix(r.URL.Path, reservedPrefix) {
		countRequest(outcomeReserved)
		return g.serveReserved(w, r, e, rt, port)
	}
	if rt.State == lifecycle.Running {
		requestsProxied.Inc()
		return g.serveRunning(w, r, next, e, s, rt, port)
	}
	return g.serveSleeping(w, r, next, e, s, rt, port)
}

// serveRunning proxies to a sandbox believed running. A sandbox sandwake is
// pausing or stopping gets no request: the request is held through the next
// wake. If the upstream cannot be reached, the belief is checked at once
// against Docker: when the container is gone or has exited, the request (if
// nothing of it was sent) is held through a wake instead of failing with a
// bare 502. A request cut because sandwake stopped the sandbox under it (the
// API, expiry) is held the same way, or answered 503 interrupted once part of
// its body was sent.
func (g *Handler) serveRunning(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, e *gateway.Gateway, s *gateway.Settings, rt *gateway.Route, port int) error {
	var body *unreadBody
	if r.Body != nil && r.Body != http.NoBody {
		body = &unreadBody{ReadCloser: r.Body}
		r.Body = body
	}
	var err error
	if cw := captureCard(w, r, rt); cw != nil {
		err = g.proxy(cw, r, next, s, rt, port)
		g.finishCard(cw, r, e, rt, port)
	} else {
		err = g.proxy(w, r, next, s, rt, port)
	}
	if err == errAnswered {
		return nil
	}
	if err == errGoingDown {
		return g.holdThrough(w, r, next, e, s, rt, port)
	}
	if err == nil || !isUpstreamFailure(err) {
		return err
	}
	if a := rt.Activity; a.GoingDown() || a.Downs() != rt.Downs {
		// sandwake paused or stopped the sandbox under this request.
		if body != nil && body.read {
			countRequest(outcomeInterrupted)
			web.WriteError(w, http.StatusServiceUnavailable, "interrupted",
				fmt.Sprintf("sandbox %s was paused or stopped by sandwake while this request was being sent; it is woken again on the next request: retry", rt.ID), 1)
			return nil
		}
		return g.holdThrough(w, r, next, e, s, rt, port)
	}
	if body != nil && body.read {
		return err
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	// The engine's event handler may have recorded the exit first; either
	// way, after this the record follows Docker.
	corr, verr := e.Mgr.ReconcileOne(ctx, rt.ID)
	if errors.Is(verr, lifecycle.ErrStoreUnavailable) {
		// Docker says it is not running, but that cannot be recorded, so
		// it cannot be woken either: not the app's 502, a retry later.
		return g.storeUnavailable(w, r, rt, port)
	}
	if verr != nil {
		return err
	}
	fresh, ferr := e.Routes.Get(rt.ID)
	if ferr != nil {
		return err
	}
	if corr != nil {
		g.logger.Info("upstream unreachable; sandbox was not running after all",
			zap.String("id", rt.ID), zap.String("now", string(corr.To)), zap.String("reason", corr.Reason))
	}
	switch fresh.State {
	case lifecycle.Running:
		if up := fresh.Upstreams[port]; up == nil || rt.Upstreams[port] == nil || up.Dial == rt.Upstreams[port].Dial {
			return err // Docker agrees it runs where we sent it: the app itself failed
		}
		// Restarted outside sandwake on a new port.
		if err := g.proxy(w, r, next, s, fresh, port); err != errAnswered {
			return err
		}
		return nil
	case lifecycle.Creating:
		return err
	default:
		if g.refuseWake(w, r, e, fresh, port) {
			return nil
		}
		return g.hold(w, r, next, e, s, fresh, port, false)
	}
}

// holdThrough holds a request whose sandbox sandwake was putting to sleep
// until it is woken again (a wake waits for the pause or stop to end).
func (g *Handler) holdThrough(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, e *gateway.Gateway, s *gateway.Settings, rt *gateway.Route, port int) error {
	if g.refuseWake(w, r, e, rt, port) {
		return nil
	}
	return g.hold(w, r, next, e, s, rt, port, false)
}

// refuseWake answers a request that must not wake the sandbox now and
// reports whether it did: a crawler or monitor, a sandbox whose wakes keep
// failing (backoff), or wakes coming faster than wake_rate. Joining a wake
// already in flight is always allowed.
func (g *Handler) refuseWake(w http.ResponseWriter, r *http.Request, e *gateway.Gateway, rt *gateway.Route, port int) bool {
	if _, waking := e.Mgr.Waking(rt.ID); waking {
		return false
	}
	if rt.State == lifecycle.Stopped && rt.Reason == lifecycle.ReasonDiskQuota {
		// Woken, it would write on past its quota: its owner decides
		// (an API wake, a purge).
		countRequest(outcomeDiskQuota)
		d := g.page(rt, port, pageError, time.Time{})
		d.Message = fmt.Sprintf("Sandbox %s was stopped: %s It is not woken by visits; its owner can free space and wake it.", rt.ID, reasonSentence(lifecycle.ReasonDiskQuota))
		answer(w, r, http.StatusInsufficientStorage, d, lifecycle.ReasonDiskQuota,
			fmt.Sprintf("sandbox %s was stopped over its disk quota; it is not woken by requests", rt.ID), 0)
		return true
	}
	if e.Guard.Crawler(r.UserAgent()) {
		// A link pasted in a chat: its card, when the app's last page
		// left one, else the asleep page.
		if g.serveCard(w, r, e, rt, port) {
			return true
		}
		countRequest(outcomeCrawler)
		d := g.page(rt, port, pageAsleep, time.Time{})
		d.RetryAfter = 3600
		renderPage(w, r, http.StatusServiceUnavailable, d)
		return true
	}
	if off, left := e.Guard.BackingOff(rt.ID, time.Now()); off {
		countRequest(outcomeBackoff)
		retry := int(left.Seconds()) + 1
		d := g.page(rt, port, pageError, time.Time{})
		d.Message = fmt.Sprintf("Sandbox %s failed to start. %s It is tried again in %ds.", rt.ID, reasonSentence(rt.Reason), retry)
		d.RetryAfter = retry
		answer(w, r, http.StatusServiceUnavailable, d, "backoff",
			fmt.Sprintf("sandbox %s failed to start; next attempt in %ds", rt.ID, retry), retry)
		return true
	}
	switch e.Guard.AllowWake(rt.ID, e.Clients, gateway.StreamClient(r), time.Now()) {
	case gateway.WakeRefusedGlobal:
		countRequest(outcomeRateLimited)
		answer(w, r, http.StatusServiceUnavailable, pageData{Kind: pageCapacity, Title: "Busy waking sandboxes", RetryAfter: 1,
			Message: "Too many previews are waking at once. This page retries by itself.", StatusURL: pathStatus, EventsURL: pathEvents},
			"wake_rate", "too many sandboxes are waking at once; retry", 1)
		return true
	case gateway.WakeRefusedClient:
		countRequest(outcomeClientRateLimited)
		answer(w, r, http.StatusTooManyRequests, pageData{Kind: pageCapacity, Title: "Too many wakes", RetryAfter: 2,
			Message: "You have woken many previews in a short time. This page retries by itself.", StatusURL: pathStatus, EventsURL: pathEvents},
			"wake_rate_client", "this client woke too many sandboxes in a short time (wake_rate_per_client); retry", 2)
		return true
	}
	return false
}

// authorize lets a request to a private sandbox through only with a valid
// preview token, and reports whether it may go on. A token given in the URL
// becomes a cookie for this host and the browser is sent to the same URL
// without it. sandwake's credentials are removed before the request reaches
// the app. Nothing unauthorised ever wakes a sandbox.
func (g *Handler) authorize(w http.ResponseWriter, r *http.Request, s *gateway.Settings, e *gateway.Gateway, rt *gateway.Route, port int) bool {
	token, fromQuery := presentedToken(r)
	if err := gateway.VerifyToken(s.PreviewSecret, token, rt.ID, rt.Incarnation, rt.TokenGen, time.Now()); err != nil {
		// Without a token, an unfurl bot gets the card of a private
		// sandbox whose owner set public_card, asleep or running (a
		// request with a token always reaches the app).
		if rt.Cards && e.Guard.Crawler(r.UserAgent()) && g.serveCard(w, r, e, rt, port) {
			return false
		}
		countRequest(outcomeUnauthorized)
		if isPageLoad(r) {
			renderPage(w, r, http.StatusUnauthorized, pageData{Kind: pageUnauthorized, SandboxID: rt.ID, Message: capitalize(err.Error()) + "."})
			return false
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="sandwake preview"`)
		web.WriteError(w, http.StatusUnauthorized, "unauthorized", err.Error(), 0)
		return false
	}
	if fromQuery {
		setTokenCookie(w, r, token, gateway.TokenExpiry(token))
		w.Header().Set("Referrer-Policy", "no-referrer")
		http.Redirect(w, r, withoutToken(r), http.StatusSeeOther)
		return false
	}
	stripToken(r)
	return true
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// unreadBody notes whether any of a request body was read, i.e. whether the
// request can still be sent again.
type unreadBody struct {
	io.ReadCloser
	read bool
}

func (b *unreadBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.read = true
	}
	return n, err
}

// isUpstreamFailure reports whether reverse_proxy failed to get an answer
// from the upstream (dial refused, connection reset before a response).
func isUpstreamFailure(err error) bool {
	var he caddyhttp.HandlerError
	return errors.As(err, &he) && he.StatusCode == http.StatusBadGateway
}

// errGoingDown: proxy sent nothing because sandwake is pausing or stopping
// the sandbox, or did since the route was read.
var errGoingDown = errors.New("sandbox going down")

// errAnswered: proxy answered the request itself (503 busy) and sent
// nothing upstream.
var errAnswered = errors.New("answered by the gate")

// errBusy is a held request's failure cause when its sandbox stayed at
// max_open_per_sandbox (for traces).
var errBusy = errors.New("the sandbox had max_open_per_sandbox exchanges open until hold_timeout")

// proxy is the hot path: no store, no Docker, no allocation of its own, and
// no lock but the sandbox's slot count (max_open_per_sandbox), taken without
// waiting while slots are free. Past the bound the request waits its turn
// (waitSlot). The request is registered as open before it is sent
// (Activity.Enter), so a pause or stop either sees it and backs off or has
// marked the sandbox first, and then proxy sends nothing and returns
// errGoingDown.
func (g *Handler) proxy(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, s *gateway.Settings, rt *gateway.Route, port int) error {
	ups := rt.Upstreams[port]
	if ups == nil {
		web.WriteError(w, http.StatusBadGateway, "no_upstream", fmt.Sprintf("sandbox %s has no address for port %d", rt.ID, port), 1)
		return nil
	}
	a := rt.Activity
	if s.MaxOpen > 0 && !isUpgrade(r) {
		sl := a.TakeSlot(s.MaxOpen)
		if sl == nil {
			if sl = g.waitSlot(w, r, s, rt); sl == nil {
				return errAnswered
			}
		}
		defer sl.Release()
	}
	if !a.Enter(rt.Downs) {
		return errGoingDown
	}
	defer a.Finish() // long exchanges (websockets, SSE) count until they end
	caddyhttp.SetVar(r.Context(), VarUpstream, ups)
	return next.ServeHTTP(w, r)
}

// isUpgrade reports whether r asks to switch protocols (a websocket, over
// HTTP/1.1's Upgrade or HTTP/2's extended CONNECT). Such exchanges take no
// slot: a slot paces requests through a storm, while a websocket is a tunnel
// for as long as its page is open, and a preview's open tabs (a dev
// server's hot reload each) would otherwise hold every slot and leave the
// next visitor 503 busy.
func isUpgrade(r *http.Request) bool {
	return len(r.Header["Upgrade"]) > 0 || r.Method == http.MethodConnect
}

// waitSlot waits, first in first out, for one of the max_open_per_sandbox
// slots of rt's sandbox, up to hold_timeout. When none came it answers 503
// busy (unless the client left) and returns nil.
func (g *Handler) waitSlot(w http.ResponseWriter, r *http.Request, s *gateway.Settings, rt *gateway.Route) *lifecycle.Slots {
	ctx, cancel := context.WithTimeout(r.Context(), s.HoldTimeout)
	defer cancel()
	metricSlotWaiting.Inc()
	sl, err := rt.Activity.WaitSlot(ctx, s.MaxOpen)
	metricSlotWaiting.Dec()
	if err == nil {
		return sl
	}
	if r.Context().Err() == nil {
		countRequest(outcomeBusy)
		web.WriteError(w, http.StatusServiceUnavailable, "busy",
			fmt.Sprintf("sandbox %s had %d exchanges open (max_open_per_sandbox) for %s; retry", rt.ID, s.MaxOpen, s.HoldTimeout), 1)
	}
	return nil
}

// serveSleeping answers a request to a sandbox that is not running.
func (g *Handler) serveSleeping(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, e *gateway.Gateway, s *gateway.Settings, rt *gateway.Route, port int) error {
	switch rt.State {
	case lifecycle.Paused, lifecycle.Stopped:
		if refused := g.refuseWake(w, r, e, rt, port); refused {
			return nil
		}
		if isPageLoad(r) {
			ctx, tr := startWakeTrace(r.Context(), rt.ID, port)
			e.Mgr.StartWake(ctx, rt.ID)
			tr.end(wakeWarmingPage, nil)
			countRequest(outcomeWarming)
			since, _ := e.Mgr.Waking(rt.ID)
			renderPage(w, r, http.StatusServiceUnavailable, g.page(rt, port, pageWarming, since))
			return nil
		}
		return g.hold(w, r, next, e, s, rt, port, false)
	case lifecycle.Creating:
		countRequest(outcomeRefused)
		// A page load gets the page (503, it reloads itself); an API client
		// a 409: creating is not something to wait for with Retry-After.
		if isPageLoad(r) {
			renderPage(w, r, http.StatusServiceUnavailable, g.page(rt, port, pageCreating, time.Time{}))
			return nil
		}
		web.WriteError(w, http.StatusConflict, "creating", fmt.Sprintf("sandbox %s is still being created", rt.ID), 2)
		return nil
	default: // killed, expired, error: explained, woken only on request
		if since, waking := e.Mgr.Waking(rt.ID); waking {
			// Someone asked for the wake: ride on it as for a stopped
			// sandbox, without ever starting one.
			if isPageLoad(r) {
				_, tr := startWakeTrace(r.Context(), rt.ID, port)
				tr.joined()
				tr.end(wakeWarmingPage, nil)
				countRequest(outcomeWarming)
				renderPage(w, r, http.StatusServiceUnavailable, g.page(rt, port, pageWarming, since))
				return nil
			}
			return g.hold(w, r, next, e, s, rt, port, true)
		}
		if isPageLoad(r) {
			countRequest(outcomeRefused)
			renderPage(w, r, http.StatusServiceUnavailable, g.page(rt, port, string(rt.State), time.Time{}))
			return nil
		}
		g.writeAsleep(w, rt)
		return nil
	}
}

// writeAsleep answers an API client of a killed, expired or failed sandbox
// that nobody is waking: what happened, as a reason code's sentence (never
// the raw error), and how to wake it.
func (g *Handler) writeAsleep(w http.ResponseWriter, rt *gateway.Route) {
	countRequest(outcomeRefused)
	web.WriteError(w, http.StatusServiceUnavailable, "sandbox_"+string(rt.State),
		fmt.Sprintf("sandbox %s is %s: %s POST %s to wake it", rt.ID, rt.State, reasonSentence(rt.Reason), pathWake), 0)
}

// hold keeps a non-browser request, body untouched, until the sandbox is
// running, then proxies it; past hold_timeout it answers 503 + Retry-After.
// With joinOnly it only waits for a wake in flight and never starts one.
// A failed wake is answered with its code and a plain sentence: the engine's
// error text is for the management API, the logs and traces, not for
// visitors. A traced request gets a sandwake.wake span with a sandwake.hold
// child per wait and a sandwake.proxy child for the exchange.
func (g *Handler) hold(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, e *gateway.Gateway, s *gateway.Settings, rt *gateway.Route, port int, joinOnly bool) error {
	ok, release := e.Clients.Hold(gateway.StreamClient(r))
	if !ok {
		countRequest(outcomeClientHeldLimit)
		web.WriteError(w, http.StatusTooManyRequests, "too_many_held",
			"this client already has as many requests waiting for sandboxes as it may (max_held_per_client); retry once they are answered", 1)
		return nil
	}
	defer release()
	ctx, cancel := context.WithTimeout(r.Context(), s.HoldTimeout)
	defer cancel()
	defer context.AfterFunc(g.exiting, cancel)()
	ctx, tr := startWakeTrace(ctx, rt.ID, port)
	var (
		outcome string
		cause   error
	)
	defer func() { tr.end(outcome, cause) }()
	if _, waking := e.Mgr.Waking(rt.ID); waking {
		metricWaitersCollapsed.Inc()
	}
	start := time.Now()
	var waited time.Duration
	for attempt := range 10 {
		held := tr.child(ctx, spanHold)
		t0 := time.Now()
		var phases *lifecycle.WakePhases
		outcome, phases, cause = g.wakeForHold(ctx, w, r, e, s, rt, port, joinOnly && attempt == 0)
		waited += time.Since(t0)
		held.end(cause)
		if outcome != "" {
			return nil // answered
		}
		w.Header().Set("Server-Timing", serverTiming(time.Since(start), waited, phases))
		woke, err := e.Routes.Get(rt.ID)
		if err != nil || woke.State != lifecycle.Running {
			outcome, cause = wakeFailed, errStateChanged
			countRequest(outcomeWakeFailed)
			web.WriteError(w, http.StatusServiceUnavailable, "waking", fmt.Sprintf("sandbox %s changed state while waking; retry", rt.ID), 1)
			return nil
		}
		proxied := tr.child(ctx, spanProxy)
		err = g.proxy(w, r, next, s, woke, port)
		proxied.end(err)
		if err == errAnswered {
			outcome, cause = wakeBusy, errBusy
			return nil
		}
		if err != errGoingDown {
			outcome, cause = wakeReady, nil
			countRequest(outcomeHeldProxied)
			return err
		}
		// Put to sleep again between the wake and now: hold on.
	}
	outcome, cause = wakeFailed, errKeptAsleep
	countRequest(outcomeWakeFailed)
	web.WriteError(w, http.StatusServiceUnavailable, "waking", fmt.Sprintf("sandbox %s keeps being put to sleep while waking; retry", rt.ID), 1)
	return nil
}

// Causes of a held request's failure that are not the wake's (for traces).
var (
	errStateChanged = errors.New("the sandbox changed state while waking")
	errKeptAsleep   = errors.New("the sandbox kept being put to sleep while waking")
)

// wakeForHold wakes rt's sandbox for a held request (with joinOnly it only
// joins a wake in flight, never starts one). It returns an empty outcome
// once the sandbox is running; when the wake fails (or the client left) it
// answers the request and returns the outcome for the trace and its cause.
func (g *Handler) wakeForHold(ctx context.Context, w http.ResponseWriter, r *http.Request, e *gateway.Gateway, s *gateway.Settings, rt *gateway.Route, port int, joinOnly bool) (outcome string, phases *lifecycle.WakePhases, cause error) {
	var (
		err   error
		woken lifecycle.Record
	)
	if joinOnly {
		var joined bool
		if woken, joined, err = e.Mgr.JoinWake(ctx, rt.ID); !joined {
			// The wake ended between the check and the join: answer from
			// the record it left.
			fresh, ferr := e.Routes.Get(rt.ID)
			if ferr != nil || fresh.State != lifecycle.Running {
				if ferr == nil {
					rt = fresh
				}
				g.writeAsleep(w, rt)
				return wakeNotWoken, nil, nil
			}
		}
	} else {
		woken, err = e.Mgr.Wake(ctx, rt.ID)
	}
	if err != nil {
		if r.Context().Err() != nil {
			return wakeClientGone, nil, err // the client left; the wake goes on for others
		}
		if g.exiting.Err() != nil {
			countRequest(outcomeUnavailable)
			web.WriteError(w, http.StatusServiceUnavailable, "unavailable",
				fmt.Sprintf("the gateway is stopping while sandbox %s wakes; retry", rt.ID), 1)
			return wakeFailed, nil, err
		}
		if errors.Is(err, context.DeadlineExceeded) {
			countRequest(outcomeHoldTimeout)
			web.WriteError(w, http.StatusServiceUnavailable, "waking",
				fmt.Sprintf("sandbox %s is still waking after %s; retry", rt.ID, s.HoldTimeout), 1)
			return wakeTimeout, nil, err
		}
		status, code, retry := web.ErrorStatus(err)
		switch code {
		case "store_unavailable":
			g.storeUnavailable(w, r, rt, port)
			return wakeFailed, nil, err
		case "capacity":
			countRequest(outcomeCapacity)
		case "unavailable":
			countRequest(outcomeUnavailable)
		default:
			countRequest(outcomeWakeFailed)
		}
		why := code
		if errors.Is(err, lifecycle.ErrCircuitOpen) {
			why = "circuit_open"
		}
		web.WriteError(w, status, code, fmt.Sprintf("sandbox %s could not be woken: %s", rt.ID, reasonSentence(why)), retry)
		return wakeFailed, nil, err
	}
	return "", woken.Phases, nil
}

// serveReserved answers /.well-known/sandwake/*.
func (g *Handler) serveReserved(w http.ResponseWriter, r *http.Request, e *gateway.Gateway, rt *gateway.Route, port int) error {
	switch r.URL.Path {
	case pathStatus:
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			web.WriteError(w, http.StatusMethodNotAllowed, "method", "GET only", 0)
			return nil
		}
		web.WriteJSON(w, http.StatusOK, g.status(e, rt, port))
	case pathEvents:
		return g.serveEvents(w, r, e, rt)
	case pathWake:
		if r.Method != http.MethodPost {
			web.WriteError(w, http.StatusMethodNotAllowed, "method", "POST only", 0)
			return nil
		}
		if rt.State == lifecycle.Creating {
			web.WriteError(w, http.StatusConflict, "creating", fmt.Sprintf("sandbox %s is still being created", rt.ID), 2)
			return nil
		}
		if refused := g.refuseWake(w, r, e, rt, port); refused {
			return nil
		}
		ctx, tr := startWakeTrace(r.Context(), rt.ID, port)
		e.Mgr.StartWake(ctx, rt.ID)
		tr.end(wakeRequested, nil)
		if strings.Contains(r.Header.Get("Accept"), "text/html") || strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded") {
			// A form post from a state page: back to the page, which now
			// shows the wake in progress.
			http.Redirect(w, r, backTo(r), http.StatusSeeOther)
			return nil
		}
		web.WriteJSON(w, http.StatusAccepted, g.status(e, rt, port))
	default:
		web.WriteError(w, http.StatusNotFound, "not_found", "no such sandwake path", 0)
	}
	return nil
}

// previewStatus is the JSON of GET /.well-known/sandwake/status. It is
// public: a failure shows as its reason code and a plain sentence, never the
// engine's error text.
type previewStatus struct {
	ID          string     `json:"id"`
	Port        int        `json:"port"`
	State       string     `json:"state"`
	Reason      string     `json:"reason,omitempty"`
	Message     string     `json:"message,omitempty"`
	Waking      bool       `json:"waking"`
	WakingSince *time.Time `json:"waking_since,omitempty"`
}

func (g *Handler) status(e *gateway.Gateway, rt *gateway.Route, port int) previewStatus {
	st := previewStatus{ID: rt.ID, Port: port, State: string(rt.State), Reason: rt.Reason}
	if fresh, err := e.Routes.Get(rt.ID); err == nil {
		st.State, st.Reason = string(fresh.State), fresh.Reason
	}
	switch lifecycle.State(st.State) {
	case lifecycle.Error, lifecycle.Killed, lifecycle.Expired:
		st.Message = reasonSentence(st.Reason)
	}
	if since, ok := e.Mgr.Waking(rt.ID); ok {
		st.Waking = true
		st.WakingSince = &since
	}
	return st
}

// serveEvents streams this sandbox's transitions as server-sent events. The
// first message is the current state, so a page that subscribes after the
// sandbox became ready still learns of it. Streams are capped per client
// and overall (max_event_streams_per_client, max_event_streams); a refused
// page polls the status instead.
func (g *Handler) serveEvents(w http.ResponseWriter, r *http.Request, e *gateway.Gateway, rt *gateway.Route) error {
	release, refused := e.Streams.Acquire(gateway.StreamClient(r))
	switch refused {
	case http.StatusTooManyRequests:
		web.WriteError(w, refused, "too_many_streams", "this client has too many event streams open; close some or poll "+pathStatus, gateway.StreamRetryAfter)
		return nil
	case http.StatusServiceUnavailable:
		web.WriteError(w, refused, "streams_full", "the gateway has too many event streams open; poll "+pathStatus, gateway.StreamRetryAfter)
		return nil
	}
	defer release()
	sub := e.Mgr.Subscribe()
	defer sub.Cancel()
	stream := web.StartSSE(w)
	defer stream.Stop()
	current := lifecycle.Event{SandboxID: rt.ID, Type: "sandbox." + string(rt.State), To: rt.State}
	if fresh, err := e.Routes.Get(rt.ID); err == nil {
		current.To, current.Type = fresh.State, "sandbox."+string(fresh.State)
	}
	if err := stream.Event(current); err != nil {
		return nil
	}
	stream.Flush()
	for {
		select {
		case <-r.Context().Done():
			return nil
		case <-g.stopping:
			return nil // the page reconnects, to the next server
		case ev, ok := <-sub.C:
			if !ok {
				return nil // lagged or shutting down; the page falls back to polling
			}
			if ev.SandboxID != rt.ID {
				continue
			}
			if stream.Event(ev) != nil {
				return nil
			}
			if ev.To == lifecycle.Running {
				// Where the wake went, for the page (and devtools).
				if ph, ok := e.Mgr.LastWake(rt.ID); ok && stream.Data(newWakeTiming(rt.ID, ph)) != nil {
					return nil
				}
			}
			if stream.Flush() != nil {
				return nil
			}
		case <-stream.Heartbeat:
			if stream.KeepAlive() != nil {
				return nil
			}
		}
	}
}

// killedMessage is the killed page's message: the reason's sentence says
// what happened to the container (said once), then what waking does.
func killedMessage(id, reason string) string {
	return fmt.Sprintf("%s Its files are kept: waking sandbox %s recreates its container.", reasonSentence(reason), id)
}

// page builds the data of a state page for rt.
func (g *Handler) page(rt *gateway.Route, port int, kind string, since time.Time) pageData {
	d := pageData{
		Kind: kind, SandboxID: rt.ID, Port: port, State: string(rt.State), Reason: rt.Reason,
		Since: since, EventsURL: pathEvents, StatusURL: pathStatus, WakeURL: pathWake,
	}
	switch kind {
	case pageWarming:
		// The record keeps its state until the wake ends; the visitor
		// sees what is happening, not the internal reason.
		d.State, d.Reason, d.RetryAfter = "starting", "", 2
		d.Title, d.Message = "Waking up…", fmt.Sprintf("Sandbox %s was %s and is starting. This page opens the app by itself as soon as it answers.", rt.ID, rt.State)
	case pageCreating:
		d.Title, d.Message, d.RetryAfter = "Being created…", fmt.Sprintf("Sandbox %s is still being created.", rt.ID), 2
	case pageKilled:
		d.Title, d.Message, d.CanWake = "Sandbox stopped unexpectedly", killedMessage(rt.ID, rt.Reason), true
	case pageExpired:
		d.Title, d.Message, d.CanWake = "Sandbox expired", fmt.Sprintf("Sandbox %s reached its maximum lifetime and was removed. Its files are kept: waking recreates it.", rt.ID), true
	case pageError:
		d.Title, d.Message, d.CanWake = "Sandbox failed to start", fmt.Sprintf("Sandbox %s could not be started. %s", rt.ID, reasonSentence(rt.Reason)), true
	}
	return d
}

func (g *Handler) notFound(w http.ResponseWriter, r *http.Request, id string, port int, msg string) error {
	countRequest(outcomeNotFound)
	answer(w, r, http.StatusNotFound, pageData{Kind: pageNotFound, Title: "No such preview", Message: msg, SandboxID: id, Port: port}, "not_found", msg, 0)
	return nil
}

// storeUnavailable answers a request for a sandbox that is not running and
// cannot be woken now because the store refuses writes (full or not
// writable): 503 with Retry-After, a page for browsers. Visitors are not
// told the store's path; readyz and the logs are.
func (g *Handler) storeUnavailable(w http.ResponseWriter, r *http.Request, rt *gateway.Route, port int) error {
	countRequest(outcomeUnavailable)
	msg := fmt.Sprintf("Sandbox %s is not running, and sandwake cannot record changes right now (its store is full or not writable), so it cannot be woken yet.", rt.ID)
	answer(w, r, http.StatusServiceUnavailable, pageData{Kind: pageUnavailable, Title: "Temporarily unavailable", Message: msg + " This page retries by itself.",
		SandboxID: rt.ID, Port: port, RetryAfter: web.StoreRetryAfter, StatusURL: pathStatus, EventsURL: pathEvents},
		"store_unavailable", msg+" Retry later.", web.StoreRetryAfter)
	return nil
}

func (g *Handler) unavailable(w http.ResponseWriter, r *http.Request, msg string) error {
	countRequest(outcomeUnavailable)
	answer(w, r, http.StatusServiceUnavailable, pageData{Kind: pageUnavailable, Title: "Starting…", Message: msg, RetryAfter: 1, StatusURL: pathStatus, EventsURL: pathEvents},
		"unavailable", msg, 1)
	return nil
}

// answer answers a request the gate does not proxy: a browser's page load
// gets page d, anything else the JSON error {code, msg}; both with status
// and, when retryAfter > 0, Retry-After (the page carries its own).
func answer(w http.ResponseWriter, r *http.Request, status int, d pageData, code, msg string, retryAfter int) {
	if isPageLoad(r) {
		renderPage(w, r, status, d)
		return
	}
	web.WriteError(w, status, code, msg, retryAfter)
}

// backTo is where a form post returns to: the page it came from on this
// host, else the root. The path is taken as sent (escaped), and never one a
// browser would read as another host.
func backTo(r *http.Request) string {
	if ref, err := url.Parse(r.Header.Get("Referer")); err == nil && ref.Host == r.Host {
		target := ref.EscapedPath()
		if ref.RawQuery != "" {
			target += "?" + ref.RawQuery
		}
		return localPath(target)
	}
	return "/"
}

// isPageLoad reports whether r is a browser navigation (it gets a page)
// rather than an API call, XHR, or websocket upgrade (held until ready).
func isPageLoad(r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	h := r.Header
	if h.Get("Upgrade") != "" || h.Get("X-Requested-With") != "" {
		return false
	}
	if m := h.Get("Sec-Fetch-Mode"); m != "" && m != "navigate" {
		return false
	}
	if d := h.Get("Sec-Fetch-Dest"); d != "" && d != "document" && d != "iframe" {
		return false
	}
	return strings.Contains(h.Get("Accept"), "text/html")
}

// Interface guard.
var _ caddyhttp.MiddlewareHandler = (*Handler)(nil)
