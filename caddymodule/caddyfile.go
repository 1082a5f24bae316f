package caddymodule

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/sandwake/sandwake/api"
	core "github.com/sandwake/sandwake/engine"
	"github.com/sandwake/sandwake/lifecycle"
)

func init() {
	httpcaddyfile.RegisterGlobalOption("sandwake", parseGlobalOption)
	httpcaddyfile.RegisterDirective("sandwake_preview", parsePreview)
	httpcaddyfile.RegisterDirectiveOrder("sandwake_preview", httpcaddyfile.Before, "reverse_proxy")
	httpcaddyfile.RegisterHandlerDirective("sandwake_api", parseAPI)
	httpcaddyfile.RegisterDirectiveOrder("sandwake_api", httpcaddyfile.Before, "reverse_proxy")
}

// parseGlobalOption parses the sandwake global option:
//
//	sandwake {
//		domain         <domain>
//		storage        <dir>
//		engine         docker | kubernetes {
//			kubeconfig    <path>
//			namespace     <namespace>
//			storage_class <class>
//			volume_size   <quantity>
//			node_selector <key> <value>
//			toleration    <key>[=<value>] [<effect>]
//			runtime_class <name>
//		}
//		docker_host    <address>
//		preview_url    <url with * for s-<id>-<port>>
//		upstream_mode  direct | published | network <docker network>
//		idle_pause     <duration>
//		idle_stop      <duration>
//		min_resident   <duration>
//		capacity_wait  <duration>
//		max_lifetime   <duration>
//		expired_wake   recreate | refuse
//		min_free_memory <size> | <percent>%
//		reap_interval  <duration>
//		reconcile_interval <duration>
//		orphans        keep | remove
//		wake_timeout   <duration>
//		hold_timeout   <duration>
//		max_open_per_sandbox <n>
//		max_resident   <n>
//		keepalive_max  <duration>
//		activity_flush <duration>
//		stop_timeout   <duration>
//		label          <key> <value>
//		webhook        <url> {
//			secret    <secret>
//			events    <type>...
//			retry_min <duration>
//		}
//		preview_secret <secret>
//		robots_txt     on | off
//		x_robots_tag   <value> | off
//		no_wake_user_agents <substring>... | off
//		wake_rate      <per second>
//		wake_burst     <n>
//		webhook_max_age <duration>
//		event_retention <duration>
//		max_event_streams <n>
//		max_event_streams_per_client <n>
//		cluster {
//			etcd          <url>...
//			node          <name>
//			peer_listen   <[host]:port>
//			advertise     <host:port>
//			peer_ca_file  <file>
//			peer_cert_file <file>
//			peer_key_file <file>
//			secret        <secret>
//			prefix        <prefix>
//			lease_ttl     <duration>
//		}
//	}
func parseGlobalOption(d *caddyfile.Dispenser, _ any) (any, error) {
	app := new(App)
	if err := app.UnmarshalCaddyfile(d); err != nil {
		return nil, err
	}
	// json.Marshal rather than caddyconfig.JSON, which would turn an
	// encoding error into a silent null app.
	b, err := json.Marshal(app)
	if err != nil {
		return nil, d.Errf("encoding sandwake options: %v", err)
	}
	return httpcaddyfile.App{Name: "sandwake", Value: b}, nil
}

// repeatableOptions are the sandwake options whose lines add up.
var repeatableOptions = map[string]bool{"webhook": true, "label": true, "allowed_images": true, "allowed_registries": true,
	"template": true, "egress_deny": true, "egress_allow_private": true, "egress_dns": true, "egress_allow": true}

