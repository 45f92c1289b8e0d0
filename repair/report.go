package repair

import (
	"cmp"
	"net/netip"
	"slices"
)

// Class is the kind of inconsistency a Finding reports. Its values are stable: they appear in
// the JSON form of a Report.
type Class string

// The classes, in the order of precedence: an address with several problems is reported once,
// with the first class that applies.
const (
	// Invalid is a Service ClusterIP that is not an address in any spelling kube-apiserver v1.33
	// accepts (allocator.ParseClusterIP), or an IPAddress name that is not an address in
	// canonical form. Repair only emits an Event (ClusterIPNotValid).
	//
	// A ClusterIP v1.33 accepts but does not write canonically ("10.96.0.010",
	// "::ffff:10.96.0.11", "FD00::A") is not invalid: the Service holds the parsed address, and
	// every finding keys it by that address, so its IPAddress object and bit are never taken for
	// a leak.
	Invalid Class = "invalid"
	// DuplicateOwner is an IP held by two or more Services. Repair only emits an Event
	// (ClusterIPAlreadyAllocated).
	DuplicateOwner Class = "duplicate-owner"
	// OutOfRange is a Service's ClusterIP in no ServiceCIDR (in Legacy mode: not an address of its
	// family's bitmap). Repair only emits an Event (ClusterIPOutOfRange).
	//
	// Every ServiceCIDR counts, ready or not, as kube-apiserver v1.33's repair counts them: while
	// a ServiceCIDR is being removed its Services keep their addresses, and a missing IPAddress
	// of one is created. An address is in a ServiceCIDR when one of its prefixes contains it and
	// it is neither the prefix's network address nor, for IPv4, its broadcast address. A
	// Service holding an address outside every ServiceCIDR, with an IPAddress object (what
	// kube-apiserver v1.33's IPAddress allocator hands out for half its picks in an IPv6 /64,
	// kubernetes#138374), is out of range, and its IPAddress is left in place.
	OutOfRange Class = "out-of-range"
	// WrongParent is an IPAddress whose parentRef is not the Service that holds its IP. Repair
	// recreates it with the right parent (IPAddressWrongReference).
	//
	// It also covers an IPAddress whose parentRef is right but whose labels are not the ones a
	// Service IP allocator gives it (the ip-family label of its IP and the managed-by label
	// ipallocator.k8s.io), which kube-apiserver's repair fixes too: the finding's Detail names
	// the labels, and repair updates them in place, with the resourceVersion it read as a
	// precondition, so the address is never free meanwhile. The table of classes is
	// fixed; a label fix is one more wrong reference of the IPAddress to what holds it.
	WrongParent Class = "wrong-parent"
	// Missing is a Service's ClusterIP with no IPAddress object (in Legacy mode: with its bit
	// clear). Repair creates it, and in DualWrite mode sets the bit too (ClusterIPNotAllocated).
	Missing Class = "missing"
	// Leaked is an IPAddress object (in Legacy mode: a bit) whose IP no Service holds. Repair
	// frees it after the hold-off (IPAddressNotAllocated).
	Leaked Class = "leaked"
	// BitmapOnly is, in DualWrite mode, a bit set with neither an IPAddress object nor a Service:
	// a stale bit. Repair clears it after the hold-off.
	BitmapOnly Class = "bitmap-only"
	// IPAddressOnly is, in DualWrite mode, a Service's IP with its IPAddress object inside a flag
	// range whose bit is clear. Repair sets the bit.
	IPAddressOnly Class = "ipaddress-only"
)

// classOrder is every Class in order of precedence.
var classOrder = [...]Class{Invalid, DuplicateOwner, OutOfRange, WrongParent, Missing, Leaked, BitmapOnly, IPAddressOnly}

// Classes returns every Class in order of precedence, in a new slice.
func Classes() []Class { return slices.Clone(classOrder[:]) }

// rank returns c's position in the order of precedence, or the number of classes for an unknown
// class.
func (c Class) rank() int {
	if i := slices.Index(classOrder[:], c); i >= 0 {
		return i
	}
	return len(classOrder)
}

// Finding is one address that needs attention. The zero Finding is meaningless.
type Finding struct {
	// IP is the address in canonical form (a ClusterIP as allocator.ParseClusterIP reads it),
	// or for Invalid the string as stored.
	IP string `json:"ip"`
	// Class is the first class of the table that applies to IP.
	Class Class `json:"class"`
	// Service is "namespace/name" of the Service concerned, if any.
	Service string `json:"service,omitempty"`
	// Detail is one sentence for a person.
	Detail string `json:"detail"`
}

