package servicecidr

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/component-base/compatibility"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/fakeclient"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

var (
	v4Flag   = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/24")}
	dualFlag = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/24"), netip.MustParsePrefix("fd00::/108")}
)

// defaultCIDR returns the default ServiceCIDR of cidrs with the Ready condition cond, if cond is
// not nil.
func defaultCIDR(cond *metav1.Condition, cidrs ...string) *networkingv1.ServiceCIDR {
	sc := testenv.ServiceCIDR(DefaultServiceCIDRName, cidrs...)
	if cond != nil {
		sc.Status.Conditions = []metav1.Condition{*cond}
	}
	return sc
}

func readyCond(s metav1.ConditionStatus, reason, message string) *metav1.Condition {
	return &metav1.Condition{Type: networkingv1.ServiceCIDRConditionReady, Status: s, Reason: reason, Message: message}
}

// defaultFixture is a DefaultController on a fake clientset whose ServiceCIDR informer has
// synced, for tests that call sync themselves.
type defaultFixture struct {
	t      *testing.T
	ctx    context.Context
	client *fakeclient.Clientset
	rec    *events.FakeRecorder
	c      *DefaultController
}

func newDefaultFixture(t *testing.T, ranges []netip.Prefix, release string, objects ...runtime.Object) *defaultFixture {
	t.Helper()
	client := fakeclient.New(fakeclient.Options{Objects: objects})
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), ktesting.NewLogger(t, ktesting.NewConfig())))
	inf := informers.NewSharedInformerFactory(client, 0)
	rec := events.NewFakeRecorder(100)
	var version compatibility.EffectiveVersion // "": the default
	if release != "" {
		v, err := featuregate.KubeVersion(release, "")
		if err != nil {
			t.Fatal(err)
		}
		version = v
	}
	c, err := NewDefaultController(ranges, client, inf.Networking().V1().ServiceCIDRs(), DefaultOptions{Version: version, Recorder: rec})
	if err != nil {
		t.Fatalf("NewDefaultController() = %v", err)
	}
	inf.Start(ctx.Done())
	t.Cleanup(func() { cancel(); inf.Shutdown() })
	if !cache.WaitForCacheSync(ctx.Done(), c.informer.HasSynced) {
		t.Fatal("ServiceCIDR informer did not sync")
	}
	client.WaitWatching(t, "servicecidrs")
	return &defaultFixture{t: t, ctx: ctx, client: client, rec: rec, c: c}
}

// stored returns the default ServiceCIDR as the fake holds it, nil if there is none.
func (f *defaultFixture) stored() *networkingv1.ServiceCIDR {
	f.t.Helper()
	sc, err := f.client.NetworkingV1().ServiceCIDRs().Get(f.ctx, DefaultServiceCIDRName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		f.t.Fatal(err)
	}
	return sc
}

// waitCached waits until the informer's cache holds the stored default ServiceCIDR.
func (f *defaultFixture) waitCached() {
	f.t.Helper()
	want := f.stored()
	testenv.WaitFor(f.t, "the cache to hold the default ServiceCIDR as stored", func() bool {
		got, err := f.c.lister.Get(DefaultServiceCIDRName)
		if want == nil {
			return apierrors.IsNotFound(err)
		}
		return err == nil && cmp.Equal(got.Spec, want.Spec) && cmp.Equal(got.Status, want.Status)
	})
}

// events drains the Events recorded so far.
func (f *defaultFixture) events() []string {
	var got []string
	for {
		select {
		case e := <-f.rec.Events:
			got = append(got, e)
		default:
			return got
		}
	}
}

// writes returns the verbs (with their subresource) of the writes sent to ServiceCIDRs since the
// last call.
func (f *defaultFixture) writes() []string {
	var got []string
	for _, a := range f.client.Actions() {
		if a.GetResource().Resource != "servicecidrs" {
			continue
		}
		switch a.GetVerb() {
		case "create", "update", "patch", "delete":
			v := a.GetVerb()
			if a.GetSubresource() != "" {
				v += "/" + a.GetSubresource()
			}
			got = append(got, v)
		}
	}
	f.client.ClearActions()
	return got
}