// UnmarshalCaddyfile sets up the app from Caddyfile tokens (see
// parseGlobalOption for the syntax).
func (a *App) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the option name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := make(map[string]bool)
	for d.NextBlock(0) {
		opt := d.Val()
		// A second line of an option would silently replace the first
		// (as caddy-ratelimit, refuse it); some options add up.
		if seen[opt] && !repeatableOptions[opt] {
			return d.Errf("sandwake option %s is given twice (the second would silently replace the first)", opt)
		}
		seen[opt] = true
		switch opt {
		case "robots_txt":
			var v string
			if !d.AllArgs(&v) || (v != "on" && v != "off") {
				return d.Err("robots_txt: want on or off")
			}
			on := v == "on"
			a.RobotsTxt = &on
		case "no_wake_user_agents":
			a.NoWakeUserAgents = d.RemainingArgs()
			if len(a.NoWakeUserAgents) == 0 {
				return d.ArgErr()
			}
		case "wake_rate":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return d.Errf("wake_rate %q: want wakes per second >= 0", v)
			}
			a.WakeRate = &f
		case "wake_rate_per_client":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return d.Errf("wake_rate_per_client %q: want wakes per second >= 0", v)
			}
			a.WakeRatePerClient = &f
		case "max_held_per_client":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			n, err := strconv.Atoi(v)
			if err != nil {
				return d.Errf("max_held_per_client %q: want a whole number >= 0", v)
			}
			a.MaxHeldPerClient = &n
		case "max_open_per_sandbox":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			n, err := strconv.Atoi(v)
			if err != nil {
				return d.Errf("max_open_per_sandbox %q: want a whole number >= 0", v)
			}
			a.MaxOpenPerSandbox = &n
		case "wake_burst":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return d.Errf("wake_burst %q: want a whole number >= 1", v)
			}
			a.WakeBurst = n
		case "preview_secret", "x_robots_tag":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			if opt == "preview_secret" {
				a.PreviewSecret = v
			} else {
				a.XRobotsTag = v
			}
		case "expired_wake", "orphans", "min_free_memory":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			switch opt {
			case "expired_wake":
				a.ExpiredWake = v
			case "orphans":
				a.Orphans = v
			case "min_free_memory":
				a.MinFreeMemory = v
			}
		case "idle_pause", "idle_stop", "min_resident", "capacity_wait":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			dur, err := caddy.ParseDuration(v)
			if err != nil {
				return d.Errf("%s %q: want a duration >= 0 like 3m (0 turns it off)", opt, v)
			}
			cd := caddy.Duration(dur)
			switch opt {
			case "idle_pause":
				a.IdlePause = &cd
			case "idle_stop":
				a.IdleStop = &cd
			case "min_resident":
				a.MinResident = &cd
			case "capacity_wait":
				a.CapacityWait = &cd
			}
		case "egress":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			switch v {
			case lifecycle.EgressPublic, lifecycle.EgressNone, lifecycle.EgressLearn:
				a.Egress = v
			case "unenforced":
				a.EgressUnenforced = true
			default:
				return d.Errf("egress %q: want public, none, learn or unenforced", v)
			}
		case "activity":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			if v != lifecycle.ActivityInbound && v != lifecycle.ActivityAny {
				return d.Errf("activity %q: want inbound or any", v)
			}
			a.Activity = v
		case "active_max":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			dur, err := caddy.ParseDuration(v)
			if err != nil || dur <= 0 {
				return d.Errf("active_max %q: want a duration > 0 like 1h", v)
			}
			a.ActiveMax = caddy.Duration(dur)
		case "egress_allow":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			a.EgressAllow = append(a.EgressAllow, args...)
		case "egress_deny", "egress_allow_private", "egress_dns":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			switch opt {
			case "egress_deny":
				a.EgressDeny = append(a.EgressDeny, args...)
			case "egress_allow_private":
				a.EgressAllowPrivate = append(a.EgressAllowPrivate, args...)
			case "egress_dns":
				a.EgressDNS = append(a.EgressDNS, args...)
			}
		case "domain", "storage", "docker_host", "preview_url", "instance", "sandbox_network", "sandbox_subnet", "default_memory", "pull":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			switch opt {
			case "instance":
				a.Instance = v
			case "sandbox_network":
				a.SandboxNetwork = v
			case "sandbox_subnet":
				a.SandboxSubnet = v
			case "default_memory":
				a.DefaultMemory = v
			case "pull":
				a.Pull = v
			case "domain":
				a.Domain = v
			case "storage":
				a.Storage = v
			case "docker_host":
				a.DockerHost = v
			case "preview_url":
				a.PreviewURL = v
			}
		case "upstream_mode":
			if !d.NextArg() {
				return d.ArgErr()
			}
			a.UpstreamMode = d.Val()
			switch a.UpstreamMode {
			case core.UpstreamDirect, core.UpstreamPublished:
			case core.UpstreamNetwork:
				if !d.NextArg() {
					return d.Err("upstream_mode network needs the Docker network name")
				}
				a.Network = d.Val()
			default:
				return d.Errf("upstream_mode %q: want direct, published or network <name>", a.UpstreamMode)
			}
			if d.NextArg() {
				return d.ArgErr()
			}
		case "wake_timeout", "hold_timeout", "keepalive_max", "activity_flush", "stop_timeout",
			"max_lifetime", "reap_interval", "reconcile_interval", "webhook_max_age", "event_retention", "disk_check_interval":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			dur, err := caddy.ParseDuration(v)
			if err != nil {
				return d.Errf("%s %q: %v", opt, v, err)
			}
			*a.durationOptions()[opt] = caddy.Duration(dur)
		case "webhook":
			var w WebhookConfig
			if !d.NextArg() {
				return d.ArgErr()
			}
			w.URL = d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
			for nesting := d.Nesting(); d.NextBlock(nesting); {
				switch d.Val() {
				case "secret":
					if !d.AllArgs(&w.Secret) {
						return d.ArgErr()
					}
				case "events":
					w.Events = d.RemainingArgs()
					if len(w.Events) == 0 {
						return d.ArgErr()
					}
				case "retry_min":
					var v string
					if !d.AllArgs(&v) {
						return d.ArgErr()
					}
					dur, err := caddy.ParseDuration(v)
					if err != nil || dur <= 0 {
						return d.Errf("retry_min %q: want a positive duration", v)
					}
					w.RetryMin = caddy.Duration(dur)
				default:
					return d.Errf("unknown webhook option %q", d.Val())
				}
			}
			a.Webhooks = append(a.Webhooks, w)
		case "allowed_registries":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			a.AllowedRegistries = append(a.AllowedRegistries, args...)
		case "allowed_images":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			a.AllowedImages = append(a.AllowedImages, args...)
		case "label":
			var k, v string
			if !d.AllArgs(&k, &v) {
				return d.ArgErr()
			}
			if a.Labels == nil {
				a.Labels = map[string]string{}
			}
			a.Labels[k] = v
		case "default_disk":
			if !d.AllArgs(&a.DefaultDisk) {
				return d.ArgErr()
			}
		case "user", "runtime":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			if opt == "user" {
				a.User = v
			} else {
				a.Runtime = v
			}
		case "readonly_rootfs":
			on, err := onOff(d, opt)
			if err != nil {
				return err
			}
			a.ReadonlyRootfs = on
		case "default_cpus":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return d.Errf("default_cpus %q: want a number of cores such as 1 or 0.5", v)
			}
			a.DefaultCPUs = f
		case "nofile", "tmp_mb":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 1 {
				return d.Errf("%s %q: want a whole number >= 1", opt, v)
			}
			if opt == "nofile" {
				a.Nofile = n
			} else {
				a.TmpMB = n
			}
		case "max_resident", "max_event_streams", "max_event_streams_per_client":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			n, err := strconv.Atoi(v)
			if err != nil {
				return d.Errf("%s %q: want a whole number >= 0", opt, v)
			}
			*map[string]**int{
				"max_resident": &a.MaxResident, "max_event_streams": &a.MaxEventStreams,
				"max_event_streams_per_client": &a.MaxEventStreamsPerClient,
			}[opt] = &n
		case "template":
			tc, err := unmarshalTemplate(d)
			if err != nil {
				return err
			}
			a.Templates = append(a.Templates, tc)
		case "pool_memory_max":
			if !d.AllArgs(&a.PoolMemoryMax) {
				return d.ArgErr()
			}
		case "engine":
			ec, err := unmarshalEngine(d)
			if err != nil {
				return err
			}
			a.Engine = ec
		case "cluster":
			cc, err := unmarshalCluster(d)
			if err != nil {
				return err
			}
			a.Cluster = cc
		default:
			return d.Errf("unknown sandwake option %q", opt)
		}
		if err := a.checkBounds(); err != nil {
			return d.Err(err.Error())
		}
	}
	return nil
}

