package kubeapiserverfork_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// The fork's two ways of writing its allocators' IPAddress objects (CLUSTERIP_IPADDRESS_WRITES):
// stock's own, through the loopback client, by default; and the IPAddress registry in the
// process, an operator's explicit choice.
var writePaths = []struct {
	name string
	env  []string
}{
	{"loopback", nil},
	{"registry", []string{"CLUSTERIP_IPADDRESS_WRITES=registry"}},
}

// forkSide is a kube-apiserver a test compares: stock, or the fork with one of its write paths.
type forkSide struct {
	name, bin string
	env       []string // added to the server's environment
}

// forkSides returns stock ("stock") and the fork with its default writes ("fork") and with the
// registry path ("fork/registry"), building the binaries if needed.
func forkSides(t *testing.T) []forkSide {
	t.Helper()
	fork, stock := forkBinary(t), stockBinary(t)
	return []forkSide{{"stock", stock, nil}, {"fork", fork, nil}, {"fork/registry", fork, writePaths[1].env}}
}

// ipAddressOnlyOptions returns the options of a kube-apiserver bin of the release under test in
// IPAddressOnly mode, serving v4Range, with env added to its environment and an encryption
// configuration.
func ipAddressOnlyOptions(t *testing.T, bin string, env []string, encryptionConfig string) testenv.KubeAPIServerOptions {
	t.Helper()
	mg, ok := modeOf(t, featuregate.IPAddressOnly)
	if !ok {
		t.Fatalf("kube-apiserver %s has no IPAddressOnly mode", release())
	}
	opts := mg.options(bin, v4Range)
	opts.Env = env
	opts.ExtraArgs = append(slices.Clip(opts.ExtraArgs), "--encryption-provider-config="+encryptionConfig)
	return opts
}

// aescbcKey is a named AES-CBC key of an EncryptionConfiguration.
type aescbcKey struct{ name, secret string }

// newAESCBCKey returns a new random 32-byte key named name.
func newAESCBCKey(t *testing.T, name string) aescbcKey {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return aescbcKey{name, base64.StdEncoding.EncodeToString(b)}
}

// Resources of an EncryptionConfiguration.
const (
	everyResource = "*.*" // the documented form of "encrypt everything"
	ipAddresses   = "ipaddresses.networking.k8s.io"
)

