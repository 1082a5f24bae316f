package caddymodule_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddytls"

	"github.com/sandwake/sandwake/caddymodule"
	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
)

// tlsCaddyfile serves previews over HTTPS with certificates from Caddy's
// internal CA, obtained on demand at the first handshake for a name and only
// if the sandwake permission module allows it. The API stays on plain HTTP.
// site is the preview site's address without scheme and port: a wildcard
// ("*.preview.localhost") or "" for every name on the port.
//
// auto_https disable_redirects keeps Caddy off the HTTP port (on-demand
// issuance works with auto_https off too); skip_install_trust keeps the
// internal root out of the system trust store. The internal issuer is
// exempt from Caddy's "on-demand needs a permission module" check, so
// without on_demand_tls { permission sandwake } every name would get a
// certificate.
func tlsCaddyfile(dir, site string, httpsPort, apiPort int) string {
	return fmt.Sprintf(`{
	admin off
	persist_config off
	auto_https disable_redirects
	skip_install_trust
	storage file_system %s
	on_demand_tls {
		permission sandwake
	}
	sandwake {
		storage %s
		preview_url https://*.preview.localhost:%d
		label %s %s
		stop_timeout 5s
	}
}
https://%s:%d {
	bind 127.0.0.1
	tls internal {
		on_demand
	}
	sandwake_preview
}
http://127.0.0.1:%d {
	bind 127.0.0.1
	sandwake_api {
		token %s
	}
}
`, filepath.Join(dir, "caddy"), filepath.Join(dir, "sandwake"), httpsPort,
		testenv.LabelRun, testenv.RunID(), site, httpsPort, apiPort, gatewaytest.Token)
}

// newTLSHarness starts a Caddy serving tlsCaddyfile. Its previewPort is the
// HTTPS port; the harness's HTTP preview client is not used.
func newTLSHarness(t *testing.T, site string) *harness {
	t.Helper()
	return newHarnessWithCaddyfile(t, func(h *harness) string {
		return tlsCaddyfile(h.Dir, site, h.PreviewPort, h.APIPort)
	})
}

