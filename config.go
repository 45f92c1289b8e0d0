package clusterip

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/component-base/compatibility"
	basefeaturegate "k8s.io/component-base/featuregate"
	netutils "k8s.io/utils/net"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/featuregate"
)

// Config says which allocators New builds and what they store their state in. The zero Config is
// invalid: it has no Ranges.
type Config struct {
	// Mode selects the allocators; see featuregate.ModeOf. Defaults to featuregate.Legacy, which
	// kube-apiserver 1.38 and later do not run: with such a Version, set IPAddressOnly.
	Mode featuregate.Mode

	// Ranges are the Service CIDRs of kube-apiserver's --service-cluster-ip-range flag, in its
	// order: the primary IP family's first. One or two, at most one per family. Required in every
	// mode: they choose the families served, and in Legacy and DualWrite the bitmaps' ranges. As
	// in kube-apiserver, the first must have at least 8 addresses (an IPv4 /29, an IPv6 /125 or
	// shorter), and in Legacy and DualWrite mode each may have at most 20 host bits (an IPv4 /12
	// or longer, an IPv6 /108 or longer), because a bitmap of it is kept; IPAddressOnly takes any
	// size, as kube-apiserver 1.33 to 1.37 do with both feature gates on and 1.38, which keeps no
	// bitmap, always does. An IPv6 range shorter than /64 is taken but, as in kube-apiserver,
	// its ServiceCIDR is not served (ipaddress.MinIPv6Bits).
	Ranges []netip.Prefix

	// Bitmaps gives the stores of the bitmaps, one per range of Ranges by its index. Required in
	// Legacy and DualWrite mode; unused in IPAddressOnly mode, which keeps no bitmap. To share
	// kube-apiserver's, in its etcd, give etcdstore.Stores{Client: etcd, Prefix: etcdPrefix}: the
	// first range's bitmap is then kept at <prefix>/ranges/serviceips, the second's at
	// <prefix>/ranges/secondaryserviceips, the prefix being kube-apiserver's --etcd-prefix
	// ("/registry" by default). Package bitmap/etcdstore is the only one that links the etcd
	// client, so a program in IPAddressOnly mode that does not import it links none.
	Bitmaps bitmap.Stores

	// Client writes IPAddress objects. Required in DualWrite and IPAddressOnly mode.
	Client kubernetes.Interface

	// Informers provides the ServiceCIDR and IPAddress informers. Required in DualWrite and
	// IPAddressOnly mode. New registers the informers it needs; the caller starts the factory
	// after New.
	Informers informers.SharedInformerFactory

	// ManagedBy is the ipaddress.kubernetes.io/managed-by label of the IPAddress objects the
	// allocators create in DualWrite and IPAddressOnly mode, and by which Release recognises them
	// outside every ServiceCIDR. Defaults to ipaddress.DefaultManagedBy ("ipallocator.k8s.io"),
	// kube-apiserver's own value, whose repair loop deletes such an object when no Service holds
	// its IP (after 60 s): give another value for addresses this process holds for something that
	// is not a Service the API server serves. Package repair treats objects with either value as
	// a Service IP allocator's.
	ManagedBy string

	// Version is the kube-apiserver whose behaviour the allocators have, as component-base's
	// compatibility versions hold it: the binary version decides what its code does (the status
	// codes and texts of the Service answers, how allocation moves between ranges, what repair
	// does), the emulation version (--emulated-version) the defaults and locks of the feature
	// gates. Build one with featuregate.KubeVersion. Nil means the newest supported release that
	// runs Mode (featuregate.DefaultVersionFor): v1.37 for IPAddressOnly, v1.37 emulating 1.34 for
	// DualWrite, v1.36 emulating 1.33 for Legacy. New refuses a Mode the version does not run,
	// with the version's own message. v1.38 (featuregate.NewestKubeVersion, its beta, for now)
	// runs IPAddressOnly only, at every version it emulates (1.35 to 1.38): it has no
	// MultiCIDRServiceAllocator or DisableAllocatorDualWrite gate, so Legacy or DualWrite is
	// refused as kube-apiserver refuses those names ("unrecognized feature gate: ..."), and emulating
	// 1.35 to 1.37 it answers as its own binary with those releases' gate defaults.
	Version compatibility.EffectiveVersion

	// FeatureGates are values of kube-apiserver's --feature-gates for the gates featuregate.NewGate
	// knows, such as {"StrictIPCIDRValidation": false}; the others keep Version's defaults.
	// MultiCIDRServiceAllocator and DisableAllocatorDualWrite follow Mode and may be left out; if
	// given, they must select Mode, and from 1.38, which does not know them, they are refused
	// whatever their values.
	FeatureGates map[string]bool

	// DefaultServiceCIDR makes Run keep the default ServiceCIDR ("kubernetes") of Ranges as
	// kube-apiserver's default-ServiceCIDR controller does: create it if missing, set it ready,
	// upgrade it to dual stack when a second range is added, and report, in the log and with a
	// Warning Event written with Client, ranges that differ from Ranges. Set it in a registry
	// that serves Services without a kube-apiserver; a kube-apiserver beside it does this
	// itself. Only in DualWrite and IPAddressOnly mode, where ServiceCIDRs are served (New refuses
	// it in Legacy mode). Defaults to false. See servicecidr.DefaultController.
	DefaultServiceCIDR bool

	// Reservations makes Services().Allocate give a Service created without a ClusterIP the
	// address reserved for it (package reservation: a reservation kept For its namespace and
	// name), claiming the reservation's IPAddress object in one update, so that no other
	// allocator can take the address at any instant; Services().Release keeps the addresses of a
	// Service whose release policy retains them (reservation.AnnotationReleasePolicy), or whose
	// ServiceCIDR has a release cooldown (reservation.AnnotationReleaseCooldown), as reservations
	// for its return; and Run deletes each reservation when it ends (a cooldown).
	// Retaining is opt-in and capped (reservation.Limits): only a Service of a namespace whose
	// Namespace has reservation.AnnotationMaxRetained may have a Retain policy, read from the
	// Namespace informer of Informers (New registers it; the client lists and watches
	// Namespaces), and a ServiceCIDR's reservation.AnnotationMaxReserved caps what it keeps.
	// The ClusterRole clusterip-registry-reservations grants what this adds to
	// clusterip-registry's calls (the claims' and releases' updates, the Namespace informer).
	// New adds an index to the IPAddress informer of Informers. Only in IPAddressOnly mode, the
	// mode in which kube-apiserver, too, keeps its hands off reserved addresses (New refuses it in
	// the others). Defaults to false: no reservation is looked up, and reserved addresses are only
	// held.
	Reservations bool

	// Registerer, if not nil, receives the allocators' metrics: kube-apiserver's
	// kube_apiserver_clusterip_allocator_* metrics with its names, labels and buckets (one
	// series per ServiceCIDR prefix where ServiceCIDRs are served), and clusterip_allocator_*
	// counters of not-ready refusals, dual-write undos and the bitmap's compare-and-swap
	// conflicts and retries (see metrics.go). Defaults to nil: no metrics. Nothing is registered
	// on a global registry.
	Registerer prometheus.Registerer
}

