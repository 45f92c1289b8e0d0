package repair_test

import (
	"net/netip"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

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
// mode. Nothing may be reported and nothing deleted or cleared: the IPAddress object of each
// address keeps its UID, its bit stays set, and kube-apiserver still refuses the address to a
// second Service. (Before repair keyed by the parsed address it took each spelling for an
// invalid ClusterIP and its IPAddress and bit for a leak, freed them, and kube-apiserver then
// gave the address to the second Service: a duplicate made by repair.)
func TestRepairKeepsNonCanonicalClusterIPsOfARealAPIServer(t *testing.T) {
	const range4, range6 = "10.96.0.0/24", "fd00:10:96::/112"
	e := testenv.NewEtcd(t)
	api := testenv.NewKubeAPIServer(t, e, testenv.KubeAPIServerOptions{ServiceClusterIPRange: range4 + "," + range6})
	cli := e.TestClient(t)
	ctx := t.Context()
	services := api.Client.CoreV1().Services(metav1.NamespaceDefault)
	ipas := api.Client.NetworkingV1().IPAddresses()
	testenv.WaitFor(t, "the kubernetes Service", func() bool {
		_, err := services.Get(ctx, "kubernetes", metav1.GetOptions{})
		return err == nil
	})

	uids := map[string]types.UID{}
	for i, s := range spellings {
		name := "spelled-" + string(rune('a'+i))
		created, err := services.Create(ctx, testenv.ClusterIPService(name, s.ClusterIP), metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create Service %s with ClusterIP %q: %v", name, s.ClusterIP, err)
		}
		if created.Spec.ClusterIP != s.ClusterIP {
			t.Logf("kube-apiserver stored ClusterIP %q as %q", s.ClusterIP, created.Spec.ClusterIP)
		}
		ipa, err := ipas.Get(ctx, s.Addr, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("kube-apiserver made no IPAddress %s for ClusterIP %q: %v", s.Addr, s.ClusterIP, err)
		}
		uids[s.Addr] = ipa.UID
	}

	cfg := clusterip.Config{
		Mode:   featuregate.DualWrite,
		Ranges: []netip.Prefix{netip.MustParsePrefix(range4), netip.MustParsePrefix(range6)},
		Client: api.Client, Etcd: cli,
	}
	auditConsistent(t, cfg, "of Services holding non-canonical ClusterIPs")
	for _, mode := range []featuregate.Mode{featuregate.DualWrite, featuregate.Legacy, featuregate.IPAddressOnly} {
		rec := &recorder{}
		c, err := repair.NewController(withMode(cfg, mode), repair.Options{LeakGrace: -1, Recorder: rec})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.RunOnce(ctx); err != nil {
			t.Fatalf("%s RunOnce() error = %v", mode, err)
		}
		if got := rec.Got(); len(got) != 0 {
			t.Errorf("%s pass: Events %q, want none", mode, got)
		}
	}
	auditConsistent(t, cfg, "after a repair pass in each mode")

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
		ipa, err := ipas.Get(ctx, s.Addr, metav1.GetOptions{})
		switch {
		case err != nil:
			t.Errorf("IPAddress %s of ClusterIP %q after repair: %v", s.Addr, s.ClusterIP, err)
		case ipa.UID != uids[s.Addr]:
			t.Errorf("IPAddress %s of ClusterIP %q was recreated (UID %s, was %s)", s.Addr, s.ClusterIP, ipa.UID, uids[s.Addr])
		}
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
