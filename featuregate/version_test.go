package featuregate_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/version"

	"github.com/kube-ipam/clusterip/featuregate"
)

func TestKubeVersionEmulatesAsKubeAPIServer(t *testing.T) {
	tests := []struct {
		binary, emulated string
		wantEmulated     string // "" for an error
		wantErr          string
	}{
		{binary: "1.37.2", wantEmulated: "1.37"},
		{binary: "v1.37.2", emulated: "1.34", wantEmulated: "1.34"},
		{binary: "1.37.2", emulated: "1.33", wantErr: "emulation version 1.33 is not between [1.34, 1.37.0]"},
		{binary: "1.36.3", emulated: "1.33", wantEmulated: "1.33"},
		{binary: "1.35.4", emulated: "1.32", wantEmulated: "1.32"},
		{binary: "1.33.13", emulated: "1.31", wantEmulated: "1.31"},
		{binary: "1.33.13", emulated: "1.30", wantErr: "emulation version 1.30 is not between [1.31, 1.33.0]"},
		{binary: "1.35.4", emulated: "1.36", wantErr: "emulation version 1.36 is not between [1.32, 1.35.0]"},
		{binary: "1.34.4", wantErr: "release 1.34 is not supported"},
		{binary: "1.38.0-beta.0", wantEmulated: "1.38"},
		{binary: "v1.38.0", emulated: "1.35", wantEmulated: "1.35"},
		{binary: "1.38.0-beta.0", emulated: "1.34", wantErr: "emulation version 1.34 is not between [1.35, 1.38.0-beta.0]"},
		{binary: "1.38.2", emulated: "1.39", wantErr: "emulation version 1.39 is not between [1.35, 1.38.0]"},
		{binary: "1.39.0", wantErr: "release 1.39 is not supported"},
		{binary: "banana", wantErr: "banana"},
		{binary: "1.37.2", emulated: "x.y", wantErr: "x.y"},
	}
	for _, tt := range tests {
		t.Run(tt.binary+"/"+tt.emulated, func(t *testing.T) {
			v, err := featuregate.KubeVersion(tt.binary, tt.emulated)
			if tt.wantErr != "" {
				var ve *featuregate.VersionError
				if !errors.As(err, &ve) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("KubeVersion() error = %v, want a *VersionError containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("KubeVersion() = %v", err)
			}
			if got := v.EmulationVersion().String(); got != tt.wantEmulated {
				t.Errorf("EmulationVersion() = %s, want %s", got, tt.wantEmulated)
			}
		})
	}
}

// TestNewGateRunsAsEachRelease checks the gates' defaults, locks and the start-up refusals of each
// supported release, and the Mode they select.
func TestNewGateRunsAsEachRelease(t *testing.T) {
	tests := []struct {
		name             string
		binary, emulated string
		set              map[string]bool
		wantMode         featuregate.Mode
		wantStrict       bool
		wantErr          string
	}{
		{name: "v1.33 default", binary: "1.33.13", wantMode: featuregate.DualWrite},
		{name: "v1.33 emulating 1.32", binary: "1.33.13", emulated: "1.32", wantMode: featuregate.Legacy},
		{name: "v1.33 runs off/on as Legacy", binary: "1.33.13",
			set: map[string]bool{"MultiCIDRServiceAllocator": false, "DisableAllocatorDualWrite": true}, wantMode: featuregate.Legacy},
		{name: "v1.35 default", binary: "1.35.4", wantMode: featuregate.IPAddressOnly},
		{name: "v1.35 emulating 1.33", binary: "1.35.4", emulated: "1.33", wantMode: featuregate.DualWrite},
		{name: "v1.35 emulating 1.34 with dual write", binary: "1.35.4", emulated: "1.34",
			set: map[string]bool{"DisableAllocatorDualWrite": false}, wantMode: featuregate.DualWrite},
		{name: "v1.35 refuses dual write unlocked at 1.35", binary: "1.35.4",
			set: map[string]bool{"DisableAllocatorDualWrite": false}, wantErr: "cannot set feature gate DisableAllocatorDualWrite to false, feature is locked to true"},
		{name: "v1.35 refuses off/on at any emulation version", binary: "1.35.4", emulated: "1.33",
			set:     map[string]bool{"MultiCIDRServiceAllocator": false, "DisableAllocatorDualWrite": true},
			wantErr: "DisableAllocatorDualWrite is enabled, but depends on features that are disabled: [MultiCIDRServiceAllocator]"},
		{name: "v1.36 emulating 1.33 off/off is Legacy", binary: "1.36.3", emulated: "1.33",
			set: map[string]bool{"MultiCIDRServiceAllocator": false}, wantMode: featuregate.Legacy},
		{name: "v1.36 default is strict", binary: "1.36.3", wantMode: featuregate.IPAddressOnly, wantStrict: true},
		{name: "v1.36 emulating 1.35 is not strict", binary: "1.36.3", emulated: "1.35", wantMode: featuregate.IPAddressOnly},
		{name: "v1.35 strict on request", binary: "1.35.4", set: map[string]bool{"StrictIPCIDRValidation": true},
			wantMode: featuregate.IPAddressOnly, wantStrict: true},
		{name: "v1.37 default", binary: "1.37.2", wantMode: featuregate.IPAddressOnly, wantStrict: true},
		{name: "v1.37 emulating 1.34 with dual write", binary: "1.37.2", emulated: "1.34",
			set: map[string]bool{"DisableAllocatorDualWrite": false}, wantMode: featuregate.DualWrite},
		{name: "v1.37 refuses Legacy", binary: "1.37.2", emulated: "1.34",
			set: map[string]bool{"MultiCIDRServiceAllocator": false}, wantErr: "cannot set feature gate MultiCIDRServiceAllocator to false, feature is locked to true"},
		{name: "an unknown gate", binary: "1.37.2", set: map[string]bool{"NoSuchGate": true}, wantErr: "unrecognized feature gate: NoSuchGate"},
		{name: "v1.38 default", binary: "1.38.0-beta.0", wantMode: featuregate.IPAddressOnly, wantStrict: true},
		{name: "v1.38 emulating 1.35", binary: "1.38.0-beta.0", emulated: "1.35", wantMode: featuregate.IPAddressOnly},
		{name: "v1.38 emulating 1.35 strict on request", binary: "1.38.0", emulated: "1.35", set: map[string]bool{"StrictIPCIDRValidation": true},
			wantMode: featuregate.IPAddressOnly, wantStrict: true},
		{name: "v1.38 emulating 1.37 strict off on request", binary: "1.38.0", emulated: "1.37", set: map[string]bool{"StrictIPCIDRValidation": false},
			wantMode: featuregate.IPAddressOnly},
		{name: "v1.38 locks strict on", binary: "1.38.0-beta.0", set: map[string]bool{"StrictIPCIDRValidation": false},
			wantErr: "cannot set feature gate StrictIPCIDRValidation to false, feature is locked to true"},
		{name: "v1.38 knows no MultiCIDRServiceAllocator", binary: "1.38.0-beta.0", set: map[string]bool{"MultiCIDRServiceAllocator": false},
			wantErr: "unrecognized feature gate: MultiCIDRServiceAllocator"},
		{name: "v1.38 knows no MultiCIDRServiceAllocator, even set to its old default", binary: "1.38.0-beta.0", set: map[string]bool{"MultiCIDRServiceAllocator": true},
			wantErr: "unrecognized feature gate: MultiCIDRServiceAllocator"},
		{name: "v1.38 emulating 1.35 knows no DisableAllocatorDualWrite", binary: "1.38.0-beta.0", emulated: "1.35", set: map[string]bool{"DisableAllocatorDualWrite": false},
			wantErr: "unrecognized feature gate: DisableAllocatorDualWrite"},
		{name: "v1.38 emulating 1.35 knows no DisableAllocatorDualWrite on either", binary: "1.38.0", emulated: "1.35", set: map[string]bool{"DisableAllocatorDualWrite": true},
			wantErr: "unrecognized feature gate: DisableAllocatorDualWrite"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := featuregate.KubeVersion(tt.binary, tt.emulated)
			if err != nil {
				t.Fatal(err)
			}
			gate, err := featuregate.NewGate(v, tt.set)
			if tt.wantErr != "" {
				var ge *featuregate.GateError
				if !errors.As(err, &ge) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("NewGate() error = %v, want a *GateError containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("NewGate() = %v", err)
			}
			if mode, err := featuregate.ModeAt(v, gate); err != nil || mode != tt.wantMode {
				t.Errorf("ModeAt() = %v, %v; want %v", mode, err, tt.wantMode)
			}
			if got := gate.Enabled(featuregate.StrictIPCIDRValidation); got != tt.wantStrict {
				t.Errorf("StrictIPCIDRValidation = %v, want %v", got, tt.wantStrict)
			}
		})
	}
}

// TestDefaultVersionForRunsTheMode checks that the version each Mode defaults to runs it.
func TestDefaultVersionForRunsTheMode(t *testing.T) {
	for _, m := range []featuregate.Mode{featuregate.Legacy, featuregate.DualWrite, featuregate.IPAddressOnly} {
		v := featuregate.DefaultVersionFor(m)
		set, err := featuregate.GatesFor(m)
		if err != nil {
			t.Fatal(err)
		}
		gate, err := featuregate.NewGate(v, set)
		if err != nil {
			t.Fatalf("%v: NewGate(%v) = %v", m, v, err)
		}
		if got, _ := featuregate.ModeOf(gate); got != m {
			t.Errorf("%v: the default version %v runs %v", m, v, got)
		}
	}
	if got := featuregate.DefaultVersionFor(featuregate.IPAddressOnly).BinaryVersion().String(); got != featuregate.DefaultKubeVersion {
		t.Errorf("IPAddressOnly defaults to %s, want the newest release %s", got, featuregate.DefaultKubeVersion)
	}
}

// TestGatesAtSelectTheModeOrAreRefused: for every supported release at every version it
// emulates, the gates GatesAt gives for a Mode either make NewGate's kube-apiserver run that Mode
// or are refused at start-up; from 1.38 only IPAddressOnly is run, with no gate named, and
// Legacy and DualWrite are refused as unrecognized gates.
func TestGatesAtSelectTheModeOrAreRefused(t *testing.T) {
	binaries := map[string]string{"1.33": "1.33.13", "1.35": "1.35.4", "1.36": "1.36.3", "1.37": featuregate.DefaultKubeVersion, "1.38": featuregate.NewestKubeVersion}
	for _, release := range featuregate.SupportedReleases() {
		bin, ok := binaries[release]
		if !ok {
			t.Fatalf("no binary version for release %s", release)
		}
		for minor := 38; minor >= 31; minor-- {
			emulated := fmt.Sprintf("1.%d", minor)
			v, err := featuregate.KubeVersion(bin, emulated)
			if err != nil {
				continue // out of the binary's range
			}
			for _, m := range []featuregate.Mode{featuregate.Legacy, featuregate.DualWrite, featuregate.IPAddressOnly} {
				set, err := featuregate.GatesAt(v, m)
				if err != nil {
					t.Fatalf("GatesAt(%s@%s, %v) = %v", bin, emulated, m, err)
				}
				gate, err := featuregate.NewGate(v, set)
				if err == nil {
					if got, err := featuregate.ModeAt(v, gate); err != nil || got != m {
						t.Errorf("%s@%s: GatesAt(%v) = %v runs %v, %v", bin, emulated, m, set, got, err)
					}
				}
				if release != "1.38" {
					continue
				}
				switch m {
				case featuregate.IPAddressOnly:
					if err != nil || len(set) != 0 {
						t.Errorf("%s@%s: IPAddressOnly: GatesAt = %v, NewGate error %v; want no gates, accepted", bin, emulated, set, err)
					}
				default:
					want := map[featuregate.Mode]string{featuregate.Legacy: "unrecognized feature gate: MultiCIDRServiceAllocator",
						featuregate.DualWrite: "unrecognized feature gate: DisableAllocatorDualWrite"}[m]
					var ge *featuregate.GateError
					if !errors.As(err, &ge) || !strings.Contains(err.Error(), want) {
						t.Errorf("%s@%s: %v: NewGate(%v) error = %v, want a *GateError saying %q", bin, emulated, m, set, err, want)
					}
				}
			}
		}
	}
	if _, err := featuregate.GatesAt(nil, featuregate.Mode(9)); err == nil {
		t.Error("GatesAt(nil, Mode(9)) = nil error, want an error")
	}
}

func TestHasAllocatorGatesUntil138(t *testing.T) {
	tests := []struct {
		binary string
		want   bool
	}{
		{"1.31.0", true},
		{"1.33.13", true},
		{"1.37.2", true},
		{"1.38.0-alpha.1", false},
		{"1.38.0-beta.0", false},
		{"1.38.0", false},
		{"1.40.1", false},
	}
	for _, tt := range tests {
		if got := featuregate.HasAllocatorGates(version.MustParse(tt.binary)); got != tt.want {
			t.Errorf("HasAllocatorGates(%s) = %v, want %v", tt.binary, got, tt.want)
		}
	}
}

func TestModeAtIsIPAddressOnlyFrom138(t *testing.T) {
	v138, err := featuregate.KubeVersion(featuregate.NewestKubeVersion, "1.35")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := featuregate.ModeAt(v138, nil); err != nil || got != featuregate.IPAddressOnly {
		t.Errorf("ModeAt(%s, nil) = %v, %v; want IPAddressOnly", v138, got, err)
	}
	v137, err := featuregate.KubeVersion(featuregate.DefaultKubeVersion, "")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := featuregate.ModeAt(v137, nil); err == nil {
		t.Errorf("ModeAt(%s, nil) = %v, nil; want ModeOf's error", v137, got)
	}
}

// TestNewestKubeVersionIsTheLastSupportedRelease: the v1.38 build the library reads is a
// supported release of its own and not (while a pre-release) the default.
func TestNewestKubeVersionIsTheLastSupportedRelease(t *testing.T) {
	v, err := featuregate.KubeVersion(featuregate.NewestKubeVersion, "")
	if err != nil {
		t.Fatalf("KubeVersion(NewestKubeVersion) = %v", err)
	}
	if got := v.BinaryVersion().String(); got != featuregate.NewestKubeVersion {
		t.Errorf("BinaryVersion() = %s, want %s (pre-release kept)", got, featuregate.NewestKubeVersion)
	}
	releases := featuregate.SupportedReleases()
	if last := releases[len(releases)-1]; fmt.Sprintf("%d.%d", v.BinaryVersion().Major(), v.BinaryVersion().Minor()) != last {
		t.Errorf("NewestKubeVersion %s is not of the last supported release %s", featuregate.NewestKubeVersion, last)
	}
	if def := featuregate.DefaultVersion().BinaryVersion(); !def.LessThan(v.BinaryVersion()) {
		t.Errorf("DefaultKubeVersion %s is not older than NewestKubeVersion %s", def, v.BinaryVersion())
	}
}
