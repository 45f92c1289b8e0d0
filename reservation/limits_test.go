package reservation_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/internal/fakeclient"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/reservation"
)

// A Namespace's max-retained reads as a decimal integer of at least 0; anything else is bad
// input, refused with an *InvalidError naming the annotation.
func TestParseMaxRetained(t *testing.T) {
	tests := []struct {
		value   string
		want    int
		invalid bool
	}{
		{value: "0", want: 0},
		{value: "3", want: 3},
		{value: "010", want: 10},
		{value: "2147483647", want: 2147483647},
		{value: "", invalid: true},
		{value: "-1", invalid: true},
		{value: "+3", invalid: true},
		{value: " 3", invalid: true},
		{value: "3.0", invalid: true},
		{value: "10%", invalid: true},
		{value: "2147483648", invalid: true},
		{value: "many", invalid: true},
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			got, err := reservation.ParseMaxRetained(tt.value)
			if tt.invalid {
				var ie *reservation.InvalidError
				if !errors.As(err, &ie) || !errors.Is(err, allocator.ErrInvalid) || got != 0 ||
					ie.Field != "metadata.annotations["+reservation.AnnotationMaxRetained+"]" || ie.Value != tt.value {
					t.Errorf("ParseMaxRetained(%q) = %v, %v; want 0 and an *InvalidError of the annotation", tt.value, got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("ParseMaxRetained(%q) = %v, %v; want %v", tt.value, got, err, tt.want)
			}
		})
	}
}

// A ServiceCIDR's max-reserved reads as "<n>" or "<p>%" with p from 0 to 100; a percentage is of
// the addresses a prefix can hand out, rounded down.
func TestParseMaxReserved(t *testing.T) {
	tests := []struct {
		value   string
		want    reservation.MaxReserved
		invalid bool
		of24    int // Of(10.96.0.0/24), 254 usable addresses
	}{
		{value: "0", want: reservation.MaxReserved{}, of24: 0},
		{value: "100", want: reservation.MaxReserved{N: 100}, of24: 100},
		{value: "10%", want: reservation.MaxReserved{N: 10, Percent: true}, of24: 25},
		{value: "100%", want: reservation.MaxReserved{N: 100, Percent: true}, of24: 254},
		{value: "0%", want: reservation.MaxReserved{Percent: true}, of24: 0},
		{value: "101%", invalid: true},
		{value: "%", invalid: true},
		{value: "-5", invalid: true},
		{value: "5.5%", invalid: true},
		{value: "10 %", invalid: true},
		{value: "", invalid: true},
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			got, err := reservation.ParseMaxReserved(tt.value)
			if tt.invalid {
				var ie *reservation.InvalidError
				if !errors.As(err, &ie) || !errors.Is(err, allocator.ErrInvalid) || got != (reservation.MaxReserved{}) ||
					ie.Field != "metadata.annotations["+reservation.AnnotationMaxReserved+"]" || ie.Value != tt.value {
					t.Errorf("ParseMaxReserved(%q) = %v, %v; want the zero value and an *InvalidError of the annotation", tt.value, got, err)
				}
				return
			}
			if err != nil || got != tt.want || got.String() != tt.value {
				t.Errorf("ParseMaxReserved(%q) = %+v (%q), %v; want %+v", tt.value, got, got.String(), err, tt.want)
			}
			if n := got.Of(netip.MustParsePrefix("10.96.0.0/24")); n != tt.of24 {
				t.Errorf("%q.Of(/24) = %d, want %d", tt.value, n, tt.of24)
			}
		})
	}
	if n := (reservation.MaxReserved{N: 50, Percent: true}).Of(netip.MustParsePrefix("fd00::/16")); n != 1<<31-1 {
		t.Errorf("50%% of an IPv6 /16 = %d, want it clamped to %d", n, 1<<31-1)
	}
}

// namespace returns Namespace name, annotated max-retained: value unless value is "".
func namespace(name, value string) *corev1.Namespace {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelMetadataName: name}}}
	if value != "" {
		ns.Annotations = map[string]string{reservation.AnnotationMaxRetained: value}
	}
	return ns
}

