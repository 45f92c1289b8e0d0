package main

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/yaml"

	cip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/localcluster"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/ipaddress"
	"github.com/kube-ipam/clusterip/repair"
	"github.com/kube-ipam/clusterip/reservation"
	"github.com/kube-ipam/clusterip/reservation/webhook"
	"github.com/kube-ipam/clusterip/servicecidr"
)

// rbacDir holds the ClusterRoles (and the Role) the repository ships.
const rbacDir = "../../deploy/rbac"

// The users of the RBAC tests and the files of the roles bound to each, relative to rbacDir: a
// ClusterRole or Role of rbacDir, or the ClusterRole of a manifest elsewhere (webhookManifest).
var rbacUsers = map[string][]string{
	"checker":        {"check.yaml"},
	"repairer":       {"check.yaml", "check-repair.yaml"},
	"bitmap-remover": {"check.yaml", "check-repair.yaml", "remove-stale-bitmaps.yaml"},
	"registry":       {"registry.yaml"},
	// A registry with clusterip.Config.Reservations.
	"registry-reservations": {"registry.yaml", "registry-reservations.yaml"},
	"lifecycle":             {"registry.yaml", "servicecidr-lifecycle.yaml"},
	"reserver":              {"reservations.yaml"},
	"webhook":               {webhookManifest, webhookManifest + roleSuffix},
	"nobody":                nil,
}

// roleSuffix names, after a manifest's file in rbacUsers, the Role the manifest holds besides its
// ClusterRole (the webhook's hand-out records, in its own namespace).
const roleSuffix = "#Role"