func TestDefaultControllerPass(t *testing.T) {
	const (
		v133 = "1.33.13"
		v137 = "1.37.2"
	)
	readyTrue := readyCond(metav1.ConditionTrue, "", messageDefaultReady)
	tests := []struct {
		name      string
		versions  []string
		ranges    []netip.Prefix
		existing  *networkingv1.ServiceCIDR // nil: none
		wantCIDRs []string                  // spec.cidrs after the pass; nil: no ServiceCIDR
		wantReady *metav1.ConditionStatus   // the Ready condition after the pass; nil: none
		wantWrite []string
		wantEvent []string
	}{
		{name: "missing is created ready", versions: []string{v133, v137}, ranges: v4Flag,
			wantCIDRs: []string{"10.96.0.0/24"}, wantReady: ptr(metav1.ConditionTrue), wantWrite: []string{"create", "patch/status"}},
		{name: "missing dual-stack is created with both", versions: []string{v133, v137}, ranges: dualFlag,
			wantCIDRs: []string{"10.96.0.0/24", "fd00::/108"}, wantReady: ptr(metav1.ConditionTrue), wantWrite: []string{"create", "patch/status"}},
		{name: "matching without condition is set ready", versions: []string{v133, v137}, ranges: v4Flag,
			existing:  defaultCIDR(nil, "10.96.0.0/24"),
			wantCIDRs: []string{"10.96.0.0/24"}, wantReady: ptr(metav1.ConditionTrue), wantWrite: []string{"patch/status"}},
		{name: "matching and ready is left alone", versions: []string{v133, v137}, ranges: v4Flag,
			existing:  defaultCIDR(readyTrue, "10.96.0.0/24"),
			wantCIDRs: []string{"10.96.0.0/24"}, wantReady: ptr(metav1.ConditionTrue)},
		{name: "matching with Ready=False is reported, 1.37", versions: []string{v137}, ranges: v4Flag,
			existing:  defaultCIDR(readyCond(metav1.ConditionFalse, "Broken", "routes are missing"), "10.96.0.0/24"),
			wantCIDRs: []string{"10.96.0.0/24"}, wantReady: ptr(metav1.ConditionFalse),
			wantEvent: []string{"Warning Broken Configuration matches, but routes are missing"}},
		{name: "matching with Ready=False is reported, 1.33", versions: []string{v133}, ranges: v4Flag,
			existing:  defaultCIDR(readyCond(metav1.ConditionFalse, "Broken", "routes are missing"), "10.96.0.0/24"),
			wantCIDRs: []string{"10.96.0.0/24"}, wantReady: ptr(metav1.ConditionFalse),
			wantEvent: []string{"Warning Broken routes are missing"}},
		{name: "matching with Ready=Unknown is set ready, 1.37", versions: []string{v137}, ranges: v4Flag,
			existing:  defaultCIDR(readyCond(metav1.ConditionUnknown, "Pending", "not checked"), "10.96.0.0/24"),
			wantCIDRs: []string{"10.96.0.0/24"}, wantReady: ptr(metav1.ConditionTrue), wantWrite: []string{"patch/status"}},
		{name: "matching with Ready=Unknown is reported, 1.33", versions: []string{v133}, ranges: v4Flag,
			existing:  defaultCIDR(readyCond(metav1.ConditionUnknown, "Pending", "not checked"), "10.96.0.0/24"),
			wantCIDRs: []string{"10.96.0.0/24"}, wantReady: ptr(metav1.ConditionUnknown),
			wantEvent: []string{"Warning Pending not checked"}},
		{name: "mismatch without condition, 1.37", versions: []string{v137}, ranges: v4Flag,
			existing:  defaultCIDR(nil, "10.100.0.0/24"),
			wantCIDRs: []string{"10.100.0.0/24"},
			wantEvent: []string{"Warning KubernetesDefaultServiceCIDRInconsistent The default ServiceCIDR [10.100.0.0/24] does not match the controller flag configurations [10.96.0.0/24]"}},
		{name: "mismatch without condition, 1.33", versions: []string{v133}, ranges: v4Flag,
			existing:  defaultCIDR(nil, "10.100.0.0/24"),
			wantCIDRs: []string{"10.100.0.0/24"},
			wantEvent: []string{"Warning KubernetesDefaultServiceCIDRInconsistent The default ServiceCIDR [10.100.0.0/24] does not match the flag configurations [10.96.0.0/24]"}},
		{name: "mismatch while ready, 1.37", versions: []string{v137}, ranges: v4Flag,
			existing:  defaultCIDR(readyTrue, "10.100.0.0/24"),
			wantCIDRs: []string{"10.100.0.0/24"}, wantReady: ptr(metav1.ConditionTrue),
			wantEvent: []string{"Warning KubernetesDefaultServiceCIDRInconsistent The default ServiceCIDR [10.100.0.0/24] does not match the controller flag configurations [10.96.0.0/24]"}},
		{name: "mismatch while ready, 1.33", versions: []string{v133}, ranges: v4Flag,
			existing:  defaultCIDR(readyTrue, "10.100.0.0/24"),
			wantCIDRs: []string{"10.100.0.0/24"}, wantReady: ptr(metav1.ConditionTrue),
			wantEvent: []string{"Warning KubernetesDefaultServiceCIDRInconsistent The default ServiceCIDR [10.100.0.0/24] does not match the flag configurations [10.96.0.0/24]"}},
		{name: "mismatch with Ready=False is a mismatch, 1.37", versions: []string{v137}, ranges: v4Flag,
			existing:  defaultCIDR(readyCond(metav1.ConditionFalse, "Broken", "routes are missing"), "10.100.0.0/24"),
			wantCIDRs: []string{"10.100.0.0/24"}, wantReady: ptr(metav1.ConditionFalse),
			wantEvent: []string{"Warning KubernetesDefaultServiceCIDRInconsistent The default ServiceCIDR [10.100.0.0/24] does not match the controller flag configurations [10.96.0.0/24]"}},
		{name: "mismatch with Ready=False is not ready, 1.33", versions: []string{v133}, ranges: v4Flag,
			existing:  defaultCIDR(readyCond(metav1.ConditionFalse, "Broken", "routes are missing"), "10.100.0.0/24"),
			wantCIDRs: []string{"10.100.0.0/24"}, wantReady: ptr(metav1.ConditionFalse),
			wantEvent: []string{"Warning Broken routes are missing"}},
		{name: "single-stack of the primary range is upgraded to dual stack", versions: []string{v133, v137}, ranges: dualFlag,
			existing:  defaultCIDR(readyTrue, "10.96.0.0/24"),
			wantCIDRs: []string{"10.96.0.0/24", "fd00::/108"}, wantReady: ptr(metav1.ConditionTrue), wantWrite: []string{"update"}},
		{name: "single-stack of another range is a mismatch", versions: []string{v137}, ranges: dualFlag,
			existing:  defaultCIDR(readyTrue, "10.100.0.0/24"),
			wantCIDRs: []string{"10.100.0.0/24"}, wantReady: ptr(metav1.ConditionTrue),
			wantEvent: []string{"Warning KubernetesDefaultServiceCIDRInconsistent The default ServiceCIDR [10.100.0.0/24] does not match the controller flag configurations [10.96.0.0/24 fd00::/108]"}},
		{name: "being deleted is left alone", versions: []string{v133, v137}, ranges: v4Flag,
			existing: func() *networkingv1.ServiceCIDR {
				sc := defaultCIDR(nil, "10.100.0.0/24")
				sc.DeletionTimestamp = &metav1.Time{Time: time.Now()}
				sc.Finalizers = []string{Finalizer}
				return sc
			}(),
			wantCIDRs: []string{"10.100.0.0/24"}},
	}
	for _, tt := range tests {
		for _, v := range tt.versions {
			t.Run(tt.name+"/"+v, func(t *testing.T) {
				var objs []runtime.Object
				if tt.existing != nil {
					objs = append(objs, tt.existing.DeepCopy())
				}
				f := newDefaultFixture(t, tt.ranges, v, objs...)
				if err := f.c.sync(f.ctx); err != nil {
					t.Fatalf("sync() = %v", err)
				}
				sc := f.stored()
				var gotCIDRs []string
				var gotReady *metav1.ConditionStatus
				if sc != nil {
					gotCIDRs = sc.Spec.CIDRs
					if c := meta.FindStatusCondition(sc.Status.Conditions, networkingv1.ServiceCIDRConditionReady); c != nil {
						gotReady = &c.Status
						if c.Status == metav1.ConditionTrue && c.Message != messageDefaultReady {
							t.Errorf("Ready=True message = %q, want kube-apiserver's %q", c.Message, messageDefaultReady)
						}
					}
				}
				if diff := cmp.Diff(tt.wantCIDRs, gotCIDRs); diff != "" {
					t.Errorf("spec.cidrs after a pass (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(tt.wantReady, gotReady); diff != "" {
					t.Errorf("Ready condition after a pass (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(tt.wantWrite, f.writes()); diff != "" {
					t.Errorf("writes of a pass (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(tt.wantEvent, f.events()); diff != "" {
					t.Errorf("Events of a pass (-want +got):\n%s", diff)
				}

				// A second pass on the cache as it is now reports nothing again, and writes
				// only what is still to do (the status after an upgrade to dual stack).
				f.waitCached()
				if err := f.c.sync(f.ctx); err != nil {
					t.Fatalf("second sync() = %v", err)
				}
				if got := f.events(); len(got) != 0 {
					t.Errorf("Events of a second pass = %q, want none: each is reported once", got)
				}
				if got := f.writes(); len(got) > 0 {
					t.Errorf("writes of a second pass = %q, want none", got)
				}
			})
		}
	}
}

func ptr[T any](v T) *T { return &v }

func TestDefaultControllerReportsCreateFailure(t *testing.T) {
	f := newDefaultFixture(t, v4Flag, "")
	f.client.PrependReactor("create", "servicecidrs", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "networking.k8s.io", Resource: "servicecidrs"}, DefaultServiceCIDRName, errors.New("no"))
	})
	if err := f.c.sync(f.ctx); !apierrors.IsForbidden(err) {
		t.Errorf("sync() with a create refused = %v, want the Forbidden error", err)
	}
	if diff := cmp.Diff([]string{"Warning KubernetesDefaultServiceCIDRError The default ServiceCIDR can not be created"}, f.events()); diff != "" {
		t.Errorf("Events (-want +got):\n%s", diff)
	}
}

