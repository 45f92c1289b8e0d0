package service_test

import (
	"context"
	"encoding/json"
	"errors"
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
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/allocator/service"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/servicecidr"
)

// sharedCluster is a real kube-apiserver v1.33 in its default mode and a service.Allocator over
// servicecidr allocators fed by the same server: both allocate from the same ServiceCIDRs and
// IPAddress objects, so that the same request can be put to each.
type sharedCluster struct {
	api      kubernetes.Interface
	families map[corev1.IPFamily]*servicecidr.Allocator
	sa       *service.Allocator
}

func newSharedCluster(t *testing.T, ranges string) *sharedCluster {
	t.Helper()
	etcd := testenv.NewEtcd(t)
	api := testenv.NewKubeAPIServer(t, etcd, testenv.KubeAPIServerOptions{ServiceClusterIPRange: ranges})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	waitForDefaultNamespace(t, ctx, api.Client)
	factory := informers.NewSharedInformerFactory(api.Client, 0)
	sc := &sharedCluster{api: api.Client, families: map[corev1.IPFamily]*servicecidr.Allocator{}}
	fams := map[corev1.IPFamily]allocator.Interface{}
	var primary corev1.IPFamily
	for i, r := range strings.Split(ranges, ",") {
		f := familyOfPrefix(netip.MustParsePrefix(r))
		if i == 0 {
			primary = f
		}
		a, err := servicecidr.New(f, api.Client, factory.Networking().V1().ServiceCIDRs(), factory.Networking().V1().IPAddresses())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a.Close() })
		sc.families[f], fams[f] = a, a
	}
	factory.Start(ctx.Done())
	for _, a := range sc.families {
		go func() { _ = a.Run(ctx) }()
	}
	testenv.WaitFor(t, "the ServiceCIDR allocators to be ready", func() bool {
		for _, a := range sc.families {
			if !a.Ready() {
				return false
			}
		}
		return true
	})
	sc.sa = newV133(t, primary, fams)
	return sc
}

// create asks v1.33 to create svc; on success it deletes it again and waits until the
// allocators no longer see its addresses.
func (sc *sharedCluster) create(t *testing.T, svc *corev1.Service) (*corev1.Service, error) {
	t.Helper()
	ctx := context.Background()
	got, err := sc.api.CoreV1().Services("default").Create(ctx, svc.DeepCopy(), metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	if err := sc.api.CoreV1().Services("default").Delete(ctx, got.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	sc.waitFreed(t, got)
	return got, nil
}

// waitFreed waits until the allocators no longer hold svc's addresses.
func (sc *sharedCluster) waitFreed(t *testing.T, svc *corev1.Service) {
	t.Helper()
	sc.waitHeld(t, svc, make([]bool, len(svc.Spec.ClusterIPs)))
}

// held reports, for each of svc's addresses, whether the allocators hold it.
func (sc *sharedCluster) held(svc *corev1.Service) []bool {
	out := make([]bool, len(svc.Spec.ClusterIPs))
	for i, s := range svc.Spec.ClusterIPs {
		if ip, err := allocator.ParseClusterIP(s); err == nil {
			if a := sc.families[allocator.FamilyOf(ip)]; a != nil {
				out[i] = a.Has(ip)
			}
		}
	}
	return out
}

// waitHeld waits until the allocators hold exactly the addresses of svc that want says.
func (sc *sharedCluster) waitHeld(t *testing.T, svc *corev1.Service, want []bool) {
	t.Helper()
	testenv.WaitFor(t, "the allocators to see the addresses of "+svc.Name, func() bool {
		return slices.Equal(sc.held(svc), want)
	})
}

// sync waits until the allocators' informer has seen every IPAddress event so far: it creates and
// deletes a canary IPAddress object and waits for both, which the watch delivers after the
// earlier events.
func (sc *sharedCluster) sync(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	canary := netip.MustParseAddr("10.96.254.254")
	a := sc.families[corev1.IPv4Protocol]
	obj := &networkingv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Name: canary.String()},
		Spec: networkingv1.IPAddressSpec{ParentRef: &networkingv1.ParentReference{Resource: "services", Namespace: "default", Name: "canary"}}}
	if _, err := sc.api.NetworkingV1().IPAddresses().Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the canary IPAddress to be seen", func() bool { return a.Has(canary) })
	if err := sc.api.NetworkingV1().IPAddresses().Delete(ctx, obj.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the canary IPAddress to be gone", func() bool { return !a.Has(canary) })
}

// ipAddressNames lists the names of the IPAddress objects whose parent is the Service name.
func (sc *sharedCluster) ipAddressNames(t *testing.T, name string) []string {
	t.Helper()
	l, err := sc.api.NetworkingV1().IPAddresses().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ipa := range l.Items {
		if ipa.Spec.ParentRef != nil && ipa.Spec.ParentRef.Name == name {
			out = append(out, ipa.Name)
		}
	}
	slices.Sort(out)
	return out
}

// createRecordingIPAddresses creates svc through kube-apiserver and returns the stored Service
// and the names of the IPAddress objects kube-apiserver created for it, sorted. They are taken
// from a watch started before the create, not from a list after it: v1.33's own IPAddress repair
// loop compares an IPAddress's name with the Service's ClusterIPs as strings, so it deletes the
// object of a ClusterIP it stored in another spelling ("fd00:10:96:0:0:0:0:b" holds
// fd00:10:96::b) as a "wrong reference" moments after the create, and a list may miss it.
func (sc *sharedCluster) createRecordingIPAddresses(t *testing.T, svc *corev1.Service) (*corev1.Service, []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.WaitTimeout)
	defer cancel()
	ipas := sc.api.NetworkingV1().IPAddresses()
	l, err := ipas.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := ipas.Watch(ctx, metav1.ListOptions{ResourceVersion: l.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	got, err := sc.api.CoreV1().Services("default").Create(ctx, svc.DeepCopy(), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kube-apiserver refused it: %v", err)
	}
	var names []string
	for len(names) < len(got.Spec.ClusterIPs) {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("the IPAddress watch ended with %v of %s's IPAddress objects seen", names, svc.Name)
			}
			if ipa, isIPA := ev.Object.(*networkingv1.IPAddress); isIPA && ev.Type == watch.Added &&
				ipa.Spec.ParentRef != nil && ipa.Spec.ParentRef.Name == svc.Name && !slices.Contains(names, ipa.Name) {
				names = append(names, ipa.Name)
			}
		case <-ctx.Done():
			t.Fatalf("kube-apiserver created %v of %s's IPAddress objects within %v", names, svc.Name, testenv.WaitTimeout)
		}
	}
	slices.Sort(names)
	return got, names
}

