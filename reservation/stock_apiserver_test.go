package reservation_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/repair"
	"github.com/kube-ipam/clusterip/reservation"
)

// The tests in this file put reservations in front of real, stock kube-apiservers in
// IPAddressOnly mode, the only mode in which stock honours them (see the package doc), on a /28:
// 14 usable addresses, the first of which its own Service default/kubernetes takes.

// stockRange is the --service-cluster-ip-range of every server here.
const stockRange = "10.96.0.0/28"

// stockReleases are the stock releases the tests run and the feature gates that put each in
// IPAddressOnly mode: v1.35.4 and later are in it by default; v1.33.13 runs dual write by
// default. v1.35.4 and v1.36.3 run where their build is at hand (testenv.StockKubeAPIServer).
var stockReleases = []struct{ release, gates string }{
	{"v1.37.2", ""},
	{"v1.36.3", ""},
	{"v1.35.4", ""},
	{"v1.33.13", "DisableAllocatorDualWrite=true"},
}

// stockCluster is a stock kube-apiserver with its own etcd, and a reservation Client on it.
type stockCluster struct {
	api    kubernetes.Interface
	res    *reservation.Client
	kubeIP netip.Addr   // the address of Service default/kubernetes
	free   []netip.Addr // the usable addresses of stockRange but kubeIP, in order
}

// startStock starts kube-apiserver release with gates on a fresh etcd and waits until it has
// allocated its own Service's address and created its ServiceCIDR. It skips t in -short mode,
// and when there is no build of release at hand (testenv.SkipWithoutStock).
func startStock(t *testing.T, release, gates string) *stockCluster {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping kube-apiserver test in -short mode")
	}
	bin := testenv.SkipWithoutStock(t, release)
	start := time.Now()
	api := testenv.NewKubeAPIServer(t, testenv.NewEtcd(t), testenv.KubeAPIServerOptions{
		Binary: bin, ServiceClusterIPRange: stockRange, FeatureGates: gates})
	sc := &stockCluster{api: api.Client, kubeIP: testenv.WaitForKubernetesService(t, api.Client)}
	testenv.WaitFor(t, "the ServiceCIDR kubernetes", func() bool {
		_, err := api.Client.NetworkingV1().ServiceCIDRs().Get(context.Background(), "kubernetes", metav1.GetOptions{})
		return err == nil
	})
	var err error
	if sc.res, err = reservation.New(api.Client); err != nil {
		t.Fatal(err)
	}
	p := netip.MustParsePrefix(stockRange)
	for ip := p.Addr().Next(); p.Contains(ip.Next()); ip = ip.Next() {
		if ip != sc.kubeIP {
			sc.free = append(sc.free, ip)
		}
	}
	t.Logf("kube-apiserver %s (%s) up with Service default/kubernetes at %s in %v", release, gatesOrDefault(gates), sc.kubeIP, time.Since(start).Round(time.Millisecond))
	return sc
}

func gatesOrDefault(gates string) string {
	if gates == "" {
		return "default gates"
	}
	return gates
}

