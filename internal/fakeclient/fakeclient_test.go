package fakeclient_test

import (
	"context"
	"slices"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	clientfeatures "k8s.io/client-go/features"
	clientfeaturestesting "k8s.io/client-go/features/testing"
	"k8s.io/client-go/informers"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/kube-ipam/clusterip/internal/fakeclient"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

func TestCreatedIPAddressesGetUIDsAndRisingResourceVersions(t *testing.T) {
	for _, fieldManaged := range []bool{false, true} {
		c := fakeclient.New(fakeclient.Options{FieldManaged: fieldManaged})
		ips := c.NetworkingV1().IPAddresses()
		ctx := context.Background()
		a, err := ips.Create(ctx, testenv.IPAddress("10.0.0.1", "", "x"), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		b, err := ips.Create(ctx, testenv.IPAddress("10.0.0.2", "", "x"), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if a.UID == "" || a.UID == b.UID || a.ResourceVersion != "1" || b.ResourceVersion != "2" {
			t.Errorf("FieldManaged %v: created UIDs %q, %q and resourceVersions %q, %q; want distinct UIDs and 1, 2",
				fieldManaged, a.UID, b.UID, a.ResourceVersion, b.ResourceVersion)
		}
	}
}

// TestStaleServiceCIDRUpdatesConflict is the race a controller's cache makes: a status update
// from an older read must not erase a deletion marked since (the API server answers Conflict),
// and a status update changes the status only.
func TestStaleServiceCIDRUpdatesConflict(t *testing.T) {
	c := fakeclient.New(fakeclient.Options{})
	cidrs := c.NetworkingV1().ServiceCIDRs()
	ctx := context.Background()
	created, err := cidrs.Create(ctx, testenv.ServiceCIDR("a", "10.0.0.0/24"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if created.ResourceVersion == "" {
		t.Fatal("Create() gave the ServiceCIDR no resourceVersion")
	}
	deleting := created.DeepCopy()
	now := metav1.Now()
	deleting.DeletionTimestamp = &now
	marked, err := cidrs.Update(ctx, deleting, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stale := created.DeepCopy()
	stale.Status.Conditions = []metav1.Condition{{Type: networkingv1.ServiceCIDRConditionReady, Status: metav1.ConditionTrue, Reason: "Ready", LastTransitionTime: now}}
	if _, err := cidrs.UpdateStatus(ctx, stale, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Errorf("UpdateStatus() with resourceVersion %s after %s = %v, want Conflict", created.ResourceVersion, marked.ResourceVersion, err)
	}
	fresh := marked.DeepCopy()
	fresh.Status = stale.Status
	fresh.DeletionTimestamp = nil
	fresh.Spec.CIDRs = []string{"10.9.0.0/24"}
	got, err := cidrs.UpdateStatus(ctx, fresh, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.DeletionTimestamp == nil || !slices.Equal(got.Spec.CIDRs, created.Spec.CIDRs) || len(got.Status.Conditions) != 1 {
		t.Errorf("UpdateStatus() = deletionTimestamp %v, cidrs %v, %d conditions; want the deletion and the CIDRs kept and the condition set",
			got.DeletionTimestamp, got.Spec.CIDRs, len(got.Status.Conditions))
	}
	if got.ResourceVersion == marked.ResourceVersion {
		t.Errorf("UpdateStatus() kept resourceVersion %s", got.ResourceVersion)
	}
}

func TestDryRunCreatePersistsNothing(t *testing.T) {
	c := fakeclient.New(fakeclient.Options{})
	ips := c.NetworkingV1().IPAddresses()
	ctx := context.Background()
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	if _, err := ips.Create(ctx, testenv.IPAddress("10.0.0.1", "", "x"), dry); err != nil {
		t.Fatalf("dry-run Create() = %v", err)
	}
	if _, err := ips.Get(ctx, "10.0.0.1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Get() after a dry-run Create = %v, want NotFound", err)
	}
	if _, err := ips.Create(ctx, testenv.IPAddress("10.0.0.1", "", "x"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := ips.Create(ctx, testenv.IPAddress("10.0.0.1", "", "x"), dry); !apierrors.IsAlreadyExists(err) {
		t.Errorf("dry-run Create() of an existing name = %v, want AlreadyExists", err)
	}
}

func TestWaitWatchingSeesAnInformersWatch(t *testing.T) {
	c := fakeclient.New(fakeclient.Options{})
	if n := c.Watching("ipaddresses"); n != 0 {
		t.Fatalf("Watching() before any informer = %d, want 0", n)
	}
	f := informers.NewSharedInformerFactory(c, 0)
	f.Networking().V1().IPAddresses().Informer()
	stop := make(chan struct{})
	defer func() { close(stop); f.Shutdown() }()
	f.Start(stop)
	c.WaitWatching(t, "ipaddresses")
}

// TestInformerSyncsByStreamingList: with client-go's WatchListClient on, an IPAddress informer on
// the fake, from the informer factory or from a plain ListWatch, syncs from one watch that asks
// for the initial events (no list), holds the objects the fake held, and then sees what is
// written after.
func TestInformerSyncsByStreamingList(t *testing.T) {
	clientfeaturestesting.SetFeatureDuringTest(t, clientfeatures.WatchListClient, true)
	tests := []struct {
		name     string
		informer func(c *fakeclient.Clientset) (cache.SharedIndexInformer, func(stop <-chan struct{}))
	}{
		{"informer factory", func(c *fakeclient.Clientset) (cache.SharedIndexInformer, func(stop <-chan struct{})) {
			f := informers.NewSharedInformerFactory(c, 0)
			inf := f.Networking().V1().IPAddresses().Informer()
			return inf, func(stop <-chan struct{}) { f.Start(stop); <-stop; f.Shutdown() }
		}},
		{"plain ListWatch", func(c *fakeclient.Clientset) (cache.SharedIndexInformer, func(stop <-chan struct{})) {
			ips := c.NetworkingV1().IPAddresses()
			lw := &cache.ListWatch{
				ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
					return ips.List(ctx, o)
				},
				WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
					return ips.Watch(ctx, o)
				},
			}
			inf := cache.NewSharedIndexInformer(lw, &networkingv1.IPAddress{}, 0, cache.Indexers{})
			return inf, inf.Run
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := fakeclient.New(fakeclient.Options{Objects: []runtime.Object{
				testenv.IPAddress("10.0.0.2", "", "b"), testenv.IPAddress("10.0.0.1", "", "a"),
			}})
			inf, run := tt.informer(c)
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() { defer close(done); run(stop) }()
			defer func() { close(stop); <-done }()
			testenv.WaitFor(t, "the informer to sync", inf.HasSynced)
			if got, want := inf.GetStore().ListKeys(), []string{"10.0.0.1", "10.0.0.2"}; !sameKeys(got, want) {
				t.Errorf("informer holds %v after sync, want %v", got, want)
			}
			var lists, streams int
			for _, a := range c.Actions() {
				switch a := a.(type) {
				case k8stesting.ListActionImpl:
					lists++
				case k8stesting.WatchActionImpl:
					if si := a.ListOptions.SendInitialEvents; si != nil && *si {
						streams++
					}
				}
			}
			if lists != 0 || streams != 1 {
				t.Errorf("informer made %d lists and %d watches with initial events, want 0 and 1", lists, streams)
			}
			if _, err := c.NetworkingV1().IPAddresses().Create(context.Background(), testenv.IPAddress("10.0.0.3", "", "c"), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			testenv.WaitFor(t, "the informer to see 10.0.0.3", func() bool {
				_, ok, _ := inf.GetStore().GetByKey("10.0.0.3")
				return ok
			})
		})
	}
}

// sameKeys reports whether got and want hold the same keys in any order.
func sameKeys(got, want []string) bool {
	got, want = slices.Clone(got), slices.Clone(want)
	slices.Sort(got)
	slices.Sort(want)
	return slices.Equal(got, want)
}

// TestWatchAnswersInitialEventsAsTheAPIServer: a watch's initial events, bookmark and errors for
// the options a streaming list and its misuses send.
func TestWatchAnswersInitialEventsAsTheAPIServer(t *testing.T) {
	const end = "BOOKMARK initial-events-end rv=2"
	tests := []struct {
		name    string
		opts    metav1.ListOptions
		want    []string // events before the create of 10.0.0.3, then its event
		invalid bool
	}{
		{
			name: "streaming list",
			opts: metav1.ListOptions{SendInitialEvents: ptr.To(true), ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, AllowWatchBookmarks: true},
			want: []string{"ADDED 10.0.0.1", "ADDED 10.0.0.2", end, "ADDED 10.0.0.3"},
		},
		{
			name: "streaming list from a resourceVersion",
			opts: metav1.ListOptions{ResourceVersion: "1", SendInitialEvents: ptr.To(true), ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, AllowWatchBookmarks: true},
			want: []string{"ADDED 10.0.0.1", "ADDED 10.0.0.2", end, "ADDED 10.0.0.3"},
		},
		{
			name: "initial events without bookmarks",
			opts: metav1.ListOptions{SendInitialEvents: ptr.To(true), ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan},
			want: []string{"ADDED 10.0.0.1", "ADDED 10.0.0.2", "ADDED 10.0.0.3"},
		},
		{
			name: "no initial events",
			opts: metav1.ListOptions{SendInitialEvents: ptr.To(false), ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, AllowWatchBookmarks: true},
			want: []string{"ADDED 10.0.0.3"},
		},
		{
			name: "plain watch",
			opts: metav1.ListOptions{},
			want: []string{"ADDED 10.0.0.3"},
		},
		{
			name:    "initial events without resourceVersionMatch",
			opts:    metav1.ListOptions{SendInitialEvents: ptr.To(true), AllowWatchBookmarks: true},
			invalid: true,
		},
		{
			name:    "initial events with resourceVersionMatch Exact",
			opts:    metav1.ListOptions{ResourceVersion: "1", SendInitialEvents: ptr.To(true), ResourceVersionMatch: metav1.ResourceVersionMatchExact},
			invalid: true,
		},
		{
			name:    "resourceVersionMatch without initial events",
			opts:    metav1.ListOptions{ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan},
			invalid: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := fakeclient.New(fakeclient.Options{})
			ips := c.NetworkingV1().IPAddresses()
			ctx := context.Background()
			for _, ip := range []string{"10.0.0.2", "10.0.0.1"} {
				if _, err := ips.Create(ctx, testenv.IPAddress(ip, "", "x"), metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			w, err := ips.Watch(ctx, tt.opts)
			if tt.invalid {
				if !apierrors.IsInvalid(err) {
					t.Errorf("Watch() = %v, want an Invalid error", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Watch() = %v", err)
			}
			defer w.Stop()
			if _, err := ips.Create(ctx, testenv.IPAddress("10.0.0.3", "", "x"), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			var got []string
			for range tt.want {
				select {
				case ev := <-w.ResultChan():
					got = append(got, describe(ev))
				case <-time.After(testenv.WaitTimeout):
					t.Fatalf("events %q, then none for %v; want %q", got, testenv.WaitTimeout, tt.want)
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("events = %q, want %q", got, tt.want)
			}
		})
	}
}

// describe names ev's type and object, an initial-events-end bookmark by its resourceVersion.
func describe(ev watch.Event) string {
	ip := ev.Object.(*networkingv1.IPAddress)
	if ev.Type == watch.Bookmark {
		if ip.Annotations[metav1.InitialEventsAnnotationKey] == "true" {
			return "BOOKMARK initial-events-end rv=" + ip.ResourceVersion
		}
		return "BOOKMARK rv=" + ip.ResourceVersion
	}
	return string(ev.Type) + " " + ip.Name
}