// parsePreview expands the sandwake_preview directive into the gate followed
// by reverse_proxy with the sandwake upstream source, the way php_fastcgi
// expands into reverse_proxy. A block is passed to reverse_proxy as its own
// options (transport, headers, flush_interval, …); upstreams may not be set.
//
//	sandwake_preview [<matcher>] {
//		<reverse_proxy subdirectives>
//	}
func parsePreview(h httpcaddyfile.Helper) ([]httpcaddyfile.ConfigValue, error) {
	if !h.Next() {
		return nil, h.ArgErr()
	}
	userMatcher, err := h.ExtractMatcherSet()
	if err != nil {
		return nil, err
	}
	// The rest (directive name and block, matcher removed) is
	// reverse_proxy's to parse. ExtractMatcherSet rewound the dispenser
	// before the directive's name: step onto it, or the segment starts
	// with an empty token and reverse_proxy never sees the block.
	h.Next()
	rest := h.NewFromNextSegment()
	proxy := &reverseproxy.Handler{}
	if err := proxy.UnmarshalCaddyfile(rest); err != nil {
		return nil, err
	}
	if len(proxy.Upstreams) > 0 || proxy.DynamicUpstreamsRaw != nil || proxy.DynamicUpstreams != nil {
		return nil, h.Err("sandwake_preview chooses the upstream itself: remove 'to' and 'dynamic'")
	}
	if err := proxy.FinalizeUnmarshalCaddyfile(h); err != nil {
		return nil, err
	}
	proxy.DynamicUpstreamsRaw = caddyconfig.JSONModuleObject(Upstreams{}, "source", "sandwake", nil)
	if proxy.TransportRaw == nil {
		// Caddy keeps 32 idle connections per upstream; a sandbox lets
		// max_open_per_sandbox exchanges (256 by default) through at once,
		// and once they are answered their connections are reused rather
		// than dialled again (through Docker's proxy, which dials the
		// container in turn). The site's handler is built before the app's
		// settings are known: it keeps the default's number.
		proxy.TransportRaw = caddyconfig.JSONModuleObject(&reverseproxy.HTTPTransport{
			KeepAlive:   &reverseproxy.KeepAlive{MaxIdleConnsPerHost: DefaultMaxOpenPerSandbox},
			Compression: &noCompression,
		}, "protocol", "http", nil)
	} else {
		proxy.TransportRaw = withoutCompression(proxy.TransportRaw)
	}

	route := caddyhttp.Route{
		HandlersRaw: []json.RawMessage{
			caddyconfig.JSONModuleObject(Gate{}, "handler", "sandwake", nil),
			caddyconfig.JSONModuleObject(proxy, "handler", "reverse_proxy", nil),
		},
	}
	if userMatcher != nil {
		route.MatcherSetsRaw = []caddy.ModuleMap{userMatcher}
	}
	return []httpcaddyfile.ConfigValue{{Class: "route", Value: caddyhttp.Subroute{Routes: caddyhttp.RouteList{route}}}}, nil
}

