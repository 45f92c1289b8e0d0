package repair_test

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/repair"
)

// TestRepairDuringAServiceCIDRRemovalOnARealAPIServer removes a ServiceCIDR that two Services
// use from a real kube-apiserver v1.33, as a cluster administrator does: it is deleted, a
// finalizer keeps it (kube-controller-manager's, here the test's own) and its Ready condition
// turns False. Its Services are healthy, and one has lost its IPAddress. The audit must report
// that one missing and nothing else, and a repair pass must create the IPAddress and emit no
// "please recreate Service" Event (before, both were out-of-range: check exited 1 on every
// ServiceCIDR removal, and repair told healthy Services to be recreated).
func TestRepairDuringAServiceCIDRRemovalOnARealAPIServer(t *testing.T) {
	t.Parallel()
	e := testenv.NewEtcd(t)
	api := testenv.NewKubeAPIServer(t, e, testenv.KubeAPIServerOptions{ServiceClusterIPRange: "10.96.0.0/24"})
	ctx := t.Context()
	scs := api.Client.NetworkingV1().ServiceCIDRs()
	services := api.Client.CoreV1().Services(metav1.NamespaceDefault)
	testenv.WaitForKubernetesService(t, api.Client)

	const finalizer = "example.com/hold"
	if _, err := scs.Create(ctx, &networkingv1.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: "old", Finalizers: []string{finalizer}},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.97.0.0/24"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ServiceCIDR: %v", err)
	}
	for name, ip := range map[string]string{"healthy": "10.97.0.10", "missing": "10.97.0.11"} {
		testenv.WaitFor(t, "Service "+name+" in the new ServiceCIDR", func() bool {
			_, err := services.Create(ctx, testenv.ClusterIPService(name, ip), metav1.CreateOptions{})
			return err == nil // kube-apiserver refuses the IP until its allocator has seen the ServiceCIDR
		})
	}
	t.Cleanup(func() {
		// Let the ServiceCIDR go, as kube-controller-manager would once its Services are gone.
		if sc, err := scs.Get(ctx, "old", metav1.GetOptions{}); err == nil {
			sc.Finalizers = nil
			_, _ = scs.Update(ctx, sc, metav1.UpdateOptions{})
		}
	})

	// The removal: delete, then Ready=False with reason Terminating as kube-controller-manager sets it.
	if err := scs.Delete(ctx, "old", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete ServiceCIDR: %v", err)
	}
	sc, err := scs.Get(ctx, "old", metav1.GetOptions{})
	if err != nil || sc.DeletionTimestamp == nil {
		t.Fatalf("ServiceCIDR after delete: %+v, %v; want it terminating, held by its finalizer", sc, err)
	}
	sc.Status.Conditions = []metav1.Condition{{Type: networkingv1.ServiceCIDRConditionReady, Status: metav1.ConditionFalse,
		Reason: "Terminating", Message: "in use", LastTransitionTime: metav1.Now()}}
	if _, err := scs.UpdateStatus(ctx, sc, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("set Ready=False: %v", err)
	}
	if err := api.Client.NetworkingV1().IPAddresses().Delete(ctx, "10.97.0.11", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete the IPAddress of Service missing: %v", err)
	}

	cfg := clusterip.Config{Mode: featuregate.DualWrite, Ranges: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/24")},
		Client: api.Client, Bitmaps: etcdstore.Stores{Client: e.TestClient(t)}}
	for _, mode := range []featuregate.Mode{featuregate.DualWrite, featuregate.IPAddressOnly} {
		rep, err := repair.Audit(ctx, withMode(cfg, mode))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]repair.Finding{f("10.97.0.11", repair.Missing, "default/missing")}, rep.Findings, ignoreDetail); diff != "" {
			t.Errorf("Audit(%s) during the removal (-want +got):\n%s", mode, diff)
		}
	}

	rec := &recorder{}
	c, err := repair.NewController(cfg, repair.Options{Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RunOnce(ctx); err != nil {
		t.Fatalf("RunOnce() error = %v", err)
	}
	if diff := cmp.Diff([]string{"Warning ClusterIPNotAllocated missing"}, rec.Got()); diff != "" {
		t.Errorf("Events of a pass during the removal (-want +got):\n%s", diff)
	}
	if ipa, err := api.Client.NetworkingV1().IPAddresses().Get(ctx, "10.97.0.11", metav1.GetOptions{}); err != nil {
		t.Errorf("IPAddress of Service missing after a pass: %v, want it created", err)
	} else if p := ipa.Spec.ParentRef; p == nil || p.Name != "missing" {
		t.Errorf("IPAddress 10.97.0.11 after a pass has parent %+v, want Service default/missing", p)
	}
	for _, mode := range []featuregate.Mode{featuregate.DualWrite, featuregate.IPAddressOnly} {
		if rep, err := repair.Audit(ctx, withMode(cfg, mode)); err != nil || !rep.Consistent {
			t.Errorf("Audit(%s) after a pass during the removal: %+v, %v; want consistent", mode, rep, err)
		}
	}
}
