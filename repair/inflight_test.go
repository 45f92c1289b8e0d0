package repair

import (
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

var (
	servicesResource    = corev1.SchemeGroupVersion.WithResource("services")
	ipAddressesResource = networkingv1.SchemeGroupVersion.WithResource("ipaddresses")
)

// TestAuditConfirmsAMissingRecordWithALiveRead: an allocation that completes while the audit
// reads (its bit and IPAddress written after they were read, its Service before the Services
// are listed) leaves a cluster that is consistent at every instant; the audit must not report
// it missing. A hook on the Services List makes the allocation between the reads. So does one
// whose Service is then deleted and released before the confirmation reads: nothing to report
// either. A record that is really missing is still reported.
func TestAuditConfirmsAMissingRecordWithALiveRead(t *testing.T) {
	e := testenv.NewEtcd(t)
	cli := e.TestClient(t)
	tests := []struct {
		name    string
		mode    featuregate.Mode
		release bool // the Service is deleted and its records released before the confirmation
		want    []Finding
	}{
		{name: "IPAddressOnly: an allocation between the IPAddress and Service Lists", mode: featuregate.IPAddressOnly},
		{name: "DualWrite: an allocation between the bitmap read and the Service List", mode: featuregate.DualWrite},
		{name: "Legacy: an allocation between the bitmap read and the Service List", mode: featuregate.Legacy},
		{name: "IPAddressOnly: an allocation released again before the confirmation", mode: featuregate.IPAddressOnly, release: true},
		{name: "DualWrite: an allocation released again before the confirmation", mode: featuregate.DualWrite, release: true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := "/inflight" + string(rune('a'+i))
			storeBitmap(t, cli, etcdstore.ServiceIPsKey(prefix), bits(t, "10.0.0.0/24", "10.0.0.11"))
			client := fake.NewClientset(testenv.ServiceCIDR("kubernetes", "10.0.0.0/24"),
				svc("a/missing", "10.0.0.11"), // a real problem: no IPAddress object (its bit is set)
			)
			bitmapStore := etcdstore.New(cli, etcdstore.ServiceIPsKey(prefix))
			var allocated atomic.Bool
			client.PrependReactor("list", "services", func(k8stesting.Action) (bool, runtime.Object, error) {
				if allocated.Swap(true) {
					return false, nil, nil
				}
				// An allocator's order: the bit, the IPAddress, then the Service.
				seedBit(t, bitmapStore, "10.0.0.0/24", "10.0.0.20")
				if err := client.Tracker().Create(ipAddressesResource, aged(ipAddr("10.0.0.20", "a/new"), 0), ""); err != nil {
					t.Errorf("hook: create IPAddress: %v", err)
				}
				if err := client.Tracker().Create(servicesResource, svc("a/new", "10.0.0.20"), "a"); err != nil {
					t.Errorf("hook: create Service: %v", err)
				}
				return false, nil, nil
			})
			cfg := clusterip.Config{Mode: tt.mode, Ranges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, Client: client, Bitmaps: etcdstore.Stores{Client: cli, Prefix: prefix}}
			if tt.release {
				// Released before the audit reads again, once the Services are listed: the
				// Service first, then its IPAddress, as an allocator releases.
				var once sync.Once
				release := func(k8stesting.Action) (bool, runtime.Object, error) {
					if allocated.Load() {
						once.Do(func() {
							if err := client.Tracker().Delete(servicesResource, "a", "new"); err != nil {
								t.Errorf("hook: delete Service: %v", err)
							}
							if err := client.Tracker().Delete(ipAddressesResource, "", "10.0.0.20"); err != nil {
								t.Errorf("hook: delete IPAddress: %v", err)
							}
						})
					}
					return false, nil, nil
				}
				client.PrependReactor("get", "ipaddresses", release)
				client.PrependReactor("list", "ipaddresses", release)
			}
			rep, err := Audit(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			want := []Finding{f("10.0.0.11", Missing, "a/missing")}
			if tt.mode == featuregate.Legacy {
				want = nil // Legacy reads no IPAddress objects; its bit is set
			}
			if diff := cmp.Diff(want, rep.Findings, ignoreDetail, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("Audit() findings (-want +got):\n%s", diff)
			}
			for _, a := range client.Actions() {
				if v := a.GetVerb(); v != "list" && v != "get" {
					t.Errorf("Audit made a %s of %s; it only reads", v, a.GetResource().Resource)
				}
			}
		})
	}
}

// TestAuditConfirmsManyMissingRecordsWithOneListEach: past 64 missing findings (a cluster moving
// from Legacy to IPAddress objects has one per Service) the audit confirms them with one more List
// of IPAddress objects and of Services, not a Get each, and still drops the one an allocation
// completed during the audit.
func TestAuditConfirmsManyMissingRecordsWithOneListEach(t *testing.T) {
	const n = 70
	objects := []runtime.Object{testenv.ServiceCIDR("kubernetes", "10.0.0.0/24")}
	var want []Finding
	for i := range n {
		ip := netip.AddrFrom4([4]byte{10, 0, 0, byte(100 + i)}).String()
		key := "a/s" + ip
		objects = append(objects, svc(key, ip))
		want = append(want, f(ip, Missing, key))
	}
	client := fake.NewClientset(objects...)
	var allocated atomic.Bool
	client.PrependReactor("list", "services", func(k8stesting.Action) (bool, runtime.Object, error) {
		if !allocated.Swap(true) {
			_ = client.Tracker().Create(ipAddressesResource, aged(ipAddr("10.0.0.20", "a/new"), 0), "")
			_ = client.Tracker().Create(servicesResource, svc("a/new", "10.0.0.20"), "a")
		}
		return false, nil, nil
	})
	rep, err := Audit(t.Context(), clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, Client: client})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, rep.Findings, ignoreDetail); diff != "" {
		t.Errorf("Audit() findings (-want +got):\n%s", diff)
	}
	if got := rep.Counts[string(Missing)]; got != n {
		t.Errorf("Counts[missing] = %d, want %d", got, n)
	}
	calls := map[string]int{}
	for _, a := range client.Actions() {
		calls[a.GetVerb()+" "+a.GetResource().Resource]++
	}
	if diff := cmp.Diff(map[string]int{"list servicecidrs": 1, "list ipaddresses": 2, "list namespaces": 1, "list services": 2}, calls); diff != "" {
		t.Errorf("API calls (-want +got):\n%s", diff)
	}
}