// noCompression is the preview transport's compression setting: off.
// Go's transport, left to itself, asks the sandbox for gzip on behalf of
// a client that asked for no encoding and inflates the answer on the
// gateway's CPU (a 1 MB answer can inflate to 1 GB). Off, the client's
// own Accept-Encoding goes to the app and the app's answer to the client
// as the app encoded it.
var noCompression = false

// withoutCompression sets compression off in an http transport's JSON
// that does not set it (a sandwake_preview block with its own transport);
// other transports, and one that sets it, are left as they are.
func withoutCompression(raw json.RawMessage) json.RawMessage {
	var t map[string]json.RawMessage
	if json.Unmarshal(raw, &t) != nil || string(t["protocol"]) != `"http"` {
		return raw
	}
	if _, set := t["compression"]; set {
		return raw
	}
	t["compression"] = json.RawMessage("false")
	out, err := json.Marshal(t)
	if err != nil {
		return raw
	}
	return out
}

// parseAPI parses the sandwake_api directive:
//
//	sandwake_api {
//		token <bearer token>
//		insecure_no_auth
//	}
func parseAPI(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	a := new(API)
	err := a.UnmarshalCaddyfile(h.Dispenser)
	return a, err
}

// UnmarshalCaddyfile sets up the API handler from Caddyfile tokens.
func (a *API) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "token":
			// token <secret> [{ scope read|operate|admin; labels k=v … }]
			var tc TokenConfig
			if !d.NextArg() {
				return d.ArgErr()
			}
			tc.Secret = d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
			block := false
			for nesting := d.Nesting(); d.NextBlock(nesting); {
				block = true
				switch d.Val() {
				case "scope":
					if !d.AllArgs(&tc.Scope) {
						return d.ArgErr()
					}
					if _, err := api.ParseScope(tc.Scope); err != nil || tc.Scope == "" {
						return d.Errf("token scope %q: want read, operate or admin", tc.Scope)
					}
				case "labels":
					args := d.RemainingArgs()
					if len(args) == 0 {
						return d.ArgErr()
					}
					if tc.Labels == nil {
						tc.Labels = map[string]string{}
					}
					for _, kv := range args {
						k, v, ok := strings.Cut(kv, "=")
						if !ok || k == "" {
							return d.Errf("token labels %q: want key=value", kv)
						}
						tc.Labels[k] = v
					}
				default:
					return d.Errf("unknown token option %q (scope, labels)", d.Val())
				}
			}
			if !block && a.Token == "" && len(a.Tokens) == 0 {
				a.Token = tc.Secret // one plain token: admin, as before scopes
			} else {
				a.Tokens = append(a.Tokens, tc)
			}
		case "insecure_no_auth":
			if d.NextArg() {
				return d.ArgErr()
			}
			a.InsecureNoAuth = true
		default:
			return d.Errf("unknown sandwake_api option %q", d.Val())
		}
	}
	return nil
}

// Interface guards.
var (
	_ caddyfile.Unmarshaler = (*App)(nil)
	_ caddyfile.Unmarshaler = (*API)(nil)
)

// onOff reads a switch's arguments: none or "on" is on, "off" is off;
// anything else is an error naming what (the option, with its block).
func onOff(d *caddyfile.Dispenser, what string) (bool, error) {
	switch args := d.RemainingArgs(); {
	case len(args) == 0 || (len(args) == 1 && args[0] == "on"):
		return true, nil
	case len(args) == 1 && args[0] == "off":
		return false, nil
	}
	return false, d.Errf("%s: want no argument, on or off", what)
}
