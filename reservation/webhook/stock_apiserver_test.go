package webhook_test

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	networkingv1informers "k8s.io/client-go/informers/networking/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/reservation"
	"github.com/kube-ipam/clusterip/reservation/webhook"
)

// webIP is the address reserved for default/web in these tests.
var webIP = netip.MustParseAddr("10.96.0.20")

// webKey is the Service the address is kept for.
var webKey = types.NamespacedName{Namespace: "default", Name: "web"}

// stockWithWebhook is a stock kube-apiserver v1.37.2 calling a webhook.Handler served over TLS
// on 127.0.0.1 by this test process, which runs the webhook.Controller (reading release
// cooldowns from ServiceCIDRs) and a reservation.ExpiryController too.
type stockWithWebhook struct {
	api      kubernetes.Interface
	res      *reservation.Client
	reg      *prometheus.Registry
	reserved func() bool // reports whether the handler's informer shows webIP reserved for web
	// cidrs is the informer factory's ServiceCIDR informer, from which the controller reads
	// release cooldowns.
	cidrs networkingv1informers.ServiceCIDRInformer
}

// startStockWithWebhook starts it all and waits until kube-apiserver calls the webhook.
func startStockWithWebhook(t *testing.T) *stockWithWebhook {
	t.Helper()
	api := testenv.NewKubeAPIServer(t, testenv.NewEtcd(t), testenv.KubeAPIServerOptions{Release: "v1.37.2", ServiceClusterIPRange: "10.96.0.0/24"})
	testenv.WaitForKubernetesService(t, api.Client)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	s := &stockWithWebhook{api: api.Client, reg: prometheus.NewRegistry()}
	var err error
	if s.res, err = reservation.New(api.Client); err != nil {
		t.Fatal(err)
	}
	m, err := webhook.NewMetrics(s.reg)
	if err != nil {
		t.Fatal(err)
	}
	claims := &webhook.Claims{}
	optIn(t, api.Client, metav1.NamespaceDefault, "100") // the tests' Retain Services live in default
	factory := informers.NewSharedInformerFactory(api.Client, 0)
	ipas := factory.Networking().V1().IPAddresses()
	s.cidrs = factory.Networking().V1().ServiceCIDRs()
	limits, err := reservation.NewLimits(ipas, factory.Core().V1().Namespaces(), s.cidrs)
	if err != nil {
		t.Fatal(err)
	}
	h, err := webhook.NewHandler(api.Client, ipas, webhook.HandlerOptions{Metrics: m, Claims: claims, ServiceCIDRs: s.cidrs, Limits: limits})
	if err != nil {
		t.Fatal(err)
	}
	ctrl, err := webhook.NewController(api.Client, factory.Core().V1().Services(), webhook.ControllerOptions{Metrics: m, Claims: claims, ServiceCIDRs: s.cidrs, Limits: limits})
	if err != nil {
		t.Fatal(err)
	}
	expiry, err := reservation.NewExpiryController(api.Client, ipas)
	if err != nil {
		t.Fatal(err)
	}
	s.reserved = func() bool {
		obj, ok, _ := ipas.Informer().GetStore().GetByKey(webIP.String())
		if !ok {
			return false
		}
		ipa, _ := obj.(interface{ GetLabels() map[string]string })
		return ipa != nil && ipa.GetLabels()["ipaddress.kubernetes.io/managed-by"] == reservation.ManagedBy
	}
	factory.Start(ctx.Done())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := ctrl.Run(ctx, 2); err != nil {
			t.Errorf("Controller.Run: %v", err)
		}
	}()
	go func() {
		defer wg.Done()
		if err := expiry.Run(ctx); err != nil {
			t.Errorf("ExpiryController.Run: %v", err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		factory.Shutdown()
	})

	// httptest's TLS server has a self-signed certificate for 127.0.0.1, its own CA.
	mux := http.NewServeMux()
	mux.Handle("/mutate-services", h)
	srv := httptest.NewUnstartedServer(mux)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	caBundle := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})

	url := srv.URL + "/mutate-services"
	fail := admissionregistrationv1.Fail // strict here: a webhook that is not called fails the test
	sideEffects := admissionregistrationv1.SideEffectClassNoneOnDryRun
	timeout := int32(10)
	cfg := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "clusterip-reservations"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    "services.reservations.clusterip.kube-ipam.io",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caBundle},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"services"}}}},
			FailurePolicy:           &fail,
			SideEffects:             &sideEffects,
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          &timeout,
		}},
	}
	if _, err := api.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, cfg, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The configuration takes effect once kube-apiserver's informer has it: a dry run of a
	// Service with a malformed policy is refused from then on.
	testenv.WaitFor(t, "kube-apiserver to call the webhook", func() bool {
		_, err := api.Client.CoreV1().Services("default").Create(ctx, withPolicy(testenv.ClusterIPService("probe", ""), "Keep"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), reservation.AnnotationReleasePolicy)
	})
	return s
}