// Report is the result of an audit. Its JSON form is stable. The zero Report is not produced
// by Audit; a Report is a plain value, safe to read concurrently.
type Report struct {
	// Mode is the featuregate.Mode the audit judged by, as its String gives it.
	Mode string `json:"mode"`
	// Consistent reports whether there are no findings.
	Consistent bool `json:"consistent"`
	// Counts holds "services", "ipAddresses" and "bitmapBits" (what was read), and the number of
	// findings of each class found, keyed by the class.
	Counts map[string]int `json:"counts"`
	// Findings are sorted by IP (as addresses, IPv4 first; unparsable strings last), then by
	// class precedence. Never nil: [] when consistent.
	Findings []Finding `json:"findings"`
	// StaleBitmaps are the bitmaps kube-apiserver's Legacy and DualWrite modes kept, found by an
	// IPAddressOnly audit given Config.Bitmaps: no allocator of that mode reads or writes them, and
	// no kube-apiserver release removes them (RemoveStaleBitmaps does, once no server can write
	// them). They are not findings (the allocations are in the IPAddress objects) and leave
	// Consistent as it is. Empty in the other modes, where the bitmaps are in use.
	StaleBitmaps []StaleBitmap `json:"staleBitmaps,omitempty"`
	// Reservations are the reservations (package reservation) that ended, lie outside every
	// ServiceCIDR, or are kept for a Service that holds another address, sorted by address. Not
	// findings: they leave Consistent as it is. Read outside Legacy mode.
	Reservations []ReservationFinding `json:"reservations,omitempty"`
	// Caps are the caps on reservations (package reservation's Limits) and where each namespace
	// and capped ServiceCIDR prefix stands against its cap. Not findings: they leave Consistent
	// as it is. Nil in Legacy mode, and when no namespace keeps a reservation or has a cap and no
	// ServiceCIDR has one.
	Caps *Caps `json:"caps,omitempty"`
	// Upgrade is the pre-flight of an upgrade to kube-apiserver 1.38 (CheckUpgrade), which Audit
	// does not make: "clusterip check" fills it in. Not a finding: it leaves Consistent as it is,
	// though check exits 1 on its Hazard. Nil when it was not made.
	Upgrade *UpgradeCheck `json:"upgrade,omitempty"`
}

// StaleBitmap is a bitmap left in the store of a flag range in IPAddressOnly mode.
type StaleBitmap struct {
	// Range is the flag range whose store holds it, such as "10.96.0.0/16".
	Range string `json:"range"`
	// Key names where it is kept, such as "/registry/ranges/serviceips".
	Key string `json:"key"`
	// StoredRange is the range the bitmap was written for (another than Range if the flag changed).
	StoredRange string `json:"storedRange"`
	// Bits is the number of addresses of Range set in it.
	Bits int `json:"bits"`
	// Revision is the store's revision of it (etcd's mod revision for etcdstore).
	Revision int64 `json:"revision"`
}

// Count keys of a Report that are not classes.
const (
	CountServices    = "services"
	CountIPAddresses = "ipAddresses"
	CountBitmapBits  = "bitmapBits"
)

// sortFindings orders fs by IP (parsed addresses first, in address order, then raw strings),
// then by raw string, then by class precedence. pub returns the Finding of an element.
func sortFindings[T any](fs []T, pub func(*T) *Finding) {
	type key struct {
		ip netip.Addr
		ok bool
	}
	keys := make(map[string]key, len(fs))
	for i := range fs {
		f := pub(&fs[i])
		if _, done := keys[f.IP]; !done {
			ip, err := netip.ParseAddr(f.IP)
			keys[f.IP] = key{ip, err == nil}
		}
	}
	slices.SortFunc(fs, func(x, y T) int {
		a, b := pub(&x), pub(&y)
		ka, kb := keys[a.IP], keys[b.IP]
		if ka.ok != kb.ok {
			if ka.ok {
				return -1
			}
			return 1
		}
		if ka.ok {
			if c := ka.ip.Compare(kb.ip); c != 0 {
				return c
			}
		}
		if c := cmp.Compare(a.IP, b.IP); c != 0 {
			return c
		}
		return cmp.Compare(a.Class.rank(), b.Class.rank())
	})
}