// cidrWithCap returns ServiceCIDR name of cidrs annotated max-reserved: value unless value is "".
func cidrWithCap(name, value string, cidrs ...string) *networkingv1.ServiceCIDR {
	sc := testenv.ServiceCIDR(name, cidrs...)
	if value != "" {
		sc.Annotations = map[string]string{reservation.AnnotationMaxReserved: value}
	}
	return sc
}

// kept returns the object of a reservation of ip kept for Service ns/name, ending at expires
// (zero: no end).
func kept(t *testing.T, ip, ns, name string, expires time.Time) *networkingv1.IPAddress {
	return record(t, reservation.Reservation{Addr: netip.MustParseAddr(ip), For: types.NamespacedName{Namespace: ns, Name: name}, Expires: expires})
}

// startLimits returns Limits over a fake clientset holding objs, its informers synced.
func startLimits(t *testing.T, objs ...runtime.Object) *reservation.Limits {
	t.Helper()
	fake := fakeclient.New(fakeclient.Options{Objects: objs})
	factory := informers.NewSharedInformerFactory(fake, 0)
	l, err := reservation.NewLimits(factory.Networking().V1().IPAddresses(), factory.Core().V1().Namespaces(), factory.Networking().V1().ServiceCIDRs())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); factory.Shutdown() })
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), l.HasSynced) {
		t.Fatal("the informers did not sync")
	}
	return l
}

// retainService returns a ClusterIP Service ns/name asking for no address with release policy
// policy ("" for none) and ipFamilyPolicy family ("" for none).
func retainService(ns, name, policy string, family corev1.IPFamilyPolicy) *corev1.Service {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP}}
	if policy != "" {
		svc.Annotations = map[string]string{reservation.AnnotationReleasePolicy: policy}
	}
	if family != "" {
		svc.Spec.IPFamilyPolicy = &family
	}
	return svc
}

