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
// (see [Metrics]; from the hand-out records below, or, without them, from [Claims], whose count
// can be a little high under heavy churn); a retried
// create gets another address. A registry with Config.Reservations
// has no window: it claims the reservation's object in one update.
//
// # Hand-out records
//
// With HandlerOptions.Handouts ([Handouts]), the Handler first records each hand-out, in a
// coordination.k8s.io/v1 Lease in the webhook's own namespace named after the address
// ([HandoutName]), holding the Service and the reservation as it was, and hands out nothing if
// the record cannot be written (the Service gets a dynamic address). A dry run writes nothing.
// While the record exists (from when the Handler's Lease informer has it, milliseconds after the
// write), the Handler refuses any other Service that asks for the address by
// spec.clusterIP or spec.clusterIPs, on CREATE and UPDATE, with kube-apiserver's own answer for an
// address already allocated (422, field spec.clusterIPs, "failed to allocate IP <ip>: provided IP
// is already allocated"). The [Controller] ends each record: once the Service holds the address
// it deletes it; if another Service took the address in the window it counts the window lost; and
// if, after the bound (HandoutsOptions.Bound, kube-apiserver's longest request plus the webhook's
// timeout), no object holds the address — the Service's create failed after the webhook (a later
// webhook or policy, quota, validation, AlreadyExists, a timeout) — it creates the reservation
// again exactly as it was, unless it has ended, and counts it in
// clusterip_reservation_webhook_handouts_returned_total. The records are shared by every replica
// and survive restarts; every end deletes its record with UID and resourceVersion preconditions,
// so that two controllers neither lose nor repeat one.
//
// What remains where kube-apiserver cannot be made to present a client certificate (managed
// clusters, see the command's --client-ca-file): a forged review that reaches the webhook still
// makes it hand out a reservation. The address is then kept from every Service that asks for it
// by address until the bound, when the reservation is put back; but in that time a dynamic pick
// by kube-apiserver can take it, as in the window above.
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
//
// # The finalizer
//
// The controller sees a delete only while it runs. So that a Retain Service deleted while the
// webhook's Deployment is down or rolling keeps its addresses too, such a Service carries the
// finalizer [Finalizer] (clusterip.kube-ipam.io/retain): the Handler adds it, in the JSONPatch of
// a CREATE or UPDATE, to a Service whose release policy is Retain or Retain/<d> and whose type
// has a ClusterIP, unless it has it already or is being deleted (kube-apiserver refuses a new
// finalizer then); the webhook never removes one. The Controller adds it to a live Retain
// Service that lacks it (created before the webhook was installed, or while it was down), if
// ControllerOptions.Sent says the webhook is sent that Service's creates, and removes it from a
// live Service that is no longer Retain.
//
// A deleted Service with the finalizer is not deleted at once: kube-apiserver sets its
// metadata.deletionTimestamp and keeps it, Terminating, its ClusterIPs still allocated to it
// (their IPAddress objects still name it), until the finalizer goes. The Controller, when it
// sees such a Service (at once, or from its informer's list when it starts again), queues each
// of its addresses to be kept, counted from the deletionTimestamp, and only then removes the
// finalizer, with a merge patch whose resourceVersion is a precondition (a conflict is tried
// again), removing only its own entry; it waits for the Service's other finalizers to go first,
// so that the addresses it waits for are released at once. kube-apiserver then deletes the
// Service and its IPAddress objects, and the controller creates the reservations as above. While
// the controller is down, `kubectl delete service` waits for the Service to go (until the
// controller is back, or kubectl's --timeout); with --wait=false it returns at once, and the
// Service is deleted when the controller is back. A crash of the controller between the
// finalizer's removal and the reservation's create loses the address as a window does: the
// Service is gone and its address free, and the controller, started again, has no Service to
// keep it for. A delete event of a Service without the finalizer keeps its addresses as before.
//
// # Kept in place: no window for a Retain Service
//
// When the webhook's configuration also sends kube-apiserver's deletes of reservations to the
// Handler with failurePolicy Fail ([Sent.GuardsReleases]; the shipped manifest does), the
// Controller does better than the window above for a Retain Service with the finalizer: before
// it removes the finalizer, while the Service still holds its addresses, it turns each
// IPAddress object into the reservation kept for the Service, in one update guarded by its
// resourceVersion, as a registry does, so the address is never free. kube-apiserver, deleting the
// Service, then deletes those objects to release them; the Handler (given
// HandlerOptions.Services) refuses that delete, as it refuses any delete by kube-apiserver
// ([KubeAPIServerUser]) of a reservation kept for a Service when no Service that is not being
// deleted holds the address; and kube-apiserver ignores a failed release (it logs it). Its
// repair, which would replace the reservation of a Terminating Service with an allocation, is
// refused the same way. A Service that is not being deleted and holds such an address still gets
// its own object from kube-apiserver's repair (the Service wins). With the webhook down, the
// release fails (failurePolicy Fail) and the reservation stays. The shipped entry sends only
// kube-apiserver's own deletes (a matchCondition on the user), so no one else's delete of a
// reservation waits for the webhook or fails while it is down. Counted in
// clusterip_reservation_controller_kept_in_place_total. Addresses of a Service deleted without
// the finalizer, and those only a ServiceCIDR's release cooldown keeps, still take the path with
// the window.
//
// An operator who uninstalls the webhook deletes its MutatingWebhookConfiguration and Deployment
// and then removes the finalizer from every Service, as README says; otherwise each Retain
// Service waits for a controller that never comes at its delete.
package webhook
