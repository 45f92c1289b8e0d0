package repair

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// followedController returns a Controller of mode over 10.0.0.0/24 on client whose passes are an
// hour apart, with a started informer factory, so that whatever a test sees within seconds after
// the first pass is Run following Services.
func followedController(t *testing.T, client *fake.Clientset, mode featuregate.Mode) *Controller {
	t.Helper()
	f := informers.NewSharedInformerFactory(client, 0)
	c, err := NewController(clusterip.Config{Mode: mode, Ranges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, Client: client, Informers: f},
		Options{Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); f.Shutdown() })
	f.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
	return c
}

// waitFirstPass fails t unless c's first pass succeeds within testenv.WaitTimeout.
func waitFirstPass(t *testing.T, c *Controller) {
	t.Helper()
	select {
	case <-c.FirstPass():
	case <-time.After(testenv.WaitTimeout):
		t.Fatal("the first pass did not succeed")
	}
}

// TestRunFollowsServicesWithoutIPAddresses: a Service that shows up holding a ClusterIP without
// an IPAddress object (a Legacy peer's, in the skew window) gets its object within seconds, as
// kube-apiserver's IPAddress repair loop gives it, not at the next pass an hour later; a Service
// whose object comes with it brings no pass forward.
func TestRunFollowsServicesWithoutIPAddresses(t *testing.T) {
	for _, mode := range []featuregate.Mode{featuregate.IPAddressOnly} { // DualWrite follows the same way, with a bitmap in etcd
		t.Run(mode.String(), func(t *testing.T) {
			client := fake.NewClientset(testenv.ServiceCIDR("kubernetes", "10.0.0.0/24"))
			passes := countServiceLists(client)
			c := followedController(t, client, mode)
			stop := runUntilCancelled(t, c)
			defer stop()
			waitFirstPass(t, c)
			base := passes.Load() // the first pass's list, and the Service informer's

			// With its IPAddress: no pass.
			ctx := t.Context()
			if _, err := client.NetworkingV1().IPAddresses().Create(ctx, ipAddr("10.0.0.4", "default/with"), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := client.CoreV1().Services("default").Create(ctx, svc("default/with", "10.0.0.4"), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(3 * followDelay)
			if got := passes.Load() - base; got != 0 {
				t.Fatalf("Run made %d passes after a Service came with its IPAddress, want none", got)
			}

			// Without: a pass creates it, once the window after the first pass is over.
			if _, err := client.CoreV1().Services("default").Create(ctx, svc("default/peer", "10.0.0.5"), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			testenv.WaitFor(t, "the IPAddress of the peer's Service", func() bool {
				_, err := client.NetworkingV1().IPAddresses().Get(ctx, "10.0.0.5", metav1.GetOptions{})
				return err == nil
			})
			if got := passes.Load() - base; got != 1 {
				t.Errorf("Run made %d passes after the first, want 1: for the followed Service", got)
			}
		})
	}
}

// TestFirstPassIsClosedByTheFirstSuccessfulPass: FirstPass stays open while passes fail and is
// closed by the first that succeeds, as kube-apiserver's repair loops report their first success
// to the start-service-ip-repair-controllers hook.
func TestFirstPassIsClosedByTheFirstSuccessfulPass(t *testing.T) {
	client := fake.NewClientset(testenv.ServiceCIDR("kubernetes", "10.0.0.0/24"))
	failFirst(client, "list", "services", 1, apierrors.NewServiceUnavailable("not yet"))
	c := hourlyController(t, client)
	if _, err := c.RunOnce(t.Context()); err == nil {
		t.Fatal("RunOnce() = nil, want the injected failure")
	}
	select {
	case <-c.FirstPass():
		t.Fatal("FirstPass closed by a failed pass")
	default:
	}
	if _, err := c.RunOnce(t.Context()); err != nil {
		t.Fatalf("RunOnce() = %v", err)
	}
	waitFirstPass(t, c)

	// And through Run, for a Controller of its own.
	c = hourlyController(t, fake.NewClientset(testenv.ServiceCIDR("kubernetes", "10.0.0.0/24")))
	stop := runUntilCancelled(t, c)
	defer stop()
	waitFirstPass(t, c)
}

// TestLegacyControllerFollowsNothing: Legacy mode has no IPAddress objects, so a Legacy
// Controller registers no informer a caller would have to start.
func TestLegacyControllerFollowsNothing(t *testing.T) {
	f := informers.NewSharedInformerFactory(fake.NewClientset(), 0)
	if got := newFollower(&Controller{cfg: clusterip.Config{Mode: featuregate.Legacy, Informers: f}}); got != nil {
		t.Errorf("newFollower() = %v in Legacy mode, want nil", got)
	}
	f.Start(t.Context().Done())
	defer f.Shutdown()
	if got := f.WaitForCacheSync(t.Context().Done()); len(got) != 0 {
		t.Errorf("a Legacy Controller registered informers %v, want none", got)
	}
}

// TestRunCoalescesFollowedServicesIntoOnePass: a burst of Services a Legacy peer allocated
// (the skew window of an upgrade), each without its IPAddress object, costs one pass, not one
// per Service: followed Services bring a pass forward to no sooner than a window after the last
// pass began (10 s here, so that Services a second and a half apart fall in one). Each still gets
// its object.
func TestRunCoalescesFollowedServicesIntoOnePass(t *testing.T) {
	t.Parallel()
	client := fake.NewClientset(testenv.ServiceCIDR("kubernetes", "10.0.0.0/24"))
	passes := countServiceLists(client)
	c := followedController(t, client, featuregate.IPAddressOnly)
	c.followWindow = 10 * time.Second
	stop := runUntilCancelled(t, c)
	defer stop()
	waitFirstPass(t, c)
	base := passes.Load()

	ctx := t.Context()
	ips := []string{"10.0.0.5", "10.0.0.6", "10.0.0.7", "10.0.0.8", "10.0.0.9"}
	for i, ip := range ips {
		if _, err := client.CoreV1().Services("default").Create(ctx, svc(fmt.Sprintf("default/peer-%d", i), ip), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(followDelay * 3 / 2) // each Service followed on its own
	}
	testenv.WaitFor(t, "the IPAddress objects of the peer's Services", func() bool {
		for _, ip := range ips {
			if _, err := client.NetworkingV1().IPAddresses().Get(ctx, ip, metav1.GetOptions{}); err != nil {
				return false
			}
		}
		return true
	})
	if got := passes.Load() - base; got != 1 {
		t.Errorf("Run made %d passes for %d followed Services, want 1", got, len(ips))
	}
}

// TestRunDoesNotFollowAServiceAPassReportedOutOfRange: a Service whose ClusterIP is in no
// ServiceCIDR can never get an IPAddress object; once a pass has reported it, updates of that
// Service bring no pass forward and emit no further Event (the next periodic pass judges it
// again, silently while the cause stays).
func TestRunDoesNotFollowAServiceAPassReportedOutOfRange(t *testing.T) {
	t.Parallel()
	client := fake.NewClientset(testenv.ServiceCIDR("kubernetes", "10.0.0.0/24"), svc("default/far", "10.9.0.1"))
	passes := countServiceLists(client)
	rec := &recorder{}
	c := followedController(t, client, featuregate.IPAddressOnly)
	c.opts.Recorder = rec
	start := time.Now()
	stop := runUntilCancelled(t, c)
	defer stop()
	waitFirstPass(t, c)
	base := passes.Load()

	ctx := t.Context()
	for i := range 4 {
		s, err := client.CoreV1().Services("default").Get(ctx, "far", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.Labels = map[string]string{"update": fmt.Sprint(i)}
		if _, err := client.CoreV1().Services("default").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(followDelay / 2)
	}
	time.Sleep(c.followWindow + 2*time.Second - time.Since(start)) // past the window after the first pass
	if got := passes.Load() - base; got != 0 {
		t.Errorf("Run made %d passes for updates of an out-of-range Service it reported, want none", got)
	}
	if diff := cmp.Diff([]string{"Warning ClusterIPOutOfRange far"}, rec.Got()); diff != "" {
		t.Errorf("Events (-want +got):\n%s", diff)
	}
}