// withPolicy returns svc with the release-policy annotation value.
func withPolicy(svc *corev1.Service, value string) *corev1.Service {
	svc.Annotations = map[string]string{reservation.AnnotationReleasePolicy: value}
	return svc
}

// counter returns the value of the counter name in s's registry.
func (s *stockWithWebhook) counter(t *testing.T, name string) int {
	t.Helper()
	mfs, err := s.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return int(mf.GetMetric()[0].GetCounter().GetValue())
		}
	}
	t.Fatalf("no counter %s", name)
	return 0
}

// reservationOfWeb returns the reservation the API server holds at webIP, if it is web's.
func (s *stockWithWebhook) reservationOfWeb(ctx context.Context) (reservation.Reservation, bool) {
	obj, err := s.api.NetworkingV1().IPAddresses().Get(ctx, webIP.String(), metav1.GetOptions{})
	if err != nil {
		return reservation.Reservation{}, false
	}
	r, ok := reservation.FromObject(obj)
	return r, ok && r.For == webKey
}

// createWeb creates default/web asking for no address, with release policy Retain/1h.
func (s *stockWithWebhook) createWeb(ctx context.Context) (*corev1.Service, error) {
	return s.api.CoreV1().Services("default").Create(ctx, withPolicy(testenv.ClusterIPService("web", ""), "Retain/1h"), metav1.CreateOptions{})
}

// TestStockKubeAPIServerWithWebhook runs the webhook and the controller beside stock
// kube-apiserver v1.37.2: a Service deleted with a Retain policy and created again gets its
// address back (as Velero restores do), a malformed policy is refused by kube-apiserver, and
// under churn every window lost is counted.
func TestStockKubeAPIServerWithWebhook(t *testing.T) {
	t.Parallel()
	s := startStockWithWebhook(t)
	ctx := context.Background()
	svcs := s.api.CoreV1().Services("default")

	t.Run("a Service deleted with Retain and created again gets its address back", func(t *testing.T) {
		if err := s.res.Reserve(ctx, reservation.Reservation{Addr: webIP, For: webKey}); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, "the webhook to see the reservation", s.reserved)
		// A dry run is patched and deletes nothing.
		dry, err := svcs.Create(ctx, withPolicy(testenv.ClusterIPService("web", ""), "Retain/1h"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			t.Fatal(err)
		}
		if dry.Spec.ClusterIP != webIP.String() {
			t.Errorf("dry-run create got %s, want %s", dry.Spec.ClusterIP, webIP)
		}
		if _, ok := s.reservationOfWeb(ctx); !ok {
			t.Fatal("the dry run deleted the reservation")
		}
		for round := range 2 {
			web, err := s.createWeb(ctx)
			if err != nil {
				t.Fatalf("round %d: create web: %v", round, err)
			}
			if web.Spec.ClusterIP != webIP.String() {
				t.Fatalf("round %d: web got %s, want %s", round, web.Spec.ClusterIP, webIP)
			}
			obj, err := s.api.NetworkingV1().IPAddresses().Get(ctx, webIP.String(), metav1.GetOptions{})
			if err != nil || reservation.IsReservation(obj) {
				t.Fatalf("round %d: IPAddress %s = %v, %v; want kube-apiserver's allocation", round, webIP, obj, err)
			}
			if round == 1 {
				break // leave web for the next subtest
			}
			start := time.Now()
			if err := svcs.Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			testenv.WaitFor(t, "the controller to reserve web's address again", func() bool {
				_, ok := s.reservationOfWeb(ctx)
				return ok
			})
			r, _ := s.reservationOfWeb(ctx)
			if d := time.Until(r.Expires); d < 59*time.Minute || d > time.Hour {
				t.Errorf("the reservation ends in %v, want about 1h", d)
			}
			t.Logf("reserved again %v after the delete", time.Since(start).Round(time.Millisecond))
			testenv.WaitFor(t, "the webhook to see the reservation", s.reserved)
		}
		if got := s.counter(t, "clusterip_reservation_webhook_claims_total"); got != 2 {
			t.Errorf("claims_total = %d, want 2", got)
		}
	})

	t.Run("a malformed release policy is refused by kube-apiserver", func(t *testing.T) {
		_, err := svcs.Create(ctx, withPolicy(testenv.ClusterIPService("bad", ""), "Retain/forever"), metav1.CreateOptions{})
		checkRefused(t, "create", err)
		web, err := svcs.Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		web.Annotations[reservation.AnnotationReleasePolicy] = "Keep"
		_, err = svcs.Update(ctx, web, metav1.UpdateOptions{})
		checkRefused(t, "update", err)
	})

	t.Run("a reservation no live ServiceCIDR serves is not handed out", func(t *testing.T) {
		s.checkOrphansNotHandedOut(t)
	})

	// Two loads of 8 churn workers: the rest of the /24 free, and then the range filled with
	// static Services but for 32 addresses besides webIP, as in a nearly full range.
	for _, load := range []struct {
		name string
		free int // addresses left free besides webIP; 0 fills nothing
	}{
		{"under churn in a /24, every lost window is counted", 0},
		{"under churn in a nearly full /24, every lost window is counted", 32},
	} {
		t.Run(load.name, func(t *testing.T) { s.churn(t, load.free) })
	}
}