// snapshot returns every IPAddress and Service the server holds, as "kind name uid rv".
func (sc *stockCluster) snapshot(t *testing.T) []string {
	t.Helper()
	ctx := context.Background()
	ipas, err := sc.api.NetworkingV1().IPAddresses().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svcs, err := sc.api.CoreV1().Services(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, o := range ipas.Items {
		out = append(out, fmt.Sprintf("IPAddress %s %s %s", o.Name, o.UID, o.ResourceVersion))
	}
	for _, o := range svcs.Items {
		out = append(out, fmt.Sprintf("Service %s/%s %s %s", o.Namespace, o.Name, o.UID, o.ResourceVersion))
	}
	slices.Sort(out)
	return out
}

// TestStockKubeAPIServerHonoursReservations reserves 5 of the 13 free addresses of a /28 on
// stock kube-apiserver of each of stockReleases, in IPAddressOnly mode, and checks what the
// package doc says of them: refusals change nothing, a Service asking for a reserved address is
// refused with 422, dynamic allocation hands out the other 8 and then answers that the range is
// full, and a released address is allocated again.
func TestStockKubeAPIServerHonoursReservations(t *testing.T) {
	t.Parallel()
	for _, rel := range stockReleases {
		t.Run(rel.release, func(t *testing.T) {
			sc := startStock(t, rel.release, rel.gates)
			ctx := context.Background()

			// Five reservations spread over the range, kept for future Services and anonymous.
			var reserved []reservation.Reservation
			for i, ip := range []netip.Addr{sc.free[1], sc.free[3], sc.free[5], sc.free[8], sc.free[12]} {
				r := reservation.Reservation{Addr: ip, Name: fmt.Sprintf("block-%d", i), Reason: "kept out of dynamic allocation"}
				if i%2 == 0 {
					r.Name, r.For = "", types.NamespacedName{Namespace: metav1.NamespaceDefault, Name: fmt.Sprintf("future-%d", i)}
				}
				if err := sc.res.Reserve(ctx, r); err != nil {
					t.Fatalf("Reserve(%s) = %v", ip, err)
				}
				reserved = append(reserved, r)
			}
			isReserved := func(ip netip.Addr) bool {
				return slices.ContainsFunc(reserved, func(r reservation.Reservation) bool { return r.Addr == ip })
			}

			t.Run("bad input changes nothing", func(t *testing.T) { testStockRefusals(t, sc, reserved) })
			t.Run("a Service asking for a reserved address gets 422", func(t *testing.T) { testStockRefusesReservedToService(t, sc, reserved) })

			t.Run("dynamic allocation skips reserved addresses until the range is full", func(t *testing.T) {
				start := time.Now()
				var got []netip.Addr
				var err error
				for i := 0; i < len(sc.free)+1; i++ {
					var svc *corev1.Service
					svc, err = sc.api.CoreV1().Services(metav1.NamespaceDefault).Create(ctx, testenv.ClusterIPService(fmt.Sprintf("fill-%d", i), ""), metav1.CreateOptions{})
					if err != nil {
						break
					}
					ip := netip.MustParseAddr(svc.Spec.ClusterIP)
					if isReserved(ip) || ip == sc.kubeIP || slices.Contains(got, ip) {
						t.Errorf("Service %s got %s: reserved %v, the kubernetes Service's %v, given before %v", svc.Name, ip, isReserved(ip), ip == sc.kubeIP, slices.Contains(got, ip))
					}
					got = append(got, ip)
				}
				if want := 14 - 1 - len(reserved); len(got) != want {
					t.Errorf("%d Services got an address before the range was full, want %d: %v", len(got), want, got)
				}
				if !apierrors.IsInternalError(err) || !strings.Contains(err.Error(), "range is full") {
					t.Errorf("the create after the last address = %v, want the InternalError \"range is full\"", err)
				}
				t.Logf("%d Services created, then %q, in %v", len(got), err, time.Since(start).Round(time.Millisecond))

				list, err := sc.res.List(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(reserved, list, addrs); diff != "" {
					t.Errorf("List() after the range filled (-want +got):\n%s", diff)
				}
			})

			t.Run("a released address is allocated again", func(t *testing.T) {
				freed := reserved[0].Addr
				if err := sc.res.Release(ctx, freed); err != nil {
					t.Fatalf("Release(%s) = %v", freed, err)
				}
				// The server's allocator reads IPAddresses through an informer: until it shows the
				// delete, it still answers that the range is full.
				var svc *corev1.Service
				testenv.WaitFor(t, "a Service to get the released address", func() bool {
					var err error
					svc, err = sc.api.CoreV1().Services(metav1.NamespaceDefault).Create(ctx, testenv.ClusterIPService("after-release", ""), metav1.CreateOptions{})
					if err != nil && !strings.Contains(err.Error(), "range is full") {
						t.Fatalf("create after the release: %v", err)
					}
					return err == nil
				})
				if got := netip.MustParseAddr(svc.Spec.ClusterIP); got != freed {
					t.Errorf("the Service created after Release(%s) got %s", freed, got)
				}
			})
		})
	}
}

// testStockRefusals puts bad input to Reserve and Release on sc and checks that it is refused
// with the documented errors and that nothing on the server changed.
func testStockRefusals(t *testing.T, sc *stockCluster, reserved []reservation.Reservation) {
	ctx := context.Background()
	before := sc.snapshot(t)
	p := netip.MustParsePrefix(stockRange)
	at := func(ip netip.Addr) reservation.Reservation { return reservation.Reservation{Addr: ip, Name: "bad"} }
	kubeOwner := allocator.Owner{Resource: "services", Namespace: metav1.NamespaceDefault, Name: "kubernetes"}
	tests := []struct {
		name   string
		r      reservation.Reservation
		wantIs error
		want   error
	}{
		{"an address outside the ServiceCIDR", at(netip.MustParseAddr("10.97.0.1")), allocator.ErrMismatchedNetwork,
			&allocator.NotInRangeError{IP: netip.MustParseAddr("10.97.0.1")}},
		{"the network address", at(p.Addr()), nil,
			&allocator.NotInRangeError{IP: p.Addr(), Range: p}},
		{"the broadcast address", at(netip.MustParseAddr("10.96.0.15")), nil,
			&allocator.NotInRangeError{IP: netip.MustParseAddr("10.96.0.15"), Range: p}},
		{"the address the kubernetes Service holds", at(sc.kubeIP), allocator.ErrAllocated,
			&reservation.HeldError{Addr: sc.kubeIP, Holder: kubeOwner, ManagedBy: "ipallocator.k8s.io"}},
		{"an address reserved already", at(reserved[1].Addr), allocator.ErrAllocated,
			&reservation.HeldError{Addr: reserved[1].Addr, Holder: reserved[1].Owner(), ManagedBy: reservation.ManagedBy}},
		{"a name that is not a DNS label", reservation.Reservation{Addr: sc.free[0], Name: "Bad_Name"}, allocator.ErrInvalid,
			&reservation.InvalidError{Field: "Name", Value: "Bad_Name", Reason: invalidLabelReason(t, "Bad_Name")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := sc.res.Reserve(ctx, tt.r)
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("Reserve() = %v, want an error matching %v", err, tt.wantIs)
			}
			if diff := cmp.Diff(tt.want, err, addrs, prefixes); diff != "" {
				t.Errorf("Reserve() error (-want +got):\n%s", diff)
			}
		})
	}
	t.Run("releasing the kubernetes Service's address", func(t *testing.T) {
		err := sc.res.Release(ctx, sc.kubeIP)
		want := &reservation.HeldError{Addr: sc.kubeIP, Holder: kubeOwner, ManagedBy: "ipallocator.k8s.io"}
		if diff := cmp.Diff(want, err, addrs); diff != "" {
			t.Errorf("Release() error (-want +got):\n%s", diff)
		}
	})
	if diff := cmp.Diff(before, sc.snapshot(t)); diff != "" {
		t.Errorf("the server's IPAddresses and Services after the refusals (-before +after):\n%s", diff)
	}
}

// invalidLabelReason returns the reason Validate gives for the name s.
func invalidLabelReason(t *testing.T, s string) string {
	t.Helper()
	var ie *reservation.InvalidError
	if err := reservation.Validate(reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.2"), Name: s}); !errors.As(err, &ie) {
		t.Fatalf("Validate(Name %q) = %v, want an *InvalidError", s, err)
	}
	return ie.Reason
}

// testStockRefusesReservedToService asks sc for Services with the reserved addresses: one
// reserved anonymously, and one kept for the very Service that asks (this first slice records
// the intent only; stock refuses it like any other).
func testStockRefusesReservedToService(t *testing.T, sc *stockCluster, reserved []reservation.Reservation) {
	ctx := context.Background()
	tests := []struct {
		name string
		svc  *corev1.Service
	}{
		{"an anonymous reservation", testenv.ClusterIPService("asks-reserved", reserved[1].Addr.String())},
		{"the reservation kept for it", testenv.ClusterIPService(reserved[0].For.Name, reserved[0].Addr.String())},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := sc.snapshot(t)
			_, err := sc.api.CoreV1().Services(metav1.NamespaceDefault).Create(ctx, tt.svc, metav1.CreateOptions{})
			var status apierrors.APIStatus
			if !errors.As(err, &status) {
				t.Fatalf("create Service %s asking for %s = %v, want a 422 Invalid", tt.svc.Name, tt.svc.Spec.ClusterIP, err)
			}
			s := status.Status()
			if s.Code != 422 || s.Reason != metav1.StatusReasonInvalid {
				t.Errorf("status code %d reason %q, want 422 %q (%v)", s.Code, s.Reason, metav1.StatusReasonInvalid, err)
			}
			var causes []string
			if s.Details != nil {
				for _, c := range s.Details.Causes {
					causes = append(causes, c.Field+": "+c.Message)
				}
			}
			if len(causes) != 1 || !strings.HasPrefix(causes[0], "spec.clusterIPs: ") || !strings.Contains(causes[0], "provided IP is already allocated") {
				t.Errorf("causes %q, want one at spec.clusterIPs saying \"provided IP is already allocated\"", causes)
			}
			if diff := cmp.Diff(before, sc.snapshot(t)); diff != "" {
				t.Errorf("the server's IPAddresses and Services after the refusal (-before +after):\n%s", diff)
			}
		})
	}
}

