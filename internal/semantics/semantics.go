// Package semantics decides, for a kube-apiserver release, each behaviour of ClusterIP allocation
// that changed between the supported releases and that the library follows: the answers a Service
// create or update gets, which ClusterIP spellings validation accepts, and what the
// default-ServiceCIDR controller does. Every such fact lives here, named after what it decides;
// the packages that act on them ask a Semantics.
//
// v1.38 (read from v1.38.0-beta.0 against v1.37.2) changes none of the answers decided here: the
// Service registry's allocation errors, the IPAddress allocator's and the repair loops' texts,
// ServiceCIDR and IPAddress validation and the default-ServiceCIDR controller are as in 1.37. What
// it does change is decided elsewhere: the allocator gates and the bitmaps are gone, so it runs
// IPAddressOnly only (featuregate.HasAllocatorGates, and Mode here), StrictIPCIDRValidation is
// GA and locked on at emulated 1.38 (its versioned specs in package featuregate), and the 20-bit
// limit on --service-cluster-ip-range went with the bitmaps (the root package's Config checks).
// Its Service storage now defaults legacy Services on decode, so their status and watch events
// carry clusterIPs, ipFamilies and ipFamilyPolicy: a matter of storage, which the library has
// none of.
package semantics

import (
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/component-base/compatibility"
	basefeaturegate "k8s.io/component-base/featuregate"

	"github.com/kube-ipam/clusterip/featuregate"
)

// Semantics is the behaviour of one kube-apiserver: its binary version decides what its code does,
// its emulation version and feature gates what validation asks. The zero Semantics is not valid;
// use Of.
type Semantics struct {
	binary   *version.Version
	emulated *version.Version
	strictIP bool
	mode     featuregate.Mode
}

// Of returns the semantics of kube-apiserver v with the feature gates gate (from
// featuregate.NewGate). A nil v is featuregate.DefaultVersion(); a nil gate, or one that does
// not know StrictIPCIDRValidation, takes that gate's default at v's emulation version. From 1.38
// the mode is IPAddressOnly whatever gate holds (featuregate.ModeAt).
func Of(v compatibility.EffectiveVersion, gate basefeaturegate.FeatureGate) Semantics {
	if v == nil {
		v = featuregate.DefaultVersion()
	}
	s := Semantics{binary: v.BinaryVersion(), emulated: v.EmulationVersion(), mode: featuregate.IPAddressOnly}
	defaults, err := featuregate.NewGate(v, nil)
	if err == nil {
		s.strictIP = defaults.Enabled(featuregate.StrictIPCIDRValidation)
		if m, err := featuregate.ModeAt(v, defaults); err == nil {
			s.mode = m
		}
	}
	if gate != nil {
		if _, ok := gate.DeepCopy().GetAllVersioned()[featuregate.StrictIPCIDRValidation]; ok {
			s.strictIP = gate.Enabled(featuregate.StrictIPCIDRValidation)
		}
		if m, err := featuregate.ModeAt(v, gate); err == nil {
			s.mode = m
		}
	}
	return s
}

// Default returns the semantics of the newest supported release, with its default gates.
func Default() Semantics { return Of(nil, nil) }

// String returns the release, such as "v1.37.2 emulating 1.37".
func (s Semantics) String() string {
	if s.binary == nil {
		return "<unset>"
	}
	return "v" + s.binary.String() + " emulating " + s.emulated.String()
}

// binaryAtLeast reports whether the binary is of minor release 1.minor or later. The zero
// Semantics counts as the newest release.
func (s Semantics) binaryAtLeast(minor uint) bool {
	return s.binary == nil || s.binary.AtLeast(version.MajorMinor(1, minor))
}

// InvalidOnAllocateNextError reports whether an error of dynamic allocation other than a full
// range is a 422 Invalid at spec.clusterIPs, "failed to allocate IP: <error>" (from 1.35,
// kubernetes#135499). Before, kube-apiserver's IPAddress allocator went on to the next address on
// any error and so answered 500 "range is full".
func (s Semantics) InvalidOnAllocateNextError() bool { return s.binaryAtLeast(35) }

// RefusedAddressReadsAsFull reports whether an IPAddress the API server refuses to create (for
// an owner without a name, say) during dynamic allocation ends in the full range's 500: before
// 1.35, kube-apiserver's IPAddress allocator went on to the next address after any such error, so
// in IPAddressOnly every address was refused in turn. In DualWrite before 1.35 the refusal came
// after the bitmap had given the address and was the answer itself, "failed to allocate a
// serviceIP: <refusal>"; from 1.35 it is InvalidOnAllocateNextError's 422.
func (s Semantics) RefusedAddressReadsAsFull() bool {
	return !s.binaryAtLeast(35) && s.mode == featuregate.IPAddressOnly
}

// FullErrorNamesService reports whether the 500 of a full range names the Service: "failed to
// allocate a serviceIP for Service \"<name>\": range is full" (from 1.36).
func (s Semantics) FullErrorNamesService() bool { return s.binaryAtLeast(36) }

// FieldValuesAsJSON reports whether a field error shows its value as JSON (["10.96.0.1"]), as
// k8s.io/apimachinery does from v0.34, rather than as Go syntax ([]string{"10.96.0.1"}).
func (s Semantics) FieldValuesAsJSON() bool { return s.binaryAtLeast(34) }

// StrictClusterIPs reports whether a new ClusterIP with leading zeros in an IPv4 octet or in
// IPv4-mapped IPv6 form is refused (StrictIPCIDRValidation, on by default from 1.36).
func (s Semantics) StrictClusterIPs() bool { return s.strictIP }

// DefaultServiceCIDRReportsMismatchFirst reports whether the default-ServiceCIDR controller
// reports ranges that differ from its flags whatever the Ready condition says, and sets an
// Unknown condition to True (from 1.34); before, a condition that is not True was reported
// instead and left alone.
func (s Semantics) DefaultServiceCIDRReportsMismatchFirst() bool { return s.binaryAtLeast(34) }
