package featuregate_test

import (
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/util/version"
	basefeaturegate "k8s.io/component-base/featuregate"

	"github.com/kube-ipam/clusterip/featuregate"
)

// A registry registers the gates in its own feature gate, lets --feature-gates set them, and asks
// which allocator mode they select.
func ExampleModeOf() {
	gate := basefeaturegate.NewVersionedFeatureGate(version.MustParse("1.33"))
	if err := featuregate.Add(gate); err != nil {
		panic(err)
	}
	mode, _ := featuregate.ModeOf(gate)
	fmt.Println("1.33 default:", mode)

	_ = gate.Set("DisableAllocatorDualWrite=true")
	mode, _ = featuregate.ModeOf(gate)
	fmt.Println("with DisableAllocatorDualWrite=true:", mode)

	// Without MultiCIDRServiceAllocator, DisableAllocatorDualWrite changes nothing: the bitmaps
	// alone, as kube-apiserver 1.31 to 1.34 run it.
	_ = gate.Set("MultiCIDRServiceAllocator=false")
	mode, _ = featuregate.ModeOf(gate)
	fmt.Println("and MultiCIDRServiceAllocator=false:", mode)
	// Output:
	// 1.33 default: DualWrite
	// with DisableAllocatorDualWrite=true: IPAddressOnly
	// and MultiCIDRServiceAllocator=false: Legacy
}

func ExampleModeFor() {
	for _, v := range []string{"1.32", "1.33", "1.34", "1.35"} {
		mode, _ := featuregate.ModeFor(v)
		fmt.Println(v, mode)
	}
	// Output:
	// 1.32 Legacy
	// 1.33 DualWrite
	// 1.34 IPAddressOnly
	// 1.35 IPAddressOnly
}

// kube-apiserver 1.38 has no allocator gates: it runs IPAddressOnly, emulating 1.35 as well, and
// refuses either name in --feature-gates.
func ExampleGatesAt() {
	v, err := featuregate.KubeVersion(featuregate.NewestKubeVersion, "1.35")
	if err != nil {
		panic(err)
	}
	for _, m := range []featuregate.Mode{featuregate.IPAddressOnly, featuregate.DualWrite} {
		gates, _ := featuregate.GatesAt(v, m)
		gate, err := featuregate.NewGate(v, gates)
		var refused *featuregate.GateError
		if errors.As(err, &refused) {
			fmt.Println(m, "refused:", refused.Err)
			continue
		}
		mode, _ := featuregate.ModeAt(v, gate)
		fmt.Println(m, "runs as", mode, "with", gates)
	}
	// Output:
	// IPAddressOnly runs as IPAddressOnly with map[]
	// DualWrite refused: unrecognized feature gate: DisableAllocatorDualWrite
}