// TestStockRepairLeavesAReservationAlone creates a reservation and, as a control, an IPAddress
// of kube-apiserver's own (managed-by ipallocator.k8s.io) for a Service that does not exist, at
// the same time, on stock kube-apiserver v1.37.2, and stops the server. Stock's repair deletes a
// leaked object of its own once it is older than 60 s, and looks at every IPAddress when it
// starts (its informer's first list hands it each object, as the resync of its full pass every
// 3 minutes does later). So 62 s on, a new server on the same etcd deletes the control in its
// first pass, and the reservation is still there, unchanged, once the repair's workers have
// taken every key of that list from their queue. Only
// v1.37.2 runs it, to keep the test time down; it waits in parallel with the package's other
// tests, with no server running.
func TestStockRepairLeavesAReservationAlone(t *testing.T) {
	t.Parallel()
	bin := testenv.SkipWithoutStock(t, "v1.37.2")
	etcd := testenv.NewEtcd(t)
	opts := testenv.KubeAPIServerOptions{Binary: bin, ServiceClusterIPRange: stockRange}
	first := testenv.NewKubeAPIServer(t, etcd, opts)
	kubeIP := testenv.WaitForKubernetesService(t, first.Client)
	ctx := context.Background()
	res, err := reservation.New(first.Client)
	if err != nil {
		t.Fatal(err)
	}
	free := netip.MustParseAddr("10.96.0.5")
	if free == kubeIP {
		free = free.Next()
	}
	r := reservation.Reservation{Addr: free, Name: "kept", Reason: "not a leak"}
	control := testenv.IPAddress(free.Next().String(), metav1.NamespaceDefault, "ghost")
	control.Labels = map[string]string{networkingv1.LabelManagedBy: "ipallocator.k8s.io", networkingv1.LabelIPAddressFamily: string(corev1.IPv4Protocol)}
	if err := res.Reserve(ctx, r); err != nil {
		t.Fatal(err)
	}
	if _, err := first.Client.NetworkingV1().IPAddresses().Create(ctx, control, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	kept, err := first.Client.NetworkingV1().IPAddresses().Get(ctx, r.Addr.String(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	first.Stop()

	time.Sleep(time.Until(created.Add(62 * time.Second)))
	second := testenv.NewKubeAPIServer(t, etcd, opts)
	ipas := second.Client.NetworkingV1().IPAddresses()
	testenv.WaitFor(t, "the new server's repair to delete the control IPAddress "+control.Name+", older than 60 s", func() bool {
		_, err := ipas.Get(ctx, control.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	// The first pass may delete the control before the repair's workers take the reservation
	// from their queue: an object of stock's own that names no Service, created now, is deleted
	// by those workers at once, after the keys of the first list.
	marker := testenv.IPAddress(free.Next().Next().String(), metav1.NamespaceDefault, "marker")
	marker.Labels = control.Labels
	marker.Spec.ParentRef.Resource = "pods"
	if _, err := ipas.Create(ctx, marker, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the repair's workers to delete "+marker.Name+", which names a Pod", func() bool {
		_, err := ipas.Get(ctx, marker.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	got, err := ipas.Get(ctx, r.Addr.String(), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the reservation after the repair's pass: %v, want it still there", err)
	}
	if got.UID != kept.UID || got.ResourceVersion != kept.ResourceVersion {
		t.Errorf("the reservation after the repair's pass has UID %s resourceVersion %s, want %s %s (unchanged)", got.UID, got.ResourceVersion, kept.UID, kept.ResourceVersion)
	}
	if back, ok := reservation.FromObject(got); !ok || !back.Expires.IsZero() || back.Addr != r.Addr || back.Name != r.Name || back.Reason != r.Reason {
		t.Errorf("FromObject(the reservation after the repair's pass) = %+v, %v; want %+v, true", back, ok, r)
	}
}

// TestStockDualWriteFailsAServiceWhoseAddressIsReserved shows why reservations are for
// IPAddressOnly clusters: stock kube-apiserver v1.33.13 in its default DualWrite mode picks a
// Service's address from its bitmap, which knows nothing of reservations, and when the pick is
// reserved the IPAddress create gets AlreadyExists and the Service's create fails with a 500. With
// 5 of the 13 free addresses reserved, that happens by the 9th create at the latest.
func TestStockDualWriteFailsAServiceWhoseAddressIsReserved(t *testing.T) {
	t.Parallel()
	sc := startStock(t, "v1.33.13", "")
	ctx := context.Background()
	for i, ip := range []netip.Addr{sc.free[1], sc.free[3], sc.free[5], sc.free[8], sc.free[12]} {
		if err := sc.res.Reserve(ctx, reservation.Reservation{Addr: ip, Name: fmt.Sprintf("block-%d", i)}); err != nil {
			t.Fatalf("Reserve(%s) = %v", ip, err)
		}
	}
	for i := range len(sc.free) - 5 + 1 {
		_, err := sc.api.CoreV1().Services(metav1.NamespaceDefault).Create(ctx, testenv.ClusterIPService(fmt.Sprintf("dw-%d", i), ""), metav1.CreateOptions{})
		if err == nil {
			continue
		}
		if !apierrors.IsInternalError(err) || !strings.Contains(err.Error(), "provided IP is already allocated") {
			t.Fatalf("create #%d = %v, want the InternalError \"provided IP is already allocated\"", i+1, err)
		}
		t.Logf("create #%d failed: %v", i+1, err)
		return
	}
	t.Errorf("%d creates all succeeded; want one to fail on a reserved address", len(sc.free)-5+1)
}

// TestRepairGivesAServiceItsAddressOverAReservation puts a reservation under an address a
// Service already holds (as a Service from a Legacy or DualWrite era, or restored from a backup,
// can hold a reserved address), on stock kube-apiserver v1.37.2: clusterip's audit reports the
// address as the Service's with a wrong parent. Stock's repair, at its next look at the Service
// (here: a label added to it), and clusterip's repair pass each delete the reservation and give
// the Service its own object; the audit is then consistent. A Service that holds an address wins
// over a reservation of it, in stock's repair and in clusterip's: the reservation was an intent,
// the Service carries traffic.
func TestRepairGivesAServiceItsAddressOverAReservation(t *testing.T) {
	t.Parallel()
	sc := startStock(t, "v1.37.2", "")
	ctx := context.Background()
	ipas := sc.api.NetworkingV1().IPAddresses()
	svcs := sc.api.CoreV1().Services(metav1.NamespaceDefault)
	cfg := clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: []netip.Prefix{netip.MustParsePrefix(stockRange)}, Client: sc.api}
	tests := []struct {
		name, service string
		ip            netip.Addr
		repair        func(t *testing.T)
	}{
		{"stock's repair, at its next look at the Service", "stock-repairs", sc.free[4], func(t *testing.T) {
			holder, err := svcs.Get(ctx, "stock-repairs", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			holder.Labels = map[string]string{"touched": "true"}
			if _, err := svcs.Update(ctx, holder, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
		{"clusterip's repair pass", "clusterip-repairs", sc.free[5], func(t *testing.T) {
			c, err := repair.NewController(cfg, repair.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.RunOnce(ctx); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := svcs.Create(ctx, testenv.ClusterIPService(tt.service, tt.ip.String()), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			// The Service's object gives way to a reservation. Stock's repair looks at a Service
			// when it changes or at its interval (3 minutes), not when its object goes; its look at
			// the create may still come after the swap, so the swap is made again until the
			// reservation stays.
			obj, err := reservation.ObjectFor(reservation.Reservation{Addr: tt.ip, Name: "under-" + tt.service, Reason: "reserved under a Service"})
			if err != nil {
				t.Fatal(err)
			}
			for try := 0; ; try++ {
				if try == 5 {
					t.Fatalf("stock's repair took %s back from the reservation 5 times", tt.ip)
				}
				if err := ipas.Delete(ctx, tt.ip.String(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
					t.Fatal(err)
				}
				if _, err := ipas.Create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
					t.Fatal(err)
				}
				time.Sleep(500 * time.Millisecond)
				if got, err := ipas.Get(ctx, tt.ip.String(), metav1.GetOptions{}); err == nil && reservation.IsReservation(got) {
					break
				}
			}
			report, err := repair.Audit(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if i := slices.IndexFunc(report.Findings, func(f repair.Finding) bool { return f.IP == tt.ip.String() }); i < 0 ||
				report.Findings[i].Class != repair.WrongParent || report.Findings[i].Service != "default/"+tt.service {
				t.Fatalf("clusterip's audit with the reservation under default/%s: %+v, want %s at %s", tt.service, report.Findings, repair.WrongParent, tt.ip)
			}

			tt.repair(t)
			testenv.WaitFor(t, "default/"+tt.service+" to get its own object back", func() bool {
				got, err := ipas.Get(ctx, tt.ip.String(), metav1.GetOptions{})
				return err == nil && !reservation.IsReservation(got) && got.Labels[networkingv1.LabelManagedBy] == "ipallocator.k8s.io" &&
					got.Spec.ParentRef != nil && got.Spec.ParentRef.Resource == "services" && got.Spec.ParentRef.Name == tt.service
			})
			if report, err = repair.Audit(ctx, cfg); err != nil {
				t.Fatal(err)
			}
			if !report.Consistent || len(report.Reservations) != 0 {
				t.Errorf("clusterip's audit after the repair: consistent %v, findings %+v, reservations %+v; want consistent with no reservation", report.Consistent, report.Findings, report.Reservations)
			}
		})
	}
}
