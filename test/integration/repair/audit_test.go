package repair_test

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/ipaddress"
	"github.com/kube-ipam/clusterip/repair"
)

// TestAuditOfARealDualWriteCluster lets a real kube-apiserver v1.33 (dual write, its default)
// allocate three Services, checks that the audit finds the cluster consistent, then seeds one
// leaked IPAddress, one missing IPAddress and one stale bit and checks that each is reported
// once, with its class.
func TestAuditOfARealDualWriteCluster(t *testing.T) {
	t.Parallel()
	e := testenv.NewEtcd(t)
	api := testenv.NewKubeAPIServer(t, e, testenv.KubeAPIServerOptions{ServiceClusterIPRange: "10.96.0.0/24"})
	cli := e.TestClient(t)
	ctx := t.Context()
	cfg := clusterip.Config{Mode: featuregate.DualWrite, Ranges: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/24")}, Client: api.Client, Bitmaps: etcdstore.Stores{Client: cli}}

	testenv.WaitForKubernetesService(t, api.Client)
	var ips []string
	for _, name := range []string{"s1", "s2", "s3"} {
		s, err := api.Client.CoreV1().Services("default").Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create Service %s: %v", name, err)
		}
		ips = append(ips, s.Spec.ClusterIP)
	}

	for _, mode := range []featuregate.Mode{featuregate.DualWrite, featuregate.Legacy, featuregate.IPAddressOnly} {
		c := cfg
		c.Mode = mode
		rep, err := repair.Audit(ctx, c)
		if err != nil {
			t.Fatalf("Audit(%s) error = %v", mode, err)
		}
		if !rep.Consistent || len(rep.Findings) != 0 {
			t.Errorf("Audit(%s) of a cluster kube-apiserver allocated: Consistent = %v, findings %+v; want consistent", mode, rep.Consistent, rep.Findings)
		}
		if got := rep.Counts[repair.CountServices]; got != 4 {
			t.Errorf("Audit(%s) Counts[services] = %d, want 4 (3 and kubernetes)", mode, got)
		}
	}

	free := unheld("10.96.0.200", ips, 3)
	leaked, stale, staleLater := free[0], free[1], free[2]

	// A leaked IPAddress: kube-apiserver's own repair leaves it for 60 s.
	if _, err := api.Client.NetworkingV1().IPAddresses().Create(ctx, ipaddress.ObjectFor(netip.MustParseAddr(leaked),
		allocator.Owner{Resource: "services", Namespace: "default", Name: "gone"}, ipaddress.DefaultManagedBy), metav1.CreateOptions{}); err != nil {
		t.Fatalf("seed leaked IPAddress: %v", err)
	}
	// A missing IPAddress: s1's, deleted behind the allocator's back.
	if err := api.Client.NetworkingV1().IPAddresses().Delete(ctx, ips[0], metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete IPAddress %s: %v", ips[0], err)
	}
	// A stale bit: set in kube-apiserver's bitmap with nothing behind it.
	store := etcdstore.New(cli, etcdstore.ServiceIPsKey(""))
	seedBit(t, store, "10.96.0.0/24", stale)
	// A wrong parent: s2's IPAddress recreated naming another Service.
	if err := api.Client.NetworkingV1().IPAddresses().Delete(ctx, ips[1], metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete IPAddress %s: %v", ips[1], err)
	}
	wrong := ipaddress.ObjectFor(netip.MustParseAddr(ips[1]), allocator.Owner{Resource: "services", Namespace: "default", Name: "other"}, ipaddress.DefaultManagedBy)
	if _, err := api.Client.NetworkingV1().IPAddresses().Create(ctx, wrong, metav1.CreateOptions{}); err != nil {
		t.Fatalf("seed wrong parent: %v", err)
	}

	tests := []struct {
		mode featuregate.Mode
		want []repair.Finding
	}{
		{featuregate.DualWrite, []repair.Finding{f(ips[0], repair.Missing, "default/s1"), f(ips[1], repair.WrongParent, "default/s2"), f(leaked, repair.Leaked, ""), f(stale, repair.BitmapOnly, "")}},
		{featuregate.IPAddressOnly, []repair.Finding{f(ips[0], repair.Missing, "default/s1"), f(ips[1], repair.WrongParent, "default/s2"), f(leaked, repair.Leaked, "")}},
		{featuregate.Legacy, []repair.Finding{f(stale, repair.Leaked, "")}},
	}
	for _, tt := range tests {
		c := cfg
		c.Mode = tt.mode
		rep, err := repair.Audit(ctx, c)
		if err != nil {
			t.Fatalf("Audit(%s) error = %v", tt.mode, err)
		}
		want := tt.want
		sortFindings(want)
		if diff := cmp.Diff(want, rep.Findings, ignoreDetail); diff != "" {
			t.Errorf("Audit(%s) of the seeded cluster: findings (-want +got):\n%s", tt.mode, diff)
		}
	}

	// One DualWrite pass with no hold-off creates the missing IPAddress (and keeps its bit),
	// recreates the wrong parent (a delete with UID and resourceVersion preconditions, which the
	// fake clientset ignores), and deletes the leaked IPAddress and clears the stale bit, each
	// after a live Get.
	rec := &recorder{}
	dw, err := repair.NewController(cfg, repair.Options{LeakGrace: -1, Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dw.RunOnce(ctx); err != nil {
		t.Fatalf("DualWrite RunOnce() error = %v", err)
	}
	auditConsistent(t, cfg, "after one DualWrite pass")
	wantEvents := []string{"Warning ClusterIPNotAllocated s1", "Warning IPAddressNotAllocated " + leaked, "Warning IPAddressWrongReference " + ips[1]}
	slices.Sort(wantEvents)
	if diff := cmp.Diff(wantEvents, rec.Got()); diff != "" {
		t.Errorf("Events (-want +got):\n%s", diff)
	}
	fixed, err := api.Client.NetworkingV1().IPAddresses().Get(ctx, ips[1], metav1.GetOptions{})
	if err != nil {
		t.Fatalf("IPAddress %s after repair: %v", ips[1], err)
	}
	if p := fixed.Spec.ParentRef; p == nil || p.Name != "s2" {
		t.Errorf("IPAddress %s parentRef after repair = %+v, want Service default/s2", ips[1], p)
	}

	// Legacy repair frees a stale bit in kube-apiserver's own bitmap on the third pass, with a
	// compare-and-swap on the key kube-apiserver writes.
	seedBit(t, store, "10.96.0.0/24", staleLater)
	lc, err := repair.NewController(withMode(cfg, featuregate.Legacy), repair.Options{LeakGrace: -1})
	if err != nil {
		t.Fatal(err)
	}
	for pass := range legacyLeakPasses {
		if _, err := lc.RunOnce(ctx); err != nil {
			t.Fatalf("Legacy RunOnce() pass %d error = %v", pass+1, err)
		}
		if want := pass < legacyLeakPasses-1; (lc.HeldOff() == 1) != want {
			t.Errorf("Legacy pass %d: HeldOff() = %d, want held off: %v", pass+1, lc.HeldOff(), want)
		}
	}
	auditConsistent(t, cfg, "after three Legacy passes")
}
