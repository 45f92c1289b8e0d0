package clusterip

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kube-ipam/clusterip/featuregate"
)

// TestNewRunsTheModesTheReleaseRuns: New refuses a Mode, or feature gates, that the configured
// kube-apiserver would refuse at start-up, with its message, and takes the rest.
func TestNewRunsTheModesTheReleaseRuns(t *testing.T) {
	client := fake.NewSimpleClientset() //nolint:staticcheck // NewClientset needs apply configurations we do not use
	v4 := []netip.Prefix{netip.MustParsePrefix("10.96.0.0/24")}
	version := func(binary, emulated string) *string { s := binary + "@" + emulated; return &s }
	tests := []struct {
		name      string
		mode      featuregate.Mode
		version   *string // binary@emulated; nil for the Mode's default
		gates     map[string]bool
		wantField string // "" for success
		wantErr   string
	}{
		{name: "IPAddressOnly by default", mode: featuregate.IPAddressOnly},
		{name: "IPAddressOnly on v1.33", mode: featuregate.IPAddressOnly, version: version("1.33.13", "")},
		{name: "Legacy on v1.37", mode: featuregate.Legacy, version: version("1.37.2", ""), wantField: "Mode",
			wantErr: "cannot set feature gate MultiCIDRServiceAllocator to false, feature is locked to true"},
		{name: "DualWrite on v1.37 emulating 1.37", mode: featuregate.DualWrite, version: version("1.37.2", ""), wantField: "Mode",
			wantErr: "cannot set feature gate DisableAllocatorDualWrite to false, feature is locked to true"},
		{name: "IPAddressOnly with a gate of another mode", mode: featuregate.IPAddressOnly, gates: map[string]bool{"DisableAllocatorDualWrite": false},
			wantField: "FeatureGates", wantErr: "DisableAllocatorDualWrite=false does not select mode IPAddressOnly"},
		{name: "an unknown gate", mode: featuregate.IPAddressOnly, gates: map[string]bool{"NoSuchGate": true},
			wantField: "FeatureGates", wantErr: "unrecognized feature gate: NoSuchGate"},
		{name: "StrictIPCIDRValidation off on v1.37", mode: featuregate.IPAddressOnly, gates: map[string]bool{"StrictIPCIDRValidation": false}},
		{name: "IPAddressOnly on v1.38", mode: featuregate.IPAddressOnly, version: version(featuregate.NewestKubeVersion, "")},
		{name: "IPAddressOnly on v1.38.0 emulating 1.35", mode: featuregate.IPAddressOnly, version: version("1.38.0", "1.35")},
		{name: "Legacy on v1.38", mode: featuregate.Legacy, version: version(featuregate.NewestKubeVersion, ""), wantField: "Mode",
			wantErr: "does not run mode Legacy (1.38 has no MultiCIDRServiceAllocator or DisableAllocatorDualWrite feature gate: it runs IPAddressOnly only): " +
				"featuregate: kube-apiserver " + featuregate.NewestKubeVersion + " emulating 1.38 refuses the feature gates: unrecognized feature gate: MultiCIDRServiceAllocator"},
		{name: "DualWrite on v1.38", mode: featuregate.DualWrite, version: version(featuregate.NewestKubeVersion, ""), wantField: "Mode",
			wantErr: "unrecognized feature gate: DisableAllocatorDualWrite"},
		{name: "Legacy on v1.38 emulating 1.35", mode: featuregate.Legacy, version: version("1.38.0", "1.35"), wantField: "Mode",
			wantErr: "unrecognized feature gate: MultiCIDRServiceAllocator"},
		{name: "DualWrite on v1.38 emulating 1.35", mode: featuregate.DualWrite, version: version("1.38.0", "1.35"), wantField: "Mode",
			wantErr: "unrecognized feature gate: DisableAllocatorDualWrite"},
		{name: "IPAddressOnly on v1.38 with DisableAllocatorDualWrite=false", mode: featuregate.IPAddressOnly, version: version(featuregate.NewestKubeVersion, "1.35"),
			gates: map[string]bool{"DisableAllocatorDualWrite": false}, wantField: "FeatureGates", wantErr: "unrecognized feature gate: DisableAllocatorDualWrite"},
		{name: "IPAddressOnly on v1.38 with MultiCIDRServiceAllocator=true", mode: featuregate.IPAddressOnly, version: version(featuregate.NewestKubeVersion, ""),
			gates: map[string]bool{"MultiCIDRServiceAllocator": true}, wantField: "FeatureGates", wantErr: "unrecognized feature gate: MultiCIDRServiceAllocator"},
		{name: "StrictIPCIDRValidation locked on v1.38", mode: featuregate.IPAddressOnly, version: version(featuregate.NewestKubeVersion, ""),
			gates: map[string]bool{"StrictIPCIDRValidation": false}, wantField: "FeatureGates", wantErr: "cannot set feature gate StrictIPCIDRValidation to false, feature is locked to true"},
		{name: "StrictIPCIDRValidation off on v1.38 emulating 1.37", mode: featuregate.IPAddressOnly, version: version(featuregate.NewestKubeVersion, "1.37"),
			gates: map[string]bool{"StrictIPCIDRValidation": false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{Mode: tt.mode, Ranges: v4, Client: client, Informers: informers.NewSharedInformerFactory(client, 0), FeatureGates: tt.gates}
			if tt.version != nil {
				binary, emulated, _ := strings.Cut(*tt.version, "@")
				v, err := featuregate.KubeVersion(binary, emulated)
				if err != nil {
					t.Fatal(err)
				}
				cfg.Version = v
			}
			a, err := New(context.Background(), cfg)
			if tt.wantField == "" {
				if err != nil {
					t.Fatalf("New() = %v", err)
				}
				a.Close()
				return
			}
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Field != tt.wantField || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("New() = %v; want a *ConfigError naming %s and saying %q", err, tt.wantField, tt.wantErr)
			}
			if strings.Contains(tt.wantErr, "feature gate") {
				var ge *featuregate.GateError
				if !errors.As(err, &ge) {
					t.Errorf("New() = %v; want it to wrap a *featuregate.GateError", err)
				}
			}
		})
	}
}