// ConfigError reports a Config that New cannot build allocators from. It names the field.
type ConfigError struct {
	// Field is the name of the Config field at fault, such as "Bitmaps" or "Ranges[1]".
	Field string
	// Reason says what is wrong with it.
	Reason string
	// Err is the underlying error, if any, such as an *allocator.PrefixError.
	Err error
}

// Error implements error.
func (e *ConfigError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("clusterip: Config.%s: %s: %v", e.Field, e.Reason, e.Err)
	}
	return fmt.Sprintf("clusterip: Config.%s: %s", e.Field, e.Reason)
}

// Unwrap returns the underlying error.
func (e *ConfigError) Unwrap() error { return e.Err }

// ParseRanges parses the value of kube-apiserver's --service-cluster-ip-range flag, such as
// "10.96.0.0/12" or "10.96.0.0/12,fd00::/108", as kube-apiserver reads it (a CIDR with host bits
// set stands for its network, IPv4 octets may have leading zeros), and checks it as New does in
// every mode (the size
// limit of Legacy and DualWrite mode is left to New, which knows the mode). Parse errors wrap an
// *allocator.PrefixError that keeps the input.
func ParseRanges(flag string) ([]netip.Prefix, error) {
	var ranges []netip.Prefix
	for i, s := range strings.Split(flag, ",") {
		p, err := parseFlagCIDR(strings.TrimSpace(s))
		if err != nil {
			return nil, &ConfigError{Field: fmt.Sprintf("Ranges[%d]", i), Reason: "does not parse", Err: err}
		}
		ranges = append(ranges, p)
	}
	if err := checkRanges(ranges); err != nil {
		return nil, err
	}
	return ranges, nil
}

