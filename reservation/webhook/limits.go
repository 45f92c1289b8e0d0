package webhook

import (
	"encoding/json"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/reservation"
)

// checkCaps returns the denial of a Service create or update whose Retain policy the caps on
// reservations refuse ([reservation.Limits.CheckService]), nil when they let it through. The
// denial is kube-apiserver's own 422 Invalid for the Service, with the field error as its cause,
// so the client reads what a registry with Config.Reservations or a fork would answer.
func (h *Handler) checkCaps(req *admissionv1.AdmissionRequest, svc *corev1.Service) *admissionv1.AdmissionResponse {
	svc = svc.DeepCopy()
	// The request's namespace and name are the Service's; the object may leave them out.
	if svc.Namespace == "" {
		svc.Namespace = req.Namespace
	}
	if svc.Name == "" {
		svc.Name = req.Name
	}
	var old *corev1.Service
	if req.Operation == admissionv1.Update {
		old = &corev1.Service{}
		if err := json.Unmarshal(req.OldObject.Raw, old); err != nil {
			old = nil // judged as a create: the stricter answer
		}
	}
	fe := h.limits.CheckService(old, svc, h.now())
	if fe == nil {
		return nil
	}
	status := apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Service").GroupKind(), svc.Name, field.ErrorList{fe}).ErrStatus
	return &admissionv1.AdmissionResponse{UID: req.UID, Result: &status}
}

// keptOnDelete returns the reservation item's address becomes, within the caps on reservations
// ([reservation.Limits.KeptOnDelete]), and whether it becomes one; it logs and counts each cap
// that refused, and logs the caps that do not parse.
func (c *Controller) keptOnDelete(item retainItem) (reservation.Reservation, bool) {
	r, ok, refused, bad := c.limits.KeptOnDelete(item.For, item.Addr, item.Policy, c.cooldown(item.Addr), item.Deleted)
	logger := klog.Background().WithValues("controller", ControllerName, "ip", item.Addr, "service", item.For)
	if bad != nil {
		logger.Error(bad, "Ignoring a cap on reservations that does not parse")
	}
	for _, e := range refused {
		c.metrics.retainRefused.WithLabelValues(e.Cap).Inc()
		logger.Info("A cap on reservations refused to keep the address of a deleted Service", "cap", e.Cap, "keptByCooldown", ok, "reason", e.Message())
	}
	return r, ok
}
