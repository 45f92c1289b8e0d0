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

// strictIPCIDRValidationSpecs are kube-apiserver's versioned specs for StrictIPCIDRValidation.
var strictIPCIDRValidationSpecs = featuregate.VersionedSpecs{
	{Version: version.MajorMinor(1, 33), Default: false, PreRelease: featuregate.Alpha},
	{Version: version.MajorMinor(1, 36), Default: true, PreRelease: featuregate.Beta},
}

// specsOf returns the specs a kube-apiserver binary of minor release binary declares for the
// three gates: those of the newest release, without the entries of later releases.
func specsOf(binary *version.Version) map[featuregate.Feature]featuregate.VersionedSpecs {
	all := specs()
	all[StrictIPCIDRValidation] = strictIPCIDRValidationSpecs
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
// (MultiCIDRServiceAllocator, DisableAllocatorDualWrite and StrictIPCIDRValidation), with the
// specs v's binary declares, the defaults and locks of v's emulation version, and the values of
// overrides, as --feature-gates would set them (keys are gate names). A nil v is DefaultVersion.
//
// It refuses, with a *GateError carrying kube-apiserver's message, what v refuses at start-up: a
// name it does not know, a locked gate set against its lock, and from 1.35 (which declares
// DisableAllocatorDualWrite dependent on MultiCIDRServiceAllocator)
// DisableAllocatorDualWrite on with MultiCIDRServiceAllocator off, at any emulation version. The
// returned gate is the caller's to read; ModeOf gives its Mode.
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
// dependent on MultiCIDRServiceAllocator, which it checks at start-up: from 1.35.
func declaresDependency(binary *version.Version) bool {
	return binary.AtLeast(version.MajorMinor(1, 35))
}

// GatesFor returns the MultiCIDRServiceAllocator and DisableAllocatorDualWrite values that select
// m, as --feature-gates would give them: for Legacy, MultiCIDRServiceAllocator off alone (whatever
// DisableAllocatorDualWrite says, which kube-apiserver 1.35 and later refuse when it is on).
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