// TestServiceAllocatorAnswersAsKubeAPIServer puts the same Service to a real kube-apiserver
// v1.33.13 and to service.Allocator over servicecidr allocators of the same cluster, and checks
// that the two agree: on failure the status code, reason, field paths and texts; on success the
// stored ClusterIP fields and the IPAddress objects the address got.
func TestServiceAllocatorAnswersAsKubeAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping kube-apiserver test in -short mode")
	}
	sc := newSharedCluster(t, "10.96.0.0/16,fd00:10:96::/112")
	ctx := context.Background()

	// A ServiceCIDR that is not ready: no kube-controller-manager runs, so set its condition.
	notReady := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "not-ready"},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.100.0.0/24"}}}
	notReady, err := sc.api.NetworkingV1().ServiceCIDRs().Create(ctx, notReady, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	notReady.Status.Conditions = []metav1.Condition{{Type: networkingv1.ServiceCIDRConditionReady,
		Status: metav1.ConditionFalse, Reason: "Test", LastTransitionTime: metav1.Now()}}
	if _, err := sc.api.NetworkingV1().ServiceCIDRs().UpdateStatus(ctx, notReady, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The allocators see it once they refuse its addresses as not ready. kube-apiserver's own
	// allocators may still take one before they see the condition: waitRefused retries.
	testenv.WaitFor(t, "the allocator to see ServiceCIDR not-ready", func() bool {
		err := sc.families[corev1.IPv4Protocol].DryRun().Allocate(ctx, netip.MustParseAddr("10.100.0.1"), allocator.Owner{})
		return errors.Is(err, allocator.ErrNotReady)
	})

	// A Service created through v1.33 holds this address.
	blocker := matrixService("blocker", matrixSpec{ClusterIP: strp("10.96.5.5"), ClusterIPs: listp("10.96.5.5")})
	if _, err := sc.api.CoreV1().Services("default").Create(ctx, blocker, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the allocator to see 10.96.5.5 held", func() bool {
		return sc.families[corev1.IPv4Protocol].Has(netip.MustParseAddr("10.96.5.5"))
	})

	require := "RequireDualStack"
	refused := []struct {
		name string
		spec matrixSpec
	}{
		{"a chosen address in a ServiceCIDR that is not ready", matrixSpec{ClusterIP: strp("10.100.0.10"), ClusterIPs: listp("10.100.0.10")}},
		{"a chosen address in a ServiceCIDR that is not ready, spelled with a leading zero", matrixSpec{ClusterIP: strp("10.100.0.011"), ClusterIPs: listp("10.100.0.011")}},
		{"a chosen secondary in a ServiceCIDR that is not ready", matrixSpec{IPFamilyPolicy: &require,
			ClusterIP: strp("fd00:10:96::77"), ClusterIPs: listp("fd00:10:96::77", "10.100.0.12")}},
		{"a chosen address that is taken", matrixSpec{ClusterIP: strp("10.96.5.5"), ClusterIPs: listp("10.96.5.5")}},
		{"a chosen address that is taken, IPv4-mapped", matrixSpec{ClusterIP: strp("::ffff:10.96.5.5"), ClusterIPs: listp("::ffff:10.96.5.5")}},
		{"a chosen address in no ServiceCIDR", matrixSpec{ClusterIP: strp("10.97.0.5"), ClusterIPs: listp("10.97.0.5")}},
		{"the network address", matrixSpec{ClusterIP: strp("10.96.0.0"), ClusterIPs: listp("10.96.0.0")}},
		{"the IPv6 network address, upper case", matrixSpec{ClusterIP: strp("FD00:10:96::"), ClusterIPs: listp("FD00:10:96::")}},
	}
	for i, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			name := "refused-" + string(rune('a'+i))
			svc := matrixService(name, tt.spec)
			before := sc.held(svc)
			var apiErr error
			testenv.WaitFor(t, "kube-apiserver to refuse "+name, func() bool {
				_, apiErr = sc.create(t, svc)
				return apiErr != nil
			})
			// v1.33 allocates the families in map order and, on create, does not give back what
			// the first took when the second fails (the IPAddress object stays until its repair
			// loop frees it): remove what it left, so that our allocators find the same free
			// addresses.
			if left := sc.ipAddressNames(t, name); len(left) > 0 {
				for _, ipa := range left {
					t.Logf("kube-apiserver v1.33 left IPAddress %s of the refused Service %s", ipa, name)
					if err := sc.api.NetworkingV1().IPAddresses().Delete(ctx, ipa, metav1.DeleteOptions{}); err != nil {
						t.Fatal(err)
					}
				}
				sc.sync(t)
			}
			sc.waitHeld(t, svc, before)
			_, err := sc.sa.Allocate(ctx, svc.DeepCopy(), false)
			if err == nil {
				t.Fatalf("service.Allocator accepted what kube-apiserver refused with %v", apiErr)
			}
			if diff := cmp.Diff(statusOfErr(t, apiErr), statusOfErr(t, err)); diff != "" {
				t.Errorf("service.Allocator's status differs from kube-apiserver's (-v1.33 +ours):\n%s", diff)
			}
		})
	}

	accepted := []struct {
		name string
		spec matrixSpec
	}{
		{"IPv4 with a leading zero", matrixSpec{ClusterIP: strp("10.96.0.010"), ClusterIPs: listp("10.96.0.010")}},
		{"IPv4-mapped IPv6", matrixSpec{ClusterIP: strp("::ffff:10.96.0.11"), ClusterIPs: listp("::ffff:10.96.0.11")}},
		{"upper-case IPv6", matrixSpec{ClusterIP: strp("FD00:10:96::A"), ClusterIPs: listp("FD00:10:96::A")}},
		{"uncompressed IPv6", matrixSpec{ClusterIP: strp("fd00:10:96:0:0:0:0:b"), ClusterIPs: listp("fd00:10:96:0:0:0:0:b")}},
		{"a dual-stack pair", matrixSpec{IPFamilyPolicy: &require, ClusterIP: strp("FD00:10:96::C"), ClusterIPs: listp("FD00:10:96::C", "10.96.0.012")}},
	}
	for i, tt := range accepted {
		t.Run(tt.name, func(t *testing.T) {
			name := "accepted-" + string(rune('a'+i))
			svc := matrixService(name, tt.spec)
			got, wantObjs := sc.createRecordingIPAddresses(t, svc)
			if err := sc.api.CoreV1().Services("default").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			sc.waitFreed(t, got)

			ours := svc.DeepCopy()
			txn, err := sc.sa.Allocate(ctx, ours, false)
			if err != nil {
				t.Fatalf("service.Allocator refused what kube-apiserver accepted: %v", err)
			}
			if err := txn.Commit(ctx); err != nil {
				t.Fatalf("Commit() = %v", err)
			}
			type fields struct {
				ClusterIP  string
				ClusterIPs []string
				IPFamilies []corev1.IPFamily
				Policy     *corev1.IPFamilyPolicy
				IPAddress  []string
			}
			want := fields{got.Spec.ClusterIP, got.Spec.ClusterIPs, got.Spec.IPFamilies, got.Spec.IPFamilyPolicy, wantObjs}
			have := fields{ours.Spec.ClusterIP, ours.Spec.ClusterIPs, ours.Spec.IPFamilies, ours.Spec.IPFamilyPolicy, sc.ipAddressNames(t, name)}
			if diff := cmp.Diff(want, have); diff != "" {
				t.Errorf("service.Allocator's Service and IPAddress objects differ from kube-apiserver's (-v1.33 +ours):\n%s", diff)
			}
			if err := sc.sa.Release(ctx, ours); err != nil {
				t.Fatal(err)
			}
			if left := sc.ipAddressNames(t, name); len(left) > 0 {
				t.Errorf("IPAddress objects left after Release: %v", left)
			}
		})
	}
}