// internalRoots is a pool holding the root of Caddy's internal CA, which the
// pki app writes to storage when it provisions.
func internalRoots(t *testing.T, h *harness) *x509.CertPool {
	t.Helper()
	pemBytes, err := os.ReadFile(filepath.Join(h.Dir, "caddy", "pki", "authorities", "local", "root.crt"))
	if err != nil {
		t.Fatalf("reading the internal CA root: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemBytes) {
		t.Fatal("the internal CA root is not a PEM certificate")
	}
	return pool
}

// handshake dials the HTTPS port on loopback with serverName as SNI and
// verifies the chain against roots.
func handshake(h *harness, roots *x509.CertPool, serverName string) (*tls.Conn, error) {
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	td := &tls.Dialer{NetDialer: dialer, Config: &tls.Config{
		ServerName: serverName,
		RootCAs:    roots,
		NextProtos: []string{"http/1.1"},
	}}
	conn, err := td.DialContext(ctx, "tcp", fmt.Sprintf("127.0.0.1:%d", h.PreviewPort))
	if err != nil {
		return nil, err
	}
	return conn.(*tls.Conn), nil
}

// storedCerts lists the names Caddy stored certificates for from its
// internal issuer ("local").
func storedCerts(t *testing.T, h *harness) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(h.Dir, "caddy", "certificates", "local"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// TestOnDemandTLSOnlyForSandboxes runs the gateway behind on-demand TLS from
// Caddy's internal CA and checks that exactly the preview hosts of existing
// sandboxes' declared ports get a certificate, for a wildcard site and for a
// site with no host (where every name reaches the permission module).
func TestOnDemandTLSOnlyForSandboxes(t *testing.T) {
	for _, site := range []struct{ name, addr string }{
		{"wildcard site", "*.preview.localhost"},
		{"site without host", ""},
	} {
		t.Run(site.name, func(t *testing.T) { testOnDemandTLS(t, site.addr) })
	}
}

func testOnDemandTLS(t *testing.T, site string) {
	h := newTLSHarness(t, site)
	rec := h.Create(nil)
	id := rec.ID
	host := fmt.Sprintf("s-%s-8080.preview.localhost", id)
	if want := fmt.Sprintf("https://%s:%d/", host, h.PreviewPort); rec.URLs["8080"] != want {
		t.Errorf("API preview URL = %q, want %q", rec.URLs["8080"], want)
	}
	roots := internalRoots(t, h)

	t.Run("sandbox host gets a certificate and is served", func(t *testing.T) {
		conn, err := handshake(h, roots, host)
		if err != nil {
			t.Fatalf("handshake for %s: %v", host, err)
		}
		defer conn.Close()
		state := conn.ConnectionState()
		leaf := state.PeerCertificates[0]
		if !slices.Contains(leaf.DNSNames, host) {
			t.Fatalf("leaf DNSNames = %v, want %s", leaf.DNSNames, host)
		}
		if len(leaf.DNSNames) != 1 {
			t.Errorf("leaf DNSNames = %v, want only %s (no wildcard)", leaf.DNSNames, host)
		}

		conn.SetDeadline(time.Now().Add(30 * time.Second))
		req, _ := http.NewRequest("GET", fmt.Sprintf("https://%s:%d/healthz", host, h.PreviewPort), nil)
		if err := req.Write(conn); err != nil {
			t.Fatalf("writing request: %v", err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), req)
		if err != nil {
			t.Fatalf("reading response: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(body) != "ok\n" {
			t.Fatalf("GET /healthz over TLS = %d %q, want 200 \"ok\\n\"", resp.StatusCode, body)
		}
	})

	// Each refused name must fail the handshake and leave no certificate:
	// the permission module said no before the CA was asked.
	for _, tt := range []struct{ name, serverName string }{
		{"unknown sandbox", fmt.Sprintf("s-nosuch%s-8080.preview.localhost", testenv.RunID())},
		{"undeclared port", fmt.Sprintf("s-%s-9999.preview.localhost", id)},
		{"extra label", fmt.Sprintf("x.s-%s-8080.preview.localhost", id)},
		{"not a preview host", "evil.example.com"},
	} {
		t.Run("refused: "+tt.name, func(t *testing.T) {
			conn, err := handshake(h, nil, tt.serverName)
			if err == nil {
				names := conn.ConnectionState().PeerCertificates[0].DNSNames
				conn.Close()
				t.Fatalf("handshake for %s succeeded with a certificate for %v", tt.serverName, names)
			}
			// A verification error would mean the server did present a
			// certificate; the handshake must fail before that.
			var verr *tls.CertificateVerificationError
			if errors.As(err, &verr) {
				t.Fatalf("handshake for %s: the server presented a certificate (%v)", tt.serverName, err)
			}
		})
	}

	// The one certificate issued is the sandbox's: none for a refused name,
	// and no wildcard obtained up front.
	if got := storedCerts(t, h); !slices.Equal(got, []string{host}) {
		t.Errorf("certificates in storage = %v, want only %s", got, host)
	}

	t.Run("CertificateAllowed", func(t *testing.T) {
		// Provisioned from the running config, as Caddy provisions it.
		p := new(caddymodule.Permission)
		if err := p.Provision(caddy.ActiveContext()); err != nil {
			t.Fatalf("provisioning the permission module: %v", err)
		}
		check := func(name string, allowed bool) {
			t.Helper()
			err := p.CertificateAllowed(context.Background(), name)
			switch {
			case allowed && err != nil:
				t.Errorf("CertificateAllowed(%q) = %v, want allowed", name, err)
			case !allowed && !errors.Is(err, caddytls.ErrPermissionDenied):
				t.Errorf("CertificateAllowed(%q) = %v, want ErrPermissionDenied", name, err)
			}
		}
		for _, tt := range []struct {
			name    string
			allowed bool
		}{
			{host, true},
			{strings.ToUpper(host), true},
			{host + ".", true},
			{fmt.Sprintf("s-%s-9999.preview.localhost", id), false},
			{fmt.Sprintf("s-%s-08080.preview.localhost", id), false},
			{fmt.Sprintf("s-nosuch%s-8080.preview.localhost", testenv.RunID()), false},
			{fmt.Sprintf("x.s-%s-8080.preview.localhost", id), false},
			{fmt.Sprintf("s-%s-8080.preview.example.com", id), false},
			{"*.preview.localhost", false},
			{"preview.localhost", false},
			{"localhost", false},
			{"evil.example.com", false},
			{"127.0.0.1", false},
			{"", false},
		} {
			check(tt.name, tt.allowed)
		}

		// A stopped sandbox still gets its certificate (the request after
		// the handshake wakes it); asking does not wake it.
		h.Stop(id)
		check(host, true)
		if s := h.State(id); s != "stopped" {
			t.Errorf("state after a permission check = %s, want stopped", s)
		}

		// A destroyed sandbox gets none.
		if status := h.API("DELETE", "/v1/sandboxes/"+id, nil, nil); status != http.StatusNoContent {
			t.Fatalf("DELETE: %d", status)
		}
		testenv.Eventually(t, 10*time.Second, func() (bool, string) {
			err := p.CertificateAllowed(context.Background(), host)
			return errors.Is(err, caddytls.ErrPermissionDenied), fmt.Sprintf("after destroy: %v", err)
		})
	})
}
