package reservation_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/internal/fakeclient"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/reservation"
)

var ipaddresses = networkingv1.SchemeGroupVersion.WithResource("ipaddresses")

// newClient returns a reservation Client over a fake clientset holding the ServiceCIDR
// "kubernetes" of 10.96.0.0/28 and fd00::/120, and objs.
func newClient(t *testing.T, objs ...runtime.Object) (*reservation.Client, *fakeclient.Clientset) {
	t.Helper()
	objs = append([]runtime.Object{testenv.ServiceCIDR("kubernetes", "10.96.0.0/28", "fd00::/120")}, objs...)
	fake := fakeclient.New(fakeclient.Options{Objects: objs})
	c, err := reservation.New(fake)
	if err != nil {
		t.Fatal(err)
	}
	return c, fake
}

// writes returns the writes the fake was asked for, as "verb resource/name".
func writes(fake *fakeclient.Clientset) []string {
	var out []string
	for _, a := range fake.Actions() {
		switch a.GetVerb() {
		case "create", "update", "patch", "delete", "delete-collection":
			name := ""
			switch a := a.(type) {
			case k8stesting.CreateAction:
				name = a.GetObject().(metav1.Object).GetName()
			case k8stesting.DeleteAction:
				name = a.GetName()
			}
			out = append(out, a.GetVerb()+" "+a.GetResource().Resource+"/"+name)
		}
	}
	return out
}

// allocation returns the IPAddress kube-apiserver keeps for Service default/name holding ip.
func allocation(ip, name string) *networkingv1.IPAddress {
	o := testenv.IPAddress(ip, metav1.NamespaceDefault, name)
	o.Labels = map[string]string{networkingv1.LabelManagedBy: "ipallocator.k8s.io", networkingv1.LabelIPAddressFamily: "IPv4"}
	return o
}

