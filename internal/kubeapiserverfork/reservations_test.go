package kubeapiserverfork_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/reservation"
)

// reservationsOn is the environment that turns the fork's reservations on.
const reservationsOn = "CLUSTERIP_RESERVATIONS=on"

// TestForkKeepsReservations runs the fork in IPAddressOnly mode with CLUSTERIP_RESERVATIONS=on,
// dual-stack, and does what a user of reservations does through kube-apiserver's own API, as a
// registry on the library does through Services() (package reservation's tests): the fork's
// registry gives a Service the addresses reserved for it, refuses a reserved address to anyone
// who asks for it with stock's 422, never picks one dynamically over the whole range, keeps a
// Retain Service's addresses across its delete and create again (Velero's restore) and across a
// restart of the server, makes a claim whose create then fails a reservation again, refuses a
// malformed release policy with 422, writing nothing, and holds a deleted Service's address for
// its ServiceCIDR's release cooldown.
func TestForkKeepsReservations(t *testing.T) {
	t.Parallel()
	fork := forkBinary(t)
	stock := stockBinary(t)
	mg, ok := modeOf(t, featuregate.IPAddressOnly)
	if !ok {
		t.Fatalf("kube-apiserver %s has no IPAddressOnly mode", release())
	}
	etcd := testenv.NewEtcd(t)
	opts := mg.options(fork, v4Range+","+v6Range)
	opts.Env = []string{reservationsOn}
	s := testenv.NewKubeAPIServer(t, etcd, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	svcs := s.Client.CoreV1().Services(metav1.NamespaceDefault)
	ipas := s.Client.NetworkingV1().IPAddresses()

	addr := netip.MustParseAddr
	anonymous := []netip.Addr{addr("10.96.0.30"), addr("10.96.0.31"), addr("fd00:10:96::30")}
	forService := map[string][]netip.Addr{
		"kept": {addr("10.96.0.40"), addr("fd00:10:96::40")},
		"dry":  {addr("10.96.0.41")},
		"np":   {addr("10.96.0.42")},
	}
	reserve(ctx, t, s.Client, anonymous, forService)
	optInFork(ctx, t, s.Client, metav1.NamespaceDefault, "100") // retaining is opt-in per namespace

	t.Run("a create asking for a reserved address gets stock's 422", func(t *testing.T) {
		sopts := mg.options(stock, v4Range+","+v6Range)
		st := testenv.NewKubeAPIServer(t, testenv.NewEtcd(t), sopts)
		reserve(ctx, t, st.Client, anonymous[:1], nil)
		for _, name := range []string{"asks-anonymous", "kept"} {
			ip := anonymous[0].String()
			if name == "kept" {
				ip = forService["kept"][0].String() // its own reserved address, asked for: refused too
			}
			_, forkErr := svcs.Create(ctx, testenv.ClusterIPService(name, ip), metav1.CreateOptions{})
			if name == "kept" {
				// stock's answer for the other address is the same but for the address
				ip = anonymous[0].String()
			}
			_, stockErr := st.Client.CoreV1().Services(metav1.NamespaceDefault).Create(ctx, testenv.ClusterIPService(name, ip), metav1.CreateOptions{})
			if !apierrors.IsInvalid(forkErr) || !apierrors.IsInvalid(stockErr) {
				t.Fatalf("%s: fork %v, stock %v; want 422 Invalid from both", name, forkErr, stockErr)
			}
			want := strings.ReplaceAll(stockErr.Error(), anonymous[0].String(), "<ip>")
			if got := strings.ReplaceAll(strings.ReplaceAll(forkErr.Error(), forService["kept"][0].String(), "<ip>"), anonymous[0].String(), "<ip>"); got != want {
				t.Errorf("%s:\nfork:  %s\nstock: %s", name, forkErr, stockErr)
			}
		}
		st.Stop()
	})

	t.Run("a dry run shows the reserved address and claims nothing", func(t *testing.T) {
		got, err := svcs.Create(ctx, testenv.ClusterIPService("dry", ""), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			t.Fatal(err)
		}
		if want := addrStrings(forService["dry"]); !slices.Equal(got.Spec.ClusterIPs, want) {
			t.Errorf("dry run of default/dry: clusterIPs %v, want %v", got.Spec.ClusterIPs, want)
		}
		wantReservation(ctx, t, ipas, forService["dry"][0], "dry")
	})

	t.Run("a Service created without a ClusterIP gets the addresses reserved for it, in each family", func(t *testing.T) {
		svc := testenv.ClusterIPService("kept", "")
		svc.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
		got, err := svcs.Create(ctx, svc, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if want := addrStrings(forService["kept"]); !slices.Equal(got.Spec.ClusterIPs, want) {
			t.Fatalf("default/kept: clusterIPs %v, want %v", got.Spec.ClusterIPs, want)
		}
		for _, ip := range forService["kept"] {
			obj, err := ipas.Get(ctx, ip.String(), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if reservation.IsReservation(obj) || obj.Labels[networkingv1.LabelManagedBy] != "ipallocator.k8s.io" || obj.Spec.ParentRef.Name != "kept" {
				t.Errorf("%s after the claim: labels %v, parentRef %+v; want kube-apiserver's allocation of default/kept", ip, obj.Labels, obj.Spec.ParentRef)
			}
		}
	})

	t.Run("a create that fails after its claim leaves the reservation", func(t *testing.T) {
		first := testenv.ClusterIPService("holds-port", "")
		first.Spec.Type = corev1.ServiceTypeNodePort
		held, err := svcs.Create(ctx, first, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		np := testenv.ClusterIPService("np", "")
		np.Spec.Type = corev1.ServiceTypeNodePort
		np.Spec.Ports[0].NodePort = held.Spec.Ports[0].NodePort
		if _, err := svcs.Create(ctx, np, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
			t.Fatalf("create of default/np on a taken node port: %v, want 422", err)
		}
		wantReservation(ctx, t, ipas, forService["np"][0], "np")
	})

	// A claim can be reverted for minutes; stock's registry releases an address a Service gives
	// up on update (here a type change to ExternalName) without the fork's release hook. The
	// claim must not outlive that release: the next allocation of the address, whose create then
	// fails, is released as any other, and its IPAddress object does not stay behind.
	t.Run("a claim given up on update never stands in for a later allocation's release", func(t *testing.T) {
		ip := addr("10.96.0.43") // reserved here: the subtests after this one find it free
		reserve(ctx, t, s.Client, nil, map[string][]netip.Addr{"gone": {ip}})
		waitForServerToSee(ctx, t, svcs, "gone", ip)
		got, err := svcs.Create(ctx, testenv.ClusterIPService("gone", ""), metav1.CreateOptions{})
		if err != nil || got.Spec.ClusterIP != ip.String() {
			t.Fatalf("create default/gone: %v, %v; want its reserved %s", got.Spec.ClusterIPs, err, ip)
		}
		got.Spec.Type, got.Spec.ExternalName = corev1.ServiceTypeExternalName, "db.example.com"
		got.Spec.ClusterIP, got.Spec.ClusterIPs, got.Spec.IPFamilies, got.Spec.IPFamilyPolicy = "", nil, nil, nil
		if _, err := svcs.Update(ctx, got, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("update default/gone to ExternalName: %v", err)
		}
		if _, err := ipas.Get(ctx, ip.String(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("%s after default/gone became ExternalName: %v, want NotFound (released)", ip, err)
		}
		if _, err := svcs.Create(ctx, testenv.ClusterIPService("taken-name", ""), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// The same name again, asking for the address: allocated, then AlreadyExists, reverted.
		if _, err := svcs.Create(ctx, testenv.ClusterIPService("taken-name", ip.String()), metav1.CreateOptions{}); !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create of a second default/taken-name asking for %s: %v, want AlreadyExists", ip, err)
		}
		if obj, err := ipas.Get(ctx, ip.String(), metav1.GetOptions{}); err == nil {
			t.Errorf("%s after the failed create is held by %+v, want no object: the failed create's allocation leaked", ip, obj.Spec.ParentRef)
		} else if !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		if err := svcs.Delete(ctx, "taken-name", metav1.DeleteOptions{}); err != nil { // the fill below counts the range
			t.Fatal(err)
		}
	})

	t.Run("a malformed release policy is refused with 422 at its annotation and writes nothing", func(t *testing.T) {
		svc := testenv.ClusterIPService("bad-policy", "")
		svc.Annotations = map[string]string{reservation.AnnotationReleasePolicy: "Retain/forever"}
		_, err := svcs.Create(ctx, svc, metav1.CreateOptions{})
		var status apierrors.APIStatus
		if !apierrors.IsInvalid(err) || !errors.As(err, &status) || status.Status().Details == nil || len(status.Status().Details.Causes) != 1 ||
			status.Status().Details.Causes[0].Field != "metadata.annotations["+reservation.AnnotationReleasePolicy+"]" {
			t.Fatalf("create with release policy Retain/forever: %v, want 422 at metadata.annotations[%s]", err, reservation.AnnotationReleasePolicy)
		}
		if _, err := svcs.Get(ctx, "bad-policy", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("default/bad-policy after the refusal: %v, want NotFound", err)
		}
	})

	var velero []string
	t.Run("a Retain Service's addresses become its reservations when it is deleted", func(t *testing.T) {
		svc := testenv.ClusterIPService("velero", "")
		svc.Annotations = map[string]string{reservation.AnnotationReleasePolicy: "Retain"}
		svc.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
		got, err := svcs.Create(ctx, svc, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		velero = got.Spec.ClusterIPs
		if err := svcs.Delete(ctx, "velero", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, ip := range velero {
			wantReservation(ctx, t, ipas, addr(ip), "velero")
		}
	})

	t.Run("dynamic creates never get a reserved address, over the whole IPv4 range", func(t *testing.T) {
		reserved := map[string]bool{}
		for _, a := range anonymous {
			reserved[a.String()] = true
		}
		for _, as := range forService {
			for _, a := range as {
				reserved[a.String()] = true
			}
		}
		for _, ip := range velero {
			reserved[ip] = true
		}
		var names []string
		for i := 0; ; i++ {
			if i > 300 {
				t.Fatal("a /24 took more than 300 Services")
			}
			name := fmt.Sprintf("fill-%d", i)
			got, err := svcs.Create(ctx, testenv.ClusterIPService(name, ""), metav1.CreateOptions{})
			if err != nil {
				if !strings.Contains(err.Error(), "range is full") {
					t.Fatalf("create %s: %v", name, err)
				}
				break
			}
			names = append(names, name)
			if ip := got.Spec.ClusterIPs[0]; reserved[ip] {
				t.Errorf("%s got %s, which is reserved", name, ip)
			}
		}
		// 254 addresses: the kubernetes Service's, default/kept's and default/holds-port's, and
		// 10.96.0.30, .31, .41, .42 and velero's IPv4 address reserved.
		if want := 254 - 3 - 5; len(names) != want {
			t.Errorf("the range took %d Services before it was full, want %d", len(names), want)
		}
		for _, name := range names {
			if err := svcs.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	})

	// A restart, in the test and not a subtest, whose end would stop the server.
	s.Stop()
	s = testenv.NewKubeAPIServer(t, etcd, opts)
	svcs = s.Client.CoreV1().Services(metav1.NamespaceDefault)
	t.Run("the Retain Service created again after a restart gets its addresses back", func(t *testing.T) {
		// Velero's restore: the same Service with its ClusterIPs cleared.
		svc := testenv.ClusterIPService("velero", "")
		svc.Annotations = map[string]string{reservation.AnnotationReleasePolicy: "Retain"}
		svc.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
		var got *corev1.Service
		testenv.WaitFor(t, "the restarted fork to give default/velero an address", func() bool {
			var err error
			got, err = svcs.Create(ctx, svc, metav1.CreateOptions{})
			return err == nil // a create before the informer synced is refused as not ready
		})
		if !slices.Equal(got.Spec.ClusterIPs, velero) {
			t.Errorf("default/velero created again: clusterIPs %v, want %v as before its delete", got.Spec.ClusterIPs, velero)
		}
		for _, a := range anonymous {
			wantReservation(ctx, t, s.Client.NetworkingV1().IPAddresses(), a, "")
		}
	})

	t.Run("a ServiceCIDR's release cooldown holds a deleted Service's address to the instant it names", func(t *testing.T) {
		cidrs := s.Client.NetworkingV1().ServiceCIDRs()
		ipas := s.Client.NetworkingV1().IPAddresses()
		defaultCIDR, err := cidrs.Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if defaultCIDR.Annotations == nil {
			defaultCIDR.Annotations = map[string]string{}
		}
		defaultCIDR.Annotations[reservation.AnnotationReleaseCooldown] = "3s"
		if _, err := cidrs.Update(ctx, defaultCIDR, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		// The allocators read the annotation from their informer: probe Services, created and
		// deleted, show when it has arrived (their addresses are then held too).
		probes := 0
		testenv.WaitFor(t, "the fork's informer to show the cooldown", func() bool {
			probes++
			name := fmt.Sprintf("probe-%d", probes)
			got, err := svcs.Create(ctx, testenv.ClusterIPService(name, ""), metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := svcs.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			_, err = ipas.Get(ctx, got.Spec.ClusterIPs[0], metav1.GetOptions{})
			return err == nil
		})
		got, err := svcs.Create(ctx, testenv.ClusterIPService("cooled", ""), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ip := got.Spec.ClusterIPs[0]
		if err := svcs.Delete(ctx, "cooled", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		obj, err := ipas.Get(ctx, ip, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s after the delete of default/cooled: %v, want it held for the cooldown", ip, err)
		}
		r, ok := reservation.FromObject(obj)
		if !ok || r.Expires.IsZero() {
			t.Fatalf("%s after the delete of default/cooled: labels %v, annotations %v; want a reservation that ends", ip, obj.Labels, obj.Annotations)
		}
		for i := 0; time.Until(r.Expires) > 300*time.Millisecond; i++ {
			if _, err := svcs.Create(ctx, testenv.ClusterIPService(fmt.Sprintf("early-%d", i), ip), metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
				t.Fatalf("a create asking for %s %v before its cooldown ends: %v, want 422", ip, time.Until(r.Expires), err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		testenv.WaitFor(t, ip+" to be free once its cooldown ends", func() bool {
			_, err := svcs.Create(ctx, testenv.ClusterIPService("after", ip), metav1.CreateOptions{})
			return err == nil
		})
		if late := time.Since(r.Expires); late < 0 {
			t.Errorf("%s was free %v before its cooldown ended", ip, -late)
		} else {
			t.Logf("%s free %v after its cooldown ended", ip, late.Round(time.Millisecond))
		}
	})

	t.Run("a Retain Service is refused over its namespace's cap, and where the namespace does not opt in", func(t *testing.T) {
		if _, err := s.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "closed"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		optInFork(ctx, t, s.Client, "capped", "1")
		retain := func(ns, name string) *corev1.Service {
			svc := testenv.ClusterIPService(name, "")
			svc.Namespace = ns
			svc.Annotations = map[string]string{reservation.AnnotationReleasePolicy: "Retain"}
			return svc
		}
		refused := func(ns, name, wantMsg string) {
			t.Helper()
			_, err := s.Client.CoreV1().Services(ns).Create(ctx, retain(ns, name), metav1.CreateOptions{})
			var status apierrors.APIStatus
			if !apierrors.IsInvalid(err) || !errors.As(err, &status) || status.Status().Details == nil || len(status.Status().Details.Causes) != 1 ||
				status.Status().Details.Causes[0].Field != "metadata.annotations["+reservation.AnnotationReleasePolicy+"]" ||
				status.Status().Details.Causes[0].Type != metav1.CauseTypeForbidden {
				t.Fatalf("create of Retain %s/%s: %v, want 422 Forbidden at the release-policy annotation", ns, name, err)
			}
			if want := fmt.Sprintf("Service %q is invalid: metadata.annotations[%s]: Forbidden: %s", name, reservation.AnnotationReleasePolicy, wantMsg); err.Error() != want {
				t.Errorf("create of Retain %s/%s:\n %s\nwant\n %s", ns, name, err, want)
			}
			if _, err := s.Client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("%s/%s after the refusal: %v, want NotFound", ns, name, err)
			}
		}
		refused("closed", "web", `namespace "closed" may not retain addresses: its Namespace has no clusterip.kube-ipam.io/max-retained annotation`)

		capped := s.Client.CoreV1().Services("capped")
		if _, err := capped.Create(ctx, retain("capped", "first"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := capped.Delete(ctx, "first", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, "the fork's informer to show capped/first's reservation", func() bool {
			_, err := capped.Create(ctx, retain("capped", "second"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return apierrors.IsInvalid(err)
		})
		refused("capped", "second", `namespace "capped" keeps 1 reserved addresses and may keep 1 (annotation clusterip.kube-ipam.io/max-retained of Namespace "capped")`)
		// The Service whose reservation it is comes back: not refused, and gets its address.
		if _, err := capped.Create(ctx, retain("capped", "first"), metav1.CreateOptions{}); err != nil {
			t.Errorf("capped/first created again at the cap: %v, want its reservation back", err)
		}
	})
}

// optInFork annotates Namespace ns (creating it if needed) with reservation.AnnotationMaxRetained
// value and waits until the fork's informer shows it: a dry run of a Retain Service in ns is
// accepted.
func optInFork(ctx context.Context, t *testing.T, client kubernetes.Interface, ns, value string) {
	t.Helper()
	nss := client.CoreV1().Namespaces()
	patch := []byte(`{"metadata":{"annotations":{"` + reservation.AnnotationMaxRetained + `":"` + value + `"}}}`)
	probe := testenv.ClusterIPService("opt-in-probe", "")
	probe.Namespace = ns
	probe.Annotations = map[string]string{reservation.AnnotationReleasePolicy: "Retain"}
	testenv.WaitFor(t, "the fork to let Namespace "+ns+" retain", func() bool {
		if _, err := nss.Patch(ctx, ns, types.MergePatchType, patch, metav1.PatchOptions{}); apierrors.IsNotFound(err) {
			_, _ = nss.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
			return false
		}
		_, err := client.CoreV1().Services(ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil
	})
}

// TestForkRefusesReservationsOutsideIPAddressOnly starts the fork with CLUSTERIP_RESERVATIONS=on
// in its release's DualWrite mode, where a bitmap knows nothing of reservations (a release
// without one skips that case), and with a value it does not know: the server stops at start-up,
// saying why.
func TestForkRefusesReservationsOutsideIPAddressOnly(t *testing.T) {
	fork := forkBinary(t)
	cases := []struct {
		name, env, want string
		mode            featuregate.Mode
	}{
		{"on in DualWrite mode", reservationsOn, "cannot create cluster IP allocator: CLUSTERIP_RESERVATIONS=on: reservations need the IPAddressOnly mode, and the feature gates select DualWrite", featuregate.DualWrite},
		{"a value it does not know", "CLUSTERIP_RESERVATIONS=yes", `cannot create cluster IP allocator: CLUSTERIP_RESERVATIONS=\"yes\": want \"on\" or \"off\" (the default)`, featuregate.IPAddressOnly},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			opts := modeOrSkip(t, c.mode).options(fork, v4Range)
			opts.Env = []string{c.env}
			assertStartFails(t, opts, c.want)
		})
	}
}

// reserve makes the reservations of anonymous (each named for its address) and of forService
// (kept for default/<name>) through the API server of c.
func reserve(ctx context.Context, t *testing.T, c kubernetes.Interface, anonymous []netip.Addr, forService map[string][]netip.Addr) {
	t.Helper()
	rc, err := reservation.New(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range anonymous {
		if err := rc.Reserve(ctx, reservation.Reservation{Addr: a, Name: "held-" + strings.ReplaceAll(strings.ReplaceAll(a.String(), ".", "-"), ":", "-")}); err != nil {
			t.Fatal(err)
		}
	}
	for name, as := range forService {
		for _, a := range as {
			if err := rc.Reserve(ctx, reservation.Reservation{Addr: a, For: types.NamespacedName{Namespace: metav1.NamespaceDefault, Name: name}}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// waitForServerToSee waits until a dry run of the create of Service default/<name> gets ip: the
// server has seen the reservation of ip kept for it. A reservation takes effect once the API
// server's informer has it; a create in the same instant may not find it (it gets a dynamic
// address, as docs/reservations.md says), which a loaded machine made this test see.
func waitForServerToSee(ctx context.Context, t *testing.T, svcs interface {
	Create(context.Context, *corev1.Service, metav1.CreateOptions) (*corev1.Service, error)
}, name string, ip netip.Addr) {
	t.Helper()
	testenv.WaitFor(t, "the server to see the reservation of "+ip.String()+" for default/"+name, func() bool {
		got, err := svcs.Create(ctx, testenv.ClusterIPService(name, ""), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && got.Spec.ClusterIP == ip.String()
	})
}

// wantReservation fails t unless the IPAddress object of ip is a reservation kept for
// default/<name>, or an anonymous one for name "".
func wantReservation(ctx context.Context, t *testing.T, ipas interface {
	Get(context.Context, string, metav1.GetOptions) (*networkingv1.IPAddress, error)
}, ip netip.Addr, name string) {
	t.Helper()
	obj, err := ipas.Get(ctx, ip.String(), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("%s: %v, want a reservation", ip, err)
	}
	r, ok := reservation.FromObject(obj)
	switch {
	case !ok:
		t.Errorf("%s: labels %v, parentRef %+v; want a reservation", ip, obj.Labels, obj.Spec.ParentRef)
	case name != "" && r.For != types.NamespacedName{Namespace: metav1.NamespaceDefault, Name: name}:
		t.Errorf("%s: a reservation kept for %q, want default/%s", ip, r.For, name)
	case name == "" && r.For.Name != "":
		t.Errorf("%s: a reservation kept for %q, want an anonymous one", ip, r.For)
	}
}

// addrStrings returns each address of as in its canonical form.
func addrStrings(as []netip.Addr) []string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return s
}
