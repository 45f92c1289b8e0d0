package reservation_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	networkingv1listers "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/internal/fakeclient"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/reservation"
)

// A ServiceCIDR's release-cooldown annotation reads as a duration of 1s to ten years; anything
// else is bad input, refused with an *InvalidError naming the annotation.
func TestParseReleaseCooldown(t *testing.T) {
	tests := []struct {
		value   string
		want    time.Duration
		invalid bool
	}{
		{value: "3s", want: 3 * time.Second},
		{value: "1s", want: time.Second},
		{value: "10m", want: 10 * time.Minute},
		{value: "1h30m", want: 90 * time.Minute},
		{value: "87600h", want: 87600 * time.Hour},
		{value: "", invalid: true},
		{value: "soon", invalid: true},
		{value: "10", invalid: true},
		{value: "999ms", invalid: true},
		{value: "0s", invalid: true},
		{value: "-1m", invalid: true},
		{value: "87601h", invalid: true},
		{value: "Retain/10m", invalid: true},
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			got, err := reservation.ParseReleaseCooldown(tt.value)
			if tt.invalid {
				var ie *reservation.InvalidError
				if !errors.As(err, &ie) || !errors.Is(err, allocator.ErrInvalid) || got != 0 ||
					ie.Field != "metadata.annotations["+reservation.AnnotationReleaseCooldown+"]" || ie.Value != tt.value {
					t.Errorf("ParseReleaseCooldown(%q) = %v, %v; want 0 and an *InvalidError of the annotation", tt.value, got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("ParseReleaseCooldown(%q) = %v, %v; want %v", tt.value, got, err, tt.want)
			}
		})
	}
	if d, err := reservation.ReleaseCooldownOf(map[string]string{"other": "x"}); d != 0 || err != nil {
		t.Errorf("ReleaseCooldownOf(no annotation) = %v, %v; want 0, nil", d, err)
	}
}

// cidrWithCooldown returns a ServiceCIDR name of cidrs whose release-cooldown annotation is
// value; "" for none.
func cidrWithCooldown(name, value string, cidrs ...string) *networkingv1.ServiceCIDR {
	sc := testenv.ServiceCIDR(name, cidrs...)
	if value != "" {
		sc.Annotations = map[string]string{reservation.AnnotationReleaseCooldown: value}
	}
	return sc
}

// An address's cooldown is the longest of the ServiceCIDRs that hold it; a bad annotation counts
// as none and its error names the ServiceCIDR.
func TestReleaseCooldownFor(t *testing.T) {
	cidrs := []*networkingv1.ServiceCIDR{
		cidrWithCooldown("kubernetes", "", "10.96.0.0/24", "fd00:10:96::/112"),
		cidrWithCooldown("cool", "3s", "10.97.0.0/24", "fd00:10:97::/112"),
		cidrWithCooldown("cooler", "1m", "10.97.0.0/28"),
		cidrWithCooldown("bad", "soon", "10.98.0.0/24", "10.97.0.0/24"),
		nil,
		cidrWithCooldown("junk", "5s", "not-a-cidr"),
	}
	tests := []struct {
		ip      string
		want    time.Duration
		wantBad bool // an *InvalidError of ServiceCIDR bad
	}{
		{ip: "10.96.0.20", want: 0},
		{ip: "fd00:10:96::20", want: 0},
		{ip: "10.97.0.20", want: 3 * time.Second, wantBad: true},
		{ip: "fd00:10:97::20", want: 3 * time.Second},
		{ip: "10.97.0.5", want: time.Minute, wantBad: true},
		{ip: "10.98.0.5", want: 0, wantBad: true},
		{ip: "10.99.0.5", want: 0},
		{ip: "::ffff:10.97.0.20", want: 3 * time.Second, wantBad: true}, // read unmapped
		{ip: "10.97.0.15", want: 3 * time.Second, wantBad: true},        // cooler's broadcast address: cooler cannot hand it out
		{ip: "10.97.0.0", want: 0},                                      // the network address of all three
	}
	lister := func() networkingv1listers.ServiceCIDRLister {
		idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
		for _, sc := range cidrs {
			if sc != nil {
				if err := idx.Add(sc); err != nil {
					t.Fatal(err)
				}
			}
		}
		return networkingv1listers.NewServiceCIDRLister(idx)
	}()
	for _, tt := range tests {
		t.Run(tt.ip, func(t *testing.T) {
			fromLister, listerErr := reservation.ReleaseCooldownIn(lister, netip.MustParseAddr(tt.ip))
			var ie *reservation.InvalidError
			if fromLister != tt.want || errors.As(listerErr, &ie) != tt.wantBad {
				t.Errorf("ReleaseCooldownIn(%s) = %v, %v; want %v, an *InvalidError: %v", tt.ip, fromLister, listerErr, tt.want, tt.wantBad)
			}
			got, err := reservation.ReleaseCooldownFor(cidrs, netip.MustParseAddr(tt.ip))
			if got != tt.want {
				t.Errorf("ReleaseCooldownFor(%s) = %v, want %v", tt.ip, got, tt.want)
			}
			if bad := errors.As(err, &ie); bad != tt.wantBad || (bad && (!strings.Contains(err.Error(), "ServiceCIDR bad") || ie.Value != "soon")) {
				t.Errorf("ReleaseCooldownFor(%s) error = %v, want an *InvalidError of ServiceCIDR bad: %v", tt.ip, err, tt.wantBad)
			}
		})
	}
	if d, err := reservation.ReleaseCooldownIn(nil, netip.MustParseAddr("10.97.0.20")); d != 0 || err != nil {
		t.Errorf("ReleaseCooldownIn(nil lister) = %v, %v; want 0, nil", d, err)
	}
}