// record returns the object of r, failing t if r is invalid.
func record(t *testing.T, r reservation.Reservation) *networkingv1.IPAddress {
	t.Helper()
	o, err := reservation.ObjectFor(r)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// service returns a ClusterIP Service default/name with uid, holding clusterIPs.
func service(name string, uid types.UID, clusterIPs ...string) *corev1.Service {
	svc := testenv.ClusterIPService(name, clusterIPs[0])
	svc.UID = uid
	svc.Spec.ClusterIPs = clusterIPs
	return svc
}

func TestReserveCreatesTheRecord(t *testing.T) {
	end := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name string
		objs []runtime.Object
		r    reservation.Reservation
	}{
		{"kept for a Service", nil, reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.10"), For: web}},
		{"anonymous with an end and a reason", nil, reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.14"), Name: "block-a", Expires: end, Reason: "cooldown"}},
		{"the first address", nil, reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.1"), Name: "a"}},
		{"the IPv6 all-ones address, which is usable", nil, reservation.Reservation{Addr: netip.MustParseAddr("fd00::ff"), Name: "a"}},
		{"the network address of one ServiceCIDR inside another", []runtime.Object{testenv.ServiceCIDR("extra", "10.96.0.8/29")},
			reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.8"), Name: "a"}},
		{"an address of a second ServiceCIDR", []runtime.Object{testenv.ServiceCIDR("extra", "10.100.0.0/24")},
			reservation.Reservation{Addr: netip.MustParseAddr("10.100.0.200"), Name: "a"}},
		{"beside a Service without a ClusterIP", []runtime.Object{&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "ext"},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.com"}}, testenv.ClusterIPService("headless", "None")},
			reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.10"), Name: "a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, fake := newClient(t, tt.objs...)
			if err := c.Reserve(context.Background(), tt.r); err != nil {
				t.Fatalf("Reserve() = %v, want nil", err)
			}
			got, err := fake.NetworkingV1().IPAddresses().Get(context.Background(), tt.r.Addr.String(), metav1.GetOptions{})
			if err != nil {
				t.Fatalf("the record: %v", err)
			}
			got.UID, got.ResourceVersion = "", ""
			if diff := cmp.Diff(record(t, tt.r), got); diff != "" {
				t.Errorf("the record (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]string{"create ipaddresses/" + tt.r.Addr.String()}, writes(fake)); diff != "" {
				t.Errorf("writes (-want +got):\n%s", diff)
			}
		})
	}
}

func TestReserveRefusesAndWritesNothing(t *testing.T) {
	addr := netip.MustParseAddr("10.96.0.10")
	anon := reservation.Reservation{Addr: addr, Name: "block-a"}
	at := func(s string) reservation.Reservation {
		return reservation.Reservation{Addr: netip.MustParseAddr(s), Name: "block-a"}
	}
	terminating := testenv.ServiceCIDR("going", "10.100.0.0/24")
	terminating.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	terminating.Finalizers = []string{"networking.k8s.io/service-cidr-finalizer"}
	past := reservation.Reservation{Addr: addr, Name: "old", Expires: time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)}
	tests := []struct {
		name    string
		objs    []runtime.Object
		r       reservation.Reservation
		wantIs  error // the sentinel the error matches
		want    error // the typed error, compared field by field
		noReads bool  // refused before any request
	}{
		{name: "invalid input", r: reservation.Reservation{Addr: addr}, wantIs: allocator.ErrInvalid,
			want: &reservation.InvalidError{Field: "Name", Reason: "a reservation needs a name, or a Service in For to be kept for"}, noReads: true},
		{name: "a zoned address", r: reservation.Reservation{Addr: netip.MustParseAddr("fe80::1%eth0"), Name: "a"}, wantIs: allocator.ErrInvalid,
			want: &reservation.InvalidError{Field: "Addr", Value: "fe80::1%eth0", Reason: "zoned address"}, noReads: true},
		{name: "outside every ServiceCIDR", r: at("10.97.0.1"), wantIs: allocator.ErrMismatchedNetwork,
			want: &allocator.NotInRangeError{IP: netip.MustParseAddr("10.97.0.1")}},
		{name: "IPv6 outside every ServiceCIDR", r: at("fd00::1:1"), wantIs: allocator.ErrMismatchedNetwork,
			want: &allocator.NotInRangeError{IP: netip.MustParseAddr("fd00::1:1")}},
		{name: "the network address", r: at("10.96.0.0"),
			want: &allocator.NotInRangeError{IP: netip.MustParseAddr("10.96.0.0"), Range: netip.MustParsePrefix("10.96.0.0/28")}},
		{name: "the IPv4 broadcast address", r: at("10.96.0.15"),
			want: &allocator.NotInRangeError{IP: netip.MustParseAddr("10.96.0.15"), Range: netip.MustParsePrefix("10.96.0.0/28")}},
		{name: "the IPv6 network address", r: at("fd00::"),
			want: &allocator.NotInRangeError{IP: netip.MustParseAddr("fd00::"), Range: netip.MustParsePrefix("fd00::/120")}},
		{name: "in a ServiceCIDR being deleted", objs: []runtime.Object{terminating}, r: at("10.100.0.1"), wantIs: allocator.ErrMismatchedNetwork,
			want: &allocator.NotInRangeError{IP: netip.MustParseAddr("10.100.0.1")}},
		{name: "held by a Service's IPAddress", objs: []runtime.Object{allocation("10.96.0.10", "web")}, r: anon, wantIs: allocator.ErrAllocated,
			want: &reservation.HeldError{Addr: addr, Holder: allocator.Owner{Resource: "services", Namespace: "default", Name: "web"}, ManagedBy: "ipallocator.k8s.io"}},
		{name: "reserved already, under another name", objs: []runtime.Object{record(t, reservation.Reservation{Addr: addr, Name: "other"})}, r: anon, wantIs: allocator.ErrAllocated,
			want: &reservation.HeldError{Addr: addr, Holder: allocator.Owner{Group: reservation.Group, Resource: reservation.Resource, Name: "other"}, ManagedBy: reservation.ManagedBy}},
		{name: "reserved already, the same name for another Service", objs: []runtime.Object{record(t, reservation.Reservation{Addr: addr, For: web})},
			r: reservation.Reservation{Addr: addr, For: types.NamespacedName{Namespace: "default", Name: "db"}}, wantIs: allocator.ErrAllocated,
			want: &reservation.HeldError{Addr: addr, Holder: allocator.Owner{Resource: "services", Namespace: "default", Name: "web"}, ManagedBy: reservation.ManagedBy}},
		{name: "reserved already with another reason", objs: []runtime.Object{record(t, reservation.Reservation{Addr: addr, Name: "block-a", Reason: "x"})}, r: anon,
			want: &reservation.HeldError{Addr: addr, Holder: allocator.Owner{Group: reservation.Group, Resource: reservation.Resource, Name: "block-a"}, ManagedBy: reservation.ManagedBy}},
		{name: "reserved by a reservation that has expired", objs: []runtime.Object{record(t, past)}, r: anon,
			want: &reservation.HeldError{Addr: addr, Holder: allocator.Owner{Group: reservation.Group, Resource: reservation.Resource, Name: "old"}, ManagedBy: reservation.ManagedBy}},
		{name: "held by a Service with no IPAddress object", objs: []runtime.Object{service("legacy", "u1", "10.96.0.10")}, r: anon, wantIs: allocator.ErrAllocated,
			want: &reservation.HeldError{Addr: addr, Holder: allocator.Owner{Resource: "services", Namespace: "default", Name: "legacy", UID: "u1"}}},
		{name: "held by a dual-stack Service's second address", objs: []runtime.Object{service("dual", "u2", "fd00::a", "10.96.0.10")}, r: anon,
			want: &reservation.HeldError{Addr: addr, Holder: allocator.Owner{Resource: "services", Namespace: "default", Name: "dual", UID: "u2"}}},
		{name: "held by a Service spelling it with a leading zero", objs: []runtime.Object{service("zero", "u3", "10.96.0.010")}, r: anon,
			want: &reservation.HeldError{Addr: addr, Holder: allocator.Owner{Resource: "services", Namespace: "default", Name: "zero", UID: "u3"}}},
		{name: "held by a Service with only spec.clusterIP", objs: []runtime.Object{testenv.ClusterIPService("old", "10.96.0.10")}, r: anon,
			want: &reservation.HeldError{Addr: addr, Holder: allocator.Owner{Resource: "services", Namespace: "default", Name: "old"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, fake := newClient(t, tt.objs...)
			err := c.Reserve(context.Background(), tt.r)
			if err == nil {
				t.Fatal("Reserve() = nil, want an error")
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("Reserve() = %v, want an error matching %v", err, tt.wantIs)
			}
			if diff := cmp.Diff(tt.want, err, addrs, prefixes); diff != "" {
				t.Errorf("Reserve() error (-want +got):\n%s", diff)
			}
			if w := writes(fake); len(w) > 0 {
				t.Errorf("Reserve() wrote %v, want nothing", w)
			}
			if n := len(fake.Actions()); tt.noReads && n > 0 {
				t.Errorf("Reserve() made %d requests, want none: %v", n, fake.Actions())
			}
		})
	}
}

// prefixes lets cmp compare netip.Prefix values.
var prefixes = cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })

func TestReserveTwiceIsOneReservation(t *testing.T) {
	r := reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.10"), Name: "block-a",
		Expires: time.Date(2030, 1, 2, 4, 4, 5, 0, time.FixedZone("CET", 3600)), Reason: "cooldown"}
	c, fake := newClient(t)
	for i := range 2 {
		if err := c.Reserve(context.Background(), r); err != nil {
			t.Fatalf("Reserve() #%d = %v, want nil", i+1, err)
		}
	}
	if diff := cmp.Diff([]string{"create ipaddresses/10.96.0.10"}, writes(fake)); diff != "" {
		t.Errorf("writes (-want +got):\n%s", diff)
	}
}

// TestReserveLosesTheRaceForAnAddress has kube-apiserver allocate the address to a Service
// between Reserve's checks and its create: the API server answers AlreadyExists, and Reserve
// names the winner.
func TestReserveLosesTheRaceForAnAddress(t *testing.T) {
	c, fake := newClient(t)
	fake.PrependReactor("create", "ipaddresses", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if err := fake.Tracker().Add(allocation("10.96.0.10", "web")); err != nil {
			t.Fatal(err)
		}
		return true, nil, apierrors.NewAlreadyExists(ipaddresses.GroupResource(), "10.96.0.10")
	})
	err := c.Reserve(context.Background(), reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.10"), Name: "block-a"})
	want := &reservation.HeldError{Addr: netip.MustParseAddr("10.96.0.10"), Holder: allocator.Owner{Resource: "services", Namespace: "default", Name: "web"}, ManagedBy: "ipallocator.k8s.io"}
	if diff := cmp.Diff(want, err, addrs); diff != "" {
		t.Errorf("Reserve() error (-want +got):\n%s", diff)
	}
	if !errors.Is(err, allocator.ErrAllocated) {
		t.Errorf("Reserve() = %v, want an error matching allocator.ErrAllocated", err)
	}
}

func TestReserveWrapsTheAPIServersErrors(t *testing.T) {
	forbidden := func(resource string) error {
		return apierrors.NewForbidden(schema.GroupResource{Resource: resource}, "", fmt.Errorf("RBAC"))
	}
	tests := []struct {
		name     string
		verb     string
		resource string
	}{
		{"listing ServiceCIDRs", "list", "servicecidrs"},
		{"reading the IPAddress", "get", "ipaddresses"},
		{"listing Services", "list", "services"},
		{"creating the IPAddress", "create", "ipaddresses"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, fake := newClient(t)
			fake.PrependReactor(tt.verb, tt.resource, func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, forbidden(tt.resource)
			})
			err := c.Reserve(context.Background(), reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.10"), Name: "a"})
			if !apierrors.IsForbidden(err) {
				t.Errorf("Reserve() = %v, want the API server's Forbidden, wrapped", err)
			}
		})
	}
}

