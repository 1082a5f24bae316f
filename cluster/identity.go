package cluster

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"
)

// ErrPeerIdentity: a node's certificate is missing, not issued by the
// cluster's CA, expired, names another node or does not cover the address
// the node is dialled at. Forwarders match it with errors.Is.
var ErrPeerIdentity = errors.New("peer certificate does not prove the node's identity")

// NodeURIPrefix starts the URI SAN that names a node in its certificate:
// sandwake://node/<name>.
const NodeURIPrefix = "sandwake://node/"

// NodeURI is the URI SAN of node name's certificate.
func NodeURI(name string) string { return NodeURIPrefix + name }

// NodeName returns the node a certificate names: the name of its one
// sandwake://node/ URI SAN. A certificate naming no node, or several, names
// none.
func NodeName(cert *x509.Certificate) (string, bool) {
	var name string
	for _, u := range cert.URIs {
		n, ok := nodeOfURI(u)
		if !ok {
			continue
		}
		if name != "" {
			return "", false
		}
		name = n
	}
	return name, name != ""
}

func nodeOfURI(u *url.URL) (string, bool) {
	if u.Scheme != "sandwake" || u.Host != "node" || u.RawQuery != "" || u.Fragment != "" {
		return "", false
	}
	name := strings.TrimPrefix(u.Path, "/")
	if name == "" || strings.ContainsAny(name, "/;") {
		return "", false
	}
	return name, true
}

// Credentials are a node's certificate, with its key, and the cluster CAs
// it trusts (one or several: old and new during a CA rotation).
type Credentials struct {
	// Cert is the node's certificate chain and key; Cert.Leaf is set.
	Cert tls.Certificate
	// Roots are the cluster's CAs.
	Roots *x509.CertPool
	// Node is the name the certificate gives the node.
	Node string
}

// LoadCredentials reads a node's credentials from PEM files: the cluster's
// CA bundle, the node's certificate (chain) and its key. The certificate
// must name a node (a sandwake://node/<name> URI SAN), be valid now and be
// issued by one of the CAs for both server and client use.
func LoadCredentials(caFile, certFile, keyFile string, now time.Time) (*Credentials, error) {
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("reading the cluster CA: %w", err)
	}
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("reading the node certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("reading the node certificate's key: %w", err)
	}
	cr, err := NewCredentials(caPEM, certPEM, keyPEM, now)
	if err != nil {
		return nil, fmt.Errorf("%w (files %s, %s, %s)", err, caFile, certFile, keyFile)
	}
	return cr, nil
}

// NewCredentials is LoadCredentials of PEM bytes: the CA bundle, the
// node's certificate (chain) and its key.
func NewCredentials(caPEM, certPEM, keyPEM []byte, now time.Time) (*Credentials, error) {
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("the cluster CA holds no PEM certificate")
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("reading the node certificate: %w", err)
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("node certificate: %w", err)
		}
	}
	cr := &Credentials{Cert: cert, Roots: roots}
	name, err := cr.verify(cert.Certificate, now, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return nil, fmt.Errorf("node certificate: %w", err)
	}
	cr.Node = name
	return cr, nil
}

// verify checks a certificate chain (leaf first, DER) against the roots
// for each of usages and returns the node its leaf names.
func (cr *Credentials) verify(chain [][]byte, now time.Time, usages ...x509.ExtKeyUsage) (string, error) {
	if len(chain) == 0 {
		return "", fmt.Errorf("%w: no certificate", ErrPeerIdentity)
	}
	certs := make([]*x509.Certificate, len(chain))
	for i, der := range chain {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return "", fmt.Errorf("%w: %w", ErrPeerIdentity, err)
		}
		certs[i] = c
	}
	return cr.verifyParsed(certs, now, usages...)
}

func (cr *Credentials) verifyParsed(certs []*x509.Certificate, now time.Time, usages ...x509.ExtKeyUsage) (string, error) {
	if len(certs) == 0 {
		return "", fmt.Errorf("%w: no certificate", ErrPeerIdentity)
	}
	leaf := certs[0]
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	// One Verify per usage: x509 accepts a chain valid for any of the
	// usages it is given, and a node certificate must serve both ways.
	for _, u := range usages {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: cr.Roots, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{u}}); err != nil {
			return "", fmt.Errorf("%w: %w", ErrPeerIdentity, err)
		}
	}
	name, ok := NodeName(leaf)
	if !ok {
		return "", fmt.Errorf("%w: it names no node (want one URI SAN %s<node>)", ErrPeerIdentity, NodeURIPrefix)
	}
	return name, nil
}

// PeerTLS holds the node's current credentials: a reload replaces them
// (a renewed certificate, a CA bundle with a new CA), and every TLS
// configuration it makes reads the current ones at each handshake.
type PeerTLS struct {
	cur atomic.Pointer[Credentials]
	// now is the clock certificates are checked against (nil: time.Now).
	now func() time.Time
	// renew, when set, issues fresh credentials (see SetRenewal);
	// renewing is true while it runs.
	renew    atomic.Pointer[func() (*Credentials, error)]
	renewing atomic.Bool
}

