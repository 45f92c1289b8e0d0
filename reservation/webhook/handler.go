package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	corev1informers "k8s.io/client-go/informers/core/v1"
	networkingv1informers "k8s.io/client-go/informers/networking/v1"
	"k8s.io/client-go/kubernetes"
	networkingv1client "k8s.io/client-go/kubernetes/typed/networking/v1"
	networkingv1listers "k8s.io/client-go/listers/networking/v1"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/reservation"
)

// maxBodyBytes bounds the AdmissionReview the Handler reads: kube-apiserver's own limit for a
// request body is 3 MiB, and a review carries the object twice.
const maxBodyBytes = 7 << 20

// HandlerOptions adjusts [NewHandler]. The zero HandlerOptions counts into unregistered metrics
// and remembers no hand-outs.
type HandlerOptions struct {
	// Metrics receives clusterip_reservation_webhook_claims_total and the admission requests'
	// count and latency. Defaults to unregistered Metrics.
	Metrics *Metrics
	// Claims remembers each address handed out, for the [Controller] to find lost windows.
	// Defaults to none: lost windows are not counted. Not needed with Handouts.
	Claims *Claims
	// Now is the clock reservations are judged expired by. Defaults to time.Now.
	Now func() time.Time
	// ServiceCIDRs, if not nil, is the ServiceCIDR informer (the caller starts it) that decides
	// which reservations may be handed out: only those of an address a live ServiceCIDR serves
	// ([reservation.Served]); until it has synced, none is. Defaults to none: every reservation
	// may be handed out.
	ServiceCIDRs networkingv1informers.ServiceCIDRInformer
	// Limits, the caps on reservations, refuses a Service whose Retain policy its namespace may
	// not have or would exceed its cap with (see [reservation.Limits.CheckService]). Defaults to
	// nil Limits: no namespace may retain, and every Service with a Retain policy is refused.
	Limits *reservation.Limits
	// Handouts, if not nil, records each hand-out before the reservation's delete (nothing is
	// handed out if the record cannot be written) and refuses other Services that ask for an
	// address handed out; give the same Handouts to the [Controller], which ends them. Defaults
	// to none: a reservation handed to a create that then fails is lost.
	Handouts *Handouts
	// Services, if not nil, is the Service informer (the caller starts it, after NewHandler,
	// which indexes it by ClusterIP) by which kube-apiserver's own delete of a reservation kept
	// for a Service is refused when no live Service holds the address: the release, at the
	// Service's delete, of an allocation the [Controller] kept in place (see the package doc).
	// Defaults to none: every delete is allowed.
	Services corev1informers.ServiceInformer
}

// Handler is the mutating admission webhook of the package doc, an http.Handler for
// admission.k8s.io/v1 AdmissionReviews of Services. It reads reservations from an IPAddress
// informer and deletes the ones it hands out through the API server.
//
// The zero Handler is not usable; use [NewHandler]. A Handler is safe for concurrent use.
type Handler struct {
	client  networkingv1client.IPAddressInterface
	index   *reservation.Index
	cidrs   networkingv1listers.ServiceCIDRLister // nil: every reservation may be handed out
	metrics *Metrics
	claims  *Claims
	now     func() time.Time
	limits  *reservation.Limits
	records *Handouts     // nil: no hand-out records
	release *releaseGuard // nil: every delete is allowed
}

var _ http.Handler = (*Handler)(nil)

// NewHandler returns a Handler that reads reservations from informer, which the caller starts
// after NewHandler returns (it adds an index, which fails once the informer has started), and
// deletes them with client. A nil client or informer is an error matching allocator.ErrInvalid.
func NewHandler(client kubernetes.Interface, informer networkingv1informers.IPAddressInformer, opts HandlerOptions) (*Handler, error) {
	if client == nil || informer == nil {
		return nil, fmt.Errorf("webhook: NewHandler needs a client and an IPAddress informer: %w", allocator.ErrInvalid)
	}
	index, err := reservation.NewIndex(informer.Informer())
	if err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	h := &Handler{client: client.NetworkingV1().IPAddresses(), index: index, metrics: opts.Metrics.orNew(), claims: opts.Claims, now: opts.Now, limits: opts.Limits, records: opts.Handouts}
	if h.now == nil {
		h.now = time.Now
	}
	if opts.Services != nil {
		services, err := indexServicesByClusterIP(opts.Services)
		if err != nil {
			return nil, err
		}
		h.release = &releaseGuard{services: services}
	}
	if opts.ServiceCIDRs != nil {
		opts.ServiceCIDRs.Informer() // registers the informer with its factory, so that the caller's Start starts it
		h.cidrs = opts.ServiceCIDRs.Lister()
	}
	return h, nil
}

