package flagchange

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/fakeclient"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/repair"
)

// kubeAPIServerRangeMismatch is kube-apiserver v1.33's text for an allocation from a bitmap stored
// for another range (pkg/registry/core/service/allocator.AllocationBitmap.Restore).
const kubeAPIServerRangeMismatch = "the provided range does not match the current range"

// migrationScenario is one case of upstream's TestServiceCIDRMigrationScenarios
// (test/integration/servicecidr/migration_test.go, kube-apiserver v1.33.13): a server runs with
// initial --service-cluster-ip-range flags and allocates a Service, then a server runs with the
// migrated flags on the same storage.
type migrationScenario struct {
	name                 string
	initial, migrated    []string
	postMigrationSvcFail bool // upstream's expectedPostMigrationSvcError (DualWrite): either outcome passes
	inconsistent         bool // upstream's expectInconsistentState: the default ServiceCIDR keeps the initial CIDRs
}

func migrationScenarios() []migrationScenario {
	const (
		v4Small = "10.0.0.0/29" // 6 IPs
		v4Big   = "10.1.0.0/16"
		v6Small = "2001:db8:1::/125"
		v6Big   = "2001:db8:2::/112"
	)
	return []migrationScenario{
		// No change.
		{name: "IPv4 -> IPv4 (no change)", initial: []string{v4Small}, migrated: []string{v4Small}},
		{name: "IPv6 -> IPv6 (no change)", initial: []string{v6Small}, migrated: []string{v6Small}},
		{name: "IPv4,IPv6 -> IPv4,IPv6 (no change)", initial: []string{v4Small, v6Small}, migrated: []string{v4Small, v6Small}},
		{name: "IPv6,IPv4 -> IPv6,IPv4 (no change)", initial: []string{v6Small, v4Small}, migrated: []string{v6Small, v4Small}},
		// Valid upgrades.
		{name: "IPv4 -> IPv4,IPv6 (upgrade)", initial: []string{v4Small}, migrated: []string{v4Small, v6Big}},
		{name: "IPv6 -> IPv6,IPv4 (upgrade)", initial: []string{v6Small}, migrated: []string{v6Small, v4Big}},
		// Invalid migrations, which need manual intervention.
		{name: "IPv4,IPv6 -> IPv6,IPv4 (change primary)", initial: []string{v4Small, v6Small}, migrated: []string{v6Small, v4Small}, postMigrationSvcFail: true, inconsistent: true},
		{name: "IPv6,IPv4 -> IPv4,IPv6 (change primary)", initial: []string{v6Small, v4Small}, migrated: []string{v4Small, v6Small}, postMigrationSvcFail: true, inconsistent: true},
		{name: "IPv4,IPv6 -> IPv4 (downgrade)", initial: []string{v4Small, v6Small}, migrated: []string{v4Small}, inconsistent: true},
		{name: "IPv4,IPv6 -> IPv6 (downgrade)", initial: []string{v4Small, v6Small}, migrated: []string{v6Small}, postMigrationSvcFail: true, inconsistent: true},
		{name: "IPv4 -> IPv6 (change family)", initial: []string{v4Small}, migrated: []string{v6Small}, postMigrationSvcFail: true, inconsistent: true},
		{name: "IPv6 -> IPv4 (change family)", initial: []string{v6Small}, migrated: []string{v4Small}, postMigrationSvcFail: true, inconsistent: true},
		{name: "IPv4 -> IPv6,IPv4 (upgrade, change primary)", initial: []string{v4Small}, migrated: []string{v6Big, v4Small}, postMigrationSvcFail: true, inconsistent: true},
		{name: "IPv6 -> IPv4,IPv6 (upgrade, change primary)", initial: []string{v6Small}, migrated: []string{v4Big, v6Small}, postMigrationSvcFail: true, inconsistent: true},
		// Not in upstream's list: the same family, another range. kube-apiserver keeps the default
		// ServiceCIDR (inconsistent) and creates the Service from it.
		{name: "IPv4 -> IPv4 (another range)", initial: []string{v4Small}, migrated: []string{"10.2.0.0/28"}, inconsistent: true},
	}
}