// KeptOnDelete is the rule: a cooldown is a Retain/<cooldown> every Service has at least.
func TestKeptOnDelete(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.FixedZone("CET", 3600))
	web := types.NamespacedName{Namespace: "default", Name: "web"}
	ip := netip.MustParseAddr("10.96.0.20")
	at := func(d time.Duration) time.Time { return now.Add(d).UTC() }
	reason := "release cooldown of 3s of its ServiceCIDR after Service default/web was deleted"
	tests := []struct {
		name     string
		policy   string
		cooldown time.Duration
		want     reservation.Reservation
		wantOK   bool
	}{
		{name: "Release without a cooldown frees", policy: "Release"},
		{name: "Release with a cooldown keeps for the cooldown", policy: "Release", cooldown: 3 * time.Second,
			want: reservation.Reservation{Addr: ip, For: web, Expires: at(3 * time.Second), Reason: reason}, wantOK: true},
		{name: "Retain keeps for ever without a cooldown", policy: "Retain",
			want: reservation.Reservation{Addr: ip, For: web}, wantOK: true},
		{name: "Retain keeps for ever with a cooldown", policy: "Retain", cooldown: 3 * time.Second,
			want: reservation.Reservation{Addr: ip, For: web}, wantOK: true},
		{name: "Retain/1s keeps until a longer cooldown ends", policy: "Retain/1s", cooldown: 3 * time.Second,
			want: reservation.Reservation{Addr: ip, For: web, Expires: at(3 * time.Second), Reason: reason}, wantOK: true},
		{name: "Retain/10m keeps past a shorter cooldown", policy: "Retain/10m", cooldown: 3 * time.Second,
			want: reservation.Reservation{Addr: ip, For: web, Expires: at(10 * time.Minute)}, wantOK: true},
		{name: "Retain/3s and a cooldown of 3s", policy: "Retain/3s", cooldown: 3 * time.Second,
			want: reservation.Reservation{Addr: ip, For: web, Expires: at(3 * time.Second)}, wantOK: true},
		{name: "Retain/1s without a cooldown", policy: "Retain/1s",
			want: reservation.Reservation{Addr: ip, For: web, Expires: at(time.Second)}, wantOK: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			policy, err := reservation.ParseReleasePolicy(tt.policy)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := reservation.KeptOnDelete(web, ip, policy, tt.cooldown, now)
			if ok != tt.wantOK {
				t.Fatalf("KeptOnDelete(%s, cooldown %v) kept = %v, want %v", tt.policy, tt.cooldown, ok, tt.wantOK)
			}
			if diff := cmp.Diff(tt.want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
				t.Errorf("KeptOnDelete(%s, cooldown %v) (-want +got):\n%s", tt.policy, tt.cooldown, diff)
			}
		})
	}
	if _, ok := reservation.KeptOnDelete(types.NamespacedName{Namespace: "default", Name: "Web"}, ip, reservation.ReleasePolicy{}, time.Second, now); ok {
		t.Error("KeptOnDelete kept an address for a name Validate refuses")
	}
}

