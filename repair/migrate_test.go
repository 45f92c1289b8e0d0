package repair

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// TestRepairMigratesALegacyClusterToIPAddresses lets a real kube-apiserver v1.33 in Legacy mode
// (MultiCIDRServiceAllocator off: bitmap only) allocate Services, then runs one IPAddressOnly
// repair pass, the migration path: every Service gets its IPAddress object and nothing else
// changes (the Services and the bitmap keep their resourceVersion and revision).
func TestRepairMigratesALegacyClusterToIPAddresses(t *testing.T) {
	e := testenv.NewEtcd(t)
	api := testenv.NewKubeAPIServer(t, e, testenv.KubeAPIServerOptions{ServiceClusterIPRange: "10.97.0.0/24", FeatureGates: "MultiCIDRServiceAllocator=false"})
	cli := e.TestClient(t)
	ctx := t.Context()
	cfg := clusterip.Config{Mode: featuregate.Legacy, Ranges: []netip.Prefix{netip.MustParsePrefix("10.97.0.0/24")}, Client: api.Client, Bitmaps: etcdstore.Stores{Client: cli}}

	testenv.WaitForKubernetesService(t, api.Client)
	for _, name := range []string{"s1", "s2", "s3", "s4", "s5"} {
		if _, err := api.Client.CoreV1().Services("default").Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create Service %s: %v", name, err)
		}
	}
	auditWant(t, cfg, 0)
	// What an upgraded kube-apiserver creates from its flag: the default ServiceCIDR.
	if _, err := api.Client.NetworkingV1().ServiceCIDRs().Create(ctx, &networkingv1.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.97.0.0/24"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the default ServiceCIDR: %v", err)
	}
	ipOnly := withMode(cfg, featuregate.IPAddressOnly)
	auditWant(t, ipOnly, 6) // five and kubernetes, all missing

	before := servicesVersions(t, cfg)
	bm, err := cli.Get(ctx, etcdstore.ServiceIPsKey(""))
	if err != nil || len(bm.Kvs) != 1 {
		t.Fatalf("read the bitmap key: %v (%d keys)", err, len(bm.Kvs))
	}

	// Events through client-go's events broadcaster, as kube-apiserver's repair sends them.
	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: api.Client.EventsV1()})
	if err := broadcaster.StartRecordingToSinkWithContext(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(broadcaster.Shutdown)
	c, err := NewController(ipOnly, Options{Recorder: broadcaster.NewRecorder(scheme.Scheme, "clusterip-repair")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RunOnce(ctx); err != nil {
		t.Fatalf("RunOnce() error = %v", err)
	}
	auditWant(t, ipOnly, 0)
	auditWant(t, cfg, 0)
	if after := servicesVersions(t, cfg); len(after) != len(before) {
		t.Errorf("Services before and after: %v, %v", before, after)
	} else {
		for k, v := range before {
			if after[k] != v {
				t.Errorf("Service %s changed: resourceVersion %s, then %s", k, v, after[k])
			}
		}
	}
	testenv.WaitFor(t, "a ClusterIPNotAllocated Event per Service", func() bool {
		l, err := api.Client.EventsV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "reason=ClusterIPNotAllocated"})
		return err == nil && len(l.Items) == 6
	})
	bm2, err := cli.Get(ctx, etcdstore.ServiceIPsKey(""))
	if err != nil || len(bm2.Kvs) != 1 {
		t.Fatalf("read the bitmap key: %v", err)
	}
	if bm2.Kvs[0].ModRevision != bm.Kvs[0].ModRevision {
		t.Errorf("the bitmap was written (ModRevision %d, then %d); migration must not touch it", bm.Kvs[0].ModRevision, bm2.Kvs[0].ModRevision)
	}
}

// auditWant fails t unless cfg's cluster audits with n findings.
func auditWant(t *testing.T, cfg clusterip.Config, n int) {
	t.Helper()
	rep, err := Audit(t.Context(), cfg)
	if err != nil {
		t.Fatalf("Audit(%s): %v", cfg.Mode, err)
	}
	if len(rep.Findings) != n {
		t.Errorf("Audit(%s): %d findings %+v, want %d", cfg.Mode, len(rep.Findings), rep.Findings, n)
	}
}

// servicesVersions returns the resourceVersion of every Service by "namespace/name".
func servicesVersions(t *testing.T, cfg clusterip.Config) map[string]string {
	t.Helper()
	l, err := cfg.Client.CoreV1().Services("").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for i := range l.Items {
		out[serviceKey(&l.Items[i])] = l.Items[i].ResourceVersion
	}
	return out
}
