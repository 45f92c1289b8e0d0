package featuregate

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/component-base/compatibility"
	"k8s.io/component-base/featuregate"
)

// strictIPCIDRValidationSpecs returns kube-apiserver's versioned specs for
// StrictIPCIDRValidation (GA and locked on from 1.38).
func strictIPCIDRValidationSpecs() featuregate.VersionedSpecs {
	return featuregate.VersionedSpecs{
		{Version: version.MajorMinor(1, 33), Default: false, PreRelease: featuregate.Alpha},
		{Version: version.MajorMinor(1, 36), Default: true, PreRelease: featuregate.Beta},
		{Version: version.MajorMinor(1, 38), Default: true, PreRelease: featuregate.GA, LockToDefault: true},
	}
}

// allocatorGatesRemoved is the first kube-apiserver release without MultiCIDRServiceAllocator and
// DisableAllocatorDualWrite: 1.38 removed them with the bitmaps and dual write, and runs
// IPAddressOnly only, at every version it emulates.
var allocatorGatesRemoved = version.MajorMinor(1, 38)

// HasAllocatorGates reports whether kube-apiserver binary declares MultiCIDRServiceAllocator and
// DisableAllocatorDualWrite: releases up to 1.37 do; from 1.38 they are gone, whatever the
// emulation version, so the binary runs IPAddressOnly only and refuses either name in
// --feature-gates ("unrecognized feature gate: ..."). Only major and minor count.
func HasAllocatorGates(binary *version.Version) bool {
	return binary == nil || version.MajorMinor(binary.Major(), binary.Minor()).LessThan(allocatorGatesRemoved)
}

// specsOf returns the specs a kube-apiserver binary of minor release binary declares for the
// gates of NewGate: those of the newest release, without the entries of later releases, and
// without MultiCIDRServiceAllocator and DisableAllocatorDualWrite from 1.38.
func specsOf(binary *version.Version) map[featuregate.Feature]featuregate.VersionedSpecs {
	all := specs()
	if !HasAllocatorGates(binary) {
		all = map[featuregate.Feature]featuregate.VersionedSpecs{}
	}
	all[StrictIPCIDRValidation] = strictIPCIDRValidationSpecs()
	minor := version.MajorMinor(binary.Major(), binary.Minor())
	for f, vs := range all {
		all[f] = slices.DeleteFunc(slices.Clone(vs), func(s featuregate.FeatureSpec) bool { return s.Version.GreaterThan(minor) })
	}
	return all
}

// GateError reports feature gate values that kube-apiserver of the version in question refuses at
// start-up. Its message is kube-apiserver's.
type GateError struct {
	// Version is the kube-apiserver, as "<binary> emulating <major.minor>".
	Version string
	// Err is the refusal.
	Err error
}

// Error implements error.
func (e *GateError) Error() string {
	return fmt.Sprintf("featuregate: kube-apiserver %s refuses the feature gates: %v", e.Version, e.Err)
}

// Unwrap returns the refusal.
func (e *GateError) Unwrap() error { return e.Err }