// TestClaimerRetainKeepsAnAddressForItsServiceCIDRsCooldown runs Claimer.Retain, the registry's
// delete path, on the fake clientset: the release cooldown of the ServiceCIDR the address lies in
// turns the Service's allocation into a reservation kept for it as KeptOnDelete says; a cooldown
// that does not parse, and an address in no ServiceCIDR with one, change nothing.
func TestClaimerRetainKeepsAnAddressForItsServiceCIDRsCooldown(t *testing.T) {
	tests := []struct {
		name       string
		cooldown   string // the ServiceCIDR 10.96.0.0/24's annotation; "" for none
		policy     string // the Service's; "" for none
		ip         string
		wantKept   bool
		wantFor    time.Duration // the reservation's end after Retain; 0 for none
		wantReason bool
	}{
		{name: "no cooldown and no policy frees", ip: "10.96.0.20"},
		{name: "a cooldown keeps a Service without a policy", cooldown: "3s", ip: "10.96.0.20", wantKept: true, wantFor: 3 * time.Second, wantReason: true},
		{name: "a cooldown keeps a Service with Release", cooldown: "3s", policy: "Release", ip: "10.96.0.20", wantKept: true, wantFor: 3 * time.Second, wantReason: true},
		{name: "a longer cooldown outlasts Retain/1s", cooldown: "3s", policy: "Retain/1s", ip: "10.96.0.20", wantKept: true, wantFor: 3 * time.Second, wantReason: true},
		{name: "Retain/10m outlasts a cooldown", cooldown: "3s", policy: "Retain/10m", ip: "10.96.0.20", wantKept: true, wantFor: 10 * time.Minute},
		{name: "Retain keeps for ever despite a cooldown", cooldown: "3s", policy: "Retain", ip: "10.96.0.20", wantKept: true},
		{name: "an address outside the ServiceCIDR has no cooldown", cooldown: "3s", ip: "10.97.0.20"},
		{name: "a cooldown that does not parse frees", cooldown: "soon", ip: "10.96.0.20"},
		{name: "a cooldown under a second frees", cooldown: "500ms", ip: "10.96.0.20"},
		{name: "a cooldown that does not parse leaves Retain/1m alone", cooldown: "soon", policy: "Retain/1m", ip: "10.96.0.20", wantKept: true, wantFor: time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			allocation := func(ip string) *networkingv1.IPAddress {
				o := testenv.IPAddress(ip, "default", "web")
				o.Labels = map[string]string{networkingv1.LabelManagedBy: "ipallocator.k8s.io", networkingv1.LabelIPAddressFamily: "IPv4"}
				return o
			}
			fake := fakeclient.New(fakeclient.Options{Objects: []runtime.Object{
				cidrWithCooldown("kubernetes", tt.cooldown, "10.96.0.0/24"),
				testenv.ServiceCIDR("other", "10.97.0.0/24"),
				namespace("default", "10"), // opts in to Retain
				allocation("10.96.0.20"), allocation("10.97.0.20"),
			}})
			factory := informers.NewSharedInformerFactory(fake, 0)
			nw := factory.Networking().V1()
			namespaces := factory.Core().V1().Namespaces()
			c, err := reservation.NewClaimer(fake, nw.IPAddresses(), "", reservation.WithServiceCIDRs(nw.ServiceCIDRs()), reservation.WithNamespaces(namespaces))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer func() { cancel(); factory.Shutdown() }()
			factory.Start(ctx.Done())
			if !cache.WaitForCacheSync(ctx.Done(), nw.ServiceCIDRs().Informer().HasSynced, nw.IPAddresses().Informer().HasSynced, namespaces.Informer().HasSynced) {
				t.Fatal("the informers did not sync")
			}

			svc := testenv.ClusterIPService("web", tt.ip)
			svc.Spec.ClusterIPs = []string{tt.ip}
			if tt.policy != "" {
				svc.Annotations = map[string]string{reservation.AnnotationReleasePolicy: tt.policy}
			}
			before := time.Now()
			kept, err := c.Retain(ctx, svc, netip.MustParseAddr(tt.ip))
			after := time.Now()
			if err != nil || kept != tt.wantKept {
				t.Fatalf("Retain(%s) = %v, %v; want %v, nil", tt.ip, kept, err, tt.wantKept)
			}
			obj, err := fake.NetworkingV1().IPAddresses().Get(ctx, tt.ip, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !tt.wantKept {
				if diff := cmp.Diff(allocation(tt.ip).Labels, obj.Labels); diff != "" || len(obj.Annotations) != 0 {
					t.Errorf("Retain(%s) changed the allocation: labels (-want +got):\n%s annotations %v", tt.ip, diff, obj.Annotations)
				}
				return
			}
			r, ok := reservation.FromObject(obj)
			if !ok || r.For != (types.NamespacedName{Namespace: "default", Name: "web"}) {
				t.Fatalf("after Retain, %s = %+v; want a reservation kept for default/web", tt.ip, obj)
			}
			if obj.Spec.ParentRef.Resource != "services" || obj.Spec.ParentRef.Name != "web" {
				t.Errorf("parentRef %+v changed", obj.Spec.ParentRef)
			}
			switch {
			case tt.wantFor == 0 && !r.Expires.IsZero():
				t.Errorf("the reservation ends at %v, want no end", r.Expires)
			case tt.wantFor > 0 && (r.Expires.Before(before.Add(tt.wantFor)) || r.Expires.After(after.Add(tt.wantFor))):
				t.Errorf("the reservation ends %v after Retain, want %v", r.Expires.Sub(before), tt.wantFor)
			}
			if got := strings.Contains(r.Reason, "default/web") && strings.Contains(r.Reason, "cooldown"); got != tt.wantReason {
				t.Errorf("reason %q; want one naming default/web and the cooldown: %v", r.Reason, tt.wantReason)
			}
			// A delete retried after the address was kept: it is still kept, and the registry
			// must not release it.
			if again, err := c.Retain(ctx, svc, netip.MustParseAddr(tt.ip)); err != nil || !again {
				t.Errorf("Retain(%s) again = %v, %v; want true, nil: the reservation stands", tt.ip, again, err)
			}
		})
	}
}
