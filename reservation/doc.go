// Package reservation keeps Service ClusterIPs out of dynamic allocation: a reserved address is
// one no Service gets when it asks for any address, either kept for a named Service that does not
// exist yet or held anonymously under a name, optionally until a time (a cooldown) and with a
// reason for people. It replaces placeholder Services created only to hold an address.
//
// # The record
//
// A reservation is a networking.k8s.io/v1 IPAddress object, the same kind kube-apiserver keeps one
// of per allocated ClusterIP (KEP-1880), so the API server's uniqueness of names is the lock
// between a reservation and every allocator:
//   - name: the address in canonical form, such as "10.96.0.10" or "fd00:10:96::a";
//   - labels: ipaddress.kubernetes.io/managed-by: [ManagedBy] and ipaddress.kubernetes.io/ip-family:
//     IPv4 or IPv6;
//   - spec.parentRef: the Service it is kept for ({group "", resource "services", namespace,
//     name}: a namespace and name, which outlive a UID), or for an anonymous reservation
//     {group [Group], resource [Resource], name: the reservation's name};
//   - annotations: [AnnotationExpires] (RFC 3339, UTC; absent for no end) and
//     [AnnotationReason] (free text; absent for none).
//
// [ObjectFor] and [FromObject] are the one place that writes and reads that format; [Validate]
// says which values it holds.
//
// # What kube-apiserver does with it
//
// Stock kube-apiserver v1.33 to v1.37 in IPAddressOnly mode (the default from v1.34;
// MultiCIDRServiceAllocator on and DisableAllocatorDualWrite on in v1.33) treats any IPAddress
// object whose managed-by label is not its own ipallocator.k8s.io as another controller's:
//   - its dynamic allocation gets AlreadyExists creating the object and tries another address,
//     so no Service that asks for any address gets a reserved one;
//   - a Service that asks for a reserved address by spec.clusterIP(s) is refused with 422
//     Invalid, field spec.clusterIPs, "provided IP is already allocated" (for a Service named in
//     a reservation's For too: this package only records the intent);
//   - its IPAddress repair loop leaves the object alone, however old it is, unless a Service
//     already holds the address, when it replaces the object with the Service's own.
//
// The tests of this package check these against real kube-apiserver v1.33.13 and v1.37.2. In
// DualWrite mode (v1.33's default) kube-apiserver picks an address from its bitmap, which knows
// nothing of reservations, and then creates the IPAddress object; if that address is reserved the
// create gets AlreadyExists and the Service's create fails with 500 "provided IP is already
// allocated" (checked against v1.33.13 too): use reservations in IPAddressOnly mode. In Legacy
// mode nothing reads IPAddress objects and a reservation has no effect.
//
// This module's own allocators (package ipaddress, servicecidr) count every IPAddress in range as
// allocated whoever manages it, and package repair never reports an object it does not manage as
// leaked; like kube-apiserver's, it gives a Service that holds a reserved address its own object
// (a wrong-parent finding).
//
// # Managing reservations
//
// A [Client] reserves ([Client.Reserve]), releases ([Client.Release]) and lists ([Client.List])
// through the API server. Reserve refuses bad input, an address no ServiceCIDR can hand out, and
// an address something already holds, before it writes anything. Release deletes only
// reservations, never the IPAddress object of a Service's allocation.
//
// A [Claimer] gives a Service the address reserved for it, and keeps a deleted Service's addresses
// as reservations when its [AnnotationReleasePolicy] or its ServiceCIDR's release cooldown says
// so, each in one update of the object, in a registry built on this module
// (clusterip.Config.Reservations, through allocator/service's Options.Reserved) and in the
// kube-apiserver forks of its repository (CLUSTERIP_RESERVATIONS=on); an [ExpiryController]
// deletes each reservation when it ends. Package reservation/webhook does the
// same beside a stock kube-apiserver, with the window its doc names.
//
// # Release cooldowns
//
// A ServiceCIDR annotated [AnnotationReleaseCooldown] (a Go duration, 1s to ten years, read by
// [ParseReleaseCooldown] alone) holds each address a deleted Service of it releases until the
// cooldown ends: the Service's allocation becomes a reservation kept for the Service's namespace
// and name, with an end and a reason naming the Service ([KeptOnDelete] states the rule, and
// how it combines with a Retain policy: the longer end wins). It is kept for the Service, not
// anonymous, because kube-apiserver refuses any change to an IPAddress object's spec.parentRef:
// only so is it one resourceVersion-guarded update with no instant in which the address is free.
// No other Service gets the address before the end; the same Service created again does. A value
// that does not parse is an [*InvalidError] from [ReleaseCooldownFor], which the Claimer and the
// webhook's controller log, and counts as no cooldown: a typo never blocks a delete. A
// ServiceCIDR without the annotation changes nothing. The Claimer reads ServiceCIDRs only with
// [WithServiceCIDRs] (clusterip.New passes it).
//
// # Caps
//
// Retaining is opt-in per namespace and capped, so that no tenant who may create and delete
// Services keeps the whole range: a Namespace's [AnnotationMaxRetained] lets its Services use a
// Retain policy and bounds what the namespace keeps, and a ServiceCIDR's [AnnotationMaxReserved]
// bounds the reservations of any owner in it. [Limits] is the one place that decides, for the
// Claimer ([WithNamespaces]; clusterip.New passes it), package reservation/webhook and
// [Client.Reserve]; a refusal is a field error or a [*LimitError] naming the cap.
package reservation
