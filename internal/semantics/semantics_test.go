package semantics

import (
	"testing"

	"github.com/kube-ipam/clusterip/featuregate"
)

// TestFactsFollowTheRelease pins each fact to the releases that have it.
func TestFactsFollowTheRelease(t *testing.T) {
	type facts struct{ invalid, namesService, json, strict, mismatchFirst, refusalFull bool }
	tests := []struct {
		binary, emulated string
		gates            map[string]bool
		want             facts
	}{
		{binary: "1.33.13", want: facts{}},
		{binary: "1.33.13", gates: map[string]bool{"DisableAllocatorDualWrite": true}, want: facts{refusalFull: true}},
		{binary: "1.35.4", emulated: "1.33", gates: map[string]bool{"DisableAllocatorDualWrite": true}, want: facts{invalid: true, json: true, mismatchFirst: true}},
		{binary: "1.35.4", emulated: "1.33", want: facts{invalid: true, json: true, mismatchFirst: true}},
		{binary: "1.35.4", want: facts{invalid: true, json: true, mismatchFirst: true}},
		{binary: "1.36.3", want: facts{invalid: true, namesService: true, json: true, strict: true, mismatchFirst: true}},
		{binary: "1.36.3", emulated: "1.35", want: facts{invalid: true, namesService: true, json: true, mismatchFirst: true}},
		{binary: "1.37.2", want: facts{invalid: true, namesService: true, json: true, strict: true, mismatchFirst: true}},
		// v1.38 answers as v1.37 does; StrictIPCIDRValidation follows the emulation version.
		{binary: featuregate.NewestKubeVersion, want: facts{invalid: true, namesService: true, json: true, strict: true, mismatchFirst: true}},
		{binary: featuregate.NewestKubeVersion, emulated: "1.35", want: facts{invalid: true, namesService: true, json: true, mismatchFirst: true}},
		{binary: "1.38.0", emulated: "1.35", gates: map[string]bool{"StrictIPCIDRValidation": true},
			want: facts{invalid: true, namesService: true, json: true, strict: true, mismatchFirst: true}},
	}
	for _, tt := range tests {
		v, err := featuregate.KubeVersion(tt.binary, tt.emulated)
		if err != nil {
			t.Fatal(err)
		}
		gate, err := featuregate.NewGate(v, tt.gates)
		if err != nil {
			t.Fatal(err)
		}
		s := Of(v, gate)
		got := facts{s.InvalidOnAllocateNextError(), s.FullErrorNamesService(), s.FieldValuesAsJSON(), s.StrictClusterIPs(), s.DefaultServiceCIDRReportsMismatchFirst(), s.RefusedAddressReadsAsFull()}
		if got != tt.want {
			t.Errorf("%s: %+v, want %+v", s, got, tt.want)
		}
	}
	if d := Default(); !d.StrictClusterIPs() || !d.FullErrorNamesService() {
		t.Errorf("Default() = %s, want the newest release's facts", d)
	}
}

// TestModeFrom138IsIPAddressOnly: a v1.38 kube-apiserver has no allocator gates and runs
// IPAddressOnly at every version it emulates, with or without a gate.
func TestModeFrom138IsIPAddressOnly(t *testing.T) {
	for _, emulated := range []string{"", "1.35", "1.36", "1.37"} {
		v, err := featuregate.KubeVersion(featuregate.NewestKubeVersion, emulated)
		if err != nil {
			t.Fatal(err)
		}
		gate, err := featuregate.NewGate(v, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []Semantics{Of(v, gate), Of(v, nil)} {
			if s.mode != featuregate.IPAddressOnly {
				t.Errorf("%s: mode = %v, want IPAddressOnly", s, s.mode)
			}
		}
	}
}