// A Service may have a Retain policy only in a namespace whose Namespace opts in with
// max-retained, and only while what the namespace keeps, plus what the Service would keep, stays
// within it; reservations of the Service's own name do not count (its create claims them back),
// nor do ended ones or those of other namespaces. An update is refused for the cap only when it
// makes the policy Retain.
func TestLimitsCheckService(t *testing.T) {
	now := time.Now()
	objs := []runtime.Object{
		namespace("capped", "3"), namespace("zero", "0"), namespace("typo", "three"), namespace("closed", ""),
		namespace("roomy", "3"),
		// capped keeps 3: two of other names, one of "web" itself.
		kept(t, "10.96.0.10", "capped", "a", time.Time{}),
		kept(t, "10.96.0.11", "capped", "b", now.Add(time.Hour)),
		kept(t, "10.96.0.12", "capped", "web", time.Time{}),
		// roomy keeps 1, and one that ended (not counted).
		kept(t, "10.96.0.20", "roomy", "a", time.Time{}),
		kept(t, "10.96.0.21", "roomy", "b", now.Add(-time.Minute)),
		// Others, not of any namespace here.
		kept(t, "10.96.0.30", "elsewhere", "a", time.Time{}),
		record(t, reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.31"), Name: "block"}),
	}
	l := startLimits(t, objs...)

	dual := corev1.IPFamilyPolicyPreferDualStack
	headless := retainService("closed", "h", "Retain", "")
	headless.Spec.ClusterIP = corev1.ClusterIPNone
	ext := retainService("closed", "e", "Retain", "")
	ext.Spec.Type = corev1.ServiceTypeExternalName

	const forbidden, invalid = field.ErrorTypeForbidden, field.ErrorTypeInvalid
	tests := []struct {
		name     string
		old, svc *corev1.Service
		wantType field.ErrorType // "" for no refusal
		wantMsg  string
	}{
		{name: "no policy", svc: retainService("closed", "web", "", "")},
		{name: "Release", svc: retainService("closed", "web", "Release", "")},
		{name: "a policy that does not parse is invalid", svc: retainService("roomy", "web", "Keep", ""), wantType: invalid},
		{name: "no annotation forbids Retain", svc: retainService("closed", "web", "Retain", ""), wantType: forbidden,
			wantMsg: `namespace "closed" may not retain addresses: its Namespace has no clusterip.kube-ipam.io/max-retained annotation`},
		{name: "no annotation forbids Retain/<d>", svc: retainService("closed", "web", "Retain/10m", ""), wantType: forbidden,
			wantMsg: `namespace "closed" may not retain addresses: its Namespace has no clusterip.kube-ipam.io/max-retained annotation`},
		{name: "a Namespace not known has no annotation", svc: retainService("gone", "web", "Retain", ""), wantType: forbidden,
			wantMsg: `namespace "gone" may not retain addresses: its Namespace has no clusterip.kube-ipam.io/max-retained annotation`},
		{name: "0 forbids Retain", svc: retainService("zero", "web", "Retain", ""), wantType: forbidden,
			wantMsg: `namespace "zero" may not retain addresses: annotation clusterip.kube-ipam.io/max-retained of Namespace "zero" is 0`},
		{name: "a cap that does not parse forbids Retain", svc: retainService("typo", "web", "Retain", ""), wantType: forbidden,
			wantMsg: `namespace "typo" may not retain addresses: annotation clusterip.kube-ipam.io/max-retained of Namespace "typo" is "three", not a decimal integer of at least 0`},
		{name: "room for one", svc: retainService("roomy", "web", "Retain", "")},
		{name: "room for two: dual-stack", svc: retainService("roomy", "web", "Retain", dual)},
		{name: "at the cap a new name is refused", svc: retainService("capped", "new", "Retain", ""), wantType: forbidden,
			wantMsg: `namespace "capped" keeps 3 reserved addresses and may keep 3 (annotation clusterip.kube-ipam.io/max-retained of Namespace "capped")`},
		{name: "the own name's reservations do not count", svc: retainService("capped", "web", "Retain", "")},
		{name: "dual-stack counts two", svc: retainService("capped", "web", "Retain", dual), wantType: forbidden,
			wantMsg: `namespace "capped" keeps 2 reserved addresses, this Service would keep 2 more, and may keep 3 (annotation clusterip.kube-ipam.io/max-retained of Namespace "capped")`},
		{name: "RequireDualStack counts two", svc: retainService("capped", "web", "Retain", corev1.IPFamilyPolicyRequireDualStack), wantType: forbidden},
		{name: "headless keeps nothing", svc: headless},
		{name: "ExternalName keeps nothing", svc: ext},
		{name: "an update of a Retain Service at the cap", old: retainService("capped", "new", "Retain", ""), svc: retainService("capped", "new", "Retain/1h", "")},
		{name: "an update to Retain at the cap is refused", old: retainService("capped", "new", "", ""), svc: retainService("capped", "new", "Retain", ""), wantType: forbidden},
		{name: "an update from a policy that did not parse is refused", old: retainService("capped", "new", "Keep", ""), svc: retainService("capped", "new", "Retain", ""), wantType: forbidden},
		{name: "an update to Retain with room", old: retainService("roomy", "web", "Release", ""), svc: retainService("roomy", "web", "Retain", "")},
		{name: "an update of a Retain Service in a closed namespace", old: retainService("closed", "web", "Retain", ""), svc: retainService("closed", "web", "Retain", "")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fe := l.CheckService(tt.old, tt.svc, now)
			if tt.wantType == "" {
				if fe != nil {
					t.Fatalf("CheckService() = %v, want nil", fe)
				}
				return
			}
			if fe == nil || fe.Type != tt.wantType || fe.Field != "metadata.annotations[clusterip.kube-ipam.io/release-policy]" {
				t.Fatalf("CheckService() = %v, want a %s error at the release-policy annotation", fe, tt.wantType)
			}
			if tt.wantMsg != "" && fe.Detail != tt.wantMsg {
				t.Errorf("CheckService() detail\n %q\nwant\n %q", fe.Detail, tt.wantMsg)
			}
		})
	}

	var nilLimits *reservation.Limits
	if fe := nilLimits.CheckService(nil, retainService("roomy", "web", "Retain", ""), now); fe == nil || fe.Type != forbidden {
		t.Errorf("nil Limits: CheckService(Retain) = %v, want Forbidden: no namespace may retain", fe)
	}
}

