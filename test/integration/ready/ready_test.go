package ready

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// notReadyWait is how long the tests below let WaitReady wait for what never comes.
const notReadyWait = 300 * time.Millisecond

// waitNotReady calls a.WaitReady with a context that ends after notReadyWait and returns its
// *clusterip.NotReadyError, failing t if it returns anything else.
func waitNotReady(t *testing.T, a *clusterip.Allocators) *clusterip.NotReadyError {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), notReadyWait)
	defer cancel()
	err := a.WaitReady(ctx)
	var nre *clusterip.NotReadyError
	if !errors.As(err, &nre) {
		t.Fatalf("WaitReady() = %v, want a *clusterip.NotReadyError", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitReady() = %v, want it to match context.DeadlineExceeded", err)
	}
	return nre
}

// waitNotReadyFor waits until WaitReady answers a *clusterip.NotReadyError of cause, failing t after
// testenv.WaitTimeout. The allocators learn of a change of a ServiceCIDR from their informer after
// the API server has it (a ServiceCIDR created without conditions is ready until they see the
// Ready=False written after it), so a test that has just changed one waits for them to catch up.
func waitNotReadyFor(t *testing.T, a *clusterip.Allocators, cause error) *clusterip.NotReadyError {
	t.Helper()
	var last error
	for deadline := time.Now().Add(testenv.WaitTimeout); time.Now().Before(deadline); {
		ctx, cancel := context.WithTimeout(context.Background(), notReadyWait)
		err := a.WaitReady(ctx)
		cancel()
		var nre *clusterip.NotReadyError
		if errors.As(err, &nre) && errors.Is(err, cause) {
			return nre
		}
		last = err
	}
	t.Fatalf("WaitReady() = %v, want a *clusterip.NotReadyError matching %v", last, cause)
	return nil
}

// checkNotReady checks e against the cause, family and detail wanted.
func checkNotReady(t *testing.T, e *clusterip.NotReadyError, cause error, family corev1.IPFamily, detail string) {
	t.Helper()
	if !errors.Is(e, cause) {
		t.Errorf("WaitReady() = %v, want it to match %v", e, cause)
	}
	if e.Cause != cause {
		t.Errorf("Cause = %v, want %v", e.Cause, cause)
	}
	if e.Family != family {
		t.Errorf("Family = %s, want %s", e.Family, family)
	}
	if !strings.Contains(e.Error(), detail) || !strings.Contains(e.Error(), string(family)) {
		t.Errorf("WaitReady() = %q, want it to name %s and say %q", e, family, detail)
	}
}

// readyCondition returns a ServiceCIDR status condition Ready with status s.
func readyCondition(s metav1.ConditionStatus, reason, message string) metav1.Condition {
	return metav1.Condition{Type: networkingv1.ServiceCIDRConditionReady, Status: s, Reason: reason, Message: message, LastTransitionTime: metav1.Now()}
}