// defaultServiceCIDRAfter returns the CIDRs of the default ServiceCIDR "kubernetes" once a
// kube-apiserver v1.33 in DualWrite mode has started with the migrated flags over one started with
// the initial ones (pkg/controlplane/controller/defaultservicecidr): created from the first
// server's flags, and changed only by a single- to dual-stack upgrade that keeps the primary.
func defaultServiceCIDRAfter(initial, migrated []string) []string {
	if len(initial) == 1 && len(migrated) == 2 && initial[0] == migrated[0] {
		return migrated
	}
	return initial
}

// flagServer is the part of a kube-apiserver run that the allocators replace: our Allocators for
// a mode and --service-cluster-ip-range flags, over a shared etcd and API.
type flagServer struct {
	allocs *clusterip.Allocators
	stop   func()
}

// startFlagServer starts the Allocators of cfg (with informers of client in DualWrite mode) and
// waits until each family serves the prefixes of cidrs, the default ServiceCIDR's, of its family.
func startFlagServer(t *testing.T, cfg clusterip.Config, client kubernetes.Interface, cidrs []string) *flagServer {
	t.Helper()
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background().V(1)))
	var inf informers.SharedInformerFactory
	if cfg.Mode != featuregate.Legacy {
		inf = informers.NewSharedInformerFactory(client, 0)
		cfg.Informers = inf
	}
	a, err := clusterip.New(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatalf("New(%v, %v) = %v, want nil: kube-apiserver v1.33 starts with these flags", cfg.Mode, cfg.Ranges, err)
	}
	done := make(chan error, 1)
	if inf != nil {
		// The fake loses what is written between an informer's list and its watch: wait for
		// this server's watches (the count includes those of an earlier server).
		fc, _ := client.(*fakeclient.Clientset)
		before := map[string]int{}
		for _, r := range []string{"servicecidrs", "ipaddresses"} {
			if fc != nil {
				before[r] = fc.Watching(r)
			}
		}
		inf.Start(ctx.Done())
		for r, n := range before {
			testenv.WaitFor(t, "a watch on "+r, func() bool { return fc.Watching(r) > n })
		}
	}
	go func() { done <- a.Run(ctx) }()
	s := &flagServer{allocs: a, stop: once(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() = %v", err)
		}
		if inf != nil {
			inf.Shutdown()
		}
		if err := a.Close(); err != nil {
			t.Errorf("Close() = %v", err)
		}
	})}
	t.Cleanup(s.stop)
	if cfg.Mode == featuregate.Legacy {
		return s
	}
	// Wait until each family serves the default ServiceCIDR's prefixes of its family (none if it
	// has none: such a family cannot allocate, as in kube-apiserver).
	for _, f := range a.Families() {
		var want []netip.Prefix
		for _, c := range cidrs {
			if p := netip.MustParsePrefix(c); allocator.FamilyOf(p.Addr()) == f {
				want = append(want, p)
			}
		}
		sc := a.ServiceCIDRs(f)
		testenv.WaitFor(t, fmt.Sprintf("%s to serve %v", f, want), func() bool {
			if len(want) == 0 {
				// Nothing to serve: wait until the allocator has synced and says so.
				_, err := sc.DryRun().AllocateNext(ctx, allocator.Owner{})
				return err != nil && !strings.Contains(err.Error(), "not synced yet")
			}
			return slices.Equal(sc.ReadyCIDRs(), want)
		})
	}
	return s
}

// once makes stop idempotent, so that a test may stop a server before its cleanup does.
func once(stop func()) func() {
	stopped := false
	return func() {
		if !stopped {
			stopped = true
			stop()
		}
	}
}

// allocateService allocates and commits the ClusterIPs of a new SingleStack ClusterIP Service, as
// the Service registry would on create, and stores the Service.
func allocateService(ctx context.Context, c kubernetes.Interface, a *clusterip.Allocators, ns, name string) (*corev1.Service, error) {
	svc := testenv.ClusterIPService(name, "")
	svc.Namespace = ns
	txn, err := a.Services().Allocate(ctx, svc, false)
	if err != nil {
		return nil, err
	}
	if err := txn.Commit(ctx); err != nil {
		return nil, err
	}
	return c.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
}

