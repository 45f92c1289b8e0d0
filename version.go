package clusterip

import (
	"fmt"
	"maps"
	"slices"

	"k8s.io/component-base/compatibility"
	basefeaturegate "k8s.io/component-base/featuregate"

	"github.com/kube-ipam/clusterip/featuregate"
)

// gates returns the kube-apiserver c describes and its feature gates running c.Mode, or a
// *ConfigError if that kube-apiserver would not start so: FeatureGates naming a gate it does not
// know or setting Mode's gates to another Mode, or a Mode the version does not run. From 1.38,
// which has no allocator gates, Mode must be IPAddressOnly, and FeatureGates naming either
// allocator gate is refused as an unrecognized gate, whatever its value, as kube-apiserver 1.38
// refuses it.
func (c *Config) gates() (compatibility.EffectiveVersion, basefeaturegate.FeatureGate, error) {
	v := c.Version
	if v == nil {
		v = featuregate.DefaultVersionFor(c.Mode)
	}
	modeGates, err := featuregate.GatesAt(v, c.Mode)
	if err != nil {
		return nil, nil, &ConfigError{Field: "Mode", Reason: fmt.Sprintf("unknown mode %v", c.Mode)}
	}
	set := maps.Clone(c.FeatureGates)
	if set == nil {
		set = map[string]bool{}
	}
	for _, name := range slices.Sorted(maps.Keys(modeGates)) {
		if given, ok := set[name]; ok && given != modeGates[name] {
			return nil, nil, &ConfigError{Field: "FeatureGates", Reason: fmt.Sprintf("%s=%v does not select mode %v", name, given, c.Mode)}
		}
		set[name] = modeGates[name]
	}
	name := fmt.Sprintf("kube-apiserver %s emulating %s", v.BinaryVersion(), v.EmulationVersion())
	note := ""
	if !featuregate.HasAllocatorGates(v.BinaryVersion()) {
		note = fmt.Sprintf(" (%d.%d has no %s or %s feature gate: it runs %v only)", v.BinaryVersion().Major(), v.BinaryVersion().Minor(),
			featuregate.MultiCIDRServiceAllocator, featuregate.DisableAllocatorDualWrite, featuregate.IPAddressOnly)
	}
	if _, err := featuregate.NewGate(v, modeGates); err != nil {
		return nil, nil, &ConfigError{Field: "Mode", Reason: fmt.Sprintf("%s does not run mode %v%s", name, c.Mode, note), Err: err}
	}
	gate, err := featuregate.NewGate(v, set)
	if err != nil {
		return nil, nil, &ConfigError{Field: "FeatureGates", Reason: fmt.Sprintf("%s does not run mode %v with these feature gates%s", name, c.Mode, note), Err: err}
	}
	return v, gate, nil
}
