// Package webhook gives a stock kube-apiserver (IPAddressOnly mode, see package reservation) the
// two hooks a registry built on this module has natively: a Service created without a ClusterIP
// gets the address reserved for its namespace and name, and a deleted Service whose
// [reservation.AnnotationReleasePolicy] says Retain leaves its addresses reserved for its name.
// It replaces running this module's registry only to get reservations claimed and retained.
//
// # The mutating webhook
//
// [Handler] serves admission.k8s.io/v1 AdmissionReviews for Services. On CREATE of a Service of
// a type with a ClusterIP (not ExternalName, not headless) that asks for none, it looks up the
// reservations kept for the Service's namespace and name that have not expired (from an
// IPAddress informer), deletes their objects through the API server with UID and resourceVersion
// preconditions, and answers with a JSONPatch that sets spec.clusterIPs to those addresses, in
// the order of spec.ipFamilies when it is set, and spec.clusterIP to the first. kube-apiserver
// then allocates them statically and creates the IPAddress objects itself. A dry-run request is
// patched the same way but deletes nothing: the webhook declares sideEffects NoneOnDryRun.
//
// The window: between the webhook's delete and kube-apiserver's create of the IPAddress object,
// the address is free, and another Service's dynamic allocation can take it. Then the create of
// the Service fails with 422 "provided IP is already allocated" and the reservation is lost: the
// address belongs to the other Service. The [Controller] sees the other Service hold an address
// the webhook has just handed out and counts it in clusterip_reservation_webhook_window_lost_total
// (see [Metrics]; under heavy churn the count can be a little high, see [Claims]); a retried
// create gets another address. A registry with Config.Reservations
// has no window: it claims the reservation's object in one update.
//
// On CREATE and UPDATE the handler also refuses a Service whose release-policy annotation does
// not parse ([reservation.ParseReleasePolicy]), with allowed=false and code 422, and one whose
// Retain policy the caps on reservations refuse (HandlerOptions.Limits,
// [reservation.Limits.CheckService]) with kube-apiserver's own 422 Invalid for the Service; the
// controller keeps an address at delete only within the caps (ControllerOptions.Limits). Every other
// request is allowed unchanged; a body that is not an AdmissionReview gets HTTP 400. With
// failurePolicy Ignore a webhook that is down lets every Service through unchanged.
//
// # The controller
//
// [Controller] follows a Service informer. When a Service whose release policy is Retain, or
// whose ServiceCIDR has a release cooldown ([reservation.AnnotationReleaseCooldown], read with
// ControllerOptions.ServiceCIDRs), is deleted, it waits (a bounded time) until kube-apiserver has
// deleted the IPAddress object of each of its ClusterIPs, and then creates the reservation
// ([reservation.ObjectFor]) kept for the Service's namespace and name, ending as
// [reservation.KeptOnDelete] says (counted from the delete). The window again: with a stock
// kube-apiserver the address is free between the Service's delete and the controller's create;
// if another Service takes it meanwhile, the controller logs it and counts it in
// clusterip_reservation_controller_window_lost_total. A registry with Config.Reservations turns
// the allocation into the reservation in one update, with no window.
package webhook
