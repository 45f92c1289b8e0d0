package clusterip

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
	"k8s.io/client-go/informers"

	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/fakeclient"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// notReadyWait is how long the tests below let WaitReady wait for what never comes.
const notReadyWait = 300 * time.Millisecond

// waitNotReady calls a.WaitReady with a context that ends after notReadyWait and returns its
// *NotReadyError, failing t if it returns anything else.
func waitNotReady(t *testing.T, a *Allocators) *NotReadyError {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), notReadyWait)
	defer cancel()
	err := a.WaitReady(ctx)
	var nre *NotReadyError
	if !errors.As(err, &nre) {
		t.Fatalf("WaitReady() = %v, want a *NotReadyError", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitReady() = %v, want it to match context.DeadlineExceeded", err)
	}
	return nre
}

// checkNotReady checks e against the cause, family and detail wanted.
func checkNotReady(t *testing.T, e *NotReadyError, cause error, family corev1.IPFamily, detail string) {
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

func TestWaitReadySaysWhatItWaitsFor(t *testing.T) {
	v4, v6 := netip.MustParsePrefix("10.96.0.0/24"), netip.MustParsePrefix("fd00::/120")
	notReady := testenv.ServiceCIDR("b-not-ready", "10.96.0.0/24")
	notReady.Status.Conditions = []metav1.Condition{readyCondition(metav1.ConditionFalse, "Broken", "the network is down")}
	notReady2 := testenv.ServiceCIDR("c-not-ready", "10.97.0.0/24")
	notReady2.Status.Conditions = []metav1.Condition{readyCondition(metav1.ConditionUnknown, "Unknown", "")}
	deleting := testenv.ServiceCIDR("a-deleting", "10.96.0.0/24")
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	deleting.Finalizers = []string{"networking.k8s.io/service-cidr-finalizer"}
	tests := []struct {
		name     string
		ranges   []netip.Prefix
		objects  []runtime.Object
		noStart  bool // leave the informer factory stopped
		noRun    bool // do not call Run
		cause    error
		family   corev1.IPFamily
		detail   string
		cidr     string                  // NotReadyError.ServiceCIDR wanted
		cond     *metav1.ConditionStatus // the status of NotReadyError.Condition wanted; nil: no Condition
		moreText string                  // more text the error must have
	}{
		{name: "informers not started", ranges: []netip.Prefix{v4}, objects: []runtime.Object{testenv.ServiceCIDR("kubernetes", "10.96.0.0/24")},
			noStart: true, cause: ErrNotSynced, family: corev1.IPv4Protocol, detail: "the ServiceCIDR informer has not synced"},
		{name: "Run not called", ranges: []netip.Prefix{v4}, objects: []runtime.Object{testenv.ServiceCIDR("kubernetes", "10.96.0.0/24")},
			noRun: true, cause: ErrNotSynced, family: corev1.IPv4Protocol, detail: "Run has not been called"},
		{name: "no ServiceCIDR at all", ranges: []netip.Prefix{v4},
			cause: ErrNoServiceCIDR, family: corev1.IPv4Protocol, detail: "no ServiceCIDR has an IPv4 prefix"},
		{name: "a ServiceCIDR of the primary family only", ranges: []netip.Prefix{v4, v6}, objects: []runtime.Object{testenv.ServiceCIDR("kubernetes", "10.96.0.0/24")},
			cause: ErrNoServiceCIDR, family: corev1.IPv6Protocol, detail: "no ServiceCIDR has an IPv6 prefix"},
		{name: "a ServiceCIDR with Ready=False", ranges: []netip.Prefix{v4}, objects: []runtime.Object{notReady},
			cause: ErrServiceCIDRNotReady, family: corev1.IPv4Protocol, detail: `ServiceCIDR "b-not-ready" [10.96.0.0/24] has condition Ready=False`,
			cidr: "b-not-ready", cond: ptrTo(metav1.ConditionFalse), moreText: `reason "Broken", message "the network is down"`},
		{name: "several not ready, one being deleted", ranges: []netip.Prefix{v4}, objects: []runtime.Object{notReady, notReady2, deleting},
			cause: ErrServiceCIDRNotReady, family: corev1.IPv4Protocol, detail: `ServiceCIDR "a-deleting" [10.96.0.0/24] is being deleted`,
			cidr: "a-deleting", moreText: "and 2 more IPv4 ServiceCIDRs are not ready"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fakeclient.New(fakeclient.Options{Objects: tt.objects})
			inf := informers.NewSharedInformerFactory(client, 0)
			a, err := New(context.Background(), Config{Mode: featuregate.IPAddressOnly, Ranges: tt.ranges, Client: client, Informers: inf})
			if err != nil {
				t.Fatalf("New() = %v", err)
			}
			defer a.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if !tt.noStart {
				inf.Start(ctx.Done())
				defer func() { cancel(); inf.Shutdown() }()
			}
			if !tt.noRun {
				done := make(chan error, 1)
				go func() { done <- a.Run(ctx) }()
				defer func() { cancel(); <-done }()
			}
			e := waitNotReady(t, a)
			checkNotReady(t, e, tt.cause, tt.family, tt.detail)
			if e.ServiceCIDR != tt.cidr {
				t.Errorf("ServiceCIDR = %q, want %q", e.ServiceCIDR, tt.cidr)
			}
			switch {
			case tt.cond == nil && e.Condition != nil:
				t.Errorf("Condition = %+v, want nil", e.Condition)
			case tt.cond != nil && (e.Condition == nil || e.Condition.Status != *tt.cond):
				t.Errorf("Condition = %+v, want status %s", e.Condition, *tt.cond)
			}
			if !strings.Contains(e.Error(), tt.moreText) {
				t.Errorf("WaitReady() = %q, want it to say %q", e, tt.moreText)
			}
		})
	}
}

