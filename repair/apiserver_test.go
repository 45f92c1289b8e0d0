package repair

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/ipaddress"
)

// TestAuditOfARealDualWriteCluster lets a real kube-apiserver v1.33 (dual write, its default)
// allocate three Services, checks that the audit finds the cluster consistent, then seeds one
// leaked IPAddress, one missing IPAddress and one stale bit and checks that each is reported
// once, with its class.
func TestAuditOfARealDualWriteCluster(t *testing.T) {
	e := testenv.NewEtcd(t)
	api := testenv.NewKubeAPIServer(t, e, testenv.KubeAPIServerOptions{ServiceClusterIPRange: "10.96.0.0/24"})
	cli := e.TestClient(t)
	ctx := t.Context()
	cfg := clusterip.Config{Mode: featuregate.DualWrite, Ranges: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/24")}, Client: api.Client, Etcd: cli}

	testenv.WaitFor(t, "the kubernetes Service", func() bool {
		_, err := api.Client.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		return err == nil
	})
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
		rep, err := Audit(ctx, c)
		if err != nil {
			t.Fatalf("Audit(%s) error = %v", mode, err)
		}
		if !rep.Consistent || len(rep.Findings) != 0 {
			t.Errorf("Audit(%s) of a cluster kube-apiserver allocated: Consistent = %v, findings %+v; want consistent", mode, rep.Consistent, rep.Findings)
		}
		if got := rep.Counts[CountServices]; got != 4 {
			t.Errorf("Audit(%s) Counts[services] = %d, want 4 (3 and kubernetes)", mode, got)
		}
	}

	// A leaked IPAddress: kube-apiserver's own repair leaves it for 60 s.
	if _, err := api.Client.NetworkingV1().IPAddresses().Create(ctx, &networkingv1.IPAddress{
		ObjectMeta: metav1.ObjectMeta{Name: "10.96.0.200", Labels: map[string]string{
			networkingv1.LabelIPAddressFamily: string(corev1.IPv4Protocol),
			networkingv1.LabelManagedBy:       "ipallocator.k8s.io",
		}},
		Spec: networkingv1.IPAddressSpec{ParentRef: &networkingv1.ParentReference{Resource: "services", Namespace: "default", Name: "gone"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("seed leaked IPAddress: %v", err)
	}
	// A missing IPAddress: s1's, deleted behind the allocator's back.
	if err := api.Client.NetworkingV1().IPAddresses().Delete(ctx, ips[0], metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete IPAddress %s: %v", ips[0], err)
	}
	// A stale bit: set in kube-apiserver's bitmap with nothing behind it.
	store := etcdstore.New(cli, etcdstore.ServiceIPsKey(""))
	seedBit(t, store, "10.96.0.0/24", "10.96.0.201")
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
		want []Finding
	}{
		{featuregate.DualWrite, []Finding{f(ips[0], Missing, "default/s1"), f(ips[1], WrongParent, "default/s2"), f("10.96.0.200", Leaked, ""), f("10.96.0.201", BitmapOnly, "")}},
		{featuregate.IPAddressOnly, []Finding{f(ips[0], Missing, "default/s1"), f(ips[1], WrongParent, "default/s2"), f("10.96.0.200", Leaked, "")}},
		{featuregate.Legacy, []Finding{f("10.96.0.201", Leaked, "")}},
	}
	for _, tt := range tests {
		c := cfg
		c.Mode = tt.mode
		rep, err := Audit(ctx, c)
		if err != nil {
			t.Fatalf("Audit(%s) error = %v", tt.mode, err)
		}
		want := tt.want
		sortFindings(want, func(f *Finding) *Finding { return f })
		if diff := cmp.Diff(want, rep.Findings, ignoreDetail); diff != "" {
			t.Errorf("Audit(%s) of the seeded cluster: findings (-want +got):\n%s", tt.mode, diff)
		}
	}

	// One DualWrite pass with no hold-off creates the missing IPAddress (and keeps its bit),
	// recreates the wrong parent (a delete with UID and resourceVersion preconditions, which the
	// fake clientset ignores), and deletes the leaked IPAddress and clears the stale bit, each
	// after a live Get.
	rec := &recorder{}
	dw, err := NewController(cfg, Options{LeakGrace: -1, Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dw.RunOnce(ctx); err != nil {
		t.Fatalf("DualWrite RunOnce() error = %v", err)
	}
	auditConsistent(t, cfg, "after one DualWrite pass")
	wantEvents := []string{"Warning ClusterIPNotAllocated s1", "Warning IPAddressNotAllocated 10.96.0.200", "Warning IPAddressWrongReference " + ips[1]}
	slices.Sort(wantEvents)
	if diff := cmp.Diff(wantEvents, rec.got()); diff != "" {
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
	seedBit(t, store, "10.96.0.0/24", "10.96.0.202")
	lc, err := NewController(withMode(cfg, featuregate.Legacy), Options{LeakGrace: -1})
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

// auditConsistent fails t unless cfg's cluster audits consistent in every mode.
func auditConsistent(t *testing.T, cfg clusterip.Config, when string) {
	t.Helper()
	for _, mode := range []featuregate.Mode{featuregate.DualWrite, featuregate.Legacy, featuregate.IPAddressOnly} {
		rep, err := Audit(t.Context(), withMode(cfg, mode))
		if err != nil {
			t.Fatalf("Audit(%s) %s: %v", mode, when, err)
		}
		if !rep.Consistent {
			t.Errorf("Audit(%s) %s: findings %+v, want none", mode, when, rep.Findings)
		}
	}
}

// seedBit sets ip in the bitmap of cidr at store with a compare-and-swap.
func seedBit(t *testing.T, store *etcdstore.Store, cidr, ip string) {
	t.Helper()
	err := bitmap.Modify(t.Context(), store, netip.MustParsePrefix(cidr), func(b *bitmap.Allocator) (bool, error) {
		return true, b.Allocate(t.Context(), netip.MustParseAddr(ip), allocator.Owner{})
	})
	if err != nil {
		t.Fatalf("seed stale bit %s: %v", ip, err)
	}
}

// withMode returns a copy of cfg for mode.
func withMode(cfg clusterip.Config, mode featuregate.Mode) clusterip.Config {
	cfg.Mode = mode
	return cfg
}

// TestRepairFixesLabelsUnderAResourceVersionPreconditionOnARealAPIServer strips the ip-family
// label of the IPAddress a real kube-apiserver v1.33 made for a Service, audits, and then writes
// the object again behind the audit's back: the label fix, an update carrying the
// resourceVersion the audit read, must fail with a Conflict and change nothing; the next pass,
// on a fresh read, fixes the label and keeps what the other writer added.
func TestRepairFixesLabelsUnderAResourceVersionPreconditionOnARealAPIServer(t *testing.T) {
	e := testenv.NewEtcd(t)
	api := testenv.NewKubeAPIServer(t, e, testenv.KubeAPIServerOptions{ServiceClusterIPRange: "10.96.0.0/24"})
	ctx := t.Context()
	cfg := clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/24")}, Client: api.Client}
	ipas := api.Client.NetworkingV1().IPAddresses()
	testenv.WaitFor(t, "the kubernetes Service", func() bool {
		_, err := api.Client.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		return err == nil
	})

	s, err := api.Client.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Service: %v", err)
	}
	ip := s.Spec.ClusterIP
	// kube-apiserver's own repair recreates an IPAddress with wrong labels when it handles its
	// Service's add event, which may come after the strip: strip until it has stuck for longer
	// than that repair's 1 s worker period (nothing else makes it look at the labels again).
	var ipa *networkingv1.IPAddress
	for attempt := 0; ; attempt++ {
		if ipa, err = ipas.Get(ctx, ip, metav1.GetOptions{}); err != nil {
			t.Fatalf("kube-apiserver made no IPAddress for %s: %v", ip, err)
		}
		if _, present := ipa.Labels[networkingv1.LabelIPAddressFamily]; !present && attempt > 0 {
			break
		}
		if attempt == 10 {
			t.Fatalf("kube-apiserver's repair keeps restoring the labels of IPAddress %s", ip)
		}
		delete(ipa.Labels, networkingv1.LabelIPAddressFamily)
		if _, err := ipas.Update(ctx, ipa, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("strip the ip-family label: %v", err)
		}
		time.Sleep(1500 * time.Millisecond)
	}

	w, err := read(ctx, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	var stale *finding
	for _, f := range classify(w).findings {
		if f.IP == ip {
			stale = &f
		}
	}
	if stale == nil || stale.Class != WrongParent || !stale.labels {
		t.Fatalf("audit of %s: %+v, want a wrong-parent finding for its labels", ip, stale)
	}

	// Another writer changes the object after the audit read it.
	live, err := ipas.Get(ctx, ip, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	live.Labels["example.com/touched"] = "yes"
	if _, err := ipas.Update(ctx, live, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("concurrent update: %v", err)
	}
	c, err := NewController(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.repairOne(ctx, stale); err != nil {
		t.Fatalf("label fix on a stale read: %v, want the Conflict taken as a change to judge again", err)
	}
	if live, err = ipas.Get(ctx, ip, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, ok := live.Labels[networkingv1.LabelIPAddressFamily]; ok || live.Labels["example.com/touched"] != "yes" {
		t.Errorf("labels after a label fix on a stale read = %v; want the concurrent writer's, unchanged", live.Labels)
	}

	if _, err := c.RunOnce(ctx); err != nil {
		t.Fatalf("RunOnce() error = %v", err)
	}
	if live, err = ipas.Get(ctx, ip, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		networkingv1.LabelIPAddressFamily: "IPv4",
		networkingv1.LabelManagedBy:       "ipallocator.k8s.io",
		"example.com/touched":             "yes",
	}
	if diff := cmp.Diff(want, live.Labels); diff != "" {
		t.Errorf("labels after a pass (-want +got):\n%s", diff)
	}
	if live.UID != ipa.UID {
		t.Errorf("the IPAddress was recreated (UID %s, was %s); want its labels updated in place", live.UID, ipa.UID)
	}
	rep, err := Audit(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Consistent {
		t.Errorf("audit after the label fix: %+v, want consistent", rep.Findings)
	}
}
