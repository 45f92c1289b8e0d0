package repair_test

import (
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/repair"
)

// spellings are the ClusterIP spellings kube-apiserver v1.33 accepts and stores as written.
var spellings = testenv.ClusterIPSpellings()

// TestRepairKeepsNonCanonicalClusterIPsOfARealAPIServer creates Services with the ClusterIP
// spellings a real kube-apiserver v1.33 accepts and stores as written (in dual write, its
// default, on a dual-stack cluster), audits, and makes one repair pass with no hold-off in each
// mode. Nothing may be reported invalid, leaked, duplicate, out of range or of the wrong parent,
// repair may delete no object and clear no bit, and kube-apiserver still refuses the address to
// a second Service. (Before repair keyed by the parsed address it took each spelling for an
// invalid ClusterIP and its IPAddress and bit for a leak, freed them, and kube-apiserver then
// gave the address to the second Service: a duplicate made by repair.)
//
// An object may go missing meanwhile, and repair then recreates it: v1.33's own IPAddress
// repair loop compares an object's name with the Service's ClusterIPs as strings, so it deletes
// the object of a non-canonical spelling as a "wrong reference" itself, at times of its own.
func TestRepairKeepsNonCanonicalClusterIPsOfARealAPIServer(t *testing.T) {
	t.Parallel()
	const range4, range6 = "10.96.0.0/24", "fd00:10:96::/112"
	e := testenv.NewEtcd(t)
	api := testenv.NewKubeAPIServer(t, e, testenv.KubeAPIServerOptions{ServiceClusterIPRange: range4 + "," + range6})
	cli := e.TestClient(t)
	ctx := t.Context()
	services := api.Client.CoreV1().Services(metav1.NamespaceDefault)
	ipas := api.Client.NetworkingV1().IPAddresses()
	testenv.WaitForKubernetesService(t, api.Client)

	for i, s := range spellings {
		name := "spelled-" + string(rune('a'+i))
		created, err := services.Create(ctx, testenv.ClusterIPService(name, s.ClusterIP), metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create Service %s with ClusterIP %q: %v", name, s.ClusterIP, err)
		}
		if created.Spec.ClusterIP != s.ClusterIP {
			t.Logf("kube-apiserver stored ClusterIP %q as %q", s.ClusterIP, created.Spec.ClusterIP)
		}
		if _, err := ipas.Get(ctx, s.Addr, metav1.GetOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("get IPAddress %s of ClusterIP %q: %v", s.Addr, s.ClusterIP, err)
		}
	}

	// Repair's client counts the deletes it sends.
	var deletes atomic.Int32
	rc := rest.CopyConfig(api.Config)
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			if req.Method != http.MethodGet {
				t.Logf("repair wrote: %s %s", req.Method, req.URL.Path)
			}
			if req.Method == http.MethodDelete {
				deletes.Add(1)
			}
			return rt.RoundTrip(req)
		})
	})
	repairClient, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := clusterip.Config{
		Mode:   featuregate.DualWrite,
		Ranges: []netip.Prefix{netip.MustParsePrefix(range4), netip.MustParsePrefix(range6)},
		Client: repairClient, Bitmaps: etcdstore.Stores{Client: cli},
	}
	auditNothingButMissing(t, cfg, "of Services holding non-canonical ClusterIPs")
	for _, mode := range []featuregate.Mode{featuregate.DualWrite, featuregate.Legacy, featuregate.IPAddressOnly} {
		rec := &recorder{}
		c, err := repair.NewController(withMode(cfg, mode), repair.Options{LeakGrace: -1, Recorder: rec})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.RunOnce(ctx); err != nil {
			t.Fatalf("%s RunOnce() error = %v", mode, err)
		}
		for _, ev := range rec.Got() {
			if !strings.Contains(ev, " ClusterIPNotAllocated ") { // the recreate of an object v1.33 deleted
				t.Errorf("%s pass: Event %q, want none but ClusterIPNotAllocated", mode, ev)
			}
		}
	}
	auditNothingButMissing(t, cfg, "after a repair pass in each mode")
	if n := deletes.Load(); n != 0 {
		t.Errorf("repair sent %d deletes to the API server (logged above), want none", n)
	}

	held := map[bool]*bitmap.Allocator{}
	for i, r := range cfg.Ranges {
		snap, _, err := etcdstore.New(cli, etcdstore.KeyFor("", i)).Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		b, _, err := bitmap.Project(snap, r)
		if err != nil {
			t.Fatalf("the bitmap of %s: %v", r, err)
		}
		held[r.Addr().Is4()] = b
	}
	for i, s := range spellings {
		addr := netip.MustParseAddr(s.Addr)
		if !held[addr.Is4()].Has(addr) {
			t.Errorf("bit of %s (ClusterIP %q) cleared by repair", s.Addr, s.ClusterIP)
		}
		second := testenv.ClusterIPService("second-"+string(rune('a'+i)), s.Addr)
		if _, err := services.Create(ctx, second, metav1.CreateOptions{}); err == nil {
			t.Errorf("a second Service got %s, the address of ClusterIP %q: a duplicate", s.Addr, s.ClusterIP)
		} else if !apierrors.IsInvalid(err) {
			t.Errorf("create a second Service with %s: %v, want 422 Invalid (already allocated)", s.Addr, err)
		}
	}
}

// auditNothingButMissing fails t if an audit of cfg's cluster in any mode finds anything but
// missing IPAddress objects, which v1.33's own repair loop may have deleted.
func auditNothingButMissing(t *testing.T, cfg clusterip.Config, when string) {
	t.Helper()
	for _, mode := range []featuregate.Mode{featuregate.DualWrite, featuregate.Legacy, featuregate.IPAddressOnly} {
		rep, err := repair.Audit(t.Context(), withMode(cfg, mode))
		if err != nil {
			t.Fatalf("Audit(%s) %s: %v", mode, when, err)
		}
		for _, f := range rep.Findings {
			if f.Class == repair.Missing {
				t.Logf("Audit(%s) %s: %+v (deleted by kube-apiserver's own repair loop)", mode, when, f)
				continue
			}
			t.Errorf("Audit(%s) %s: finding %+v, want none but missing", mode, when, f)
		}
	}
}

// roundTripperFunc is an http.RoundTripper of a function.
type roundTripperFunc func(*http.Request) (*http.Response, error)

// RoundTrip calls f.
func (f roundTripperFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }
