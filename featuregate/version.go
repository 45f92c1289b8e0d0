package featuregate

import (
	"errors"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/component-base/compatibility"
)

// SupportedReleases are the kube-apiserver minor releases whose behaviour the library has, oldest
// first. v1.34 is not among them: it reached its end of life before this module supported it.
// v1.38 is, from its beta (NewestKubeVersion).
var supportedReleases = []*version.Version{
	version.MajorMinor(1, 33),
	version.MajorMinor(1, 35),
	version.MajorMinor(1, 36),
	version.MajorMinor(1, 37),
	version.MajorMinor(1, 38),
}

// SupportedReleases returns the kube-apiserver minor releases whose behaviour the library has,
// oldest first: "1.33", "1.35", "1.36", "1.37" and "1.38".
func SupportedReleases() []string {
	out := make([]string, len(supportedReleases))
	for i, v := range supportedReleases {
		out[i] = v.String()
	}
	return out
}

// DefaultKubeVersion is the binary version of the newest supported kube-apiserver release that
// has shipped, the one the library behaves as when it is not told otherwise.
const DefaultKubeVersion = "1.37.2"

// NewestKubeVersion is the binary version of the newest kube-apiserver build whose behaviour the
// library has: v1.38's beta, whose source its 1.38 semantics are read from, until v1.38.0 ships
// and becomes DefaultKubeVersion. It is not the default while it is a pre-release; give it to
// KubeVersion to behave as it. Its minor is the last of SupportedReleases.
const NewestKubeVersion = "1.38.0-beta.0"

// minimumEmulationVersion is the lowest version kube-apiserver emulates at all: the release that
// introduced compatibility versions.
var minimumEmulationVersion = version.MajorMinor(1, 31)

// VersionError reports a binary and emulated version that no supported kube-apiserver runs as.
type VersionError struct {
	// Binary and Emulated are the versions as given.
	Binary, Emulated string
	// Reason says what is wrong with them.
	Reason string
}

// Error implements error.
func (e *VersionError) Error() string {
	return fmt.Sprintf("featuregate: kube-apiserver %s emulating %s: %s", e.Binary, e.Emulated, e.Reason)
}

// KubeVersion returns the compatibility version of a kube-apiserver whose binary version is binary
// (such as "1.37.2", "v1.35.4" or NewestKubeVersion, "1.38.0-beta.0", whose pre-release it keeps)
// and which runs with --emulated-version=emulated (major.minor,
// such as "1.34"; "" for the binary's own minor), as kube-apiserver builds its own: it may emulate
// down to its minor minus 3, not below 1.31, and its minimum compatibility version is the emulated
// minor minus 1 (not below that floor). The binary's minor must be one of SupportedReleases. It
// returns a *VersionError for versions that do not parse, an unsupported release or an emulated
// version out of the binary's range, with kube-apiserver's message for the last.
func KubeVersion(binary, emulated string) (compatibility.MutableEffectiveVersion, error) {
	// Parse keeps a pre-release ("1.38.0-beta.0"), as kube-apiserver reads its own version;
	// only major and minor count below.
	bin, err := version.Parse(binary)
	if err != nil {
		return nil, &VersionError{Binary: binary, Emulated: emulated, Reason: err.Error()}
	}
	minor := version.MajorMinor(bin.Major(), bin.Minor())
	if !slices.ContainsFunc(supportedReleases, minor.EqualTo) {
		return nil, &VersionError{Binary: binary, Emulated: emulated,
			Reason: fmt.Sprintf("release %s is not supported (supported: %v)", minor, SupportedReleases())}
	}
	floor := minor.SubtractMinor(3)
	if floor.LessThan(minimumEmulationVersion) {
		floor = minimumEmulationVersion
	}
	v := compatibility.NewEffectiveVersion(bin, false, floor, floor)
	if emulated != "" {
		em, err := version.ParseGeneric(emulated)
		if err != nil {
			return nil, &VersionError{Binary: binary, Emulated: emulated, Reason: err.Error()}
		}
		v.SetEmulationVersion(em)
	}
	if errs := v.Validate(); len(errs) > 0 {
		return nil, &VersionError{Binary: binary, Emulated: emulated, Reason: errors.Join(errs...).Error()}
	}
	return v, nil
}

// DefaultVersion returns the compatibility version the library behaves as when it is not told
// otherwise: kube-apiserver DefaultKubeVersion emulating its own minor.
func DefaultVersion() compatibility.MutableEffectiveVersion {
	v, err := KubeVersion(DefaultKubeVersion, "")
	if err != nil { // DefaultKubeVersion is a supported release
		panic(err)
	}
	return v
}

// DefaultVersionFor returns the compatibility version the library behaves as, when it is not
// told otherwise, in Mode m: the newest supported kube-apiserver that runs m, at the newest
// version it can emulate while running m. That is DefaultVersion for IPAddressOnly, v1.37.2
// emulating 1.34 for DualWrite (DisableAllocatorDualWrite is locked on from 1.35), and v1.36.3
// emulating 1.33 for Legacy (MultiCIDRServiceAllocator is locked on from 1.34, and v1.37 cannot
// emulate 1.33). An unknown Mode gets DefaultVersion.
func DefaultVersionFor(m Mode) compatibility.MutableEffectiveVersion {
	binary, emulated := DefaultKubeVersion, ""
	switch m {
	case DualWrite:
		emulated = "1.34"
	case Legacy:
		binary, emulated = "1.36.3", "1.33"
	}
	v, err := KubeVersion(binary, emulated)
	if err != nil { // supported releases and emulation versions within their range
		panic(err)
	}
	return v
}
