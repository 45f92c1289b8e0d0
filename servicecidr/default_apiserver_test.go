package servicecidr

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"

	"github.com/kube-ipam/clusterip/internal/testenv"
)

// TestDefaultControllerOnKubeAPIServer runs DefaultControllers against a real kube-apiserver
// v1.33.13 started with MultiCIDRServiceAllocator=false, which runs no default-ServiceCIDR
// controller of its own (its post-start hook is registered only with the gate on), as a registry
// that is not kube-apiserver would: the first creates the default ServiceCIDR and sets it ready
// so that an Allocator serves from it, a second with a dual-stack flag upgrades it, and a third
// with other flags reports the mismatch with an Event stored in the API server.
func TestDefaultControllerOnKubeAPIServer(t *testing.T) {
	api := testenv.NewKubeAPIServer(t, testenv.NewEtcd(t), testenv.KubeAPIServerOptions{
		ServiceClusterIPRange: "10.96.0.0/24", FeatureGates: "MultiCIDRServiceAllocator=false",
	})
	client := api.Client
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := client.NetworkingV1().ServiceCIDRs().Get(ctx, DefaultServiceCIDRName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("get ServiceCIDR %s from a ready kube-apiserver with MultiCIDRServiceAllocator=false = %v, want NotFound", DefaultServiceCIDRName, err)
	}

	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	if err := broadcaster.StartRecordingToSinkWithContext(ctx); err != nil {
		t.Fatal(err)
	}
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, DefaultControllerName)

	// run starts a DefaultController of flag with its own informers and returns it, the informer
	// factory, the context it runs in and a function that stops it.
	run := func(flag string) (*DefaultController, informers.SharedInformerFactory, context.Context, func()) {
		t.Helper()
		var ranges []netip.Prefix
		for _, s := range strings.Split(flag, ",") {
			ranges = append(ranges, netip.MustParsePrefix(s))
		}
		runCtx, stop := context.WithCancel(ctx)
		inf := informers.NewSharedInformerFactory(client, 0)
		c, err := NewDefaultController(ranges, client, inf.Networking().V1().ServiceCIDRs(), DefaultOptions{Recorder: recorder})
		if err != nil {
			t.Fatal(err)
		}
		inf.Start(runCtx.Done())
		done := make(chan error, 1)
		go func() { done <- c.Run(runCtx) }()
		return c, inf, runCtx, func() {
			stop()
			if err := <-done; err != nil {
				t.Errorf("Run() = %v", err)
			}
			inf.Shutdown()
		}
	}

	// A registry's start: the default ServiceCIDR is created, set ready, and served.
	first, inf, firstCtx, stopFirst := run("10.100.0.0/24")
	a, err := New(corev1.IPv4Protocol, client, inf.Networking().V1().ServiceCIDRs(), inf.Networking().V1().IPAddresses())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	inf.Start(firstCtx.Done()) // the IPAddress informer New asked for
	allocDone := make(chan error, 1)
	allocCtx, stopAlloc := context.WithCancel(firstCtx)
	go func() { allocDone <- a.Run(allocCtx) }()
	testenv.WaitFor(t, "the DefaultController's first pass", first.HasSynced)
	sc := getDefault(ctx, t, client)
	if !slices.Equal(sc.Spec.CIDRs, []string{"10.100.0.0/24"}) {
		t.Errorf("spec.cidrs = %q, want [10.100.0.0/24]", sc.Spec.CIDRs)
	}
	if c := meta.FindStatusCondition(sc.Status.Conditions, networkingv1.ServiceCIDRConditionReady); c == nil || c.Status != metav1.ConditionTrue || c.Message != messageDefaultReady {
		t.Errorf("Ready condition = %+v, want True with kube-apiserver's message", c)
	}
	if !slices.ContainsFunc(sc.ManagedFields, func(m metav1.ManagedFieldsEntry) bool {
		return m.Manager == DefaultControllerName && m.Operation == metav1.ManagedFieldsOperationApply && m.Subresource == "status"
	}) {
		t.Errorf("managedFields = %+v, want the status applied by %s, as kube-apiserver applies it", sc.ManagedFields, DefaultControllerName)
	}
	testenv.WaitFor(t, "the Allocator to serve the default ServiceCIDR", a.Ready)
	ip, err := a.AllocateNext(ctx, testOwner)
	if err != nil || !netip.MustParsePrefix("10.100.0.0/24").Contains(ip) {
		t.Fatalf("AllocateNext() = %v, %v; want an address of 10.100.0.0/24", ip, err)
	}
	if err := a.Release(ctx, ip); err != nil {
		t.Errorf("Release(%s) = %v", ip, err)
	}
	stopAlloc()
	<-allocDone
	stopFirst()

	// The flag gains an IPv6 range: the default ServiceCIDR is upgraded to dual stack.
	_, _, _, stopDual := run("10.100.0.0/24,fd00:100::/112")
	testenv.WaitFor(t, "the default ServiceCIDR to be dual-stack", func() bool {
		return slices.Equal(getDefault(ctx, t, client).Spec.CIDRs, []string{"10.100.0.0/24", "fd00:100::/112"})
	})
	stopDual()

	// Another server with other flags reports the mismatch and changes nothing.
	_, _, _, stopOther := run("10.200.0.0/24")
	defer stopOther()
	const wantNote = "The default ServiceCIDR [10.100.0.0/24 fd00:100::/112] does not match the controller flag configurations [10.200.0.0/24]"
	testenv.WaitFor(t, "a "+EventReasonDefaultInconsistent+" Event", func() bool {
		list, err := client.EventsV1().Events("").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(list.Items, func(e eventsv1.Event) bool {
			return e.Reason == EventReasonDefaultInconsistent && e.Note == wantNote && e.Type == corev1.EventTypeWarning &&
				e.Regarding.Kind == "ServiceCIDR" && e.Regarding.Name == DefaultServiceCIDRName
		})
	})
	if got := getDefault(ctx, t, client).Spec.CIDRs; !slices.Equal(got, []string{"10.100.0.0/24", "fd00:100::/112"}) {
		t.Errorf("spec.cidrs after a mismatch = %q, want them unchanged", got)
	}
}

// getDefault reads the default ServiceCIDR from the API server.
func getDefault(ctx context.Context, t *testing.T, client kubernetes.Interface) *networkingv1.ServiceCIDR {
	t.Helper()
	sc, err := client.NetworkingV1().ServiceCIDRs().Get(ctx, DefaultServiceCIDRName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get the default ServiceCIDR: %v", err)
	}
	return sc
}
