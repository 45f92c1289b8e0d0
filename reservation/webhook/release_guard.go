package webhook

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1informers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-ipam/clusterip/reservation"
)

// KubeAPIServerUser is the user kube-apiserver's own requests to itself are made as (its loopback
// client): the one that releases a deleted Service's addresses and runs the IPAddress repair.
const KubeAPIServerUser = "system:apiserver"

// servicesByClusterIPIndex is the Service informer's index of the addresses each Service holds.
const servicesByClusterIPIndex = "clusterip.kube-ipam.io/cluster-ips"

// indexServicesByClusterIP adds the index of Services by the addresses they hold to informer,
// unless it has it already.
func indexServicesByClusterIP(informer corev1informers.ServiceInformer) (cache.Indexer, error) {
	inf := informer.Informer()
	if _, ok := inf.GetIndexer().GetIndexers()[servicesByClusterIPIndex]; ok {
		return inf.GetIndexer(), nil
	}
	err := inf.AddIndexers(cache.Indexers{servicesByClusterIPIndex: func(obj any) ([]string, error) {
		svc, ok := obj.(*corev1.Service)
		if !ok {
			return nil, nil
		}
		var keys []string
		for _, ip := range clusterIPs(svc) {
			keys = append(keys, ip.String())
		}
		return keys, nil
	}})
	if err != nil {
		return nil, fmt.Errorf("webhook: index Services by ClusterIP: %w", err)
	}
	return inf.GetIndexer(), nil
}

// releaseGuard refuses kube-apiserver's delete of a reservation that the [Controller] made, in
// place, of a Retain Service's allocation before it let the Service go (see the package doc): the
// delete is kube-apiserver releasing the address of the Service it has just deleted, which it
// would otherwise free for any other Service. kube-apiserver ignores the refusal (it logs it).
type releaseGuard struct {
	services cache.Indexer // the Service informer's, with servicesByClusterIPIndex
}

// review decides on the DELETE of an IPAddress object. It refuses it only when all hold: the
// request is kube-apiserver's own ([KubeAPIServerUser]), the object is a well-formed reservation
// kept for a Service, and no Service that is not being deleted holds the address by the informer. So kube-apiserver's repair still replaces a reservation with the
// allocation of a live Service that holds the address (the Service wins), and every other user
// (an operator, the webhook's own controllers, clusterip repair) deletes reservations as before.
func (g *releaseGuard) review(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	allow := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if g == nil || req.UserInfo.Username != KubeAPIServerUser {
		return allow
	}
	var obj networkingv1.IPAddress
	if err := json.Unmarshal(req.OldObject.Raw, &obj); err != nil {
		return allow
	}
	r, ok := reservation.FromObject(&obj)
	if !ok || r.For == (types.NamespacedName{}) {
		return allow
	}
	if g.heldByLiveService(r.Addr) {
		return allow
	}
	return &admissionv1.AdmissionResponse{UID: req.UID, Result: &metav1.Status{
		Status: metav1.StatusFailure, Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden,
		Message: fmt.Sprintf("ipaddresses.networking.k8s.io %q is kept as a reservation for Service %s by its release policy: it is not released with the Service", obj.Name, r.For),
		Details: &metav1.StatusDetails{Name: obj.Name, Group: networkingv1.GroupName, Kind: "ipaddresses"},
	}}
}

// heldByLiveService reports whether a Service that is not being deleted holds addr by the
// informer: another Service (the Service wins), or the one the reservation is kept for before
// its delete began (which the Controller's conversion waits for).
func (g *releaseGuard) heldByLiveService(addr netip.Addr) bool {
	objs, err := g.services.ByIndex(servicesByClusterIPIndex, addr.String())
	if err != nil {
		return false
	}
	for _, o := range objs {
		if svc, ok := o.(*corev1.Service); ok && svc.DeletionTimestamp == nil {
			return true
		}
	}
	return false
}
