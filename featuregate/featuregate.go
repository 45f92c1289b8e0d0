package featuregate

import (
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/component-base/featuregate"
)

// The gates, named as in kube-apiserver.
const (
	// MultiCIDRServiceAllocator allocates Service ClusterIPs as networking.k8s.io IPAddress objects
	// from ServiceCIDRs (KEP-1880). Alpha in 1.27 (off), beta in 1.31 (off), GA in 1.33 (on),
	// locked on from 1.34, removed in 1.38.
	MultiCIDRServiceAllocator featuregate.Feature = "MultiCIDRServiceAllocator"

	// DisableAllocatorDualWrite stops mirroring the IPAddress allocations of the flag ranges into
	// the legacy bitmaps. With MultiCIDRServiceAllocator off it changes nothing (Legacy). Alpha in
	// 1.31 (off), beta in 1.33 (off), GA in 1.34 (on), locked on from 1.35, removed in 1.38.
	DisableAllocatorDualWrite featuregate.Feature = "DisableAllocatorDualWrite"

	// StrictIPCIDRValidation refuses new IP and CIDR values in ambiguous spellings: for
	// ClusterIPs, IPv4 octets with leading zeros and IPv4-mapped IPv6 addresses (a Service keeps
	// what it already has). Alpha in 1.33 (off), beta in 1.36 (on), GA and locked on from 1.38.
	// NewGate registers it; Add, which registers into a caller's gate, does not.
	StrictIPCIDRValidation featuregate.Feature = "StrictIPCIDRValidation"
)

// specs are the versioned specs kube-apiserver 1.37, the last release that has them, declares for
// the two allocator gates.
func specs() map[featuregate.Feature]featuregate.VersionedSpecs {
	return map[featuregate.Feature]featuregate.VersionedSpecs{
		MultiCIDRServiceAllocator: {
			{Version: version.MajorMinor(1, 27), Default: false, PreRelease: featuregate.Alpha},
			{Version: version.MajorMinor(1, 31), Default: false, PreRelease: featuregate.Beta},
			{Version: version.MajorMinor(1, 33), Default: true, PreRelease: featuregate.GA},
			{Version: version.MajorMinor(1, 34), Default: true, PreRelease: featuregate.GA, LockToDefault: true},
		},
		DisableAllocatorDualWrite: {
			{Version: version.MajorMinor(1, 31), Default: false, PreRelease: featuregate.Alpha},
			{Version: version.MajorMinor(1, 33), Default: false, PreRelease: featuregate.Beta},
			{Version: version.MajorMinor(1, 34), Default: true, PreRelease: featuregate.GA},
			{Version: version.MajorMinor(1, 35), Default: true, PreRelease: featuregate.GA, LockToDefault: true},
		},
	}
}

// Add registers MultiCIDRServiceAllocator and DisableAllocatorDualWrite, with kube-apiserver's
// versioned specs, into gate. Registering them twice is harmless; it returns gate's error if the
// gate is closed (already added to a flag set) or holds one of the names with another spec. A
// registry that behaves as kube-apiserver 1.38 or later does not call it: that release has no
// such gates and runs IPAddressOnly.
func Add(gate featuregate.MutableVersionedFeatureGate) error {
	if gate == nil {
		return errors.New("featuregate: Add: nil feature gate")
	}
	if err := gate.AddVersioned(specs()); err != nil {
		return fmt.Errorf("featuregate: add %s and %s: %w", MultiCIDRServiceAllocator, DisableAllocatorDualWrite, err)
	}
	return nil
}

// Mode is how Service ClusterIPs are allocated and recorded. The zero Mode is Legacy.
type Mode int

const (
	// Legacy keeps each IP family's allocations in a bitmap in etcd, as kube-apiserver did before
	// ServiceCIDRs.
	Legacy Mode = iota
	// DualWrite allocates from ServiceCIDRs as IPAddress objects and mirrors the allocations of
	// each family's flag range into that family's bitmap, so that Legacy peers keep working.
	DualWrite
	// IPAddressOnly allocates from ServiceCIDRs as IPAddress objects only.
	IPAddressOnly
)

