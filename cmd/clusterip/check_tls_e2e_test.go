package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/internal/localcluster"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/repair"
)

// TestCheckReadsAnEtcdThatRequiresClientCertificates runs check against a kube-apiserver whose
// etcd serves clients over mutual TLS only: with --etcd-cacert, --etcd-cert and --etcd-key it
// reads the bitmap; with a client certificate missing or of another CA, a CA bundle that does not
// verify the server, or unusable files, it exits 2 with one line saying which, soon after
// --request-timeout.
func TestCheckReadsAnEtcdThatRequiresClientCertificates(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping kube-apiserver test in -short mode")
	}
	dir := t.TempDir()
	ca := newTestCA(t, "etcd-ca")
	other := newTestCA(t, "another-ca")
	files := map[string]string{}
	write := func(name string, p pemPair) {
		cert, key := p.cert, p.key
		files[name+".crt"] = filepath.Join(dir, name+".crt")
		files[name+".key"] = filepath.Join(dir, name+".key")
		if err := os.WriteFile(files[name+".crt"], cert, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(files[name+".key"], key, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("ca", pemPair{ca.certPEM, ca.keyPEM})
	write("other-ca", pemPair{other.certPEM, other.keyPEM})
	// etcd's gRPC gateway dials the server with the server's certificate: it is a client too.
	write("server", ca.issue(t, "etcd-server", x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth))
	write("client", ca.issue(t, "clusterip-check", x509.ExtKeyUsageClientAuth))
	write("other-client", other.issue(t, "clusterip-check", x509.ExtKeyUsageClientAuth))

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	le, err := localcluster.StartEtcd(ctx, localcluster.EtcdOptions{UnsafeNoFsync: true, ClientTLS: &localcluster.EtcdTLS{
		CertFile: files["server.crt"], KeyFile: files["server.key"], CAFile: files["ca.crt"],
		ClientCertFile: files["client.crt"], ClientKeyFile: files["client.key"],
	}})
	if err != nil {
		t.Fatalf("start etcd with client certificates: %v", err)
	}
	t.Cleanup(func() { le.Close() })
	e := &testenv.Etcd{Etcd: le}
	api := testenv.NewKubeAPIServer(t, e, testenv.KubeAPIServerOptions{})
	kubeconfig := writeKubeconfigWithToken(t, api.Config.Host, api.Config.BearerToken)
	endpoint := e.Endpoints()[0]
	if !strings.HasPrefix(endpoint, "https://") {
		t.Fatalf("etcd endpoint %s, want https", endpoint)
	}
	waitForDefaultServiceCIDR(t, api.Client)
	if modRevision(t, e, etcdstore.ServiceIPsKey("")) == 0 { // through Etcd.Client, with the client certificate
		t.Fatalf("kube-apiserver stored no bitmap at %s", etcdstore.ServiceIPsKey(""))
	}

	base := []string{"check", "--kubeconfig", kubeconfig, "--etcd-endpoints", endpoint, "--request-timeout", "5s"}
	t.Run("with the client certificate", func(t *testing.T) {
		rep := checkJSON(t, exitOK, append(base, "--etcd-cacert", files["ca.crt"], "--etcd-cert", files["client.crt"], "--etcd-key", files["client.key"], "-o", "json")...)
		if rep.Counts[repair.CountBitmapBits] != 1 {
			t.Errorf("check read %d bits, want 1 (the kubernetes Service's): were the bitmaps read?", rep.Counts[repair.CountBitmapBits])
		}
	})

	refused := "etcd at " + endpoint + " refused the client certificate: remote error: tls: "
	unverified := "etcd at " + endpoint + ": TLS handshake failed: tls: failed to verify certificate: x509: certificate signed by unknown authority; does --etcd-cacert hold the CA"
	tests := []struct {
		name string
		tls  []string
		want string
	}{
		{"no client certificate", []string{"--etcd-cacert", files["ca.crt"]}, refused + "certificate required; give --etcd-cert and --etcd-key"},
		{"a client certificate of another CA", []string{"--etcd-cacert", files["ca.crt"], "--etcd-cert", files["other-client.crt"], "--etcd-key", files["other-client.key"]},
			refused + "unknown certificate authority"},
		{"no TLS flags", nil, unverified},
		{"a CA that did not sign the server's certificate", []string{"--etcd-cacert", files["other-ca.crt"], "--etcd-cert", files["client.crt"], "--etcd-key", files["client.key"]},
			unverified},
		{"the key of another certificate", []string{"--etcd-cacert", files["ca.crt"], "--etcd-cert", files["client.crt"], "--etcd-key", files["other-client.key"]},
			"etcd TLS: tls: private key does not match public key"},
		{"a missing key file", []string{"--etcd-cacert", files["ca.crt"], "--etcd-cert", files["client.crt"], "--etcd-key", filepath.Join(dir, "absent.key")},
			"etcd TLS: open " + filepath.Join(dir, "absent.key")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			checkCouldNotRun(t, append(append([]string{}, base...), tt.tls...), tt.want)
			if d := time.Since(start); d > 20*time.Second {
				t.Errorf("check took %v to give up, want about --request-timeout 5s", d)
			}
		})
	}
}

// testCA is a certificate authority made up for a test.
type testCA struct {
	cert            *x509.Certificate
	key             *ecdsa.PrivateKey
	certPEM, keyPEM []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, certPEM: pemOf("CERTIFICATE", der), keyPEM: keyPEM(t, key)}
}

// pemPair is a certificate and its key, as PEM.
type pemPair struct{ cert, key []byte }

// issue returns a certificate for name (valid for 127.0.0.1 too) signed by ca, and its key.
func (ca *testCA) issue(t *testing.T, name string, usages ...x509.ExtKeyUsage) pemPair {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usages,
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return pemPair{pemOf("CERTIFICATE", der), keyPEM(t, key)}
}

func keyPEM(t *testing.T, key *ecdsa.PrivateKey) []byte {
	t.Helper()
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pemOf("EC PRIVATE KEY", der)
}

func pemOf(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