// hookTransport calls hook before it forwards a request for which match reports true.
type hookTransport struct {
	next  http.RoundTripper
	match func(*http.Request) bool
	hook  func()
}

func (h *hookTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if h.match(r) {
		h.hook()
	}
	return h.next.RoundTrip(r)
}

// TestAuditOfARealAPIServerAllocatingDuringTheAudit makes a real kube-apiserver v1.33 (dual
// write, its default) allocate a Service between the audit's reads of the records and its List
// of Services: kube-apiserver sets the bit, creates the IPAddress and then the Service, so the
// cluster is consistent at every instant. The audit must find it so in every mode, and a repair
// pass must write nothing. (Before the confirmation, each mode reported the Service missing and
// check exited 1.)
func TestAuditOfARealAPIServerAllocatingDuringTheAudit(t *testing.T) {
	e := testenv.NewEtcd(t)
	api := testenv.NewKubeAPIServer(t, e, testenv.KubeAPIServerOptions{ServiceClusterIPRange: "10.96.0.0/24"})
	ctx := t.Context()
	services := api.Client.CoreV1().Services(metav1.NamespaceDefault)
	testenv.WaitForKubernetesService(t, api.Client)

	var armed atomic.Bool
	created := 0
	config := rest.CopyConfig(api.Config)
	config.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return &hookTransport{next: rt,
			match: func(r *http.Request) bool {
				return r.Method == http.MethodGet && r.URL.Path == "/api/v1/services" && armed.Swap(false)
			},
			hook: func() {
				created++
				name := "during-" + strconv.Itoa(created)
				if _, err := services.Create(ctx, testenv.ClusterIPService(name, ""), metav1.CreateOptions{}); err != nil {
					t.Errorf("create Service %s during the audit: %v", name, err)
				}
			},
		}
	}
	hooked, err := kubernetes.NewForConfig(config)
	if err != nil {
		t.Fatal(err)
	}
	cfg := clusterip.Config{Mode: featuregate.DualWrite, Ranges: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/24")},
		Client: hooked, Bitmaps: etcdstore.Stores{Client: e.TestClient(t)}}
	for _, mode := range []featuregate.Mode{featuregate.DualWrite, featuregate.Legacy, featuregate.IPAddressOnly} {
		armed.Store(true)
		rep, err := Audit(ctx, withMode(cfg, mode))
		if err != nil {
			t.Fatal(err)
		}
		if armed.Load() {
			t.Fatalf("Audit(%s) made no List of Services through the hook", mode)
		}
		if !rep.Consistent {
			t.Errorf("Audit(%s) with an allocation during the audit: %+v, want consistent", mode, rep.Findings)
		}

		armed.Store(true)
		rec := &recorder{}
		c, err := NewController(withMode(cfg, mode), Options{LeakGrace: -1, Recorder: rec})
		if err != nil {
			t.Fatal(err)
		}
		if rep, err = c.RunOnce(ctx); err != nil {
			t.Errorf("%s RunOnce() with an allocation during its audit: %v", mode, err)
		} else if !rep.Consistent {
			t.Errorf("%s RunOnce() acted on %+v, want a consistent audit", mode, rep.Findings)
		}
		if got := rec.Got(); len(got) != 0 {
			t.Errorf("%s pass: Events %q, want none", mode, got)
		}
	}
	auditConsistent(t, withMode(cfg, featuregate.DualWrite), "after the allocations")
}