// ServeHTTP answers one AdmissionReview. A request that is not a POST of a JSON
// admission.k8s.io/v1 AdmissionReview with a request gets HTTP 400 (405 for another method);
// every review gets HTTP 200 with the response of [Handler.Review].
//
// Each request is counted in clusterip_reservation_webhook_admission_requests_total and timed in
// clusterip_reservation_webhook_admission_duration_seconds (see [Metrics]).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	result := resultError
	defer func() { h.metrics.observeAdmission(result, start) }()
	if r.Method != http.MethodPost {
		http.Error(w, "webhook: only POST is served", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		http.Error(w, "webhook: read the body: "+err.Error(), http.StatusBadRequest)
		return
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil {
		http.Error(w, "webhook: the body is not an AdmissionReview: "+err.Error(), http.StatusBadRequest)
		return
	}
	if review.Request == nil {
		http.Error(w, "webhook: the AdmissionReview has no request", http.StatusBadRequest)
		return
	}
	resp := h.Review(r.Context(), review.Request)
	out := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Response: resp}
	data, err := json.Marshal(out)
	if err != nil {
		http.Error(w, "webhook: encode the response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(data)
	result = resultOf(resp)
}

// resultOf returns the result a review's response counts as.
func resultOf(resp *admissionv1.AdmissionResponse) string {
	switch {
	case !resp.Allowed:
		return resultRefused
	case len(resp.Patch) > 0:
		return resultPatched
	default:
		return resultAllowed
	}
}

// servicesResource is what a Service request's Resource is.
var servicesResource = metav1.GroupVersionResource{Version: "v1", Resource: "services"}

// Review decides on one admission request, as the package doc says: an IPAddress CREATE of an
// address handed out is refused unless it is for the Service it is handed to (see [Handouts]);
// kube-apiserver's IPAddress DELETE of a reservation kept for a Service no live Service holds
// is refused (see HandlerOptions.Services); a
// Service CREATE or UPDATE
// with a malformed release-policy annotation is denied with code 422; a Service CREATE that asks
// for no ClusterIP and has reservations gets them, after their objects are deleted (not for a
// dry run); a Service CREATE or UPDATE with release policy Retain gets [Finalizer] unless it has
// it or is being deleted (in the same JSONPatch); anything else, including an object that does
// not decode, is allowed unchanged. The response always carries the request's UID.
func (h *Handler) Review(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	allow := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if req.Resource == ipAddressesResource && req.SubResource == "" {
		switch req.Operation {
		case admissionv1.Create:
			return h.records.guard(req)
		case admissionv1.Delete:
			return h.release.review(req)
		}
		return allow
	}
	if req.Resource != servicesResource || req.SubResource != "" || (req.Operation != admissionv1.Create && req.Operation != admissionv1.Update) {
		return allow
	}
	var svc corev1.Service
	if err := json.Unmarshal(req.Object.Raw, &svc); err != nil {
		return allow // not ours to judge: kube-apiserver decoded it
	}
	if _, err := reservation.ReleasePolicyOf(svc.Annotations); err != nil {
		var ie *reservation.InvalidError
		reason := err.Error()
		if errors.As(err, &ie) {
			reason = ie.Reason
		}
		return &admissionv1.AdmissionResponse{UID: req.UID, Result: &metav1.Status{
			Status: metav1.StatusFailure, Code: http.StatusUnprocessableEntity, Reason: metav1.StatusReasonInvalid,
			Message: fmt.Sprintf("metadata.annotations[%s]: Invalid value: %q: %s", reservation.AnnotationReleasePolicy, svc.Annotations[reservation.AnnotationReleasePolicy], reason),
		}}
	}
	if denied := h.checkCaps(req, &svc); denied != nil {
		return denied
	}
	fin := finalizerPatch(&svc) // Retain: the Controller keeps its addresses even if down at its delete
	// The request's namespace is the Service's; the object may leave it out.
	owner := types.NamespacedName{Namespace: req.Namespace, Name: svc.Name}
	if owner.Name == "" {
		owner.Name = req.Name
	}
	if resp := h.records.refuseHandedOut(req, &svc, owner); resp != nil {
		return resp
	}
	if req.Operation != admissionv1.Create || !wantsAnyClusterIP(&svc) {
		return withPatch(allow, fin)
	}
	picked := h.pick(owner, &svc)
	if len(picked) == 0 {
		return withPatch(allow, fin)
	}
	dryRun := req.DryRun != nil && *req.DryRun
	var addrs []string
	for _, obj := range picked {
		if !dryRun {
			ip, _ := netip.ParseAddr(obj.Name)
			rv, _ := strconv.ParseUint(obj.ResourceVersion, 10, 64)
			undo, err := h.records.record(ctx, owner, obj, h.now())
			if err != nil {
				klog.FromContext(ctx).Info("Not handing out a reservation: its hand-out record could not be written", "ip", obj.Name, "service", owner, "err", err)
				break
			}
			h.claims.add(ip, owner, rv, h.now()) // before the delete: the window opens there
			if err := h.delete(ctx, obj); err != nil {
				h.claims.forget(ip)
				undo(ctx)
				klog.FromContext(ctx).Info("Not handing out a reservation: its delete failed", "ip", obj.Name, "service", owner, "err", err)
				break // a secondary without its primary is no use
			}
		}
		addrs = append(addrs, obj.Name)
	}
	if len(addrs) == 0 {
		return withPatch(allow, fin)
	}
	patch, err := json.Marshal(append([]map[string]any{
		{"op": "add", "path": "/spec/clusterIP", "value": addrs[0]},
		{"op": "add", "path": "/spec/clusterIPs", "value": addrs},
	}, fin...))
	if err != nil {
		return allow
	}
	if !dryRun {
		h.metrics.claims.Inc()
		klog.FromContext(ctx).V(2).Info("Handed reserved addresses to a Service", "service", owner, "ips", addrs)
	}
	pt := admissionv1.PatchTypeJSONPatch
	return &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true, Patch: patch, PatchType: &pt}
}

// wantsAnyClusterIP reports whether svc gets a ClusterIP and asks for none: not ExternalName,
// and neither spec.clusterIP nor spec.clusterIPs set (headless "None" is set).
func wantsAnyClusterIP(svc *corev1.Service) bool {
	return svc.Spec.Type != corev1.ServiceTypeExternalName && svc.Spec.ClusterIP == "" && len(svc.Spec.ClusterIPs) == 0
}

// pick returns the reservation objects to hand to svc, owner, in the order its addresses go in
// spec.clusterIPs: the lowest unexpired reservation of each family (of an address a live
// ServiceCIDR serves, with HandlerOptions.ServiceCIDRs), in the order of spec.ipFamilies if set
// (stopping at the first family without one) and else IPv4 before IPv6; only the first unless
// spec.ipFamilyPolicy asks for two families.
func (h *Handler) pick(owner types.NamespacedName, svc *corev1.Service) []*networkingv1.IPAddress {
	now := h.now()
	lowest := h.index.Lowest
	if h.cidrs != nil {
		cidrs, err := h.cidrs.List(labels.Everything())
		if err != nil {
			return nil
		}
		lowest = func(owner types.NamespacedName, f corev1.IPFamily, now time.Time) (reservation.Reservation, *networkingv1.IPAddress, bool) {
			return h.index.LowestServed(owner, f, now, cidrs)
		}
	}
	byFamily := map[corev1.IPFamily]*networkingv1.IPAddress{}
	for _, f := range []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol} {
		if _, obj, ok := lowest(owner, f, now); ok {
			byFamily[f] = obj
		}
	}
	families := svc.Spec.IPFamilies
	if len(families) == 0 {
		for _, f := range []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol} {
			if byFamily[f] != nil {
				families = append(families, f)
			}
		}
	}
	n := 1
	if p := svc.Spec.IPFamilyPolicy; p != nil && *p != corev1.IPFamilyPolicySingleStack {
		n = 2
	}
	var out []*networkingv1.IPAddress
	for _, f := range families[:min(n, len(families))] {
		obj := byFamily[f]
		if obj == nil || slices.Contains(out, obj) {
			break
		}
		out = append(out, obj)
	}
	return out
}

// delete deletes the reservation obj with its UID and resourceVersion as preconditions, so that
// nothing that took its place is deleted.
func (h *Handler) delete(ctx context.Context, obj *networkingv1.IPAddress) error {
	uid, rv := obj.UID, obj.ResourceVersion
	err := h.client.Delete(ctx, obj.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("webhook: delete reservation %s: %w", obj.Name, err)
	}
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("webhook: reservation %s is gone: %w", obj.Name, err)
	}
	return nil
}