// TestShippedRolesGrantExactlyWhatEachUserNeeds runs a real kube-apiserver v1.33 with RBAC
// authorization and an audit log, applies the roles of rbacUsers (applyRoles), and works as a user
// bound to each, judging by what the server logged of that user:
//   - with clusterip-check alone, check audits (with and without etcd) and asks for nothing but
//     get and list; repair exits 2 naming the permissions it lacks, and writes nothing,
//     neither through the API server nor to the bitmap in etcd; with no role at all, check
//     exits 2 at once naming what clusterip-check grants;
//   - with clusterip-check-repair too, repair --dry-run writes nothing, though it may, and
//     repair repairs, using each verb the role grants;
//   - with clusterip-registry, allocators built by clusterip.New allocate and release in
//     DualWrite and IPAddressOnly mode;
//   - with clusterip-servicecidr-lifecycle too, the ServiceCIDR lifecycle controller adds its
//     finalizer and Ready condition, blocks a deletion with an Event, and lets it go.
//
// No request of a bound user is refused (403), and the verbs each user used are exactly those
// its roles grant: the roles are enough, and no broader than the code.
func TestShippedRolesGrantExactlyWhatEachUserNeeds(t *testing.T) {
	t.Parallel()
	e := testenv.NewEtcd(t)
	var users []localcluster.User
	for name := range rbacUsers {
		users = append(users, localcluster.User{Name: name})
	}
	api := testenv.NewKubeAPIServer(t, e, testenv.KubeAPIServerOptions{
		ServiceClusterIPRange: "10.96.0.0/24", AuthorizationMode: "RBAC", AuditLog: true, Users: users,
	})
	ctx := t.Context()
	grants := applyRoles(t, api.Client)
	waitForDefaultServiceCIDR(t, api.Client)
	kubeconfigOf := func(user string) string {
		return writeKubeconfigWithToken(t, api.Config.Host, api.UserConfig(user).BearerToken)
	}
	etcdFlags := []string{"--etcd-servers", strings.Join(e.Endpoints(), ",")}
	log := &auditLog{path: api.AuditLogPath}

	// The seeds, one finding for each write repair makes: a Service whose IPAddress is gone
	// (create), an IPAddress with another managed-by label (update), a leaked IPAddress (delete),
	// and a stale bit, which repair clears in etcd.
	for name, ip := range map[string]string{"s1": "10.96.0.10", "s2": "10.96.0.11"} {
		if _, err := api.Client.CoreV1().Services("default").Create(ctx, testenv.ClusterIPService(name, ip), metav1.CreateOptions{}); err != nil {
			t.Fatalf("create Service %s: %v", name, err)
		}
	}
	deleteIPAddressOfNewService(t, api.Client, "10.96.0.10")
	ipa, err := api.Client.NetworkingV1().IPAddresses().Get(ctx, "10.96.0.11", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ipa.Labels[networkingv1.LabelManagedBy] = "someone-else"
	if _, err := api.Client.NetworkingV1().IPAddresses().Update(ctx, ipa, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("relabel the IPAddress of Service s2: %v", err)
	}
	if _, err := api.Client.NetworkingV1().IPAddresses().Create(ctx, leakedIPAddress("10.96.0.200"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("seed a leaked IPAddress: %v", err)
	}
	bitmapKey := etcdstore.ServiceIPsKey("")
	setBit(t, etcdstore.New(e.TestClient(t), bitmapKey), "10.96.0.201")
	seeded := []repair.Finding{
		{IP: "10.96.0.10", Class: repair.Missing, Service: "default/s1"},
		{IP: "10.96.0.11", Class: repair.WrongParent, Service: "default/s2"},
		{IP: "10.96.0.200", Class: repair.Leaked},
		{IP: "10.96.0.201", Class: repair.BitmapOnly},
	}

	t.Run("check with the read-only role audits and writes nothing", func(t *testing.T) {
		from := log.mark(t)
		kubeconfig := kubeconfigOf("checker")
		for _, args := range [][]string{
			slices.Concat([]string{"check", "--kubeconfig", kubeconfig, "-o", "json"}, etcdFlags),
			{"check", "--kubeconfig", kubeconfig, "-o", "json"}, // the Service CIDRs from the ServiceCIDR
		} {
			rep := checkJSON(t, exitProblem, args...)
			want := seeded
			if !slices.Contains(args, etcdFlags[0]) {
				want = seeded[:3] // the stale bit is not seen without etcd
			}
			if diff := cmp.Diff(want, rep.Findings, cmpopts.IgnoreFields(repair.Finding{}, "Detail")); diff != "" {
				t.Errorf("clusterip %q: findings (-want +got):\n%s", args, diff)
			}
		}
		log.checkUsedExactly(t, from, "checker", grants.of("checker"))
	})

	t.Run("repair with the read-only role exits 2 naming what it lacks and writes nothing", func(t *testing.T) {
		from := log.mark(t)
		before := modRevision(t, e, bitmapKey)
		checkCouldNotRun(t, slices.Concat([]string{"repair", "--kubeconfig", kubeconfigOf("checker"), "--leak-grace", "0"}, etcdFlags),
			`missing RBAC permission at API server `+api.Config.Host+`: user "checker" may not create, update, delete ipaddresses.networking.k8s.io, which clusterip repair in DualWrite mode needs; bind the ClusterRole clusterip-check-repair`)
		if writes := log.writes(t, from, "checker"); len(writes) > 0 {
			t.Errorf("repair without clusterip-check-repair asked the API server to %q", writes)
		}
		if after := modRevision(t, e, bitmapKey); after != before {
			t.Errorf("repair without clusterip-check-repair wrote the bitmap at %s (mod revision %d, then %d)", bitmapKey, before, after)
		}
	})

	t.Run("a user with no role exits 2 at once naming what check needs", func(t *testing.T) {
		start := time.Now()
		checkCouldNotRun(t, []string{"check", "--kubeconfig", kubeconfigOf("nobody")},
			`user "nobody" may not list, get services and list, get servicecidrs.networking.k8s.io and list, get ipaddresses.networking.k8s.io and list namespaces, which clusterip check in IPAddressOnly mode needs; bind the ClusterRole clusterip-check`)
		checkCouldNotRun(t, slices.Concat([]string{"repair", "--kubeconfig", kubeconfigOf("nobody")}, etcdFlags),
			"bind the ClusterRoles clusterip-check and clusterip-check-repair")
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("check without any role took %v to give up, want an answer at once", d)
		}
	})

	t.Run("repair --dry-run with the repair role writes nothing", func(t *testing.T) {
		from := log.mark(t)
		before := modRevision(t, e, bitmapKey)
		args := slices.Concat([]string{"repair", "--dry-run", "--kubeconfig", kubeconfigOf("repairer"), "--leak-grace", "0", "-o", "json"}, etcdFlags)
		rep := checkJSON(t, exitProblem, args...)
		if diff := cmp.Diff(seeded, rep.Findings, cmpopts.IgnoreFields(repair.Finding{}, "Detail")); diff != "" {
			t.Errorf("repair --dry-run: findings (-want +got):\n%s", diff)
		}
		if writes := log.writes(t, from, "repairer"); len(writes) > 0 {
			t.Errorf("repair --dry-run asked the API server to %q", writes)
		}
		if after := modRevision(t, e, bitmapKey); after != before {
			t.Errorf("repair --dry-run wrote the bitmap at %s (mod revision %d, then %d)", bitmapKey, before, after)
		}
	})

	t.Run("repair with the repair role repairs", func(t *testing.T) {
		from := log.mark(t)
		args := slices.Concat([]string{"repair", "--kubeconfig", kubeconfigOf("repairer"), "--leak-grace", "0", "-o", "json"}, etcdFlags)
		if rep := checkJSON(t, exitOK, args...); !rep.Consistent {
			t.Errorf("repair left %v", rep.Findings)
		}
		checkJSON(t, exitOK, "check", "--kubeconfig", kubeconfigOf("repairer"), "-o", "json") // reads the ServiceCIDR kubernetes
		log.checkUsedExactly(t, from, "repairer", grants.of("repairer"))
	})

	// startRegistry builds and runs allocators as user with cfg (its Client and Informers set
	// here) until the test ends.
	startRegistry := func(t *testing.T, user string, cfg cip.Config) *cip.Allocators {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		client := kubernetes.NewForConfigOrDie(api.UserConfig(user))
		factory := informers.NewSharedInformerFactory(client, 0)
		cfg.Client, cfg.Informers = client, factory
		cfg.Ranges = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/24")}
		allocs, err := cip.New(ctx, cfg)
		if err != nil {
			cancel()
			t.Fatalf("clusterip.New as the %s user: %v", user, err)
		}
		factory.Start(ctx.Done())
		done := make(chan error, 1)
		go func() { done <- allocs.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done; factory.Shutdown(); allocs.Close() })
		if err := allocs.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		return allocs
	}
	// allocateAndRelease allocates a chosen address and the next free one for a Service of the
	// user's, then releases both and an address in no ServiceCIDR the allocator knows (its
	// ServiceCIDR went without the lifecycle controller), whose object Release reads first.
	allocateAndRelease := func(t *testing.T, user string, a allocator.Interface, name string) {
		t.Helper()
		ctx := t.Context()
		owner := allocator.Owner{Resource: "services", Namespace: "default", Name: name}
		// The chosen address first: AllocateNext could otherwise take it.
		chosen := netip.MustParseAddr("10.96.0.50")
		if err := a.Allocate(ctx, chosen, owner); err != nil {
			t.Fatalf("Allocate(%s) as the %s user: %v", chosen, user, err)
		}
		ip, err := a.AllocateNext(ctx, owner)
		if err != nil {
			t.Fatalf("AllocateNext as the %s user: %v", user, err)
		}
		orphan := netip.MustParseAddr("10.98.0.7")
		if _, err := api.Client.NetworkingV1().IPAddresses().Create(ctx, ipaddress.ObjectFor(orphan, owner, ipaddress.DefaultManagedBy), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, ip := range []netip.Addr{ip, chosen, orphan} {
			if err := a.Release(ctx, ip); err != nil {
				t.Errorf("Release(%s) as the %s user: %v", ip, user, err)
			}
			if _, err := api.Client.NetworkingV1().IPAddresses().Get(ctx, ip.String(), metav1.GetOptions{}); err == nil {
				t.Errorf("Release(%s) as the %s user left its IPAddress", ip, user)
			}
		}
	}

	t.Run("the registry role allocates and releases in every mode", func(t *testing.T) {
		from := log.mark(t)
		for _, mode := range []featuregate.Mode{featuregate.DualWrite, featuregate.IPAddressOnly} {
			t.Run(mode.String(), func(t *testing.T) {
				cfg := cip.Config{Mode: mode}
				if mode == featuregate.DualWrite {
					cfg.Bitmaps = etcdstore.Stores{Client: e.TestClient(t)}
				}
				allocs := startRegistry(t, "registry", cfg)
				allocateAndRelease(t, "registry", allocs.For(corev1.IPv4Protocol), "registry-"+strings.ToLower(mode.String()))
			})
		}
		log.checkUsedExactly(t, from, "registry", grants.of("registry"))
	})

	t.Run("the registry role with its reservations role claims and retains", func(t *testing.T) {
		from := log.mark(t)
		const ns = "retaining"
		if _, err := api.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
			Annotations: map[string]string{reservation.AnnotationMaxRetained: "4"}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		rc, err := reservation.New(api.Client)
		if err != nil {
			t.Fatal(err)
		}
		kept := netip.MustParseAddr("10.96.0.60")
		web := types.NamespacedName{Namespace: ns, Name: "web"}
		if err := rc.Reserve(ctx, reservation.Reservation{Addr: kept, For: web, Reason: "rbac"}); err != nil {
			t.Fatal(err)
		}
		allocs := startRegistry(t, "registry-reservations", cip.Config{Mode: featuregate.IPAddressOnly, Reservations: true})
		allocateAndRelease(t, "registry-reservations", allocs.For(corev1.IPv4Protocol), "registry-reservations")
		service := func(name string, annotations map[string]string) *corev1.Service {
			return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations},
				Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Ports: []corev1.ServicePort{{Port: 80}}}}
		}
		// The create of the Service a reservation is kept for claims it (an update of its object),
		// once the informer shows it.
		poll(t, "a dry run to show the reservation", func() bool {
			svc := service(web.Name, nil)
			_, err := allocs.Services().Allocate(ctx, svc, true)
			return err == nil && slices.Equal(svc.Spec.ClusterIPs, []string{kept.String()})
		})
		svc := service(web.Name, nil)
		if _, err := allocs.Services().Allocate(ctx, svc, false); err != nil || !slices.Equal(svc.Spec.ClusterIPs, []string{kept.String()}) {
			t.Fatalf("the registry gave %s %v, %v; want the address reserved for it, %s", web, svc.Spec.ClusterIPs, err, kept)
		}
		// A Retain Service of the opted-in namespace keeps its address when it is released (an
		// update of its object into a reservation).
		db := service("db", map[string]string{reservation.AnnotationReleasePolicy: "Retain"})
		if _, err := allocs.Services().Allocate(ctx, db, false); err != nil {
			t.Fatalf("Allocate(%s/db) as the registry-reservations user: %v", ns, err)
		}
		if err := allocs.Services().Release(ctx, db); err != nil {
			t.Fatalf("Release(%s/db) as the registry-reservations user: %v", ns, err)
		}
		obj, err := api.Client.NetworkingV1().IPAddresses().Get(ctx, db.Spec.ClusterIPs[0], metav1.GetOptions{})
		if r, ok := reservation.FromObject(obj); err != nil || !ok || r.For != (types.NamespacedName{Namespace: ns, Name: "db"}) {
			t.Errorf("after the release of the Retain Service %s/db, %s = %v, %v; want its reservation", ns, db.Spec.ClusterIPs[0], obj, err)
		}
		log.checkUsedExactly(t, from, "registry-reservations", grants.of("registry-reservations"))
	})

	t.Run("check reports each namespace's reservations against its cap", func(t *testing.T) {
		// The registry's subtest above left one reservation in the namespace "retaining" (its
		// Retain Service db, released), whose cap is 4; no ServiceCIDR is capped. It also left
		// the allocation of the Service web, which exists only in the registry: a finding, so
		// check exits 1.
		rep := checkJSON(t, exitProblem, "check", "--kubeconfig", kubeconfigOf("checker"), "-o", "json")
		want := &repair.Caps{Namespaces: []repair.CapUsage{{Namespace: "retaining", Reserved: 1, Cap: "4", State: repair.CapOK}}}
		if diff := cmp.Diff(want, rep.Caps); diff != "" {
			t.Errorf("check's caps (-want +got):\n%s", diff)
		}
		r := clusterip(t, "check", "--kubeconfig", kubeconfigOf("checker"))
		if row := regexp.MustCompile(`(?m)^\s*retaining\s+1\s+4\s+ok\s*$`); r.code != exitProblem || !row.MatchString(r.stdout) {
			t.Errorf("check's table: exit %d; want %d and a row %q\nstdout:\n%s", r.code, exitProblem, row, r.stdout)
		}
	})

	t.Run("the lifecycle role runs the ServiceCIDR lifecycle controller", func(t *testing.T) {
		from := log.mark(t)
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		client := kubernetes.NewForConfigOrDie(api.UserConfig("lifecycle"))
		broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
		broadcaster.StartRecordingToSink(ctx.Done())
		defer broadcaster.Shutdown()
		factory := informers.NewSharedInformerFactory(client, 0)
		nw := factory.Networking().V1()
		c, err := servicecidr.NewLifecycleController(client, nw.ServiceCIDRs(), nw.IPAddresses(), servicecidr.LifecycleOptions{
			GracePeriod: -1, RecheckInterval: time.Second, Recorder: broadcaster.NewRecorder(scheme.Scheme, "clusterip-test"),
		})
		if err != nil {
			t.Fatal(err)
		}
		factory.Start(ctx.Done())
		defer factory.Shutdown()
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx, 1) }()
		stop := sync.OnceFunc(func() { cancel(); <-done })
		defer stop()

		admin := api.Client.NetworkingV1()
		if _, err := admin.ServiceCIDRs().Create(ctx, &networkingv1.ServiceCIDR{
			ObjectMeta: metav1.ObjectMeta{Name: "extra"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.97.0.0/28"}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		poll(t, "the finalizer and Ready condition on ServiceCIDR extra", func() bool {
			sc, err := admin.ServiceCIDRs().Get(ctx, "extra", metav1.GetOptions{})
			return err == nil && slices.Contains(sc.Finalizers, servicecidr.Finalizer) && readyStatus(sc) == metav1.ConditionTrue
		})
		if _, err := admin.IPAddresses().Create(ctx, &networkingv1.IPAddress{
			ObjectMeta: metav1.ObjectMeta{Name: "10.97.0.5"},
			Spec:       networkingv1.IPAddressSpec{ParentRef: &networkingv1.ParentReference{Resource: "services", Namespace: "default", Name: "s9"}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := admin.ServiceCIDRs().Delete(ctx, "extra", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		poll(t, "the deletion of ServiceCIDR extra to be blocked, with an Event", func() bool {
			sc, err := admin.ServiceCIDRs().Get(ctx, "extra", metav1.GetOptions{})
			if err != nil || readyStatus(sc) != metav1.ConditionFalse {
				return false
			}
			evs, err := api.Client.EventsV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
			return err == nil && slices.ContainsFunc(evs.Items, func(ev eventsv1.Event) bool {
				return ev.Regarding.Name == "extra" && ev.Reason == servicecidr.EventReasonTerminating
			})
		})
		if err := admin.IPAddresses().Delete(ctx, "10.97.0.5", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		poll(t, "ServiceCIDR extra to be gone", func() bool {
			_, err := admin.ServiceCIDRs().Get(ctx, "extra", metav1.GetOptions{})
			return err != nil
		})
		stop()
		// The controller's own verbs, and the reads of the registry's that it shares (its
		// informers, and the List before a finalizer comes off). An Event repeated soon after
		// (the broadcaster patches it) need not happen here.
		want := map[string]bool{}
		for a := range grants["servicecidr-lifecycle.yaml"] {
			want[a] = true
		}
		for _, a := range []string{"list servicecidrs.networking.k8s.io", "watch servicecidrs.networking.k8s.io",
			"list ipaddresses.networking.k8s.io", "watch ipaddresses.networking.k8s.io"} {
			if !grants["registry.yaml"][a] {
				t.Errorf("clusterip-registry does not grant %q, which the lifecycle controller needs of it", a)
			}
			want[a] = true
		}
		delete(want, "patch events.events.k8s.io")
		log.checkUsed(t, from, "lifecycle", grants.of("lifecycle"), want)
	})
}

// TestShippedRolesOfReservationsAndBitmapRemovalGrantExactlyWhatEachUserNeeds runs a real stock
// kube-apiserver v1.37.2 (IPAddressOnly, identity Leases with peer addresses) with RBAC
// authorization and an audit log, applies the roles as TestShippedRolesGrantExactlyWhatEachUserNeeds
// does, and works as a user bound to each role of a command that needs such a server:
//   - with clusterip-remove-stale-bitmaps (a Role in kube-system) besides the repair roles,
//     repair --remove-stale-bitmaps removes a stale bitmap; without it, the same command is
//     refused (403) the Leases, exits 2 naming the permission, and removes nothing; the Role
//     lists no other namespace's Leases; check's upgrade pre-flight reads the Leases with the
//     Role, and without it asks first and notes it, refused nothing;
//   - with clusterip-reservations, clusterip reservations create, list and delete work; with no
//     role, list is refused;
//   - with the ClusterRole of deploy/webhook/webhook.yaml, clusterip reservations webhook, run
//     as a process, keeps a deleted Retain Service's address as a reservation (in place) and
//     hands it back to the Service created again, and reserves the address of a Service deleted
//     from a ServiceCIDR with a release cooldown; a Service it does not read is refused.
//
// As in the v1.33 test, no request of a bound user is refused, and the verbs each used are those
// its roles grant (for bitmap removal: the Role's, and no others than granted).
func TestShippedRolesOfReservationsAndBitmapRemovalGrantExactlyWhatEachUserNeeds(t *testing.T) {
	t.Parallel()
	const flag = "10.96.0.0/24"
	e := testenv.NewEtcd(t)
	var users []localcluster.User
	for name := range rbacUsers {
		users = append(users, localcluster.User{Name: name})
	}
	api := testenv.NewKubeAPIServer(t, e, testenv.KubeAPIServerOptions{
		Release: "v1.37.2", ServiceClusterIPRange: flag, AuthorizationMode: "RBAC", AuditLog: true, Users: users,
	})
	ctx := t.Context()
	grants := applyRoles(t, api.Client)
	waitForDefaultServiceCIDR(t, api.Client)
	peer := strings.TrimPrefix(api.Config.Host, "https://")
	waitForIdentityLease(t, api.Client, func(p string) bool { return p == peer })
	kubeconfigOf := func(user string) string {
		return writeKubeconfigWithToken(t, api.Config.Host, api.UserConfig(user).BearerToken)
	}
	clientOf := func(user string) kubernetes.Interface { return kubernetes.NewForConfigOrDie(api.UserConfig(user)) }
	log := &auditLog{path: api.AuditLogPath}

	// A bitmap a DualWrite era left: v1.37.2 neither reads nor writes it.
	key := etcdstore.ServiceIPsKey("")
	seed, err := bitmap.New(netip.MustParsePrefix(flag))
	if err != nil {
		t.Fatal(err)
	}
	if err := seed.Allocate(ctx, netip.MustParseAddr("10.96.0.200"), allocator.Owner{}); err != nil {
		t.Fatal(err)
	}
	if _, err := etcdstore.New(e.TestClient(t), key).Update(ctx, 0, seed.Snapshot()); err != nil {
		t.Fatalf("seed the bitmap: %v", err)
	}
	removeArgs := func(user string) []string {
		return []string{"repair", "--remove-stale-bitmaps", "--kubeconfig", kubeconfigOf(user), "--etcd-servers", strings.Join(e.Endpoints(), ","), "--leak-grace", "0"}
	}

	t.Run("repair --remove-stale-bitmaps without the Lease role is refused and removes nothing", func(t *testing.T) {
		from := log.mark(t)
		before := modRevision(t, e, key)
		checkCouldNotRun(t, removeArgs("repairer"), "--remove-stale-bitmaps also needs list on leases.coordination.k8s.io in kube-system, to count the kube-apiservers by their identity Leases; bind the Role clusterip-remove-stale-bitmaps")
		if codes := log.requests(t, from, "repairer")["list leases.coordination.k8s.io"]; !slices.Contains(codes, 403) {
			t.Errorf("repairer's Lease lists were answered %v, want a 403", codes)
		}
		if after := modRevision(t, e, key); after != before {
			t.Errorf("repair without the Lease role changed the bitmap at %s: mod revision %d, then %d", key, before, after)
		}
	})

	t.Run("repair --remove-stale-bitmaps with the Lease role removes the stale bitmap", func(t *testing.T) {
		from := log.mark(t)
		r := clusterip(t, removeArgs("bitmap-remover")...)
		if r.code != exitOK || !strings.Contains(r.stderr, "clusterip: removed the stale bitmap "+key) {
			t.Fatalf("repair --remove-stale-bitmaps: exit %d, want %d and the bitmap removed\nstdout:\n%s\nstderr:\n%s", r.code, exitOK, r.stdout, r.stderr)
		}
		if rev := modRevision(t, e, key); rev != 0 {
			t.Errorf("%s is still in etcd (mod revision %d)", key, rev)
		}
		log.checkUsed(t, from, "bitmap-remover", grants.of("bitmap-remover"), grants["remove-stale-bitmaps.yaml"])
		if _, err := clientOf("bitmap-remover").CoordinationV1().Leases(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("bitmap-remover listed the Leases of namespace default: %v, want 403: the Role is kube-system's", err)
		}
	})

	t.Run("check's upgrade pre-flight counts the servers with the Lease role, and asks first without it", func(t *testing.T) {
		from := log.mark(t)
		r := clusterip(t, "check", "--kubeconfig", kubeconfigOf("checker"), "-o", "json")
		var rep repair.Report
		if err := json.Unmarshal([]byte(r.stdout), &rep); r.code != exitOK || err != nil || rep.Upgrade == nil {
			t.Fatalf("check as checker: exit %d, %v; want %d and a report with the upgrade pre-flight\nstdout:\n%s\nstderr:\n%s", r.code, err, exitOK, r.stdout, r.stderr)
		}
		note := `clusterip: note: upgrade to 1.38: the identity Leases of kube-apiserver were not read (user "checker" may not list leases.coordination.k8s.io in kube-system)`
		if !strings.Contains(r.stderr, note) || rep.Upgrade.Status != repair.UpgradeUnknown {
			t.Errorf("check without the Lease role: upgrade %s, stderr %q; want unknown and a note %q", rep.Upgrade.Status, r.stderr, note)
		}
		log.checkUsed(t, from, "checker", grants.of("checker"), nil)

		from = log.mark(t)
		rep = checkJSON(t, exitOK, "check", "--kubeconfig", kubeconfigOf("bitmap-remover"), "-o", "json")
		if rep.Upgrade == nil || rep.Upgrade.Status != repair.UpgradeReady {
			t.Errorf("check with the Lease role: upgrade %+v, want ready", rep.Upgrade)
		}
		log.checkUsed(t, from, "bitmap-remover", grants.of("bitmap-remover"), grants["remove-stale-bitmaps.yaml"])
	})

	t.Run("the reservations role creates, lists and deletes reservations", func(t *testing.T) {
		from := log.mark(t)
		kubeconfig := kubeconfigOf("reserver")
		for _, args := range [][]string{
			{"create", "10.96.0.20", "--for", "default/web", "--reason", "clients pin it"},
			{"list", "-o", "json"},
			{"delete", "10.96.0.20"},
		} {
			r := clusterip(t, slices.Concat([]string{"reservations"}, args, []string{"--kubeconfig", kubeconfig})...)
			if r.code != exitOK {
				t.Errorf("clusterip reservations %q as reserver: exit %d, want %d\nstderr:\n%s", args, r.code, exitOK, r.stderr)
			}
		}
		log.checkUsedExactly(t, from, "reserver", grants.of("reserver"))

		from = log.mark(t)
		checkCouldNotRun(t, []string{"reservations", "list", "--kubeconfig", kubeconfigOf("nobody")}, "forbidden: User \"nobody\" cannot list resource \"ipaddresses\" in API group \"networking.k8s.io\" at the cluster scope; bind the ClusterRole clusterip-reservations")
		if codes := log.requests(t, from, "nobody")["list ipaddresses.networking.k8s.io"]; !slices.Contains(codes, 403) {
			t.Errorf("nobody's IPAddress lists were answered %v, want a 403", codes)
		}
	})

	t.Run("the webhook role runs the webhook and its controller", func(t *testing.T) {
		optInToRetain(t, api.Client, metav1.NamespaceDefault) // before the webhook's informers list it
		from := log.mark(t)
		dir := t.TempDir()
		caPEM := writeServingCertificate(t, dir)
		p := startWebhook(t, []string{"reservations", "webhook", "--kubeconfig", kubeconfigOf("webhook"),
			"--tls-cert-file", filepath.Join(dir, "tls.crt"), "--tls-private-key-file", filepath.Join(dir, "tls.key"), "--listen", "127.0.0.1:0",
			"--health-probe-bind-address", "127.0.0.1:0", "--metrics-bind-address", "0"}, nil)
		dyn, err := dynamic.NewForConfig(api.Config)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := dyn.Resource(admissionregistrationv1.SchemeGroupVersion.WithResource("mutatingwebhookconfigurations")).
			Create(ctx, shippedWebhookConfiguration(t, p.addr, caPEM), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitForWebhook(t, api.Client)
		first, second := deleteAndRecreate(t, api.Client, retainedService("web", corev1.IPFamilyPolicySingleStack), nil)
		if !slices.Equal(first, second) {
			t.Errorf("ClusterIPs after the restore = %q, want %q", second, first)
		}
		// A Service without a Retain policy, in a ServiceCIDR with a release cooldown: the
		// controller reserves its address after kube-apiserver releases it (a create).
		cidrs := api.Client.NetworkingV1().ServiceCIDRs()
		if _, err := cidrs.Patch(ctx, "kubernetes", types.MergePatchType, []byte(`{"metadata":{"annotations":{"`+reservation.AnnotationReleaseCooldown+`":"1m"}}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		cool, err := api.Client.CoreV1().Services(metav1.NamespaceDefault).Create(ctx, testenv.ClusterIPService("cool", ""), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := api.Client.CoreV1().Services(metav1.NamespaceDefault).Delete(ctx, "cool", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, "the cooldown's reservation of "+cool.Spec.ClusterIP, func() bool {
			obj, err := api.Client.NetworkingV1().IPAddresses().Get(ctx, cool.Spec.ClusterIP, metav1.GetOptions{})
			r, ok := reservation.FromObject(obj)
			return err == nil && ok && r.For.Name == "cool"
		})
		if _, err := cidrs.Patch(ctx, "kubernetes", types.MergePatchType, []byte(`{"metadata":{"annotations":{"`+reservation.AnnotationReleaseCooldown+`":null}}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		// The hand-out of the restore is done once its Service holds the address: the controller
		// deletes its record, the last call its roles grant.
		testenv.WaitFor(t, "the webhook to delete its hand-out record", func() bool {
			l, err := api.Client.CoordinationV1().Leases(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{LabelSelector: webhook.LabelHandout})
			return err == nil && len(l.Items) == 0
		})
		p.stop()
		log.checkUsedExactly(t, from, "webhook", grants.of("webhook"))
		if _, err := clientOf("webhook").CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "web", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("the webhook's user read Service default/web: %v, want 403", err)
		}
	})
}

// readyStatus returns the status of sc's Ready condition, or "" if it has none.
func readyStatus(sc *networkingv1.ServiceCIDR) metav1.ConditionStatus {
	if c := meta.FindStatusCondition(sc.Status.Conditions, networkingv1.ServiceCIDRConditionReady); c != nil {
		return c.Status
	}
	return ""
}

// poll calls cond every 50 ms until it returns true, and fails t after a minute.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// roleGrants are the permissions of the ClusterRoles of rbacDir, by file name, each as
// "verb resource[.group][/subresource]".
type roleGrants map[string]map[string]bool

// of returns the permissions the roles of user grant.
func (g roleGrants) of(user string) map[string]bool {
	out := map[string]bool{}
	for _, f := range rbacUsers[user] {
		for a := range g[f] {
			out[a] = true
		}
	}
	return out
}

// applyRoles creates every role of rbacDir (each of its files but kustomization.yaml) and the ClusterRole of each other file of rbacUsers
// (and its Role, if it has one, known as the file's name and roleSuffix), binds those of rbacUsers to each user (a ClusterRole with a ClusterRoleBinding, a Role with a
// RoleBinding in its namespace), and returns what each file grants. It fails t if rbacDir holds a
// file that is not one ClusterRole or Role, or another file of rbacUsers not exactly one
// ClusterRole among its objects.
func applyRoles(t *testing.T, admin kubernetes.Interface) roleGrants {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(rbacDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no ClusterRoles in %s: %v", rbacDir, err)
	}
	type role struct {
		kind, name, namespace string
		rules                 []rbacv1.PolicyRule
	}
	roles := map[string]role{}
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" { // lists the roles' files; TestShippedKustomizations renders it
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var r rbacv1.Role // a ClusterRole's fields but aggregationRule, which none has
		if err := yaml.UnmarshalStrict(b, &r); err != nil || (r.Kind != "ClusterRole" && r.Kind != "Role") {
			t.Fatalf("%s: not one ClusterRole or Role (kind %q): %v", f, r.Kind, err)
		}
		if r.Kind == "ClusterRole" {
			_, err = admin.RbacV1().ClusterRoles().Create(t.Context(), &rbacv1.ClusterRole{ObjectMeta: r.ObjectMeta, Rules: r.Rules}, metav1.CreateOptions{})
		} else {
			_, err = admin.RbacV1().Roles(r.Namespace).Create(t.Context(), &r, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatalf("create the %s of %s: %v", r.Kind, f, err)
		}
		roles[filepath.Base(f)] = role{r.Kind, r.Name, r.Namespace, r.Rules}
	}
	for _, fs := range rbacUsers {
		for _, f := range fs {
			if _, ok := roles[f]; ok || filepath.Dir(f) == "." || strings.HasSuffix(f, roleSuffix) {
				continue
			}
			var found []rbacv1.ClusterRole
			for _, obj := range manifestObjects(t, filepath.Join(rbacDir, f)) {
				switch obj.GetKind() {
				case "ClusterRole":
					var cr rbacv1.ClusterRole
					if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(obj.Object, &cr, true); err != nil {
						t.Fatalf("%s: ClusterRole %s: %v", f, obj.GetName(), err)
					}
					found = append(found, cr)
				case "Role":
					var r rbacv1.Role
					if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(obj.Object, &r, true); err != nil {
						t.Fatalf("%s: Role %s: %v", f, obj.GetName(), err)
					}
					if _, err := admin.RbacV1().Roles(r.Namespace).Create(t.Context(), &r, metav1.CreateOptions{}); err != nil {
						t.Fatalf("create the Role of %s: %v", f, err)
					}
					roles[f+roleSuffix] = role{"Role", r.Name, r.Namespace, r.Rules}
				}
			}
			if len(found) != 1 {
				t.Fatalf("%s: %d ClusterRoles, want one", f, len(found))
			}
			if _, err := admin.RbacV1().ClusterRoles().Create(t.Context(), &found[0], metav1.CreateOptions{}); err != nil {
				t.Fatalf("create the ClusterRole of %s: %v", f, err)
			}
			roles[f] = role{"ClusterRole", found[0].Name, "", found[0].Rules}
		}
	}
	grants := roleGrants{}
	for f, r := range roles {
		grants[f] = map[string]bool{}
		for _, rule := range r.rules {
			for _, g := range rule.APIGroups {
				for _, res := range rule.Resources {
					for _, v := range rule.Verbs {
						name, sub, _ := strings.Cut(res, "/")
						grants[f][access(v, g, name, sub)] = true
					}
				}
			}
		}
	}
	for user, fs := range rbacUsers {
		for _, f := range fs {
			r, ok := roles[f]
			if !ok {
				t.Fatalf("no %s in %s", f, rbacDir)
			}
			meta := metav1.ObjectMeta{Name: user + "-" + r.name}
			ref := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: r.kind, Name: r.name}
			subjects := []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}}
			var err error
			if r.kind == "Role" {
				meta.Namespace = r.namespace
				_, err = admin.RbacV1().RoleBindings(r.namespace).Create(t.Context(), &rbacv1.RoleBinding{ObjectMeta: meta, RoleRef: ref, Subjects: subjects}, metav1.CreateOptions{})
			} else {
				_, err = admin.RbacV1().ClusterRoleBindings().Create(t.Context(), &rbacv1.ClusterRoleBinding{ObjectMeta: meta, RoleRef: ref, Subjects: subjects}, metav1.CreateOptions{})
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	return grants
}

// access spells a permission as "verb resource[.group][/subresource]".
func access(verb, group, resource, subresource string) string {
	s := verb + " " + resource
	if group != "" {
		s += "." + group
	}
	if subresource != "" {
		s += "/" + subresource
	}
	return s
}

// auditLog reads the audit log of the test's kube-apiserver, which logs each request before it
// answers it (--audit-log-mode=blocking): once a command has exited, its requests are logged.
type auditLog struct{ path string }

// mark returns the size of the log so far: where the requests of what follows begin.
func (l *auditLog) mark(t *testing.T) int64 {
	t.Helper()
	fi, err := os.Stat(l.path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// requests returns the permissions used by user's requests logged from offset from on, each with
// the codes of its answers. The reviews check makes of its own permissions and identity
// (SelfSubjectAccessReview, SelfSubjectReview) are left out: every user may make them, and they
// store nothing.
func (l *auditLog) requests(t *testing.T, from int64, user string) map[string][]int {
	t.Helper()
	events, err := testenv.AuditEventsFrom(l.path, from)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]int{}
	for _, ev := range events {
		if ev.User.Username != user || ev.ObjectRef == nil {
			continue
		}
		if r := ev.ObjectRef.Resource; r == "selfsubjectaccessreviews" || r == "selfsubjectreviews" {
			continue
		}
		a := access(ev.Verb, ev.ObjectRef.APIGroup, ev.ObjectRef.Resource, ev.ObjectRef.Subresource)
		code := 0
		if ev.ResponseStatus != nil {
			code = ev.ResponseStatus.Code
		}
		out[a] = append(out[a], code)
		if ev.Verb == "watch" && strings.Contains(ev.RequestURI, "sendInitialEvents=true") {
			// From client-go v0.35 on, an informer lists by a watch that sends the initial
			// events (WatchListClient). The roles still grant list, which a client before v0.35
			// and a server that refuses such a watch use instead, so count it as that list.
			l := access("list", ev.ObjectRef.APIGroup, ev.ObjectRef.Resource, ev.ObjectRef.Subresource)
			out[l] = append(out[l], code)
		}
	}
	return out
}

// writes returns the requests of user from offset from on that ask to change something.
func (l *auditLog) writes(t *testing.T, from int64, user string) []string {
	t.Helper()
	var out []string
	for a := range l.requests(t, from, user) {
		switch verb, _, _ := strings.Cut(a, " "); verb {
		case "create", "update", "patch", "delete", "deletecollection":
			out = append(out, a)
		}
	}
	sort.Strings(out)
	return out
}

// checkUsedExactly checks that the server refused none of user's requests logged from offset
// from on, and that they used exactly the permissions of want.
func (l *auditLog) checkUsedExactly(t *testing.T, from int64, user string, want map[string]bool) {
	t.Helper()
	l.checkUsed(t, from, user, want, want)
}

// checkUsed checks that the server refused none of user's requests logged from offset from on,
// that they used only permissions of granted, and every permission of required.
func (l *auditLog) checkUsed(t *testing.T, from int64, user string, granted, required map[string]bool) {
	t.Helper()
	used := map[string]bool{}
	for a, codes := range l.requests(t, from, user) {
		used[a] = true
		if slices.Contains(codes, 403) {
			t.Errorf("the API server refused %s %q (403)", user, a)
		}
		if !granted[a] {
			t.Errorf("%s used %q, which its roles do not grant", user, a)
		}
	}
	for a := range required {
		if !used[a] {
			t.Errorf("%s never used %q, which its roles grant for this", user, a)
		}
	}
}

// modRevision returns the revision at which key was last written in e's etcd (0 if absent).
func modRevision(t *testing.T, e *testenv.Etcd, key string) int64 {
	t.Helper()
	resp, err := e.TestClient(t).Get(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return 0
	}
	return resp.Kvs[0].ModRevision
}

// deleteIPAddressOfNewService deletes the IPAddress ip of a Service created a moment ago, and
// keeps it deleted until kube-apiserver's own IPAddress repair has dealt with the Service's
// creation: that repair syncs each new Service once, from its informer, and a sync that reads its
// cache after the delete creates the IPAddress again. It deletes again whenever the object is
// back, until it has stayed gone for 3 s (at most 5 times), failing t otherwise.
func deleteIPAddressOfNewService(t *testing.T, client kubernetes.Interface, ip string) {
	t.Helper()
	ctx := t.Context()
	for range 5 {
		if err := client.NetworkingV1().IPAddresses().Delete(ctx, ip, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("delete IPAddress %s: %v", ip, err)
		}
		back := false
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline) && !back; time.Sleep(100 * time.Millisecond) {
			_, err := client.NetworkingV1().IPAddresses().Get(ctx, ip, metav1.GetOptions{})
			back = err == nil
		}
		if !back {
			return
		}
	}
	t.Fatalf("kube-apiserver kept creating IPAddress %s again", ip)
}