// minPrimaryHostBits is the fewest host bits kube-apiserver (v1.33 to v1.38) takes in the primary
// --service-cluster-ip-range, in every mode: 3, 8 addresses (network address included).
const minPrimaryHostBits = 3

// parseFlagCIDR parses one CIDR of --service-cluster-ip-range as kube-apiserver does, with
// ParseCIDRSloppy (IPv4 octets with leading zeros are decimal), and returns its network, so that
// host bits are dropped as kube-apiserver drops them. Input it does not take gives
// allocator.ParsePrefix's error, which keeps it.
func parseFlagCIDR(s string) (netip.Prefix, error) {
	_, n, err := netutils.ParseCIDRSloppy(s)
	if err != nil {
		return allocator.ParsePrefix(s)
	}
	addr, ok := netip.AddrFromSlice(n.IP)
	ones, _ := n.Mask.Size()
	if !ok {
		return allocator.ParsePrefix(s)
	}
	return netip.PrefixFrom(addr, ones), nil
}

// checkRanges checks what every mode needs of Ranges.
func checkRanges(ranges []netip.Prefix) error {
	switch {
	case len(ranges) == 0:
		return &ConfigError{Field: "Ranges", Reason: "required: the Service CIDRs of --service-cluster-ip-range"}
	case len(ranges) > 2:
		return &ConfigError{Field: "Ranges", Reason: fmt.Sprintf("%d ranges given, at most one per IP family", len(ranges))}
	}
	for i, r := range ranges {
		if err := allocator.CheckPrefix(r); err != nil {
			return &ConfigError{Field: fmt.Sprintf("Ranges[%d]", i), Reason: "not a usable range", Err: err}
		}
	}
	if p := ranges[0]; p.Addr().BitLen()-p.Bits() < minPrimaryHostBits {
		// kube-apiserver (v1.33 to v1.38) refuses to start so, whatever the mode.
		return &ConfigError{Field: "Ranges[0]", Reason: "the service cluster IP range must be at least 8 IP addresses"}
	}
	if len(ranges) == 2 && allocator.FamilyOf(ranges[0].Addr()) == allocator.FamilyOf(ranges[1].Addr()) {
		return &ConfigError{Field: "Ranges[1]", Reason: fmt.Sprintf("%s is of the same IP family as %s; at most one range per family", ranges[1], ranges[0])}
	}
	return nil
}

// maxBitmapHostBits is the most host bits kube-apiserver v1.33 to v1.37 takes in a
// --service-cluster-ip-range of either family while it keeps a bitmap of it (unless
// MultiCIDRServiceAllocator and DisableAllocatorDualWrite are both on): an IPv4 /12, an IPv6 /108.
// v1.38 keeps no bitmap and has no such limit; it runs IPAddressOnly only, which New never
// checks against it.
const maxBitmapHostBits = 20