// String returns "Legacy", "DualWrite" or "IPAddressOnly", and "Mode(n)" for any other value.
func (m Mode) String() string {
	switch m {
	case Legacy:
		return "Legacy"
	case DualWrite:
		return "DualWrite"
	case IPAddressOnly:
		return "IPAddressOnly"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// ParseMode returns the Mode whose String is s.
func ParseMode(s string) (Mode, error) {
	for _, m := range []Mode{Legacy, DualWrite, IPAddressOnly} {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("featuregate: unknown mode %q (want Legacy, DualWrite or IPAddressOnly)", s)
}

// ModeOf returns the Mode gate selects: Legacy while MultiCIDRServiceAllocator is off, whatever
// DisableAllocatorDualWrite says, as in kube-apiserver 1.31 to 1.34; otherwise DualWrite, or
// IPAddressOnly with DisableAllocatorDualWrite on. It returns an error if gate is nil or does not
// know the gates (see Add), as a gate of kube-apiserver 1.38 does not: ModeAt answers for those.
func ModeOf(gate featuregate.FeatureGate) (Mode, error) {
	if gate == nil {
		return 0, errors.New("featuregate: ModeOf: nil feature gate")
	}
	// Enabled panics for a gate it does not know; find out first.
	known := gate.DeepCopy().GetAllVersioned()
	for _, f := range []featuregate.Feature{MultiCIDRServiceAllocator, DisableAllocatorDualWrite} {
		if _, ok := known[f]; !ok {
			return 0, fmt.Errorf("featuregate: feature gate %s is not registered (call featuregate.Add)", f)
		}
	}
	switch {
	case !gate.Enabled(MultiCIDRServiceAllocator):
		return Legacy, nil
	case !gate.Enabled(DisableAllocatorDualWrite):
		return DualWrite, nil
	}
	return IPAddressOnly, nil
}

// ModeFor returns the default Mode of kube-apiserver at version v, such as "1.33", "v1.33.13" or
// "1.34.0-alpha.1" (only major and minor count): Legacy up to 1.32, DualWrite for 1.33 and
// IPAddressOnly from 1.34 (and the only mode from 1.38). It returns an error if v does not parse.
func ModeFor(v string) (Mode, error) {
	parsed, err := version.ParseGeneric(v)
	if err != nil {
		return 0, fmt.Errorf("featuregate: kube-apiserver version %q: %w", v, err)
	}
	gate := featuregate.NewVersionedFeatureGate(version.MajorMinor(parsed.Major(), parsed.Minor()))
	if err := Add(gate); err != nil {
		return 0, err
	}
	return ModeOf(gate)
}

// CanWriteBitmaps reports whether kube-apiserver emulating version v (such as "1.34" or
// "v1.33.13"; only major and minor count) can run in a Mode that writes the bitmaps, Legacy or
// DualWrite, by default or with some --feature-gates: below 1.35 it can (at 1.34 only with
// DisableAllocatorDualWrite=false), from 1.35 it cannot, as both gates are locked on there (and
// gone from 1.38) and it runs IPAddressOnly whatever its flags say. A kube-apiserver older than 1.31 emulates nothing: v
// is its own version. It returns an error if v does not parse.
//
// The answer is derived from the gates' versioned specs, as ModeFor's is, so that their locks are
// stated once.
func CanWriteBitmaps(v string) (bool, error) {
	parsed, err := version.ParseGeneric(v)
	if err != nil {
		return false, fmt.Errorf("featuregate: kube-apiserver version %q: %w", v, err)
	}
	emulated := version.MajorMinor(parsed.Major(), parsed.Minor())
	all := specs()
	for _, m := range []Mode{Legacy, DualWrite} {
		overrides, err := GatesFor(m)
		if err != nil {
			return false, err
		}
		if canSet(all, emulated, overrides) {
			return true, nil
		}
	}
	return false, nil
}

// canSet reports whether kube-apiserver emulating v accepts every value of overrides: a gate
// locked at v takes only its default, and one that does not exist yet at v is off and cannot be
// turned on.
func canSet(all map[featuregate.Feature]featuregate.VersionedSpecs, v *version.Version, overrides map[string]bool) bool {
	for name, on := range overrides {
		var spec *featuregate.FeatureSpec
		for i, s := range all[featuregate.Feature(name)] { // oldest first
			if !s.Version.GreaterThan(v) {
				spec = &all[featuregate.Feature(name)][i]
			}
		}
		switch {
		case spec == nil && on:
			return false
		case spec != nil && spec.LockToDefault && spec.Default != on:
			return false
		}
	}
	return true
}