// TestServiceUpdateWithoutClusterIPsKubeAPIServer records what kube-apiserver v1.33.13 answers to
// the update TestServiceAllocatorUpdateOfServiceWithoutClusterIPs makes: a stored Service with
// ipFamilies but no clusterIPs (written straight to etcd, as an older or foreign writer could),
// upgraded to RequireDualStack. v1.33 indexes past the end of clusterIPs and the request ends in a
// panic, with no Status, so there is no answer to copy; service.Allocator answers with a 422.
func TestServiceUpdateWithoutClusterIPsKubeAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping kube-apiserver test in -short mode")
	}
	etcd := testenv.NewEtcd(t)
	api := testenv.NewKubeAPIServer(t, etcd, testenv.KubeAPIServerOptions{ServiceClusterIPRange: "10.96.0.0/16,fd00:10:96::/112"})
	ctx := context.Background()
	waitForDefaultNamespace(t, ctx, api.Client)

	single := corev1.IPFamilyPolicySingleStack
	stored := matrixService("bare", matrixSpec{})
	stored.APIVersion, stored.Kind = "v1", "Service"
	stored.UID, stored.CreationTimestamp = "bare-uid", metav1.Now()
	stored.Spec.IPFamilyPolicy = &single
	stored.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol}
	data, err := json.Marshal(stored)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := etcd.TestClient(t).Put(ctx, "/registry/services/specs/default/bare", string(data)); err != nil {
		t.Fatal(err)
	}
	old, err := api.Client.CoreV1().Services("default").Get(ctx, "bare", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(old.Spec.ClusterIPs) != 0 || len(old.Spec.IPFamilies) != 1 {
		t.Fatalf("stored Service reads back with clusterIPs %q and ipFamilies %q, want none and one", old.Spec.ClusterIPs, old.Spec.IPFamilies)
	}
	upgrade := func(svc *corev1.Service) *corev1.Service {
		upd := svc.DeepCopy()
		require := corev1.IPFamilyPolicyRequireDualStack
		upd.Spec.IPFamilyPolicy = &require
		upd.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
		return upd
	}
	uctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, apiErr := api.Client.CoreV1().Services("default").Update(uctx, upgrade(old), metav1.UpdateOptions{})
	var se *apierrors.StatusError
	switch {
	case apiErr == nil:
		t.Errorf("kube-apiserver accepted the upgrade; the 422 of service.Allocator needs another look")
	case errors.As(apiErr, &se):
		t.Errorf("kube-apiserver answered with a Status (%d %s: %s); service.Allocator should answer the same", se.Status().Code, se.Status().Reason, se.Status().Message)
	default:
		t.Logf("kube-apiserver v1.33 answers with no Status: %v", apiErr)
	}

	mc := newMemCluster(t, matrixCluster{Name: "dual", Ranges: []string{"10.96.0.0/16", "fd00:10:96::/112"}}, optionsOf(t, "1.33.13"))
	_, err = mc.sa.Update(ctx, old, upgrade(old), false)
	if st := statusOfErr(t, err); st.Code != 422 {
		t.Errorf("service.Allocator.Update() status = %d %s, want 422", st.Code, st.Reason)
	}
	mc.checkHeld(t, "after the refused update", nil)
}
