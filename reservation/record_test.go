package reservation_test

import (
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-ipam/clusterip/reservation"
)

var web = types.NamespacedName{Namespace: "default", Name: "web"}

// addrs lets cmp compare netip.Addr values, whose fields are unexported. (cmp compares
// time.Time values with their Equal method.)
var addrs = cmp.Comparer(func(a, b netip.Addr) bool { return a == b })

func TestObjectForWritesTheRecordFormat(t *testing.T) {
	tests := []struct {
		name string
		r    reservation.Reservation
		want *networkingv1.IPAddress
	}{
		{
			name: "kept for a Service, no end, no reason",
			r:    reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.10"), For: web},
			want: &networkingv1.IPAddress{
				ObjectMeta: metav1.ObjectMeta{Name: "10.96.0.10", Labels: map[string]string{
					networkingv1.LabelIPAddressFamily: "IPv4", networkingv1.LabelManagedBy: "reservations.clusterip.kube-ipam.io"}},
				Spec: networkingv1.IPAddressSpec{ParentRef: &networkingv1.ParentReference{Resource: "services", Namespace: "default", Name: "web"}},
			},
		},
		{
			name: "anonymous IPv6, named by its canonical form, with an end in UTC and a reason",
			r: reservation.Reservation{Addr: netip.MustParseAddr("fd00:10:96:0::a"), Name: "block-a",
				Expires: time.Date(2030, 1, 2, 4, 4, 5, 500_000_000, time.FixedZone("CET", 3600)), Reason: "cooldown after web was deleted"},
			want: &networkingv1.IPAddress{
				ObjectMeta: metav1.ObjectMeta{Name: "fd00:10:96::a",
					Labels: map[string]string{networkingv1.LabelIPAddressFamily: "IPv6", networkingv1.LabelManagedBy: "reservations.clusterip.kube-ipam.io"},
					Annotations: map[string]string{
						"clusterip.kube-ipam.io/expires": "2030-01-02T03:04:05.5Z",
						"clusterip.kube-ipam.io/reason":  "cooldown after web was deleted",
					}},
				Spec: networkingv1.IPAddressSpec{ParentRef: &networkingv1.ParentReference{Group: "clusterip.kube-ipam.io", Resource: "reservations", Name: "block-a"}},
			},
		},
		{
			name: "an end on a whole second has no fraction",
			r:    reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.11"), Name: "b", Expires: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)},
			want: &networkingv1.IPAddress{
				ObjectMeta: metav1.ObjectMeta{Name: "10.96.0.11",
					Labels:      map[string]string{networkingv1.LabelIPAddressFamily: "IPv4", networkingv1.LabelManagedBy: "reservations.clusterip.kube-ipam.io"},
					Annotations: map[string]string{"clusterip.kube-ipam.io/expires": "2030-01-02T03:04:05Z"}},
				Spec: networkingv1.IPAddressSpec{ParentRef: &networkingv1.ParentReference{Group: "clusterip.kube-ipam.io", Resource: "reservations", Name: "b"}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := reservation.ObjectFor(tt.r)
			if err != nil {
				t.Fatalf("ObjectFor() error = %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ObjectFor() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestObjectForRefusesWhatValidateRefuses(t *testing.T) {
	obj, err := reservation.ObjectFor(reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.10")})
	if obj != nil || err == nil {
		t.Errorf("ObjectFor(no For, no Name) = %v, %v; want nil and the error of Validate", obj, err)
	}
}

// randomReservation returns a valid Reservation drawn from r.
func randomReservation(rng *rand.Rand) reservation.Reservation {
	var res reservation.Reservation
	if rng.IntN(2) == 0 {
		res.Addr = netip.AddrFrom4([4]byte{10, 96, byte(rng.IntN(256)), byte(rng.IntN(256))})
	} else {
		var b [16]byte
		b[0], b[1] = 0xfd, 0x00
		for i := 8; i < 16; i++ {
			b[i] = byte(rng.IntN(256))
		}
		res.Addr = netip.AddrFrom16(b)
	}
	names := []string{"a", "web", "block-a", "x-1", "0db"}
	if rng.IntN(2) == 0 {
		res.For = types.NamespacedName{Namespace: names[rng.IntN(len(names))], Name: names[rng.IntN(len(names))]}
	} else {
		res.Name = names[rng.IntN(len(names))]
	}
	if rng.IntN(2) == 0 {
		// From the epoch to nine years from now: Validate refuses more than ten.
		res.Expires = time.Unix(rng.Int64N(time.Now().Unix()+9*365*24*3600), rng.Int64N(1e9)).In(time.FixedZone("", rng.IntN(24)*3600-12*3600))
	}
	if rng.IntN(2) == 0 {
		res.Reason = []string{"cooldown", "kept for the DNS service", "Grund: Übergang"}[rng.IntN(3)]
	}
	return res
}

// TestFromObjectReadsWhatObjectForWrites is the round trip: every valid Reservation comes back
// from its object, its end in UTC and the same instant.
func TestFromObjectReadsWhatObjectForWrites(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		want := randomReservation(rng)
		obj, err := reservation.ObjectFor(want)
		if err != nil {
			t.Fatalf("ObjectFor(%+v) error = %v", want, err)
		}
		got, ok := reservation.FromObject(obj)
		if !ok {
			t.Fatalf("FromObject(ObjectFor(%+v)) not a reservation; object %+v", want, obj)
		}
		if !want.Expires.IsZero() {
			if got.Expires.Location() != time.UTC {
				t.Errorf("FromObject().Expires in %v, want UTC", got.Expires.Location())
			}
			want.Expires = want.Expires.UTC()
		}
		if diff := cmp.Diff(want, got, addrs); diff != "" {
			t.Fatalf("FromObject(ObjectFor(r)) (-want +got):\n%s", diff)
		}
	}
}

func TestFromObjectRefusesWhatIsNotAReservation(t *testing.T) {
	good := func() *networkingv1.IPAddress {
		obj, err := reservation.ObjectFor(reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.10"), Name: "block-a"})
		if err != nil {
			t.Fatal(err)
		}
		return obj
	}
	if _, ok := reservation.FromObject(good()); !ok {
		t.Fatal("FromObject(the base object) = false; the cases below test nothing")
	}
	tests := []struct {
		name   string
		change func(*networkingv1.IPAddress)
	}{
		{"kube-apiserver's own object", func(o *networkingv1.IPAddress) { o.Labels[networkingv1.LabelManagedBy] = "ipallocator.k8s.io" }},
		{"no managed-by label", func(o *networkingv1.IPAddress) { delete(o.Labels, networkingv1.LabelManagedBy) }},
		{"no labels", func(o *networkingv1.IPAddress) { o.Labels = nil }},
		{"no parentRef", func(o *networkingv1.IPAddress) { o.Spec.ParentRef = nil }},
		{"a name that is not an address", func(o *networkingv1.IPAddress) { o.Name = "block-a" }},
		{"a name not in canonical form", func(o *networkingv1.IPAddress) { o.Name = "fd00:0::a" }},
		{"a zoned name", func(o *networkingv1.IPAddress) { o.Name = "fe80::1%eth0" }},
		{"an IPv4-mapped name", func(o *networkingv1.IPAddress) { o.Name = "::ffff:10.96.0.10" }},
		{"a parentRef of another resource", func(o *networkingv1.IPAddress) { o.Spec.ParentRef.Resource = "gateways" }},
		{"a parentRef of another group", func(o *networkingv1.IPAddress) { o.Spec.ParentRef.Group = "example.com" }},
		{"an anonymous reservation with a namespace", func(o *networkingv1.IPAddress) { o.Spec.ParentRef.Namespace = "default" }},
		{"a Service of another group", func(o *networkingv1.IPAddress) {
			*o.Spec.ParentRef = networkingv1.ParentReference{Group: "example.com", Resource: "services", Namespace: "default", Name: "web"}
		}},
		{"a Service without a namespace", func(o *networkingv1.IPAddress) {
			*o.Spec.ParentRef = networkingv1.ParentReference{Resource: "services", Name: "web"}
		}},
		{"a name that is not a DNS label", func(o *networkingv1.IPAddress) { o.Spec.ParentRef.Name = "Block_A" }},
		{"an end that is not RFC 3339", func(o *networkingv1.IPAddress) {
			o.Annotations = map[string]string{reservation.AnnotationExpires: "tomorrow"}
		}},
		{"an end before the epoch", func(o *networkingv1.IPAddress) {
			o.Annotations = map[string]string{reservation.AnnotationExpires: "1969-12-31T23:59:59Z"}
		}},
		{"an end in 9999, past ten years from now", func(o *networkingv1.IPAddress) {
			o.Annotations = map[string]string{reservation.AnnotationExpires: "9999-12-31T23:59:59Z"}
		}},
		{"a reason on two lines", func(o *networkingv1.IPAddress) {
			o.Annotations = map[string]string{reservation.AnnotationReason: "one\ntwo"}
		}},
		{"a reason with a right-to-left override", func(o *networkingv1.IPAddress) {
			o.Annotations = map[string]string{reservation.AnnotationReason: "ok \u202egnp.exe"}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obj := good()
			tt.change(obj)
			if r, ok := reservation.FromObject(obj); ok {
				t.Errorf("FromObject() = %+v, true; want false", r)
			}
		})
	}
	if r, ok := reservation.FromObject(nil); ok {
		t.Errorf("FromObject(nil) = %+v, true; want false", r)
	}
}

func TestFromObjectReadsAnEndWithAnOffset(t *testing.T) {
	obj, err := reservation.ObjectFor(reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.10"), Name: "block-a"})
	if err != nil {
		t.Fatal(err)
	}
	obj.Annotations = map[string]string{reservation.AnnotationExpires: "2030-01-02T04:04:05+01:00"}
	got, ok := reservation.FromObject(obj)
	if want := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC); !ok || got.Expires != want {
		t.Errorf("FromObject().Expires = %v, %v; want %v, true", got.Expires, ok, want)
	}
}

func TestExpired(t *testing.T) {
	end := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name    string
		expires time.Time
		now     time.Time
		want    bool
	}{
		{"no end is never expired", time.Time{}, end.AddDate(100, 0, 0), false},
		{"before the end", end, end.Add(-time.Nanosecond), false},
		{"at the end", end, end, true},
		{"after the end", end, end.Add(time.Second), true},
		{"the same instant in another zone", end, end.In(time.FixedZone("CET", 3600)), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.10"), Name: "a", Expires: tt.expires}
			if got := r.Expired(tt.now); got != tt.want {
				t.Errorf("Expired(%v) = %v, want %v", tt.now, got, tt.want)
			}
		})
	}
}