// writeEncryptionConfig writes an EncryptionConfiguration of resource to a new file in dir, and
// returns its path: an aescbc provider with keys, the first of which encrypts, followed by the
// identity provider if identity is set (so that plaintext is still read).
func writeEncryptionConfig(t *testing.T, dir, resource string, identity bool, keys ...aescbcKey) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [%q]\n  providers:\n  - aescbc:\n      keys:\n", resource)
	for _, k := range keys {
		fmt.Fprintf(&b, "      - name: %s\n        secret: %s\n", k.name, k.secret)
	}
	if identity {
		b.WriteString("  - identity: {}\n")
	}
	f, err := os.CreateTemp(dir, "encryption-*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(b.String()); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}

// encryptedWith is the prefix of an etcd value that the aescbc key named key encrypted.
func encryptedWith(key string) []byte { return []byte("k8s:enc:aescbc:v1:" + key + ":") }

// ipAddressKey is the etcd key of the IPAddress object of ip, under the default prefix.
func ipAddressKey(ip string) string { return "/registry/ipaddresses/" + ip }

// rawValue returns the value stored at key in etcd, and false if there is none.
func rawValue(ctx context.Context, t *testing.T, c *clientv3.Client, key string) ([]byte, bool) {
	t.Helper()
	resp, err := c.Get(ctx, key)
	if err != nil {
		t.Fatalf("etcd get %s: %v", key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, false
	}
	return resp.Kvs[0].Value, true
}

// wantEncrypted fails t unless the IPAddress object of each ip is stored in etcd encrypted by
// the aescbc key named key.
func wantEncrypted(ctx context.Context, t *testing.T, c *clientv3.Client, key string, ips ...string) {
	t.Helper()
	for _, ip := range ips {
		v, ok := rawValue(ctx, t, c, ipAddressKey(ip))
		switch {
		case !ok:
			t.Errorf("IPAddress %s: not in etcd", ip)
		case !bytes.HasPrefix(v, encryptedWith(key)):
			t.Errorf("IPAddress %s is stored as %q…, want it encrypted with key %s (%q…)", ip, v[:min(len(v), 40)], key, encryptedWith(key))
		}
	}
}

// waitGone waits until etcd holds no IPAddress object of ip.
func waitGone(ctx context.Context, t *testing.T, c *clientv3.Client, ip string) {
	t.Helper()
	testenv.WaitFor(t, "IPAddress "+ip+" gone from etcd", func() bool {
		_, ok := rawValue(ctx, t, c, ipAddressKey(ip))
		return !ok
	})
}

// createService creates a ClusterIP Service name with clusterIP in the default namespace of s,
// and fails t if it is refused.
func createService(ctx context.Context, t *testing.T, s *testenv.KubeAPIServer, name, clusterIP string) {
	t.Helper()
	if _, err := s.Client.CoreV1().Services(metav1.NamespaceDefault).Create(ctx, testenv.ClusterIPService(name, clusterIP), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Service %s with ClusterIP %s: %v", name, clusterIP, err)
	}
}

// deleteService deletes the Service name of the default namespace through s, and fails t if the
// delete is refused.
func deleteService(ctx context.Context, t *testing.T, s *testenv.KubeAPIServer, name string) {
	t.Helper()
	if err := s.Client.CoreV1().Services(metav1.NamespaceDefault).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete Service %s: %v", name, err)
	}
}

// TestForkEncryptsIPAddressesAsStock starts stock and the fork in turn on one etcd, both with an
// EncryptionConfiguration of every resource ("*.*"), with and without the identity provider, and
// with each of the fork's write paths: each stores its IPAddress objects encrypted; the fork
// reads, and so frees, the object stock wrote, and stock the fork's.
func TestForkEncryptsIPAddressesAsStock(t *testing.T) {
	t.Parallel()
	fork, stock := forkBinary(t), stockBinary(t)
	for _, identity := range []bool{true, false} {
		for _, wp := range writePaths {
			name := "aescbc+identity/" + wp.name
			if !identity {
				name = "aescbc/" + wp.name
			}
			t.Run(name, func(t *testing.T) {
				etcd := testenv.NewEtcd(t)
				raw := etcd.TestClient(t)
				key := newAESCBCKey(t, "key1")
				config := writeEncryptionConfig(t, t.TempDir(), everyResource, identity, key)
				start := func(bin string, env []string) *testenv.KubeAPIServer {
					return testenv.NewKubeAPIServer(t, etcd, ipAddressOnlyOptions(t, bin, env, config))
				}
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
				defer cancel()

				const stockIP, forkIP = "10.96.0.10", "10.96.0.11"
				s := start(stock, nil)
				createService(ctx, t, s, "from-stock", stockIP)
				s.Stop()

				f := start(fork, wp.env)
				createService(ctx, t, f, "from-fork", forkIP)
				wantEncrypted(ctx, t, raw, key.name, stockIP, forkIP)
				if _, err := f.Client.NetworkingV1().IPAddresses().List(ctx, metav1.ListOptions{}); err != nil {
					t.Errorf("fork: list IPAddresses: %v", err)
				}
				deleteService(ctx, t, f, "from-stock")
				waitGone(ctx, t, raw, stockIP)
				f.Stop()

				s = start(stock, nil)
				if _, err := s.Client.NetworkingV1().IPAddresses().Get(ctx, forkIP, metav1.GetOptions{}); err != nil {
					t.Errorf("stock: get the fork's IPAddress %s: %v", forkIP, err)
				}
				deleteService(ctx, t, s, "from-fork")
				waitGone(ctx, t, raw, forkIP)
			})
		}
	}
}

// TestForkIPAddressesSurviveKeyRotation runs stock and the fork side by side on one etcd through
// a key rotation as the Kubernetes documentation describes it: a new key first (the old one still
// decrypts), a storage rewrite of every IPAddress object, then the old key removed. After each
// step every object is readable by both, and at the end every Service's delete, on either server,
// frees its address. Only IPAddress objects are encrypted here: with "*.*" the rewrite would have
// to cover every resource before the old key goes, which is the operator's part, not the fork's.
func TestForkIPAddressesSurviveKeyRotation(t *testing.T) {
	t.Parallel()
	fork, stock := forkBinary(t), stockBinary(t)
	for _, wp := range writePaths {
		t.Run(wp.name, func(t *testing.T) {
			etcd := testenv.NewEtcd(t)
			raw := etcd.TestClient(t)
			dir := t.TempDir()
			oldKey, newKey := newAESCBCKey(t, "old"), newAESCBCKey(t, "new")
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()

			var servers []*testenv.KubeAPIServer // stock, fork
			startBoth := func(keys ...aescbcKey) {
				config := writeEncryptionConfig(t, dir, ipAddresses, false, keys...)
				for _, s := range servers {
					s.Stop()
				}
				servers = nil
				for _, side := range []struct {
					bin string
					env []string
				}{{stock, nil}, {fork, wp.env}} {
					servers = append(servers, testenv.NewKubeAPIServer(t, etcd, ipAddressOnlyOptions(t, side.bin, side.env, config)))
				}
			}
			// ips are the Services' addresses, by Service name; even ones are stock's.
			ips := map[string]string{}
			createOnBoth := func(round int) {
				for i, s := range servers {
					name := fmt.Sprintf("svc-%d-%d", round, i)
					ips[name] = fmt.Sprintf("10.96.0.%d", 10*round+i+10)
					createService(ctx, t, s, name, ips[name])
				}
			}
			readableByBoth := func(step string) {
				t.Helper()
				for i, s := range servers {
					list, err := s.Client.NetworkingV1().IPAddresses().List(ctx, metav1.ListOptions{})
					if err != nil {
						t.Fatalf("%s: server %d: list IPAddresses: %v", step, i, err)
					}
					got := map[string]bool{}
					for _, o := range list.Items {
						got[o.Name] = true
					}
					for name, ip := range ips {
						if !got[ip] {
							t.Errorf("%s: server %d lists no IPAddress %s of Service %s", step, i, ip, name)
						}
					}
				}
			}

			startBoth(oldKey)
			createOnBoth(0)
			wantEncrypted(ctx, t, raw, oldKey.name, ips["svc-0-0"], ips["svc-0-1"])
			readableByBoth("old key")

			startBoth(newKey, oldKey)
			createOnBoth(1)
			wantEncrypted(ctx, t, raw, newKey.name, ips["svc-1-0"], ips["svc-1-1"])
			readableByBoth("new key first")

			// The storage rewrite: replace every object unchanged, which re-encrypts what an
			// older key encrypted.
			ipas := servers[0].Client.NetworkingV1().IPAddresses()
			list, err := ipas.List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for i := range list.Items {
				if _, err := ipas.Update(ctx, &list.Items[i], metav1.UpdateOptions{}); err != nil {
					t.Fatalf("rewrite IPAddress %s: %v", list.Items[i].Name, err)
				}
			}
			for _, ip := range ips {
				wantEncrypted(ctx, t, raw, newKey.name, ip)
			}

			startBoth(newKey)
			readableByBoth("old key removed")
			i := 0
			for name, ip := range ips {
				deleteService(ctx, t, servers[i%2], name)
				waitGone(ctx, t, raw, ip)
				i++
			}
			for _, s := range servers {
				if _, err := s.Client.CoreV1().Services(metav1.NamespaceDefault).Create(ctx, testenv.ClusterIPService("after", ""), metav1.CreateOptions{}); err != nil {
					t.Errorf("create a Service after the rotation: %v", err)
				}
				if err := s.Client.CoreV1().Services(metav1.NamespaceDefault).Delete(ctx, "after", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
					t.Errorf("delete it: %v", err)
				}
			}
		})
	}
}