func TestDefaultControllerReportsUpgradeFailure(t *testing.T) {
	f := newDefaultFixture(t, dualFlag, "", defaultCIDR(nil, "10.96.0.0/24"))
	f.client.PrependReactor("update", "servicecidrs", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewInvalid(schema.GroupKind{Group: "networking.k8s.io", Kind: "ServiceCIDR"}, DefaultServiceCIDRName, nil)
	})
	if err := f.c.sync(f.ctx); err != nil {
		t.Errorf("sync() with the upgrade refused = %v, want nil (reported, tried again next pass)", err)
	}
	const want = "Warning KubernetesDefaultServiceCIDRError The default ServiceCIDR can not be upgraded from 10.96.0.0/24 to dual stack [10.96.0.0/24 fd00::/108] : "
	if got := f.events(); len(got) != 1 || !strings.HasPrefix(got[0], want) {
		t.Errorf("Events = %q, want one that begins %q", got, want)
	}
}

func TestNewDefaultControllerRejectsBadArguments(t *testing.T) {
	client := fakeclient.New(fakeclient.Options{})
	cidrs := informers.NewSharedInformerFactory(client, 0).Networking().V1().ServiceCIDRs()
	v4b := netip.MustParsePrefix("10.1.0.0/24")
	tests := []struct {
		name   string
		ranges []netip.Prefix
		opts   DefaultOptions
	}{
		{name: "no range"},
		{name: "three ranges", ranges: []netip.Prefix{v4Flag[0], dualFlag[1], v4b}},
		{name: "two of one family", ranges: []netip.Prefix{v4Flag[0], v4b}},
		{name: "invalid range", ranges: []netip.Prefix{{}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if c, err := NewDefaultController(tt.ranges, client, cidrs, tt.opts); err == nil {
				t.Errorf("NewDefaultController() = %v, nil; want an error", c)
			}
		})
	}
	if _, err := NewDefaultController(v4Flag, nil, cidrs, DefaultOptions{}); err == nil {
		t.Error("NewDefaultController(nil client) = nil error")
	}
	if _, err := NewDefaultController(v4Flag, client, nil, DefaultOptions{}); err == nil {
		t.Error("NewDefaultController(nil informer) = nil error")
	}
	c, err := NewDefaultController([]netip.Prefix{netip.MustParsePrefix("10.96.0.7/24")}, client, cidrs, DefaultOptions{})
	if err != nil || c.cidrs[0] != "10.96.0.0/24" || !c.v134 {
		t.Errorf("NewDefaultController(10.96.0.7/24) = %+v, %v; want the range masked and 1.37's behaviour", c, err)
	}
}

// TestDefaultControllerRunRecreatesDeleted runs the controller as a registry does: it creates the
// default ServiceCIDR, HasSynced turns true, an Allocator serves from it, and it is created again
// after a deletion, within the interval.
func TestDefaultControllerRunRecreatesDeleted(t *testing.T) {
	f := newFixture(t, fixtureConfig{})
	c, err := NewDefaultController(v4Flag, f.client, f.cidrInf.Networking().V1().ServiceCIDRs(), DefaultOptions{Interval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(f.ctx) }()
	testenv.WaitFor(t, "HasSynced", c.HasSynced)
	f.waitReady("10.96.0.0/24")
	if err := c.Run(f.ctx); err == nil {
		t.Error("second Run() = nil, want an error")
	}
	if err := f.client.NetworkingV1().ServiceCIDRs().Delete(f.ctx, DefaultServiceCIDRName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the default ServiceCIDR to be created again", func() bool {
		sc, err := f.client.NetworkingV1().ServiceCIDRs().Get(f.ctx, DefaultServiceCIDRName, metav1.GetOptions{})
		return err == nil && meta.IsStatusConditionTrue(sc.Status.Conditions, networkingv1.ServiceCIDRConditionReady)
	})
	f.waitReady("10.96.0.0/24")
}
