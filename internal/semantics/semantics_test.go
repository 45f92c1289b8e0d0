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
