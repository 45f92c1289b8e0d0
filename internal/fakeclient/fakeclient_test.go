package fakeclient_test

import (
	"context"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"

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