// TestServiceCIDRMigrationScenarios runs the flag changes of upstream's
// TestServiceCIDRMigrationScenarios through New, in Legacy and DualWrite mode, and asserts what
// upstream asserts: the server starts with the migrated flags (New succeeds; a bitmap stored for
// another range does not stop it), the Service allocated before keeps its ClusterIPs (and, where
// the new flags still serve it, its address stays held), and a Service created afterwards gets
// its primary ClusterIP from the range upstream expects, except in the cases upstream lets fail.
//
// DualWrite runs as upstream's test does (v1.33's default gates): the default ServiceCIDR is what
// kube-apiserver's own controller leaves (created from the first flags, kept on an inconsistent
// change), and a family whose mirror is stored for another range allocates from the ServiceCIDRs
// alone. Legacy adds what upstream's Legacy server does before it turns ready: one repair pass,
// which rewrites a bitmap stored for another range to the flag range; until it runs, that
// family's allocations fail with kube-apiserver's text. After it, every case allocates from the
// migrated primary range.
func TestServiceCIDRMigrationScenarios(t *testing.T) {
	etcd := testenv.NewEtcd(t)
	cli := etcd.TestClient(t)
	for _, mode := range []featuregate.Mode{featuregate.Legacy, featuregate.DualWrite} {
		for i, tc := range migrationScenarios() {
			t.Run(mode.String()+"/"+tc.name, func(t *testing.T) {
				ctx := context.Background()
				prefix := fmt.Sprintf("/migrate-%s-%d", strings.ToLower(mode.String()), i)
				initial, migrated := prefixes(t, tc.initial), prefixes(t, tc.migrated)
				client := fakeclient.New(fakeclient.Options{})
				cfg := clusterip.Config{Mode: mode, Bitmaps: etcdstore.Stores{Client: cli, Prefix: prefix}, Client: client}
				var wantCIDRs []string // where the post-migration Service's primary IP must be
				if mode == featuregate.DualWrite {
					setDefaultServiceCIDR(t, client, tc.initial)
				}

				// --- The first server.
				cfg.Ranges = initial
				s1 := startFlagServer(t, cfg, client, tc.initial)
				pre, err := allocateService(ctx, client, s1.allocs, "migrate", "svc-pre")
				if err != nil {
					t.Fatalf("create the pre-migration Service: %v", err)
				}
				if !cidrContains(tc.initial[0], pre.Spec.ClusterIPs[0]) {
					t.Fatalf("pre-migration Service's primary IP %s not in %s", pre.Spec.ClusterIPs[0], tc.initial[0])
				}
				s1.stop()

				// --- The migrated server.
				cfg.Ranges = migrated
				cidrs := tc.migrated
				if mode == featuregate.DualWrite {
					cidrs = defaultServiceCIDRAfter(tc.initial, tc.migrated)
					if got := !slices.Equal(cidrs, tc.migrated); got != tc.inconsistent {
						t.Fatalf("kube-apiserver's default ServiceCIDR rule leaves %v (inconsistent %t); upstream's case says inconsistent %t", cidrs, got, tc.inconsistent)
					}
					setDefaultServiceCIDR(t, client, cidrs)
				}
				wantCIDRs = cidrs
				s2 := startFlagServer(t, cfg, client, cidrs)
				if mode == featuregate.Legacy {
					for i, r := range migrated {
						if i >= len(initial) || initial[i] == r {
							continue
						}
						// The bitmap at this key is of initial[i]: no allocation until the repair.
						_, err := s2.allocs.For(allocator.FamilyOf(r.Addr())).AllocateNext(ctx, allocator.Owner{})
						if !errors.Is(err, allocator.ErrMismatchedNetwork) || !strings.HasPrefix(err.Error(), kubeAPIServerRangeMismatch) {
							t.Errorf("AllocateNext from %s before the repair = %v; want ErrMismatchedNetwork beginning with %q", r, err, kubeAPIServerRangeMismatch)
						}
					}
					c, err := repair.NewController(cfg, repair.Options{})
					if err != nil {
						t.Fatal(err)
					}
					if _, err := c.RunOnce(ctx); err != nil {
						t.Fatalf("repair RunOnce() = %v", err)
					}
					for i, r := range migrated {
						snap, _, err := etcdstore.New(cli, etcdstore.KeyFor(prefix, i)).Get(ctx)
						if err != nil || snap.Range != r.String() {
							t.Errorf("bitmap at %s after the repair is of %q, %v; want %s", etcdstore.KeyFor(prefix, i), snap.Range, err, r)
						}
					}
				}

				// The pre-migration Service keeps its ClusterIPs, and the address stays held where
				// the migrated server serves it.
				got, err := client.CoreV1().Services("migrate").Get(ctx, "svc-pre", metav1.GetOptions{})
				if err != nil || !slices.Equal(got.Spec.ClusterIPs, pre.Spec.ClusterIPs) {
					t.Errorf("pre-migration Service's ClusterIPs = %v, %v; want %v", got.Spec.ClusterIPs, err, pre.Spec.ClusterIPs)
				}
				ip := netip.MustParseAddr(pre.Spec.ClusterIPs[0])
				if a := s2.allocs.For(allocator.FamilyOf(ip)); a != nil && served(mode, migrated, cidrs, ip) {
					if bm := s2.allocs.Bitmap(allocator.FamilyOf(ip)); mode == featuregate.Legacy && bm != nil {
						if err := bm.Refresh(ctx); err != nil {
							t.Fatal(err)
						}
					}
					if !a.Has(ip) {
						t.Errorf("the migrated server does not hold the pre-migration Service's %s", ip)
					}
				}

				// A Service created after the migration.
				post, err := allocateService(ctx, client, s2.allocs, "migrate", "svc-post")
				switch {
				case err != nil && (mode == featuregate.Legacy || !tc.postMigrationSvcFail):
					t.Fatalf("create the post-migration Service: %v", err)
				case err != nil:
					t.Logf("post-migration Service refused, as upstream allows: %v", err)
				case mode == featuregate.DualWrite && tc.postMigrationSvcFail:
					t.Logf("post-migration Service created with %v, as upstream allows", post.Spec.ClusterIPs)
				case !cidrContains(wantCIDRs[0], post.Spec.ClusterIPs[0]):
					t.Errorf("post-migration Service's primary IP %s not in %s", post.Spec.ClusterIPs[0], wantCIDRs[0])
				}
			})
		}
	}
}

