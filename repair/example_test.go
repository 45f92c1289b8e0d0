package repair_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/kubernetes/fake"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/repair"
)

// An IPAddressOnly audit of a cluster with one Service whose IPAddress object is missing and one
// IPAddress object that no Service holds.
func ExampleAudit() {
	client := fake.NewClientset(
		&networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/24"}}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"}}},
		&networkingv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Name: "10.96.0.20", Labels: map[string]string{networkingv1.LabelManagedBy: "ipallocator.k8s.io"}}, Spec: networkingv1.IPAddressSpec{
			ParentRef: &networkingv1.ParentReference{Resource: "services", Namespace: "default", Name: "gone"}}},
	)
	rep, err := repair.Audit(context.Background(), clusterip.Config{
		Mode:   featuregate.IPAddressOnly,
		Ranges: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/24")},
		Client: client,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := rep.WriteTable(os.Stdout); err != nil {
		fmt.Println(err)
	}
	b, _ := json.Marshal(rep.Counts)
	fmt.Println(string(b))
	// Output:
	// Mode IPAddressOnly: inconsistent: 2 findings
	// Read 1 Services, 1 IPAddress objects, 0 bitmap bits.
	// By class: missing 1, leaked 1.
	//
	// IP          CLASS    SERVICE      DETAIL
	// 10.96.0.10  missing  default/web  Service default/web holds 10.96.0.10 but there is no IPAddress object for it.
	// 10.96.0.20  leaked   -            IPAddress 10.96.0.20 (parent services default/gone) is held by no Service.
	// {"bitmapBits":0,"ipAddresses":1,"leaked":1,"missing":1,"services":1}
}

// The pre-flight of an upgrade to kube-apiserver 1.38, from the identity Leases of two servers
// and the /version each answered at its peer address: one still emulates 1.34.
func ExampleCheckUpgrade() {
	live := []repair.APIServer{
		{Identity: "apiserver-a", PeerAddress: "10.0.0.1:6443"},
		{Identity: "apiserver-b", PeerAddress: "10.0.0.2:6443"},
	}
	versions := []repair.ServerVersion{
		{Endpoint: "10.0.0.1:6443", Info: version.Info{GitVersion: "v1.37.2", EmulationMajor: "1", EmulationMinor: "37"}},
		{Endpoint: "10.0.0.2:6443", Info: version.Info{GitVersion: "v1.37.2", EmulationMajor: "1", EmulationMinor: "34"}},
	}
	c := repair.CheckUpgrade(repair.UpgradeEvidence{Live: live, Versions: versions})
	fmt.Println(c.Status)
	for _, s := range c.Servers {
		fmt.Printf("%s: %t: %s\n", s.Identity, s.CanWriteBitmaps, s.Reason)
	}
	// Output:
	// blocked
	// apiserver-a: false: kube-apiserver v1.37.2 emulating 1.37: from 1.35 both allocator gates are locked on: it runs IPAddressOnly, whatever its flags say
	// apiserver-b: true: kube-apiserver v1.37.2 emulating 1.34: below 1.35 it can run DualWrite (with --feature-gates=DisableAllocatorDualWrite=false), which writes the bitmaps
}