func TestRelease(t *testing.T) {
	addr := netip.MustParseAddr("10.96.0.10")
	malformed := record(t, reservation.Reservation{Addr: addr, Name: "block-a"})
	malformed.Annotations = map[string]string{reservation.AnnotationExpires: "tomorrow"}
	foreign := allocation("10.96.0.10", "web")
	foreign.Labels[networkingv1.LabelManagedBy] = "example.com/ipam"
	tests := []struct {
		name        string
		objs        []runtime.Object
		addr        netip.Addr
		want        error
		wantDeleted bool
	}{
		{name: "a reservation kept for a Service", objs: []runtime.Object{record(t, reservation.Reservation{Addr: addr, For: web})}, addr: addr, wantDeleted: true},
		{name: "an anonymous reservation", objs: []runtime.Object{record(t, reservation.Reservation{Addr: addr, Name: "block-a"})}, addr: addr, wantDeleted: true},
		{name: "a malformed reservation", objs: []runtime.Object{malformed}, addr: addr, wantDeleted: true},
		{name: "no object", addr: addr},
		{name: "a Service's allocation", objs: []runtime.Object{allocation("10.96.0.10", "web")}, addr: addr,
			want: &reservation.HeldError{Addr: addr, Holder: allocator.Owner{Resource: "services", Namespace: "default", Name: "web"}, ManagedBy: "ipallocator.k8s.io"}},
		{name: "another controller's object", objs: []runtime.Object{foreign}, addr: addr,
			want: &reservation.HeldError{Addr: addr, Holder: allocator.Owner{Resource: "services", Namespace: "default", Name: "web"}, ManagedBy: "example.com/ipam"}},
		{name: "an invalid address", addr: netip.Addr{}, want: &reservation.InvalidError{Field: "Addr", Reason: "invalid address"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, fake := newClient(t, tt.objs...)
			err := c.Release(context.Background(), tt.addr)
			if diff := cmp.Diff(tt.want, err, addrs); diff != "" {
				t.Errorf("Release() error (-want +got):\n%s", diff)
			}
			var want []string
			if tt.wantDeleted {
				want = []string{"delete ipaddresses/" + tt.addr.String()}
			}
			if diff := cmp.Diff(want, writes(fake)); diff != "" {
				t.Errorf("writes (-want +got):\n%s", diff)
			}
		})
	}
}

