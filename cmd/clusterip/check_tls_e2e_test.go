package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/internal/localcluster"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/repair"
)

// TestCheckReadsAnEtcdThatRequiresClientCertificates runs check against a kube-apiserver whose
// etcd serves clients over mutual TLS only: with kube-apiserver's flags --etcd-servers,
// --etcd-cafile, --etcd-certfile and --etcd-keyfile it reads the bitmap, and so it does with the
// previous release's spellings (--etcd-endpoints, --etcd-cacert, --etcd-cert, --etcd-key) and a
// warning for each; repair --dry-run reads it with the same flags, and repair writes it; with a client certificate
// missing or of another CA, a CA bundle that does not verify the server, or unusable files, it
// exits 2 with one line saying which, soon after --request-timeout.
func TestCheckReadsAnEtcdThatRequiresClientCertificates(t *testing.T) {
	t.Parallel()
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

	base := []string{"check", "--kubeconfig", kubeconfig, "--etcd-servers", endpoint, "--request-timeout", "5s"}
	clientTLS := []string{"--etcd-cafile", files["ca.crt"], "--etcd-certfile", files["client.crt"], "--etcd-keyfile", files["client.key"]}
	readsTheBitmap := func(t *testing.T, args ...string) (stderr string) {
		t.Helper()
		r := clusterip(t, args...)
		var rep repair.Report
		if r.code != exitOK || json.Unmarshal([]byte(r.stdout), &rep) != nil {
			t.Fatalf("clusterip %q: exit %d, want %d and a report\nstdout:\n%s\nstderr:\n%s", args, r.code, exitOK, r.stdout, r.stderr)
		}
		if rep.Counts[repair.CountBitmapBits] != 1 {
			t.Errorf("clusterip %q read %d bits, want 1 (the kubernetes Service's): were the bitmaps read?", args, rep.Counts[repair.CountBitmapBits])
		}
		return r.stderr
	}
	t.Run("with kube-apiserver's etcd flags", func(t *testing.T) {
		if stderr := readsTheBitmap(t, slices.Concat(base, clientTLS, []string{"-o", "json"})...); stderr != "" {
			t.Errorf("check printed %q on stderr, want nothing", stderr)
		}
	})
	t.Run("repair --dry-run with kube-apiserver's etcd flags", func(t *testing.T) {
		args := slices.Concat([]string{"repair", "--dry-run"}, base[1:], clientTLS, []string{"-o", "json"})
		if stderr := readsTheBitmap(t, args...); stderr != "clusterip: dry run: nothing was changed; there is nothing to repair\n" {
			t.Errorf("repair --dry-run printed %q on stderr, want only the dry-run line", stderr)
		}
	})
	t.Run("repair with kube-apiserver's etcd flags clears a stale bit", func(t *testing.T) {
		setBit(t, etcdstore.New(e.TestClient(t), etcdstore.ServiceIPsKey("")), "10.96.0.201")
		args := slices.Concat([]string{"repair", "--leak-grace", "0"}, base[1:], clientTLS, []string{"-o", "json"})
		if stderr := readsTheBitmap(t, args...); !strings.Contains(stderr, "clusterip: repair pass 1: 1 finding, none held off") {
			t.Errorf("repair printed %q on stderr, want the pass that cleared the bit", stderr)
		}
	})
	t.Run("with the previous release's spellings, and a warning each", func(t *testing.T) {
		args := []string{"check", "--kubeconfig", kubeconfig, "--etcd-endpoints", endpoint, "--request-timeout", "5s",
			"--etcd-cacert", files["ca.crt"], "--etcd-cert", files["client.crt"], "--etcd-key", files["client.key"], "-o", "json"}
		var want strings.Builder
		for _, r := range [][2]string{{"etcd-cacert", "etcd-cafile"}, {"etcd-cert", "etcd-certfile"}, {"etcd-endpoints", "etcd-servers"}, {"etcd-key", "etcd-keyfile"}} {
			fmt.Fprintf(&want, "clusterip: warning: --%s is deprecated and will be removed in the next release; use --%s\n", r[0], r[1])
		}
		if diff := cmp.Diff(want.String(), readsTheBitmap(t, args...)); diff != "" {
			t.Errorf("check with the old etcd flags: stderr (-want +got):\n%s", diff)
		}
	})

	refused := "etcd at " + endpoint + " refused the client certificate: remote error: tls: "
	unverified := "etcd at " + endpoint + ": TLS handshake failed: tls: failed to verify certificate: x509: certificate signed by unknown authority; does --etcd-cafile hold the CA"
	tests := []struct {
		name string
		tls  []string
		want string
	}{
		{"no client certificate", []string{"--etcd-cafile", files["ca.crt"]}, refused + "certificate required; give --etcd-certfile and --etcd-keyfile"},
		{"a client certificate of another CA", []string{"--etcd-cafile", files["ca.crt"], "--etcd-certfile", files["other-client.crt"], "--etcd-keyfile", files["other-client.key"]},
			refused + "unknown certificate authority"},
		{"no TLS flags", nil, unverified},
		{"a CA that did not sign the server's certificate", []string{"--etcd-cafile", files["other-ca.crt"], "--etcd-certfile", files["client.crt"], "--etcd-keyfile", files["client.key"]},
			unverified},
		{"the key of another certificate", []string{"--etcd-cafile", files["ca.crt"], "--etcd-certfile", files["client.crt"], "--etcd-keyfile", files["other-client.key"]},
			"etcd TLS: tls: private key does not match public key"},
		{"a missing key file", []string{"--etcd-cafile", files["ca.crt"], "--etcd-certfile", files["client.crt"], "--etcd-keyfile", filepath.Join(dir, "absent.key")},
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
