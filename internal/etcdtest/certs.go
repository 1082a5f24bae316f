package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Certs are a throwaway CA and the certificates an etcd cluster of a test
// runs with: one server certificate for every member (loopback names; it
// serves peers and clients, and is a client of the other members) and a
// client certificate, as PEM files in one directory.
type Certs struct {
	Dir                         string
	CAFile                      string
	ServerCertFile, ServerKey   string
	ClientCertFile, ClientKey   string
	OtherCAFile                 string // a second CA that signed nothing etcd trusts
	OtherCertFile, OtherKeyFile string // a client certificate of that other CA
}

// NewCerts writes a new CA, server and client certificates to dir (ECDSA
// P-256, valid one day; keys 0600).
func NewCerts(dir string) (*Certs, error) {
	c := &Certs{Dir: dir}
	ca, caKey, err := writeCA(dir, "ca")
	if err != nil {
		return nil, err
	}
	c.CAFile = filepath.Join(dir, "ca.crt")
	server := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "etcd"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if c.ServerCertFile, c.ServerKey, err = writeLeaf(dir, "server", server, ca, caKey); err != nil {
		return nil, err
	}
	client := &x509.Certificate{Subject: pkix.Name{CommonName: "sandwake"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if c.ClientCertFile, c.ClientKey, err = writeLeaf(dir, "client", client, ca, caKey); err != nil {
		return nil, err
	}
	other, otherKey, err := writeCA(dir, "other-ca")
	if err != nil {
		return nil, err
	}
	c.OtherCAFile = filepath.Join(dir, "other-ca.crt")
	stranger := &x509.Certificate{Subject: pkix.Name{CommonName: "stranger"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if c.OtherCertFile, c.OtherKeyFile, err = writeLeaf(dir, "stranger", stranger, other, otherKey); err != nil {
		return nil, err
	}
	return c, nil
}

// ClientTLS is the TLS configuration of an etcd client of the cluster:
// the CA to verify members with and the client certificate.
func (c *Certs) ClientTLS() (*tls.Config, error) {
	pool := x509.NewCertPool()
	pem, err := os.ReadFile(c.CAFile)
	if err != nil {
		return nil, err
	}
	pool.AppendCertsFromPEM(pem)
	cert, err := tls.LoadX509KeyPair(c.ClientCertFile, c.ClientKey)
	if err != nil {
		return nil, err
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

var serial struct {
	sync.Mutex
	n int64
}

func nextSerial() *big.Int {
	serial.Lock()
	defer serial.Unlock()
	serial.n++
	return big.NewInt(time.Now().UnixNano() + serial.n)
}

func writeCA(dir, name string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: nextSerial(), Subject: pkix.Name{CommonName: "sandwake test " + name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	if err := writePEM(filepath.Join(dir, name+".crt"), "CERTIFICATE", der, 0o644); err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}

func writeLeaf(dir, name string, tmpl, ca *x509.Certificate, caKey *ecdsa.PrivateKey) (certFile, keyFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	tmpl.SerialNumber = nextSerial()
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return "", "", fmt.Errorf("certificate %s: %w", name, err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := writePEM(certFile, "CERTIFICATE", der, 0o644); err != nil {
		return "", "", err
	}
	return certFile, keyFile, writePEM(keyFile, "EC PRIVATE KEY", kder, 0o600)
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode)
}