// TestAuditConfirmationKeepsTheFirstReadOfABitmapStoredForAnotherRange: if the bitmap is
// rewritten for another range (kube-apiserver's flag changed) between the audit's read and its
// confirmation, no bit of the audited range can have appeared: the missing finding stands.
func TestAuditConfirmationKeepsTheFirstReadOfABitmapStoredForAnotherRange(t *testing.T) {
	e := testenv.NewEtcd(t)
	cli := e.TestClient(t)
	storeBitmap(t, cli, etcdstore.ServiceIPsKey(""), bits(t, "10.0.0.0/24"))
	client := fake.NewClientset(svc("a/missing", "10.0.0.11"))
	var rewritten atomic.Bool
	client.PrependReactor("list", "services", func(k8stesting.Action) (bool, runtime.Object, error) {
		if !rewritten.Swap(true) {
			storeBitmap(t, cli, etcdstore.ServiceIPsKey(""), bits(t, "10.1.0.0/24", "10.1.0.11"))
		}
		return false, nil, nil
	})
	rep, err := Audit(t.Context(), clusterip.Config{Mode: featuregate.Legacy, Ranges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, Client: client, Bitmaps: etcdstore.Stores{Client: cli}})
	if err != nil {
		t.Fatalf("Audit() error = %v, want the first read to stand", err)
	}
	if diff := cmp.Diff([]Finding{f("10.0.0.11", Missing, "a/missing")}, rep.Findings, ignoreDetail); diff != "" {
		t.Errorf("Audit() findings (-want +got):\n%s", diff)
	}
}

// TestAuditConfirmationDropsAFindingWhoseServiceWentMeanwhile: a Service listed without its
// IPAddress is deleted, and its address given to another Service, before the confirmation
// reads: the IPAddress read again names the other Service, but the listed one holds nothing
// now, so there is nothing to report (not a wrong parent).
func TestAuditConfirmationDropsAFindingWhoseServiceWentMeanwhile(t *testing.T) {
	client := fake.NewClientset(testenv.ServiceCIDR("kubernetes", "10.0.0.0/24"), svc("a/old", "10.0.0.20"))
	var once sync.Once
	client.PrependReactor("get", "ipaddresses", func(k8stesting.Action) (bool, runtime.Object, error) {
		once.Do(func() {
			_ = client.Tracker().Delete(servicesResource, "a", "old")
			_ = client.Tracker().Create(ipAddressesResource, aged(ipAddr("10.0.0.20", "a/new"), 0), "")
			_ = client.Tracker().Create(servicesResource, svc("a/new", "10.0.0.20"), "a")
		})
		return false, nil, nil
	})
	rep, err := Audit(t.Context(), clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, Client: client})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Consistent {
		t.Errorf("Audit() findings %+v, want none", rep.Findings)
	}
}
