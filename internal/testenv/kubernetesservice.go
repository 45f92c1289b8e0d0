package testenv

import (
	"context"
	"net/netip"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// WaitForKubernetesService waits until the kube-apiserver behind c has allocated the ClusterIP of
// its own Service default/kubernetes, and returns that address. A kube-apiserver creates the
// Service shortly after it reports ready, and a test that allocates before then races it for its
// address.
func WaitForKubernetesService(t testing.TB, c kubernetes.Interface) netip.Addr {
	t.Helper()
	var ip netip.Addr
	WaitFor(t, "Service default/kubernetes and its ClusterIP", func() bool {
		svc, err := c.CoreV1().Services(metav1.NamespaceDefault).Get(context.Background(), "kubernetes", metav1.GetOptions{})
		if err != nil {
			return false
		}
		ip, err = netip.ParseAddr(svc.Spec.ClusterIP)
		return err == nil
	})
	return ip
}
