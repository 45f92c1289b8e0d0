package repair

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// recorder keeps the Events a test's Controller emits.
type recorder = testenv.EventRecorder

// aged sets ipa's UID, resourceVersion and creation time (age before now).
func aged(ipa *networkingv1.IPAddress, age time.Duration) *networkingv1.IPAddress {
	ipa.UID = types.UID("uid-" + ipa.Name)
	ipa.ResourceVersion = "1"
	ipa.CreationTimestamp = metav1.NewTime(time.Now().Add(-age))
	return ipa
}

func TestOptionsLeakGrace(t *testing.T) {
	tests := []struct {
		in, want time.Duration
	}{
		{0, DefaultLeakGrace},
		{-time.Second, 0},
		{5 * time.Second, 5 * time.Second},
	}
	for _, tt := range tests {
		if got := (Options{LeakGrace: tt.in}).leakGrace(); got != tt.want {
			t.Errorf("Options{LeakGrace: %v}.leakGrace() = %v, want %v", tt.in, got, tt.want)
		}
	}
	if got := (Options{Interval: -1}).interval(); got != DefaultInterval {
		t.Errorf("Options{Interval: -1}.interval() = %v, want %v", got, DefaultInterval)
	}
}

func TestRepairIPAddressOnlyHealsWhatItMayAndReportsTheRest(t *testing.T) {
	objects := []runtime.Object{
		testenv.ServiceCIDR("kubernetes", "10.0.0.0/24"),
		svc("a/ok", "10.0.0.10"), aged(ipAddr("10.0.0.10", "a/ok"), time.Hour),
		svc("a/missing", "10.0.0.11"),
		aged(ipAddr("10.0.0.30", "a/gone"), time.Hour),   // leaked long ago: deleted
		aged(ipAddr("10.0.0.31", "a/gone"), time.Second), // leaked just now: held off
		svc("a/wrong", "10.0.0.50"), aged(ipAddr("10.0.0.50", "a/other"), time.Hour),
		svc("a/dup1", "10.0.0.60"), svc("a/dup2", "10.0.0.60"), aged(ipAddr("10.0.0.60", "a/dup1"), time.Hour),
		svc("a/far", "10.9.0.1"),
		svc("a/bad", "10.0.0.700"),
	}
	client := fake.NewClientset(objects...)
	rec := &recorder{}
	cfg := clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, Client: client}
	c, err := NewController(cfg, Options{Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := c.RunOnce(t.Context())
	if err != nil {
		t.Fatalf("RunOnce() error = %v", err)
	}
	if got := len(rep.Findings); got != 7 {
		t.Errorf("RunOnce() acted on %d findings, want 7: %+v", got, rep.Findings)
	}
	if got := c.HeldOff(); got != 1 {
		t.Errorf("HeldOff() = %d, want 1 (10.0.0.31)", got)
	}
	wantEvents := []string{
		"Warning ClusterIPAlreadyAllocated dup1",
		"Warning ClusterIPNotAllocated missing",
		"Warning ClusterIPNotValid bad",
		"Warning ClusterIPOutOfRange far",
		"Warning IPAddressNotAllocated 10.0.0.30",
		"Warning IPAddressWrongReference 10.0.0.50",
	}
	if diff := cmp.Diff(wantEvents, rec.Got()); diff != "" {
		t.Errorf("Events (-want +got):\n%s", diff)
	}
	for _, a := range client.Actions() {
		if d, ok := a.(k8stesting.DeleteActionImpl); ok {
			p := d.DeleteOptions.Preconditions
			if p == nil || p.UID == nil || p.ResourceVersion == nil || *p.UID == "" || *p.ResourceVersion == "" {
				t.Errorf("delete of IPAddress %s without a UID and resourceVersion precondition: %+v", d.Name, p)
			}
		}
	}

	after, err := Audit(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := []Finding{
		f("10.0.0.31", Leaked, ""),
		f("10.0.0.60", DuplicateOwner, "a/dup1"),
		f("10.9.0.1", OutOfRange, "a/far"),
		f("10.0.0.700", Invalid, "a/bad"),
	}
	if diff := cmp.Diff(want, after.Findings, ignoreDetail); diff != "" {
		t.Errorf("audit after one pass (-want +got):\n%s", diff)
	}
	ipa, err := client.NetworkingV1().IPAddresses().Get(t.Context(), "10.0.0.11", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("missing IPAddress not created: %v", err)
	}
	wantLabels := map[string]string{networkingv1.LabelIPAddressFamily: "IPv4", networkingv1.LabelManagedBy: "ipallocator.k8s.io"}
	if diff := cmp.Diff(wantLabels, ipa.Labels); diff != "" {
		t.Errorf("labels of the created IPAddress (-want +got):\n%s", diff)
	}

	// With no hold-off the young leak goes too.
	c2, err := NewController(cfg, Options{LeakGrace: -1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c2.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	if c2.HeldOff() != 0 {
		t.Errorf("HeldOff() with LeakGrace -1 = %d, want 0", c2.HeldOff())
	}
	if _, err := client.NetworkingV1().IPAddresses().Get(t.Context(), "10.0.0.31", metav1.GetOptions{}); err == nil {
		t.Errorf("IPAddress 10.0.0.31 still there with LeakGrace -1")
	}
}

func TestRepairIPAddressOnlyKeepsALeakThatChangedSinceTheAudit(t *testing.T) {
	client := fake.NewClientset(testenv.ServiceCIDR("kubernetes", "10.0.0.0/24"), aged(ipAddr("10.0.0.30", "a/gone"), time.Hour))
	// The live Get sees another resourceVersion than the List did: someone wrote it meanwhile.
	client.PrependReactor("get", "ipaddresses", func(k8stesting.Action) (bool, runtime.Object, error) {
		live := aged(ipAddr("10.0.0.30", "a/new"), time.Hour)
		live.ResourceVersion = "2"
		return true, live, nil
	})
	c, err := NewController(clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, Client: client}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, a := range client.Actions() {
		if a.GetVerb() == "delete" {
			t.Errorf("RunOnce deleted an IPAddress that changed since the audit")
		}
	}
}

// TestRepairLegacyRebuildsBitsAndFreesALeakAfterThreePassesAndTheGrace drives the Legacy repair
// against a real etcd with a controlled clock.
func TestRepairLegacyRebuildsBitsAndFreesALeakAfterThreePassesAndTheGrace(t *testing.T) {
	e := testenv.NewEtcd(t)
	cli := e.TestClient(t)
	ranges := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("fd00::/64")}
	storeBitmap(t, cli, etcdstore.ServiceIPsKey(""), bits(t, "10.0.0.0/24", "10.0.0.10", "10.0.0.30"))
	// No secondary bitmap: repair creates it.
	client := fake.NewClientset(svc("a/ok", "10.0.0.10", "fd00::a"), svc("a/missing", "10.0.0.11"), svc("a/far", "10.9.0.1"))
	rec := &recorder{}
	cfg := clusterip.Config{Mode: featuregate.Legacy, Ranges: ranges, Client: client, Bitmaps: etcdstore.Stores{Client: cli}}
	c, err := NewController(cfg, Options{LeakGrace: time.Minute, Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	c.now = func() time.Time { return now }

	wantHeld := []int{1, 1, 1, 0} // pass 3 has 3 sightings but only 0 s of grace; pass 4 is a minute on
	for pass, held := range wantHeld {
		if pass == 3 {
			now = now.Add(time.Minute)
		}
		if _, err := c.RunOnce(t.Context()); err != nil {
			t.Fatalf("pass %d: RunOnce() error = %v", pass+1, err)
		}
		if got := c.HeldOff(); got != held {
			t.Errorf("pass %d: HeldOff() = %d, want %d", pass+1, got, held)
		}
	}
	rep, err := Audit(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]Finding{f("10.9.0.1", OutOfRange, "a/far")}, rep.Findings, ignoreDetail); diff != "" {
		t.Errorf("audit after repair (-want +got):\n%s", diff)
	}
	wantEvents := []string{
		"Warning ClusterIPNotAllocated missing", // pass 1 sets 10.0.0.11
		"Warning ClusterIPNotAllocated ok",      // and creates the IPv6 bitmap with fd00::a
		"Warning ClusterIPOutOfRange far",       // once: the three passes after it still find the cause
	}
	if diff := cmp.Diff(wantEvents, rec.Got()); diff != "" {
		t.Errorf("Events (-want +got):\n%s", diff)
	}
}

// TestRepairLegacyNeverUndoesAConcurrentAllocation changes the bitmap between the audit's read and
// the repair's write: the compare-and-swap must fail and the concurrent bit survive.
func TestRepairLegacyNeverUndoesAConcurrentAllocation(t *testing.T) {
	e := testenv.NewEtcd(t)
	cli := e.TestClient(t)
	ranges := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}
	storeBitmap(t, cli, etcdstore.ServiceIPsKey(""), bits(t, "10.0.0.0/24"))
	client := fake.NewClientset(svc("a/missing", "10.0.0.11"))
	cfg := clusterip.Config{Mode: featuregate.Legacy, Ranges: ranges, Client: client, Bitmaps: etcdstore.Stores{Client: cli}}
	c, err := NewController(cfg, Options{LeakGrace: -1})
	if err != nil {
		t.Fatal(err)
	}
	w, err := read(t.Context(), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	storeBitmap(t, cli, etcdstore.ServiceIPsKey(""), bits(t, "10.0.0.0/24", "10.0.0.99")) // a concurrent allocation
	if _, err := c.repairBitmaps(t.Context(), w, classify(w), nil); err == nil {
		t.Errorf("repairBitmaps over a stale read succeeded; want a compare-and-swap conflict")
	}
	b, _, err := bitmap.Load(t.Context(), etcdstore.New(cli, etcdstore.ServiceIPsKey("")), netip.MustParsePrefix("10.0.0.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	if !b.Has(netip.MustParseAddr("10.0.0.99")) {
		t.Errorf("the concurrent allocation of 10.0.0.99 was undone")
	}
}

// TestRepairDualWriteHealsBothStores drives the DualWrite repair against a real etcd with a
// controlled clock: one pass fixes the IPAddress objects and the bits Services need, and frees the
// leaked IPAddress with its bit; the stale bit waits for the hold-off.
func TestRepairDualWriteHealsBothStores(t *testing.T) {
	e := testenv.NewEtcd(t)
	cli := e.TestClient(t)
	ranges := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}
	storeBitmap(t, cli, etcdstore.ServiceIPsKey(""), bits(t, "10.0.0.0/24", "10.0.0.10", "10.0.0.30", "10.0.0.40"))
	client := fake.NewClientset(
		testenv.ServiceCIDR("kubernetes", "10.0.0.0/24"),
		svc("a/ok", "10.0.0.10"), aged(ipAddr("10.0.0.10", "a/ok"), time.Hour),
		svc("a/missing", "10.0.0.11"),
		svc("a/nobit", "10.0.0.12"), aged(ipAddr("10.0.0.12", "a/nobit"), time.Hour),
		aged(ipAddr("10.0.0.30", "a/gone"), time.Hour),
	)
	cfg := clusterip.Config{Mode: featuregate.DualWrite, Ranges: ranges, Client: client, Bitmaps: etcdstore.Stores{Client: cli}}
	rec := &recorder{}
	c, err := NewController(cfg, Options{LeakGrace: time.Minute, Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	c.now = func() time.Time { return now }

	rep, err := c.RunOnce(t.Context())
	if err != nil {
		t.Fatalf("pass 1: RunOnce() error = %v", err)
	}
	want := []Finding{f("10.0.0.11", Missing, "a/missing"), f("10.0.0.12", IPAddressOnly, "a/nobit"), f("10.0.0.30", Leaked, ""), f("10.0.0.40", BitmapOnly, "")}
	if diff := cmp.Diff(want, rep.Findings, ignoreDetail); diff != "" {
		t.Errorf("pass 1 acted on (-want +got):\n%s", diff)
	}
	if got := c.HeldOff(); got != 1 {
		t.Errorf("pass 1: HeldOff() = %d, want 1 (the stale bit)", got)
	}
	after, err := Audit(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]Finding{f("10.0.0.40", BitmapOnly, "")}, after.Findings, ignoreDetail); diff != "" {
		t.Errorf("audit after pass 1 (-want +got):\n%s", diff)
	}

	now = now.Add(time.Minute)
	if _, err := c.RunOnce(t.Context()); err != nil {
		t.Fatalf("pass 2: RunOnce() error = %v", err)
	}
	if after, err = Audit(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	if !after.Consistent {
		t.Errorf("audit after pass 2: %+v, want consistent", after.Findings)
	}
	wantEvents := []string{"Warning ClusterIPNotAllocated missing", "Warning IPAddressNotAllocated 10.0.0.30"}
	if diff := cmp.Diff(wantEvents, rec.Got()); diff != "" {
		t.Errorf("Events (-want +got):\n%s", diff)
	}
}

// TestRepairDualWriteKeepsABitWhoseIPAddressAppears: a bit that looked stale keeps its place when
// the live Get finds an IPAddress (an allocation in flight when the audit read).
func TestRepairDualWriteKeepsABitWhoseIPAddressAppears(t *testing.T) {
	e := testenv.NewEtcd(t)
	cli := e.TestClient(t)
	storeBitmap(t, cli, etcdstore.ServiceIPsKey(""), bits(t, "10.0.0.0/24", "10.0.0.40"))
	client := fake.NewClientset(testenv.ServiceCIDR("kubernetes", "10.0.0.0/24"))
	client.PrependReactor("get", "ipaddresses", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, aged(ipAddr("10.0.0.40", "a/new"), 0), nil
	})
	cfg := clusterip.Config{Mode: featuregate.DualWrite, Ranges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, Client: client, Bitmaps: etcdstore.Stores{Client: cli}}
	c, err := NewController(cfg, Options{LeakGrace: -1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	rep, err := Audit(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]Finding{f("10.0.0.40", BitmapOnly, "")}, rep.Findings, ignoreDetail); diff != "" {
		t.Errorf("the bit was cleared though a live IPAddress holds it (-want +got):\n%s", diff)
	}
}

// TestRunRetriesAFailedPassAndStopsWithTheContext fails the first two Service lists: Run must
// retry (without waiting for the Interval), repair, and return nil once ctx is done.
func TestRunRetriesAFailedPassAndStopsWithTheContext(t *testing.T) {
	client := fake.NewClientset(testenv.ServiceCIDR("kubernetes", "10.0.0.0/24"), svc("a/missing", "10.0.0.11"))
	failFirst(client, "list", "services", 2, errors.New("apiserver not up yet"))
	c := hourlyController(t, client)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	testenv.WaitFor(t, "the missing IPAddress", func() bool {
		_, err := client.NetworkingV1().IPAddresses().Get(t.Context(), "10.0.0.11", metav1.GetOptions{})
		return err == nil
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run() = %v, want nil once ctx is done", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after ctx was cancelled")
	}
}

// TestRepairHoldsOffAnIPAddressNewerThanItsParent follows kubernetes#132321 as kube-apiserver
// fixed it (kubernetes#132906): a leaked IPAddress whose parent Service exists, does not hold it
// and is older than it is the IPAddress of a create of an existing Service, which kube-apiserver
// deletes itself; repair leaves it for 5 s from its creation even with no LeakGrace, and past
// that deletes it as a wrong reference. One whose parent is still of type ExternalName, whose
// update to a type with a ClusterIP may be in flight, is held for 60 s (kubernetes#135503).
func TestRepairHoldsOffAnIPAddressNewerThanItsParent(t *testing.T) {
	now := time.Now().Truncate(time.Second)
	at := func(obj metav1.Object, age time.Duration) { obj.SetCreationTimestamp(metav1.NewTime(now.Add(-age))) }
	tests := []struct {
		name              string
		parentAge, ipaAge time.Duration // no parent if parentAge is 0
		externalName      bool          // the parent is of type ExternalName
		leakGrace         time.Duration
		wantHeld          int
		wantDelete        bool
		wantEvent         string
	}{
		{name: "newer than its parent, within 5 s: held off", parentAge: time.Hour, ipaAge: 3 * time.Second, leakGrace: -1,
			wantHeld: 1},
		{name: "newer than its parent, within 5 s, with a 1 s LeakGrace: held off", parentAge: time.Hour, ipaAge: 3 * time.Second, leakGrace: time.Second,
			wantHeld: 1},
		{name: "newer than its parent, past 5 s: a wrong reference", parentAge: time.Hour, ipaAge: 6 * time.Second, leakGrace: -1,
			wantDelete: true, wantEvent: "Warning IPAddressWrongReference 10.0.0.30"},
		{name: "older than its parent: a wrong reference at once", parentAge: time.Second, ipaAge: 3 * time.Second, leakGrace: -1,
			wantDelete: true, wantEvent: "Warning IPAddressWrongReference 10.0.0.30"},
		{name: "created in the same second as its parent: a wrong reference at once", parentAge: 3 * time.Second, ipaAge: 3 * time.Second, leakGrace: -1,
			wantDelete: true, wantEvent: "Warning IPAddressWrongReference 10.0.0.30"},
		{name: "parent gone: no hold-off with no LeakGrace", ipaAge: 3 * time.Second, leakGrace: -1,
			wantDelete: true, wantEvent: "Warning IPAddressNotAllocated 10.0.0.30"},
		{name: "newer than its parent, the default LeakGrace is longer", parentAge: time.Hour, ipaAge: 6 * time.Second,
			wantHeld: 1},
		{name: "an ExternalName parent, within 60 s: held off", parentAge: time.Hour, ipaAge: 59 * time.Second, externalName: true, leakGrace: -1,
			wantHeld: 1},
		{name: "an ExternalName parent, older than the IPAddress, within 60 s: held off", parentAge: time.Second, ipaAge: 30 * time.Second, externalName: true, leakGrace: time.Second,
			wantHeld: 1},
		{name: "an ExternalName parent, past 60 s: a wrong reference", parentAge: time.Hour, ipaAge: 61 * time.Second, externalName: true, leakGrace: -1,
			wantDelete: true, wantEvent: "Warning IPAddressWrongReference 10.0.0.30"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ipa := aged(ipAddr("10.0.0.30", "a/web"), 0)
			at(ipa, tt.ipaAge)
			objects := []runtime.Object{testenv.ServiceCIDR("kubernetes", "10.0.0.0/24"), ipa}
			if tt.parentAge > 0 {
				parent := svc("a/web", "10.0.0.10")
				at(parent, tt.parentAge)
				objects = append(objects, parent)
				if tt.externalName {
					parent.Spec = corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.com"}
				} else {
					objects = append(objects, aged(ipAddr("10.0.0.10", "a/web"), time.Hour))
				}
			}
			client := fake.NewClientset(objects...)
			rec := &recorder{}
			c, err := NewController(clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, Client: client},
				Options{LeakGrace: tt.leakGrace, Recorder: rec})
			if err != nil {
				t.Fatal(err)
			}
			c.now = func() time.Time { return now }
			if _, err := c.RunOnce(t.Context()); err != nil {
				t.Fatalf("RunOnce() error = %v", err)
			}
			if got := c.HeldOff(); got != tt.wantHeld {
				t.Errorf("HeldOff() = %d, want %d", got, tt.wantHeld)
			}
			_, err = client.NetworkingV1().IPAddresses().Get(t.Context(), "10.0.0.30", metav1.GetOptions{})
			if deleted := err != nil; deleted != tt.wantDelete {
				t.Errorf("IPAddress 10.0.0.30 deleted = %v, want %v", deleted, tt.wantDelete)
			}
			var want []string
			if tt.wantEvent != "" {
				want = []string{tt.wantEvent}
			}
			if diff := cmp.Diff(want, rec.Got(), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("Events (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRepairFixesLabelsInPlace: an IPAddress whose parent is right but whose labels are not the
// allocator's is updated (never deleted), carrying the resourceVersion the audit read.
func TestRepairFixesLabelsInPlace(t *testing.T) {
	client := fake.NewClientset(testenv.ServiceCIDR("kubernetes", "10.0.0.0/24", "fd00::/64"),
		svc("a/x", "10.0.0.10", "fd00::a"),
		aged(withLabel(ipAddr("10.0.0.10", "a/x"), networkingv1.LabelIPAddressFamily, ""), time.Hour),
		aged(withLabel(ipAddr("fd00::a", "a/x"), networkingv1.LabelManagedBy, ""), time.Hour),
	)
	cfg := clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("fd00::/64")}, Client: client}
	c, err := NewController(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := c.RunOnce(t.Context())
	if err != nil {
		t.Fatalf("RunOnce() error = %v", err)
	}
	if diff := cmp.Diff([]Finding{f("10.0.0.10", WrongParent, "a/x"), f("fd00::a", WrongParent, "a/x")}, rep.Findings, ignoreDetail); diff != "" {
		t.Errorf("RunOnce() acted on (-want +got):\n%s", diff)
	}
	var updates []string
	for _, a := range client.Actions() {
		switch a := a.(type) {
		case k8stesting.UpdateActionImpl:
			ipa := a.GetObject().(*networkingv1.IPAddress)
			updates = append(updates, ipa.Name)
			if ipa.ResourceVersion != "1" {
				t.Errorf("update of %s carries resourceVersion %q, want the audit's %q", ipa.Name, ipa.ResourceVersion, "1")
			}
		case k8stesting.DeleteActionImpl, k8stesting.CreateActionImpl:
			t.Errorf("RunOnce %s IPAddress %v; want labels updated in place", a.GetVerb(), a)
		}
	}
	slices.Sort(updates)
	if diff := cmp.Diff([]string{"10.0.0.10", "fd00::a"}, updates); diff != "" {
		t.Errorf("updated IPAddresses (-want +got):\n%s", diff)
	}
	after, err := Audit(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !after.Consistent {
		t.Errorf("audit after the label fix: %+v, want consistent", after.Findings)
	}
}

// TestRepairReportsEachCauseOnce: a finding repair cannot fix (an invalid, duplicate or
// out-of-range ClusterIP) gets its Warning Event on the first pass that finds it, not again on
// every pass while it stays; once a pass no longer finds it, its return is reported again, and a
// new cause for the same Service (another address) is reported at once.
func TestRepairReportsEachCauseOnce(t *testing.T) {
	client := fake.NewClientset(
		testenv.ServiceCIDR("kubernetes", "10.0.0.0/24"),
		svc("a/far", "10.9.0.1"),
		svc("a/bad", "10.0.0.700"),
		svc("a/dup1", "10.0.0.60"), svc("a/dup2", "10.0.0.60"), aged(ipAddr("10.0.0.60", "a/dup1"), time.Hour),
	)
	rec := &recorder{}
	c, err := NewController(clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, Client: client},
		Options{Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	pass := func(when string) {
		t.Helper()
		if _, err := c.RunOnce(ctx); err != nil {
			t.Fatalf("RunOnce() %s: %v", when, err)
		}
	}
	wantEvents := func(when string, want ...string) {
		t.Helper()
		slices.Sort(want)
		if diff := cmp.Diff(want, rec.Got(), cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("Events %s (-want +got):\n%s", when, diff)
		}
	}
	first := []string{"Warning ClusterIPAlreadyAllocated dup1", "Warning ClusterIPNotValid bad", "Warning ClusterIPOutOfRange far"}
	for i := range 3 {
		pass(fmt.Sprintf("pass %d", i+1))
	}
	wantEvents("after three passes", first...)

	// The cause cleared: a ServiceCIDR now holds 10.9.0.1, and a pass creates its IPAddress.
	far := testenv.ServiceCIDR("far", "10.9.0.0/24")
	if _, err := client.NetworkingV1().ServiceCIDRs().Create(ctx, far, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pass("with 10.9.0.0/24 served")
	pass("with 10.9.0.0/24 served, again")
	notAllocated := "Warning ClusterIPNotAllocated far"
	wantEvents("once 10.9.0.1 is served", append(slices.Clone(first), notAllocated)...)

	// And back: the ServiceCIDR goes, and 10.9.0.1 is out of range again.
	if err := client.NetworkingV1().ServiceCIDRs().Delete(ctx, "far", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	pass("with 10.9.0.0/24 gone")
	pass("with 10.9.0.0/24 gone, again")
	wantEvents("once 10.9.0.1 is out of range again", append(slices.Clone(first), notAllocated, "Warning ClusterIPOutOfRange far")...)

	// A new cause for the same Service: another out-of-range address.
	s, err := client.CoreV1().Services("a").Get(ctx, "far", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.8.0.1", []string{"10.8.0.1"}
	if _, err := client.CoreV1().Services("a").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pass("with far at 10.8.0.1")
	pass("with far at 10.8.0.1, again")
	wantEvents("once far holds 10.8.0.1", append(slices.Clone(first), notAllocated, "Warning ClusterIPOutOfRange far", "Warning ClusterIPOutOfRange far",
		"Warning IPAddressWrongReference 10.9.0.1")...) // the object of 10.9.0.1, deleted
}