func TestReleaseDeletesOnlyTheObjectItRead(t *testing.T) {
	r := reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.10"), Name: "block-a"}
	c, fake := newClient(t)
	if err := c.Reserve(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	stored, err := fake.NetworkingV1().IPAddresses().Get(context.Background(), "10.96.0.10", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The first delete loses a race, as the API server answers a failed precondition.
	conflicts := 1
	fake.PrependReactor("delete", "ipaddresses", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if conflicts > 0 {
			conflicts--
			return true, nil, apierrors.NewConflict(ipaddresses.GroupResource(), "10.96.0.10", fmt.Errorf("precondition failed"))
		}
		return false, nil, nil
	})
	fake.ClearActions()
	if err := c.Release(context.Background(), r.Addr); err != nil {
		t.Fatalf("Release() = %v, want nil", err)
	}
	var gets, deletes int
	for _, a := range fake.Actions() {
		switch a.GetVerb() {
		case "get":
			gets++
		case "delete":
			deletes++
			p := a.(k8stesting.DeleteActionImpl).DeleteOptions.Preconditions
			if p == nil || p.UID == nil || *p.UID != stored.UID || p.ResourceVersion == nil || *p.ResourceVersion != stored.ResourceVersion {
				t.Errorf("delete preconditions %+v, want UID %q and resourceVersion %q", p, stored.UID, stored.ResourceVersion)
			}
		}
	}
	if gets != 2 || deletes != 2 {
		t.Errorf("Release() made %d gets and %d deletes, want 2 and 2 (read again after the conflict)", gets, deletes)
	}
	if _, err := fake.NetworkingV1().IPAddresses().Get(context.Background(), "10.96.0.10", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the record after Release: %v, want NotFound", err)
	}
}

func TestReleaseGivesUpOnAnObjectThatKeepsChanging(t *testing.T) {
	c, fake := newClient(t, record(t, reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.10"), Name: "block-a"}))
	fake.PrependReactor("delete", "ipaddresses", func(action k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewConflict(ipaddresses.GroupResource(), "10.96.0.10", fmt.Errorf("precondition failed"))
	})
	err := c.Release(context.Background(), netip.MustParseAddr("10.96.0.10"))
	if !apierrors.IsConflict(err) {
		t.Errorf("Release() = %v, want the last Conflict, wrapped", err)
	}
	if n := len(writes(fake)); n != 5 {
		t.Errorf("Release() tried %d deletes, want 5", n)
	}
}

func TestListReturnsEveryReservationByAddress(t *testing.T) {
	end := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	want := []reservation.Reservation{
		{Addr: netip.MustParseAddr("10.96.0.2"), Name: "b", Expires: end, Reason: "expired, still listed"},
		{Addr: netip.MustParseAddr("10.96.0.10"), For: web},
		{Addr: netip.MustParseAddr("fd00::9"), Name: "v6"},
	}
	malformed := record(t, reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.3"), Name: "bad"})
	malformed.Spec.ParentRef.Namespace = "default"
	objs := []runtime.Object{allocation("10.96.0.1", "kubernetes"), malformed}
	for i := len(want) - 1; i >= 0; i-- {
		objs = append(objs, record(t, want[i]))
	}
	c, _ := newClient(t, objs...)
	got, err := c.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got, addrs); diff != "" {
		t.Errorf("List() (-want +got):\n%s", diff)
	}
	objects, err := c.ListObjects(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, o := range objects {
		names = append(names, o.Name)
	}
	if diff := cmp.Diff([]string{"10.96.0.2", "10.96.0.10", "fd00::9"}, names); diff != "" {
		t.Errorf("ListObjects() names (-want +got):\n%s", diff)
	}
}

func TestListOfNoReservationsIsEmpty(t *testing.T) {
	c, _ := newClient(t, allocation("10.96.0.1", "kubernetes"))
	got, err := c.List(context.Background())
	if err != nil || len(got) != 0 {
		t.Errorf("List() = %v, %v; want none, nil", got, err)
	}
}

func TestANilClientIsRefused(t *testing.T) {
	if c, err := reservation.New(nil); c != nil || !errors.Is(err, allocator.ErrInvalid) {
		t.Errorf("New(nil) = %v, %v; want nil and an error matching allocator.ErrInvalid", c, err)
	}
	var zero reservation.Client
	ctx := context.Background()
	r := reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.10"), Name: "a"}
	if err := zero.Reserve(ctx, r); !errors.Is(err, allocator.ErrInvalid) {
		t.Errorf("zero Client Reserve() = %v, want an error matching allocator.ErrInvalid", err)
	}
	if err := zero.Release(ctx, r.Addr); !errors.Is(err, allocator.ErrInvalid) {
		t.Errorf("zero Client Release() = %v, want an error matching allocator.ErrInvalid", err)
	}
	if _, err := zero.List(ctx); !errors.Is(err, allocator.ErrInvalid) {
		t.Errorf("zero Client List() = %v, want an error matching allocator.ErrInvalid", err)
	}
}