func ptrTo[T any](v T) *T { return &v }

// TestWaitReadyWaitsForLegacyBitmapOfAnotherRange stores, in a real etcd, a bitmap of another
// range than the flag range at the Legacy key: WaitReady says so until the bitmap is rewritten
// (as repair's first pass does) and then returns nil.
func TestWaitReadyWaitsForLegacyBitmapOfAnotherRange(t *testing.T) {
	etcd := testenv.NewEtcd(t).TestClient(t)
	ctx := context.Background()
	flag := netip.MustParsePrefix("10.96.0.0/24")
	store := etcdstore.New(etcd, etcdstore.KeyFor("/waitready", 0))
	if _, err := store.Update(ctx, 0, bitmap.Snapshot{Range: "10.9.0.0/24", Data: []byte{0x01}}); err != nil {
		t.Fatalf("store a bitmap of another range: %v", err)
	}
	a, err := New(ctx, Config{Mode: featuregate.Legacy, Ranges: []netip.Prefix{flag}, Bitmaps: etcdstore.Stores{Client: etcd, Prefix: "/waitready"}})
	if err != nil {
		t.Fatalf("New() over a bitmap of another range = %v, want nil as kube-apiserver starts", err)
	}
	defer a.Close()

	e := waitNotReady(t, a)
	checkNotReady(t, e, ErrBitmapNotLoaded, corev1.IPv4Protocol, "its bitmap cannot be read as one of 10.96.0.0/24")
	var mismatch *bitmap.RangeMismatchError
	if !errors.As(e, &mismatch) || mismatch.Stored != "10.9.0.0/24" || !errors.As(e.Reason, &mismatch) {
		t.Errorf("WaitReady() = %v, want a *bitmap.RangeMismatchError of 10.9.0.0/24 as its Reason", e)
	}

	// What repair's first pass does: rewrite the bitmap to the flag range.
	_, rev, err := store.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitErr := make(chan error, 1)
	waitCtx, cancel := context.WithTimeout(ctx, testenv.WaitTimeout)
	defer cancel()
	go func() { waitErr <- a.WaitReady(waitCtx) }()
	if _, err := store.Update(ctx, rev, bitmap.Snapshot{Range: flag.String()}); err != nil {
		t.Fatalf("rewrite the bitmap: %v", err)
	}
	if err := <-waitErr; err != nil {
		t.Fatalf("WaitReady() after the bitmap was rewritten = %v, want nil", err)
	}
	if _, err := a.For(corev1.IPv4Protocol).AllocateNext(ctx, testOwner); err != nil {
		t.Errorf("AllocateNext() after WaitReady = %v", err)
	}
}
