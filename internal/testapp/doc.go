// Command testapp is the tiny static HTTP server sandwake's tests and demo run
// as a sandbox image. It needs nothing from the image but itself.
//
// Environment: PORT (default 8080), EXTRA_PORTS (comma-separated ports also
// served), STARTUP_DELAY (a Go duration to wait before listening; the file
// startup_delay of the workspace, when there, overrides it, so that a test
// can make a sandbox's next start slow), WORKSPACE (default /workspace).
//
// Endpoints: / (an HTML page), /healthz, /echo (method and body back),
// /headers (the request's headers back, one "Name: value" line each), /ws
// (websocket echo), /sse (an event stream), /files/<name> (GET and PUT into the
// workspace), /exit?code=N (the process exits), /oom (allocates until the
// memory limit kills it), /dial?addr=host:port (an outbound connection from
// the sandbox; see dialHandler), /self (the process's user, capabilities
// and limits, as JSON; see selfHandler), /fill?path=/file&mb=N (writes N MiB;
// see fillHandler), /gzip?mb=N (a gzip body of about N KiB that inflates
// to N MiB, when gzip is asked for; see gzipHandler), /raw and /garp (a datagram from another source address,
// a gratuitous ARP; they need NET_RAW; see spoof.go).
package main