// At delete a Retain policy keeps an address only within the namespace's cap (else a release
// cooldown alone may keep it), and whatever is kept only within the cap of each ServiceCIDR
// that can hand the address out, counting every reservation in it; a cap that does not parse
// counts as none and is reported.
func TestLimitsKeptOnDelete(t *testing.T) {
	now := time.Now()
	objs := []runtime.Object{
		namespace("team", "2"), namespace("closed", ""),
		kept(t, "10.96.0.10", "team", "a", time.Time{}),
		// /28 capped at 2 and holding 2 (one anonymous); /27 at 10% (3) holding 1; /26 with a typo.
		cidrWithCap("small", "2", "10.97.0.0/28"),
		record(t, reservation.Reservation{Addr: netip.MustParseAddr("10.97.0.2"), Name: "block"}),
		kept(t, "10.97.0.3", "other", "x", now.Add(time.Hour)),
		cidrWithCap("share", "10%", "10.98.0.0/27"),
		kept(t, "10.98.0.3", "other", "y", time.Time{}),
		cidrWithCap("typo", "lots", "10.99.0.0/26"),
		testenv.ServiceCIDR("kubernetes", "10.96.0.0/24"),
	}
	l := startLimits(t, objs...)
	svc := types.NamespacedName{Namespace: "team", Name: "web"}
	retain := reservation.ReleasePolicy{Retain: true}
	tests := []struct {
		name      string
		svc       types.NamespacedName
		ip        string
		policy    reservation.ReleasePolicy
		cooldown  time.Duration
		wantKept  bool
		wantEnd   bool // the reservation has an end (a cooldown's)
		wantCaps  []string
		wantBadSC bool
	}{
		{name: "Release frees", svc: svc, ip: "10.96.0.50"},
		{name: "Retain within the namespace's cap", svc: svc, ip: "10.96.0.50", policy: retain, wantKept: true},
		{name: "the address's own reservation is not counted", svc: svc, ip: "10.96.0.10", policy: retain, wantKept: true},
		{name: "Retain in a closed namespace frees", svc: types.NamespacedName{Namespace: "closed", Name: "web"}, ip: "10.96.0.50", policy: retain, wantCaps: []string{"namespace"}},
		{name: "a closed namespace's cooldown still keeps", svc: types.NamespacedName{Namespace: "closed", Name: "web"}, ip: "10.96.0.50", policy: retain, cooldown: time.Minute, wantKept: true, wantEnd: true, wantCaps: []string{"namespace"}},
		{name: "a full ServiceCIDR frees Retain", svc: svc, ip: "10.97.0.5", policy: retain, wantCaps: []string{"servicecidr"}},
		{name: "a full ServiceCIDR frees a cooldown", svc: svc, ip: "10.97.0.5", cooldown: time.Minute, wantCaps: []string{"servicecidr"}},
		{name: "a share with room keeps", svc: svc, ip: "10.98.0.5", policy: retain, wantKept: true},
		{name: "a cap that does not parse is none", svc: svc, ip: "10.99.0.5", policy: retain, wantKept: true, wantBadSC: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, ok, refused, bad := l.KeptOnDelete(tt.svc, netip.MustParseAddr(tt.ip), tt.policy, tt.cooldown, now)
			if ok != tt.wantKept || (ok && (r.For != tt.svc || r.Addr.String() != tt.ip || r.Expires.IsZero() == tt.wantEnd)) {
				t.Errorf("KeptOnDelete() = %+v, %v; want kept %v (with an end: %v)", r, ok, tt.wantKept, tt.wantEnd)
			}
			var caps []string
			for _, e := range refused {
				caps = append(caps, e.Cap)
				if !errors.Is(e, reservation.ErrCapped) {
					t.Errorf("%v does not match ErrCapped", e)
				}
			}
			if strings.Join(caps, ",") != strings.Join(tt.wantCaps, ",") {
				t.Errorf("refused by %v, want %v", caps, tt.wantCaps)
			}
			var ie *reservation.InvalidError
			if got := errors.As(bad, &ie); got != tt.wantBadSC {
				t.Errorf("bad caps = %v, want an *InvalidError: %v", bad, tt.wantBadSC)
			}
		})
	}
	// The refusal names the ServiceCIDR, its prefix and its cap.
	_, _, refused, _ := l.KeptOnDelete(svc, netip.MustParseAddr("10.97.0.5"), retain, 0, now)
	want := `ServiceCIDR "small" keeps 2 reserved addresses in 10.97.0.0/28 and may keep 2 (annotation clusterip.kube-ipam.io/max-reserved: "2" of ServiceCIDR "small")`
	if len(refused) != 1 || refused[0].Message() != want {
		t.Errorf("refusal %v, want %q", refused, want)
	}
}