// churn deletes and creates web 20 times while 8 workers create and delete other Services, after
// filling the range with static Services but for free addresses besides webIP (none if free is
// 0), and checks that the metrics count every lost window the test sees.
func (s *stockWithWebhook) churn(t *testing.T, free int) {
	ctx := context.Background()
	svcs := s.api.CoreV1().Services("default")
	if free > 0 {
		var fill []string
		for i := 2; i <= 254; i++ {
			if i != 20 && (i < 21 || i >= 21+free) {
				fill = append(fill, fmt.Sprintf("10.96.0.%d", i))
			}
		}
		var wg sync.WaitGroup
		ch := make(chan string)
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ip := range ch {
					_, err := svcs.Create(ctx, testenv.ClusterIPService("fill-"+strings.ReplaceAll(ip, ".", "-"), ip), metav1.CreateOptions{})
					if err != nil && !apierrors.IsAlreadyExists(err) {
						t.Errorf("fill %s: %v", ip, err)
					}
				}
			}()
		}
		for _, ip := range fill {
			ch <- ip
		}
		close(ch)
		wg.Wait()
	}
	webhookBefore := s.counter(t, "clusterip_reservation_webhook_window_lost_total")
	controllerBefore := s.counter(t, "clusterip_reservation_controller_window_lost_total")

	var taken atomic.Int64 // churn Services that got webIP
	stop := make(chan struct{})
	churnDone := make(chan testenv.ChurnResult)
	go func() {
		churnDone <- testenv.ServiceChurn{Workers: 8, Stop: stop, Prefix: fmt.Sprintf("churn%d", free), Delete: true,
			Created: func(svc *corev1.Service) {
				if svc.Spec.ClusterIP == webIP.String() {
					taken.Add(1)
				}
			},
		}.Run(ctx, t, s.api)
	}()

	const rounds = 20
	var webhookLost, controllerLost int
	start := time.Now()
	for round := range rounds {
		before := s.counter(t, "clusterip_reservation_controller_window_lost_total")
		if err := svcs.Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, "the reservation, or a lost window", func() bool {
			_, ok := s.reservationOfWeb(ctx)
			return ok || s.counter(t, "clusterip_reservation_controller_window_lost_total") > before
		})
		if _, ok := s.reservationOfWeb(ctx); !ok {
			controllerLost++
			t.Logf("round %d: another Service took %s before the controller reserved it", round, webIP)
		}
		webhookLost += s.recreateWeb(t, ctx, round)
	}
	took := time.Since(start)
	defer func() {
		t.Logf("metrics: webhook %d, controller %d", s.counter(t, "clusterip_reservation_webhook_window_lost_total")-webhookBefore, s.counter(t, "clusterip_reservation_controller_window_lost_total")-controllerBefore)
	}()
	close(stop)
	res := <-churnDone
	t.Logf("%d rounds: %d windows lost in the webhook, %d in the controller, seen by the test", rounds, webhookLost, controllerLost)
	// Every lost window is counted. The controller's count is exact; the webhook's may count a
	// few more than were lost under heavy churn (see webhook.Claims), never fewer.
	testenv.WaitFor(t, "the metrics to count every lost window", func() bool {
		return s.counter(t, "clusterip_reservation_webhook_window_lost_total")-webhookBefore >= webhookLost &&
			s.counter(t, "clusterip_reservation_controller_window_lost_total")-controllerBefore == controllerLost
	})
	t.Logf("%d rounds of delete and create of web in %v beside 8 churn workers (%d creates, %d refused; %s taken by churn %d times, recoveries included): %d windows lost in the webhook, %d in the controller",
		rounds, took.Round(time.Millisecond), res.Created, res.Failed, webIP, taken.Load(), webhookLost, controllerLost)
}

