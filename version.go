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
// know or setting Mode's gates to another Mode, or a Mode the version does not run.
func (c *Config) gates() (compatibility.EffectiveVersion, basefeaturegate.FeatureGate, error) {
	v := c.Version
	if v == nil {
		v = featuregate.DefaultVersionFor(c.Mode)
	}
	modeGates, err := featuregate.GatesFor(c.Mode)
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
	reason := fmt.Sprintf("kube-apiserver %s emulating %s does not run mode %v", v.BinaryVersion(), v.EmulationVersion(), c.Mode)
	if _, err := featuregate.NewGate(v, modeGates); err != nil {
		return nil, nil, &ConfigError{Field: "Mode", Reason: reason, Err: err}
	}
	gate, err := featuregate.NewGate(v, set)
	if err != nil {
		return nil, nil, &ConfigError{Field: "FeatureGates", Reason: reason + " with these feature gates", Err: err}
	}
	return v, gate, nil
}
