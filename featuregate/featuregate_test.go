package featuregate_test

import (
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/util/version"
	basefeaturegate "k8s.io/component-base/featuregate"

	"github.com/kube-ipam/clusterip/featuregate"
)

func newGate(t *testing.T, v string) basefeaturegate.MutableVersionedFeatureGate {
	t.Helper()
	gate := basefeaturegate.NewVersionedFeatureGate(version.MustParse(v))
	if err := featuregate.Add(gate); err != nil {
		t.Fatalf("Add() = %v", err)
	}
	return gate
}

func TestModeOfFollowsTheGates(t *testing.T) {
	tests := []struct {
		name    string
		version string
		flags   map[string]bool
		want    featuregate.Mode
	}{
		{name: "1.32 defaults", version: "1.32", want: featuregate.Legacy},
		{name: "1.33 defaults", version: "1.33", want: featuregate.DualWrite},
		{name: "1.34 defaults", version: "1.34", want: featuregate.IPAddressOnly},
		{name: "1.33 legacy", version: "1.33", flags: map[string]bool{"MultiCIDRServiceAllocator": false}, want: featuregate.Legacy},
		{name: "1.33 IPAddress only", version: "1.33", flags: map[string]bool{"DisableAllocatorDualWrite": true}, want: featuregate.IPAddressOnly},
		{name: "1.32 dual write", version: "1.32", flags: map[string]bool{"MultiCIDRServiceAllocator": true}, want: featuregate.DualWrite},
		{name: "1.34 dual write", version: "1.34", flags: map[string]bool{"DisableAllocatorDualWrite": false}, want: featuregate.DualWrite},
		// kube-apiserver 1.31–1.34 declare no dependency between the gates: every check of
		// DisableAllocatorDualWrite sits inside a MultiCIDRServiceAllocator branch, so off/on runs
		// the bitmaps alone, and upstream's own integration tests start servers that way.
		{name: "1.33 off/on", version: "1.33", flags: map[string]bool{"MultiCIDRServiceAllocator": false, "DisableAllocatorDualWrite": true}, want: featuregate.Legacy},
		{name: "1.32 off/on", version: "1.32", flags: map[string]bool{"DisableAllocatorDualWrite": true}, want: featuregate.Legacy},
		{name: "1.31 off/on", version: "1.31", flags: map[string]bool{"DisableAllocatorDualWrite": true}, want: featuregate.Legacy},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gate := newGate(t, tt.version)
			if err := gate.SetFromMap(tt.flags); err != nil {
				t.Fatalf("SetFromMap(%v) = %v", tt.flags, err)
			}
			got, err := featuregate.ModeOf(gate)
			if err != nil {
				t.Fatalf("ModeOf() error = %v, want %v", err, tt.want)
			}
			if got != tt.want {
				t.Errorf("ModeOf() = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestGatesLockedAsInKubeAPIServer(t *testing.T) {
	tests := []struct {
		version string
		flag    string
		value   bool
		locked  bool
	}{
		{version: "1.33", flag: "MultiCIDRServiceAllocator", value: false, locked: false},
		{version: "1.34", flag: "MultiCIDRServiceAllocator", value: false, locked: true},
		{version: "1.34", flag: "DisableAllocatorDualWrite", value: false, locked: false},
		{version: "1.35", flag: "DisableAllocatorDualWrite", value: false, locked: true},
	}
	for _, tt := range tests {
		t.Run(tt.version+"/"+tt.flag, func(t *testing.T) {
			err := newGate(t, tt.version).SetFromMap(map[string]bool{tt.flag: tt.value})
			if got := err != nil; got != tt.locked {
				t.Errorf("SetFromMap(%s=%t) at %s = %v, want locked %t", tt.flag, tt.value, tt.version, err, tt.locked)
			}
		})
	}
}

func TestModeForKubeAPIServerVersions(t *testing.T) {
	tests := []struct {
		version string
		want    featuregate.Mode
	}{
		{"1.26", featuregate.Legacy},
		{"1.30", featuregate.Legacy},
		{"1.31", featuregate.Legacy},
		{"1.32", featuregate.Legacy},
		{"1.33", featuregate.DualWrite},
		{"v1.33.13", featuregate.DualWrite},
		{"1.34", featuregate.IPAddressOnly},
		{"1.34.0-alpha.1", featuregate.IPAddressOnly},
		{"1.35", featuregate.IPAddressOnly},
		{"1.40", featuregate.IPAddressOnly},
	}
	for _, tt := range tests {
		t.Run(tt.version, func(t *testing.T) {
			got, err := featuregate.ModeFor(tt.version)
			if err != nil {
				t.Fatalf("ModeFor(%q) = %v", tt.version, err)
			}
			if got != tt.want {
				t.Errorf("ModeFor(%q) = %v, want %v", tt.version, got, tt.want)
			}
		})
	}
}

func TestModeForRejectsGarbage(t *testing.T) {
	for _, v := range []string{"", "one.two", "latest"} {
		if got, err := featuregate.ModeFor(v); err == nil {
			t.Errorf("ModeFor(%q) = %v, nil; want an error", v, got)
		}
	}
}

// TestCanWriteBitmapsUntilBothGatesAreLocked: kube-apiserver writes the bitmaps in Legacy and
// DualWrite mode, which it reaches by default up to 1.33 and at 1.34 with
// DisableAllocatorDualWrite=false; from 1.35 both gates are locked on and nothing it is given
// makes it write them.
func TestCanWriteBitmapsUntilBothGatesAreLocked(t *testing.T) {
	tests := []struct {
		version string
		want    bool
	}{
		{"1.20", true}, // before either gate: Legacy only
		{"1.30", true},
		{"1.32", true},
		{"v1.33.13", true},
		{"1.34", true}, // IPAddressOnly by default, DualWrite with DisableAllocatorDualWrite=false
		{"1.34.0-alpha.1", true},
		{"1.35", false},
		{"v1.37.2", false},
		{"1.40", false},
	}
	for _, tt := range tests {
		t.Run(tt.version, func(t *testing.T) {
			got, err := featuregate.CanWriteBitmaps(tt.version)
			if err != nil {
				t.Fatalf("CanWriteBitmaps(%q) error = %v", tt.version, err)
			}
			if got != tt.want {
				t.Errorf("CanWriteBitmaps(%q) = %v, want %v", tt.version, got, tt.want)
			}
		})
	}
	for _, v := range []string{"", "one.two", "latest"} {
		if got, err := featuregate.CanWriteBitmaps(v); err == nil {
			t.Errorf("CanWriteBitmaps(%q) = %v, nil; want an error", v, got)
		}
	}
}

// TestCanWriteBitmapsAgreesWithTheGatesKubeAPIServerAccepts: for every supported release at
// every version it emulates, CanWriteBitmaps says true exactly when NewGate, which refuses what
// that kube-apiserver refuses at start-up, accepts the gates of Legacy or DualWrite.
func TestCanWriteBitmapsAgreesWithTheGatesKubeAPIServerAccepts(t *testing.T) {
	for _, release := range featuregate.SupportedReleases() {
		bin := version.MustParse(release + ".0")
		for minor := bin.Minor(); minor+3 >= bin.Minor() && minor >= 31; minor-- {
			emulated := fmt.Sprintf("1.%d", minor)
			v, err := featuregate.KubeVersion(bin.String(), emulated)
			if err != nil {
				t.Fatalf("KubeVersion(%s, %s) error = %v", bin, emulated, err)
			}
			accepted := false
			for _, m := range []featuregate.Mode{featuregate.Legacy, featuregate.DualWrite} {
				overrides, _ := featuregate.GatesFor(m)
				if gate, err := featuregate.NewGate(v, overrides); err == nil {
					if got, _ := featuregate.ModeOf(gate); got == m {
						accepted = true
					}
				}
			}
			got, err := featuregate.CanWriteBitmaps(emulated)
			if err != nil || got != accepted {
				t.Errorf("kube-apiserver %s emulating %s: CanWriteBitmaps = %v, %v; want %v (what NewGate accepts)", bin, emulated, got, err, accepted)
			}
		}
	}
}

func TestModeOfUnregisteredGateIsAnError(t *testing.T) {
	gate := basefeaturegate.NewVersionedFeatureGate(version.MustParse("1.33"))
	if got, err := featuregate.ModeOf(gate); err == nil {
		t.Errorf("ModeOf(gate without the features) = %v, nil; want an error", got)
	}
	if _, err := featuregate.ModeOf(nil); err == nil {
		t.Error("ModeOf(nil) = nil error, want an error")
	}
}

func TestAddTwiceIsHarmless(t *testing.T) {
	gate := newGate(t, "1.33")
	if err := featuregate.Add(gate); err != nil {
		t.Errorf("second Add() = %v, want nil", err)
	}
	if err := featuregate.Add(nil); err == nil {
		t.Error("Add(nil) = nil, want an error")
	}
}

func TestModeStringRoundTrips(t *testing.T) {
	for _, m := range []featuregate.Mode{featuregate.Legacy, featuregate.DualWrite, featuregate.IPAddressOnly} {
		got, err := featuregate.ParseMode(m.String())
		if err != nil || got != m {
			t.Errorf("ParseMode(%q) = %v, %v; want %v, nil", m.String(), got, err, m)
		}
	}
	if got := featuregate.Mode(7).String(); got != "Mode(7)" {
		t.Errorf("Mode(7).String() = %q, want %q", got, "Mode(7)")
	}
	if _, err := featuregate.ParseMode("legacy"); err == nil {
		t.Error(`ParseMode("legacy") = nil error, want an error`)
	}
}