// recreateWeb creates web again with webIP: through the controller's reservation if there is
// one, else (after a lost window) through a new one made once the churn Service holding webIP is
// gone. It returns how many of its creates lost the webhook's window.
func (s *stockWithWebhook) recreateWeb(t *testing.T, ctx context.Context, round int) (lost int) {
	t.Helper()
	for {
		testenv.WaitFor(t, "a reservation of web's address", func() bool {
			if _, ok := s.reservationOfWeb(ctx); ok {
				return true
			}
			// A create, not Reserve: Reserve's checks list every Service, and under churn another
			// Service takes the address while they run.
			obj, err := reservation.ObjectFor(reservation.Reservation{Addr: webIP, For: webKey})
			if err != nil {
				t.Fatal(err)
			}
			_, err = s.api.NetworkingV1().IPAddresses().Create(ctx, obj, metav1.CreateOptions{})
			return err == nil
		})
		testenv.WaitFor(t, "the webhook to see the reservation", s.reserved)
		web, err := s.createWeb(ctx)
		switch {
		case err == nil && web.Spec.ClusterIP == webIP.String():
			return lost
		case err == nil:
			t.Fatalf("round %d: web got %s, want %s", round, web.Spec.ClusterIP, webIP)
		case apierrors.IsInvalid(err) && strings.Contains(err.Error(), "already allocated"):
			lost++
			t.Logf("round %d: another Service took %s in the webhook's window: %v", round, webIP, err)
		default:
			t.Fatalf("round %d: create web: %v", round, err)
		}
	}
}

// checkRefused fails t unless err is kube-apiserver's refusal, with code 422, of a malformed
// release-policy annotation by the webhook.
func checkRefused(t *testing.T, what string, err error) {
	t.Helper()
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Code != http.StatusUnprocessableEntity || !strings.Contains(err.Error(), reservation.AnnotationReleasePolicy) {
		t.Errorf("%s with a malformed release policy: %v, want a 422 refusal naming %s", what, err, reservation.AnnotationReleasePolicy)
	}
}

// checkOrphansNotHandedOut makes two reservations no live ServiceCIDR serves, kept for default/gone
// and default/closing: one of an address outside every ServiceCIDR, created by hand as anyone who
// may create IPAddress objects can, and one in a ServiceCIDR being deleted (held terminating by a
// finalizer of the test's, as kube-controller-manager's holds one that still has addresses).
// Each Service then gets a dynamic address in 10.96.0.0/24, and each reservation is still there.
func (s *stockWithWebhook) checkOrphansNotHandedOut(t *testing.T) {
	ctx := context.Background()
	const hold = "test.clusterip.kube-ipam.io/hold"
	cidr := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "closing", Finalizers: []string{hold}}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.97.0.0/24"}}}
	if _, err := s.api.NetworkingV1().ServiceCIDRs().Create(ctx, cidr, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		patch := []byte(`{"metadata":{"finalizers":null}}`)
		_, _ = s.api.NetworkingV1().ServiceCIDRs().Patch(context.Background(), "closing", types.MergePatchType, patch, metav1.PatchOptions{})
	})
	outside, closing := netip.MustParseAddr("10.98.0.5"), netip.MustParseAddr("10.97.0.5")
	// The second is reserved while its ServiceCIDR is live, as Reserve requires.
	if err := s.res.Reserve(ctx, reservation.Reservation{Addr: closing, For: types.NamespacedName{Namespace: "default", Name: "closing"}}); err != nil {
		t.Fatal(err)
	}
	obj, err := reservation.ObjectFor(reservation.Reservation{Addr: outside, For: types.NamespacedName{Namespace: "default", Name: "gone"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.api.NetworkingV1().IPAddresses().Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.api.NetworkingV1().ServiceCIDRs().Delete(ctx, "closing", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the webhook's informer to see ServiceCIDR closing being deleted", func() bool {
		sc, err := s.cidrs.Lister().Get("closing")
		return err == nil && sc.DeletionTimestamp != nil
	})
	serving := netip.MustParsePrefix("10.96.0.0/24")
	for name, ip := range map[string]netip.Addr{"gone": outside, "closing": closing} {
		svc, err := s.api.CoreV1().Services("default").Create(ctx, testenv.ClusterIPService(name, ""), metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create default/%s: %v", name, err)
		}
		if got, err := netip.ParseAddr(svc.Spec.ClusterIP); err != nil || !serving.Contains(got) {
			t.Errorf("default/%s got %q, want a dynamic address of %s (not its reserved %s)", name, svc.Spec.ClusterIP, serving, ip)
		}
		obj, err := s.api.NetworkingV1().IPAddresses().Get(ctx, ip.String(), metav1.GetOptions{})
		if r, ok := reservation.FromObject(obj); err != nil || !ok || r.For.Name != name {
			t.Errorf("the reservation of %s after default/%s's create = %v, %v; want it still there", ip, name, obj, err)
		}
		// The churn after this fills the /24 address by address: leave it as it was.
		if err := s.api.CoreV1().Services("default").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}
