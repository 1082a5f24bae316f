package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"strings"
	"time"
)

// Validity of the certificates NewCA and IssueNodeCert make by default.
const (
	DefaultCAValidity   = 10 * 365 * 24 * time.Hour
	DefaultNodeValidity = 30 * 24 * time.Hour
)

// backdate is how far before now a certificate becomes valid, for clocks
// a little behind the issuer's.
const backdate = 5 * time.Minute

// NewCA makes a cluster CA: an ECDSA P-256 key and a self-signed
// certificate that may sign node certificates only (path length 0). The
// results are PEM.
func NewCA(name string, now time.Time, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	if validity <= 0 {
		validity = DefaultCAValidity
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating the CA key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name, Organization: []string{"sandwake cluster"}},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(validity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		SubjectKeyId:          keyID(&key.PublicKey),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("signing the CA certificate: %w", err)
	}
	return encodePair(der, key)
}

// NodeCertRequest is what IssueNodeCert puts in a node certificate.
type NodeCertRequest struct {
	// Node is the node's name (its URI SAN sandwake://node/<name> and
	// common name).
	Node string
	// Hosts are the addresses other nodes dial it at: IP addresses
	// become IP SANs, names DNS SANs. At least one.
	Hosts []string
	// Validity is how long the certificate is valid (DefaultNodeValidity
	// when 0).
	Validity time.Duration
}

// IssueNodeCert signs a node certificate with the CA (PEM certificate and
// key): a new ECDSA P-256 key, ExtKeyUsage server and client, the node's
// name as URI SAN, its hosts as IP or DNS SANs.
func IssueNodeCert(caCertPEM, caKeyPEM []byte, req NodeCertRequest, now time.Time) (certPEM, keyPEM []byte, err error) {
	if req.Node == "" || strings.ContainsAny(req.Node, "/; \t\r\n") {
		return nil, nil, fmt.Errorf("node name %q: want a name without '/', ';' or spaces", req.Node)
	}
	if len(req.Hosts) == 0 {
		return nil, nil, errors.New("a node certificate needs at least one address (--addr)")
	}
	if req.Validity <= 0 {
		req.Validity = DefaultNodeValidity
	}
	ca, caKey, err := parseCA(caCertPEM, caKeyPEM)
	if err != nil {
		return nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating the node key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, nil, err
	}
	uri, err := url.Parse(NodeURI(req.Node))
	if err != nil {
		return nil, nil, fmt.Errorf("node name %q: %w", req.Node, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: req.Node, Organization: []string{"sandwake cluster"}},
		NotBefore:    now.Add(-backdate),
		NotAfter:     now.Add(req.Validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{uri},
	}
	for _, h := range req.Hosts {
		h = strings.TrimSpace(h)
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" && !strings.ContainsAny(h, ":/ ") {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		} else {
			return nil, nil, fmt.Errorf("address %q: want an IP address or a host name, without a port", h)
		}
	}
	if tmpl.NotAfter.After(ca.NotAfter) {
		tmpl.NotAfter = ca.NotAfter
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("signing the node certificate: %w", err)
	}
	return encodePair(der, key)
}

// parseCA reads a CA's PEM certificate and ECDSA key and checks they
// belong together.
func parseCA(certPEM, keyPEM []byte) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, nil, errors.New("the CA certificate is not a PEM CERTIFICATE")
	}
	ca, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("the CA certificate: %w", err)
	}
	if !ca.IsCA {
		return nil, nil, errors.New("the CA certificate is not a CA")
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, nil, errors.New("the CA key is not PEM")
	}
	var key *ecdsa.PrivateKey
	switch kb.Type {
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(kb.Bytes)
	case "PRIVATE KEY":
		var k any
		if k, err = x509.ParsePKCS8PrivateKey(kb.Bytes); err == nil {
			var ok bool
			if key, ok = k.(*ecdsa.PrivateKey); !ok {
				err = fmt.Errorf("a %T, not an ECDSA key", k)
			}
		}
	default:
		err = fmt.Errorf("PEM block %q is not a private key", kb.Type)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("the CA key: %w", err)
	}
	if !key.PublicKey.Equal(ca.PublicKey) {
		return nil, nil, errors.New("the CA key does not belong to the CA certificate")
	}
	return ca, key, nil
}

func encodePair(der []byte, key *ecdsa.PrivateKey) (certPEM, keyPEM []byte, err error) {
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding the key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

func randomSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("a serial number: %w", err)
	}
	return n, nil
}

// keyID is the subject key identifier of a public key (RFC 7093, method 1).
func keyID(pub *ecdsa.PublicKey) []byte {
	b, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil
	}
	sum := sha256.Sum256(b)
	return sum[:20]
}
