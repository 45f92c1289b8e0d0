package repair

import (
	"context"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

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
//
// Unlike repair's other tests on a real kube-apiserver (test/integration/repair), it stays in the
// package: it makes the write between one pass's read and its fix, which only the unexported
// read, classify and repairOne let it do.
func TestRepairFixesLabelsUnderAResourceVersionPreconditionOnARealAPIServer(t *testing.T) {
	e := testenv.NewEtcd(t)
	api := testenv.NewKubeAPIServer(t, e, testenv.KubeAPIServerOptions{ServiceClusterIPRange: "10.96.0.0/24"})
	ctx := t.Context()
	cfg := clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/24")}, Client: api.Client}
	ipas := api.Client.NetworkingV1().IPAddresses()
	testenv.WaitForKubernetesService(t, api.Client)

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

// TestRepairFollowsALegacyKubeAPIServerOnePassPerWindowAndReportsOnce is the skew window of an
// upgrade against a real kube-apiserver v1.33 with MultiCIDRServiceAllocator=false (a Legacy
// peer: bitmap only, no IPAddress objects), whose flag range 10.96.0.0/24 is wider than the one
// ServiceCIDR, 10.96.0.0/25. Our DualWrite Controller, passes an hour apart and a follow window
// of 10 s, follows the peer's Services. Three Services the peer creates in the ServiceCIDR a second and a half apart,
// and one it creates outside every ServiceCIDR, cost one pass between them, not one each; the
// outside one gets one ClusterIPOutOfRange Event. Its later updates bring no pass forward and
// no Event: a pass reported it, and nothing repair does can give it an IPAddress.
func TestRepairFollowsALegacyKubeAPIServerOnePassPerWindowAndReportsOnce(t *testing.T) {
	const flag = "10.96.0.0/24"
	e := testenv.NewEtcd(t)
	api := testenv.NewKubeAPIServer(t, e, testenv.KubeAPIServerOptions{ServiceClusterIPRange: flag, FeatureGates: "MultiCIDRServiceAllocator=false"})
	ctx := t.Context()
	services := api.Client.CoreV1().Services(metav1.NamespaceDefault)
	ipas := api.Client.NetworkingV1().IPAddresses()
	testenv.WaitForKubernetesService(t, api.Client)
	if _, err := api.Client.NetworkingV1().ServiceCIDRs().Create(ctx, &networkingv1.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/25"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ServiceCIDR kubernetes: %v", err)
	}

	var passes atomic.Int32 // the Controller's lists of Services: one per pass
	config := rest.CopyConfig(api.Config)
	config.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return &hookTransport{next: rt,
			match: func(r *http.Request) bool {
				return r.Method == http.MethodGet && r.URL.Path == "/api/v1/services" && r.URL.Query().Get("watch") == ""
			},
			hook: func() { passes.Add(1) },
		}
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		t.Fatal(err)
	}
	factory := informers.NewSharedInformerFactory(api.Client, 0)
	rec := &recorder{}
	c, err := NewController(clusterip.Config{Mode: featuregate.DualWrite, Ranges: []netip.Prefix{netip.MustParsePrefix(flag)},
		Client: client, Bitmaps: etcdstore.Stores{Client: e.TestClient(t)}, Informers: factory}, Options{Interval: time.Hour, Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	c.followWindow = 10 * time.Second
	runCtx, cancel := context.WithCancel(context.Background())
	defer factory.Shutdown()
	defer cancel()
	factory.Start(runCtx.Done())
	stop := runUntilCancelled(t, c)
	defer stop()
	waitFirstPass(t, c)
	base := passes.Load()

	if _, err := services.Create(ctx, testenv.ClusterIPService("far", "10.96.0.200"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("the legacy peer creates Service far: %v", err)
	}
	peers := map[string]string{"peer-a": "10.96.0.50", "peer-b": "10.96.0.51", "peer-c": "10.96.0.52"}
	for _, name := range []string{"peer-a", "peer-b", "peer-c"} {
		time.Sleep(followDelay * 3 / 2) // each followed on its own
		if _, err := services.Create(ctx, testenv.ClusterIPService(name, peers[name]), metav1.CreateOptions{}); err != nil {
			t.Fatalf("the legacy peer creates Service %s: %v", name, err)
		}
	}
	testenv.WaitFor(t, "the IPAddress objects of the peer's Services", func() bool {
		for _, ip := range peers {
			if _, err := ipas.Get(ctx, ip, metav1.GetOptions{}); err != nil {
				return false
			}
		}
		return true
	})
	if got := passes.Load() - base; got != 1 {
		t.Errorf("the Controller made %d passes for 4 followed Services, want 1", got)
	}

	// Updates of the out-of-range Service, past the window after that pass.
	base = passes.Load()
	start := time.Now()
	for i := range 4 {
		s, err := services.Get(ctx, "far", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.Labels = map[string]string{"update": strconv.Itoa(i)}
		if _, err := services.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("update Service far: %v", err)
		}
		time.Sleep(followDelay / 2)
	}
	time.Sleep(c.followWindow + 2*time.Second - time.Since(start))
	if got := passes.Load() - base; got != 0 {
		t.Errorf("the Controller made %d passes for updates of an out-of-range Service it reported, want none", got)
	}
	var outOfRange []string
	for _, ev := range rec.Got() {
		if strings.Contains(ev, reasonOutOfRange) {
			outOfRange = append(outOfRange, ev)
		}
	}
	if diff := cmp.Diff([]string{"Warning ClusterIPOutOfRange far"}, outOfRange); diff != "" {
		t.Errorf("ClusterIPOutOfRange Events (-want +got):\n%s", diff)
	}
	if _, err := ipas.Get(ctx, "10.96.0.200", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("IPAddress 10.96.0.200 of the out-of-range Service: %v, want NotFound", err)
	}
}