// Reserve refuses an address that would take a ServiceCIDR over its max-reserved, naming the
// cap, and writes nothing; an address already reserved for the same reservation is not counted
// against itself.
func TestReserveRefusesOverAServiceCIDRsCap(t *testing.T) {
	fake := fakeclient.New(fakeclient.Options{Objects: []runtime.Object{
		cidrWithCap("kubernetes", "2", "10.96.0.0/28"),
		record(t, reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.2"), Name: "a"}),
		record(t, reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.3"), Name: "b"}),
	}})
	c, err := reservation.New(fake)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	fake.ClearActions()
	err = c.Reserve(ctx, reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.4"), Name: "c"})
	var le *reservation.LimitError
	if !errors.As(err, &le) || !errors.Is(err, reservation.ErrCapped) || le.Cap != reservation.CapServiceCIDR || le.Name != "kubernetes" || le.Kept != 2 || le.Max != 2 {
		t.Fatalf("Reserve(over the cap) = %v; want a *LimitError of ServiceCIDR kubernetes, 2 of 2", err)
	}
	if !strings.Contains(err.Error(), `ServiceCIDR "kubernetes" keeps 2 reserved addresses in 10.96.0.0/28 and may keep 2`) {
		t.Errorf("Reserve() = %q; want it to name the cap", err)
	}
	if w := writes(fake); len(w) != 0 {
		t.Errorf("Reserve wrote %v, want nothing", w)
	}
	if err := c.Reserve(ctx, reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.3"), Name: "b"}); err != nil {
		t.Errorf("Reserve(the same reservation again) = %v, want nil", err)
	}
	if err := c.Release(ctx, netip.MustParseAddr("10.96.0.3")); err != nil {
		t.Fatal(err)
	}
	if err := c.Reserve(ctx, reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.4"), Name: "c"}); err != nil {
		t.Errorf("Reserve(with room) = %v, want nil", err)
	}
}

// A ServiceCIDR cap that does not parse refuses Reserve with its *InvalidError.
func TestReserveRefusesUnderACapThatDoesNotParse(t *testing.T) {
	fake := fakeclient.New(fakeclient.Options{Objects: []runtime.Object{cidrWithCap("kubernetes", "lots", "10.96.0.0/28")}})
	c, err := reservation.New(fake)
	if err != nil {
		t.Fatal(err)
	}
	err = c.Reserve(context.Background(), reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.4"), Name: "c"})
	var ie *reservation.InvalidError
	if !errors.As(err, &ie) || !strings.Contains(err.Error(), "ServiceCIDR kubernetes") {
		t.Fatalf("Reserve() = %v, want the annotation's *InvalidError naming the ServiceCIDR", err)
	}
}