// served reports whether the migrated server serves ip: in Legacy mode a flag range holds it, in
// DualWrite mode the default ServiceCIDR does.
func served(mode featuregate.Mode, flags []netip.Prefix, cidrs []string, ip netip.Addr) bool {
	if mode == featuregate.Legacy {
		return slices.ContainsFunc(flags, func(p netip.Prefix) bool { return p.Contains(ip) })
	}
	return slices.ContainsFunc(cidrs, func(c string) bool { return cidrContains(c, ip.String()) })
}

func prefixes(t testing.TB, ss []string) []netip.Prefix {
	t.Helper()
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func cidrContains(cidr, ip string) bool {
	a, err := netip.ParseAddr(ip)
	return err == nil && netip.MustParsePrefix(cidr).Contains(a)
}

// setDefaultServiceCIDR creates or updates the default ServiceCIDR "kubernetes", Ready, as
// kube-apiserver's default ServiceCIDR controller would.
func setDefaultServiceCIDR(t testing.TB, c kubernetes.Interface, cidrs []string) {
	t.Helper()
	ctx := context.Background()
	sc := &networkingv1.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: cidrs},
		Status: networkingv1.ServiceCIDRStatus{Conditions: []metav1.Condition{{
			Type: networkingv1.ServiceCIDRConditionReady, Status: metav1.ConditionTrue, Reason: "Ready", LastTransitionTime: metav1.Now(),
		}}},
	}
	old, err := c.NetworkingV1().ServiceCIDRs().Get(ctx, sc.Name, metav1.GetOptions{})
	if err != nil {
		if _, err := c.NetworkingV1().ServiceCIDRs().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		return
	}
	old.Spec = sc.Spec
	if _, err := c.NetworkingV1().ServiceCIDRs().Update(ctx, old, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}
