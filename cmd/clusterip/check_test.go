package main

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/version"

	"github.com/kube-ipam/clusterip/featuregate"
)

func TestLeakGraceFlagMapsToRepairOptions(t *testing.T) {
	tests := []struct {
		flag, wantOption, wantInterval time.Duration
	}{
		{0, -1, time.Second},                                      // no hold-off: repair.Options' negative value; Legacy's 3 passes 1 s apart
		{time.Minute, time.Minute, 6 * time.Second},               // the default: a tenth of the hold-off between passes
		{5 * time.Millisecond, 5 * time.Millisecond, time.Second}, // never faster than a pass a second
		{time.Hour, time.Hour, 10 * time.Second},                  // never slower than a pass every 10 s
	}
	for _, tt := range tests {
		if got := leakGraceOption(tt.flag); got != tt.wantOption {
			t.Errorf("leakGraceOption(%v) = %v, want %v", tt.flag, got, tt.wantOption)
		}
		if got := passInterval(tt.flag); got != tt.wantInterval {
			t.Errorf("passInterval(%v) = %v, want %v", tt.flag, got, tt.wantInterval)
		}
	}
}

func TestModeFlagIgnoresCase(t *testing.T) {
	tests := []struct {
		flag   string
		want   string
		wantOK bool
	}{
		{"auto", "auto", true},
		{"AUTO", "auto", true},
		{"Legacy", "Legacy", true},
		{"legacy", "Legacy", true},
		{"DualWrite", "DualWrite", true},
		{"dualwrite", "DualWrite", true},
		{"DUALWRITE", "DualWrite", true},
		{"IPAddressOnly", "IPAddressOnly", true},
		{"ipaddressonly", "IPAddressOnly", true},
		{"IpAddressOnly", "IPAddressOnly", true},
		{"", "", false},                // no default here: the flag's is auto
		{"Hybrid", "", false},          // no such mode
		{"ip-address-only", "", false}, // case folds, spelling does not
		{" Legacy", "", false},         // nor blanks
	}
	for _, tt := range tests {
		got, ok := modeFlag(tt.flag)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("modeFlag(%q) = %q, %v; want %q, %v", tt.flag, got, ok, tt.want, tt.wantOK)
		}
	}
}

// TestAutoModeFollowsTheEmulatedVersion: --mode auto takes the defaults of the version
// kube-apiserver emulates, which /version reports from 1.31, not of its binary.
func TestAutoModeFollowsTheEmulatedVersion(t *testing.T) {
	tests := []struct {
		info version.Info
		want featuregate.Mode
	}{
		{info: version.Info{GitVersion: "v1.33.13"}, want: featuregate.DualWrite},
		{info: version.Info{GitVersion: "v1.33.13", EmulationMajor: "1", EmulationMinor: "33"}, want: featuregate.DualWrite},
		{info: version.Info{GitVersion: "v1.35.4", EmulationMajor: "1", EmulationMinor: "33"}, want: featuregate.DualWrite},
		{info: version.Info{GitVersion: "v1.35.4", EmulationMajor: "1", EmulationMinor: "35"}, want: featuregate.IPAddressOnly},
		{info: version.Info{GitVersion: "v1.37.2", EmulationMajor: "1", EmulationMinor: "34"}, want: featuregate.IPAddressOnly},
	}
	o := &checkOptions{mode: "auto"}
	for _, tt := range tests {
		if got, err := o.modeFor(emulatedVersion(&tt.info)); err != nil || got != tt.want {
			t.Errorf("%+v: mode %v, %v; want %v", tt.info, got, err, tt.want)
		}
	}
}
