package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TLS is a certificate authority and a server certificate for 127.0.0.1
// and localhost, made for one test.
type TLS struct {
	// CAFile, CertFile and KeyFile are the PEM files of the authority, the
	// server's certificate and its key.
	CAFile, CertFile, KeyFile string
	pool                      *x509.CertPool
}

// NewTLS makes a CA and a server certificate signed by it, in files under a
// temporary directory of tb.
func NewTLS(tb testing.TB) *TLS {
	tb.Helper()
	dir := tb.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "redistest CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		tb.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	srv := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srv, caCert, &key.PublicKey, caKey)
	if err != nil {
		tb.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	t := &TLS{
		CAFile: filepath.Join(dir, "ca.crt"), CertFile: filepath.Join(dir, "server.crt"),
		KeyFile: filepath.Join(dir, "server.key"), pool: x509.NewCertPool(),
	}
	t.pool.AddCert(caCert)
	for path, block := range map[string]*pem.Block{
		t.CAFile:   {Type: "CERTIFICATE", Bytes: caDER},
		t.CertFile: {Type: "CERTIFICATE", Bytes: srvDER},
		t.KeyFile:  {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			tb.Fatal(err)
		}
	}
	return t
}

// ClientConfig returns a TLS configuration that trusts the CA.
func (t *TLS) ClientConfig() *tls.Config {
	return &tls.Config{RootCAs: t.pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
}

// WithTLS makes the server TLS-only: it listens with TLS on its port and
// not at all in plain text. Clients need not present a certificate.
func WithTLS(t *TLS) Option {
	return func(c *config) { c.tls = t }
}

func (t *TLS) serverArgs() []string {
	return []string{"--tls-cert-file", t.CertFile, "--tls-key-file", t.KeyFile,
		"--tls-ca-cert-file", t.CAFile, "--tls-auth-clients", "no"}
}