// checkBitmapRanges refuses, as kube-apiserver v1.33 to v1.37 refuse at start-up in Legacy and
// DualWrite mode, a range with more than maxBitmapHostBits host bits, with kube-apiserver's
// message.
func checkBitmapRanges(ranges []netip.Prefix) error {
	for i, r := range ranges {
		bits := r.Addr().BitLen()
		if bits-r.Bits() <= maxBitmapHostBits {
			continue
		}
		flag := "--service-cluster-ip-range"
		if i > 0 {
			flag += fmt.Sprintf("[%d]", i)
		}
		return &ConfigError{Field: fmt.Sprintf("Ranges[%d]", i), Reason: fmt.Sprintf(
			"specified %s is too large; for %d-bit addresses, the mask must be >= %d (kube-apiserver's limit while a bitmap is kept, in Legacy and DualWrite mode)",
			flag, bits, bits-maxBitmapHostBits)}
	}
	return nil
}

// Validate returns a *ConfigError for the first problem of c that every user of a Config has with
// it, New and package repair alike: Ranges that kube-apiserver's --service-cluster-ip-range would
// not take in any mode (none, more than two, two of one family, a range allocator.CheckPrefix
// refuses, a primary range of fewer than 8 addresses), or an unknown Mode. It returns nil
// otherwise. It does not check the clients: each user of a Config checks those it needs, and New
// also refuses a range too large for the bitmap of a Legacy or DualWrite mode.
func (c *Config) Validate() error {
	if err := checkRanges(c.Ranges); err != nil {
		return err
	}
	switch c.Mode {
	case featuregate.Legacy, featuregate.DualWrite, featuregate.IPAddressOnly:
	default:
		return &ConfigError{Field: "Mode", Reason: fmt.Sprintf("unknown mode %v", c.Mode)}
	}
	return nil
}

// check returns the first problem New would have with c, and otherwise the kube-apiserver c
// describes and its feature gates (see gates), which New builds the allocators with.
func (c *Config) check() (compatibility.EffectiveVersion, basefeaturegate.FeatureGate, error) {
	if err := c.Validate(); err != nil {
		return nil, nil, err
	}
	version, gate, err := c.gates()
	if err != nil {
		return nil, nil, err
	}
	if err := c.checkStores(); err != nil {
		return nil, nil, err
	}
	return version, gate, nil
}

// checkStores returns the first problem c has for its Mode besides the gates: a range too large
// for a bitmap, or a store, client or option the Mode needs or does not take.
func (c *Config) checkStores() error {
	if c.Mode != featuregate.IPAddressOnly {
		if err := checkBitmapRanges(c.Ranges); err != nil {
			return err
		}
	}
	if c.Mode != featuregate.IPAddressOnly && c.Bitmaps == nil {
		return &ConfigError{Field: "Bitmaps", Reason: "required in " + c.Mode.String() + " mode, to hold the bitmaps (etcdstore.Stores for kube-apiserver's, in its etcd)"}
	}
	if c.Mode != featuregate.IPAddressOnly && c.Reservations {
		return &ConfigError{Field: "Reservations", Reason: "only in IPAddressOnly mode: a bitmap knows nothing of reservations, and kube-apiserver in DualWrite mode fails a Service's create whose bitmap pick is reserved"}
	}
	if c.Mode == featuregate.Legacy && c.DefaultServiceCIDR {
		return &ConfigError{Field: "DefaultServiceCIDR", Reason: "only in DualWrite and IPAddressOnly mode: Legacy mode serves no ServiceCIDR (kube-apiserver runs its default-ServiceCIDR controller only with MultiCIDRServiceAllocator on)"}
	}
	if c.Mode != featuregate.Legacy {
		if c.Client == nil {
			return &ConfigError{Field: "Client", Reason: "required in " + c.Mode.String() + " mode, to write IPAddress objects"}
		}
		if c.Informers == nil {
			return &ConfigError{Field: "Informers", Reason: "required in " + c.Mode.String() + " mode, for the ServiceCIDR and IPAddress informers"}
		}
	}
	return nil
}

// familyOf returns the IP family of a range.
func familyOf(p netip.Prefix) corev1.IPFamily { return allocator.FamilyOf(p.Addr()) }
