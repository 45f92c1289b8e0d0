package featuregate_test

import (
	"errors"
	"strings"
	"testing"

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
		{binary: "1.38.0", wantErr: "release 1.38 is not supported"},
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
			if mode, err := featuregate.ModeOf(gate); err != nil || mode != tt.wantMode {
				t.Errorf("ModeOf() = %v, %v; want %v", mode, err, tt.wantMode)
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