// NewGate returns the feature gates of kube-apiserver v that concern ClusterIP allocation
// (MultiCIDRServiceAllocator, DisableAllocatorDualWrite and StrictIPCIDRValidation; from 1.38
// StrictIPCIDRValidation alone, see HasAllocatorGates), with the specs v's binary declares, the
// defaults and locks of v's emulation version, and the values of overrides, as --feature-gates
// would set them (keys are gate names). A nil v is DefaultVersion.
//
// It refuses, with a *GateError carrying kube-apiserver's message, what v refuses at start-up: a
// name it does not know ("unrecognized feature gate: <name>", which from 1.38 includes
// MultiCIDRServiceAllocator and DisableAllocatorDualWrite, set to any value at any emulation
// version), a locked gate set against its lock, and in 1.35 to 1.37 (which declare
// DisableAllocatorDualWrite dependent on MultiCIDRServiceAllocator) DisableAllocatorDualWrite on
// with MultiCIDRServiceAllocator off, at any emulation version. The returned gate is the caller's
// to read; ModeAt gives its Mode.
func NewGate(v compatibility.EffectiveVersion, overrides map[string]bool) (featuregate.FeatureGate, error) {
	if v == nil {
		v = DefaultVersion()
	}
	name := v.BinaryVersion().String() + " emulating " + v.EmulationVersion().String()
	gate := featuregate.NewVersionedFeatureGate(v.EmulationVersion())
	if err := gate.AddVersioned(specsOf(v.BinaryVersion())); err != nil {
		return nil, fmt.Errorf("featuregate: %w", err)
	}
	// SetFromMap reports one problem at a time in map order; set the names in a stable order.
	// A value equal to the default is left alone: setting it changes nothing, and component-base
	// would log a warning for every GA gate set.
	known := gate.GetAll()
	for _, k := range slices.Sorted(maps.Keys(overrides)) {
		if _, ok := known[featuregate.Feature(k)]; ok && gate.Enabled(featuregate.Feature(k)) == overrides[k] {
			continue
		}
		if err := gate.SetFromMap(map[string]bool{k: overrides[k]}); err != nil {
			return nil, &GateError{Version: name, Err: err}
		}
	}
	if declaresDependency(v.BinaryVersion()) && gate.Enabled(DisableAllocatorDualWrite) && !gate.Enabled(MultiCIDRServiceAllocator) {
		return nil, &GateError{Version: name, Err: fmt.Errorf("%s is enabled, but depends on features that are disabled: %v",
			DisableAllocatorDualWrite, []featuregate.Feature{MultiCIDRServiceAllocator})}
	}
	return gate, nil
}

// declaresDependency reports whether kube-apiserver binary declares DisableAllocatorDualWrite
// dependent on MultiCIDRServiceAllocator, which it checks at start-up: from 1.35 until the gates
// are removed in 1.38.
func declaresDependency(binary *version.Version) bool {
	return binary.AtLeast(version.MajorMinor(1, 35)) && HasAllocatorGates(binary)
}

// GatesFor returns the MultiCIDRServiceAllocator and DisableAllocatorDualWrite values that select
// m, as --feature-gates would give them: for Legacy, MultiCIDRServiceAllocator off alone (whatever
// DisableAllocatorDualWrite says, which kube-apiserver 1.35 to 1.37 refuse when it is on). For a
// kube-apiserver that may be 1.38 or later, which has no such gates, use GatesAt.
func GatesFor(m Mode) (map[string]bool, error) {
	switch m {
	case Legacy:
		return map[string]bool{string(MultiCIDRServiceAllocator): false}, nil
	case DualWrite:
		return map[string]bool{string(MultiCIDRServiceAllocator): true, string(DisableAllocatorDualWrite): false}, nil
	case IPAddressOnly:
		return map[string]bool{string(MultiCIDRServiceAllocator): true, string(DisableAllocatorDualWrite): true}, nil
	}
	return nil, errors.New("featuregate: unknown " + m.String())
}

// GatesAt returns the --feature-gates values that select m in kube-apiserver v (nil is
// DefaultVersion): GatesFor(m) where v's binary declares the allocator gates, and from 1.38,
// which has none and runs IPAddressOnly only, no values for IPAddressOnly and GatesFor(m) for
// Legacy and DualWrite, which NewGate then refuses as kube-apiserver 1.38 does
// ("unrecognized feature gate: MultiCIDRServiceAllocator" for Legacy,
// "unrecognized feature gate: DisableAllocatorDualWrite" for DualWrite). It returns an error for
// an unknown Mode.
func GatesAt(v compatibility.EffectiveVersion, m Mode) (map[string]bool, error) {
	gates, err := GatesFor(m)
	if err != nil {
		return nil, err
	}
	if v == nil {
		v = DefaultVersion()
	}
	if m == IPAddressOnly && !HasAllocatorGates(v.BinaryVersion()) {
		return map[string]bool{}, nil
	}
	return gates, nil
}

// ModeAt returns the Mode kube-apiserver v (nil is DefaultVersion) runs with the feature gates
// gate (from NewGate): IPAddressOnly from 1.38, which has no allocator gates, and ModeOf(gate)
// before.
func ModeAt(v compatibility.EffectiveVersion, gate featuregate.FeatureGate) (Mode, error) {
	if v == nil {
		v = DefaultVersion()
	}
	if !HasAllocatorGates(v.BinaryVersion()) {
		return IPAddressOnly, nil
	}
	return ModeOf(gate)
}