// TestWaitReadyOnKubeAPIServer runs IPAddressOnly allocators beside a real kube-apiserver v1.33
// that creates no ServiceCIDR (MultiCIDRServiceAllocator=false runs no default-ServiceCIDR
// controller) and checks WaitReady's answer as ServiceCIDRs come: none, one with Ready=False,
// then the same with Ready=True.
func TestWaitReadyOnKubeAPIServer(t *testing.T) {
	api := testenv.NewKubeAPIServer(t, testenv.NewEtcd(t), testenv.KubeAPIServerOptions{
		ServiceClusterIPRange: "10.96.0.0/24", FeatureGates: "MultiCIDRServiceAllocator=false",
	})
	client := api.Client
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	inf := informers.NewSharedInformerFactory(client, 0)
	a, err := clusterip.New(ctx, clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: []netip.Prefix{netip.MustParsePrefix("10.100.0.0/24")}, Client: client, Informers: inf})
	if err != nil {
		t.Fatalf("clusterip.New() = %v", err)
	}
	defer a.Close()
	inf.Start(ctx.Done())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done; inf.Shutdown() }()

	checkNotReady(t, waitNotReady(t, a), clusterip.ErrNoServiceCIDR, corev1.IPv4Protocol, "no ServiceCIDR has an IPv4 prefix")

	sc, err := client.NetworkingV1().ServiceCIDRs().Create(ctx, testenv.ServiceCIDR("extra", "10.100.0.0/24"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sc.Status.Conditions = []metav1.Condition{readyCondition(metav1.ConditionFalse, "NetworkNotProgrammed", "routes are missing")}
	if sc, err = client.NetworkingV1().ServiceCIDRs().UpdateStatus(ctx, sc, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("set Ready=False: %v", err)
	}
	waitForCache(t, inf, sc)
	e := waitNotReadyFor(t, a, clusterip.ErrServiceCIDRNotReady)
	checkNotReady(t, e, clusterip.ErrServiceCIDRNotReady, corev1.IPv4Protocol, `ServiceCIDR "extra" [10.100.0.0/24] has condition Ready=False (reason "NetworkNotProgrammed", message "routes are missing")`)
	if e.ServiceCIDR != "extra" || e.Condition == nil || e.Condition.Reason != "NetworkNotProgrammed" {
		t.Errorf("ServiceCIDR = %q, Condition = %+v; want extra with reason NetworkNotProgrammed", e.ServiceCIDR, e.Condition)
	}

	sc.Status.Conditions = []metav1.Condition{readyCondition(metav1.ConditionTrue, "Ready", "")}
	if _, err = client.NetworkingV1().ServiceCIDRs().UpdateStatus(ctx, sc, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("set Ready=True: %v", err)
	}
	readyCtx, cancelReady := context.WithTimeout(ctx, testenv.WaitTimeout)
	defer cancelReady()
	if err := a.WaitReady(readyCtx); err != nil {
		t.Fatalf("WaitReady() once the ServiceCIDR is ready = %v", err)
	}

	// A registry beside no kube-apiserver of its own has Run create the default ServiceCIDR.
	inf2 := informers.NewSharedInformerFactory(client, 0)
	b, err := clusterip.New(ctx, clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: []netip.Prefix{netip.MustParsePrefix("10.101.0.0/24")}, Client: client, Informers: inf2, DefaultServiceCIDR: true})
	if err != nil {
		t.Fatalf("clusterip.New(DefaultServiceCIDR) = %v", err)
	}
	defer b.Close()
	ctx2, cancel2 := context.WithCancel(ctx)
	inf2.Start(ctx2.Done())
	done2 := make(chan error, 1)
	go func() { done2 <- b.Run(ctx2) }()
	defer func() { cancel2(); <-done2; inf2.Shutdown() }()
	if err := b.WaitReady(readyCtx); err != nil {
		t.Fatalf("WaitReady() with DefaultServiceCIDR = %v", err)
	}
	testenv.WaitFor(t, "the default ServiceCIDR to be Ready=True", func() bool {
		sc, err := client.NetworkingV1().ServiceCIDRs().Get(ctx, "kubernetes", metav1.GetOptions{})
		return err == nil && slices.Equal(sc.Spec.CIDRs, []string{"10.101.0.0/24"}) &&
			meta.IsStatusConditionTrue(sc.Status.Conditions, networkingv1.ServiceCIDRConditionReady)
	})
}

// waitForCache waits until the informer factory's ServiceCIDR cache holds sc at its
// resourceVersion or later, so that WaitReady is asked about it.
func waitForCache(t *testing.T, inf informers.SharedInformerFactory, sc *networkingv1.ServiceCIDR) {
	t.Helper()
	lister := inf.Networking().V1().ServiceCIDRs().Lister()
	testenv.WaitFor(t, "ServiceCIDR "+sc.Name+" in the cache", func() bool {
		got, err := lister.Get(sc.Name)
		return err == nil && got.ResourceVersion == sc.ResourceVersion
	})
}