// NewPeerTLS holds cr.
func NewPeerTLS(cr *Credentials) *PeerTLS {
	p := &PeerTLS{}
	p.cur.Store(cr)
	return p
}

func (p *PeerTLS) clock() time.Time {
	if p.now != nil {
		return p.now()
	}
	return time.Now()
}

// Store replaces the credentials (a reload).
func (p *PeerTLS) Store(cr *Credentials) { p.cur.Store(cr) }

// Current returns the credentials in use.
func (p *PeerTLS) Current() *Credentials { return p.load() }

// SetRenewal makes the credentials renew themselves: once the certificate
// in use is past half its life, the next use of it calls issue (in the
// background; the current one serves meanwhile) and stores what it
// returns. A node that issues its own certificate (peer_ca_key_file) never
// outlives it however long it runs. Nil stops renewing.
func (p *PeerTLS) SetRenewal(issue func() (*Credentials, error)) {
	if issue == nil {
		p.renew.Store(nil)
		return
	}
	p.renew.Store(&issue)
}

// load returns the credentials in use, starting their renewal when due.
func (p *PeerTLS) load() *Credentials {
	cr := p.cur.Load()
	issue := p.renew.Load()
	if issue == nil || cr == nil || cr.Cert.Leaf == nil {
		return cr
	}
	leaf := cr.Cert.Leaf
	half := leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore) / 2)
	if p.clock().Before(half) || !p.renewing.CompareAndSwap(false, true) {
		return cr
	}
	go func() {
		defer p.renewing.Store(false)
		if next, err := (*issue)(); err == nil && next != nil {
			p.cur.CompareAndSwap(cr, next)
		}
	}()
	return cr
}

// ServerConfig is the TLS configuration of the node's peer listener: TLS
// 1.3, the node's certificate, and a client certificate of the cluster's
// CA naming a node required (PeerNode reads its name).
func (p *PeerTLS) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cr := p.load()
			return &tls.Config{
				MinVersion:   tls.VersionTLS13,
				Certificates: []tls.Certificate{cr.Cert},
				ClientAuth:   tls.RequireAndVerifyClientCert,
				ClientCAs:    cr.Roots,
				NextProtos:   []string{"http/1.1"},
				VerifyConnection: func(cs tls.ConnectionState) error {
					if _, ok := PeerNode(cs); !ok {
						return fmt.Errorf("%w: the client certificate names no node", ErrPeerIdentity)
					}
					return nil
				},
			}, nil
		},
	}
}

// PeerNode is the node whose verified client certificate opened cs.
func PeerNode(cs tls.ConnectionState) (string, bool) {
	if len(cs.VerifiedChains) == 0 || len(cs.PeerCertificates) == 0 {
		return "", false
	}
	return NodeName(cs.PeerCertificates[0])
}

// ClientConfig is the TLS configuration for dialling node at host (its
// advertised address's host): the node's certificate as client
// certificate, and the peer's accepted only if the cluster's CA issued it
// for node and host. The check runs before this node sends its own
// certificate or a byte of the request.
func (p *PeerTLS) ClientConfig(node, host string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: []string{"http/1.1"},
		// Verified below, against the current roots and with the node's
		// name, which the standard check knows nothing of.
		InsecureSkipVerify: true,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &p.load().Cert, nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			return p.verifyPeer(cs.PeerCertificates, node, host)
		},
	}
}

// verifyPeer checks that certs (leaf first) are node's, issued by the
// cluster's CA for serving at host.
func (p *PeerTLS) verifyPeer(certs []*x509.Certificate, node, host string) error {
	name, err := p.load().verifyParsed(certs, p.clock(), x509.ExtKeyUsageServerAuth)
	if err != nil {
		return fmt.Errorf("node %s at %s: %w", node, host, err)
	}
	if name != node {
		return fmt.Errorf("node %s at %s: %w: it names node %s", node, host, ErrPeerIdentity, name)
	}
	if err := certs[0].VerifyHostname(host); err != nil {
		return fmt.Errorf("node %s at %s: %w: %w", node, host, ErrPeerIdentity, err)
	}
	return nil
}

// verifyRegistration checks the certificate chain a node published with
// its registration: issued by the cluster's CA to node, for serving at
// host.
func (p *PeerTLS) verifyRegistration(chain [][]byte, node, host string) error {
	cr := p.load()
	name, err := cr.verify(chain, p.clock(), x509.ExtKeyUsageServerAuth)
	if err != nil {
		return err
	}
	if name != node {
		return fmt.Errorf("%w: it names node %s", ErrPeerIdentity, name)
	}
	leaf, _ := x509.ParseCertificate(chain[0]) // parsed by verify already
	if err := leaf.VerifyHostname(host); err != nil {
		return fmt.Errorf("%w: %w", ErrPeerIdentity, err)
	}
	return nil
}
