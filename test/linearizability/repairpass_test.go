package linearizability

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kube-ipam/clusterip/repair"
)

func TestRepairPassFailsAHistoryOnTwoOwners(t *testing.T) {
	consistent := &repair.Report{Mode: "DualWrite", Consistent: true, Findings: []repair.Finding{}}
	report := func(fs ...repair.Finding) *repair.Report {
		return &repair.Report{Mode: "DualWrite", Findings: fs}
	}
	tests := []struct {
		name string
		pass *repair.Report
		// parents are the parentRefs of the IPAddress objects read before the pass, by name.
		parents map[string]string
		after   *repair.Report
		want    []string
	}{
		{
			name: "a Service and an allocator process hold one address to the end",
			pass: report(repair.Finding{IP: "10.96.0.5", Class: repair.WrongParent, Service: "default/h-7-12",
				Detail: "IPAddress 10.96.0.5 names services/history/ipaddressonly-1-0-9-40 as its parent but Service default/h-7-12 holds it."}),
			parents: map[string]string{"10.96.0.5": "services/history/ipaddressonly-1-0-9-40"},
			after:   consistent,
			want:    []string{"two owners before the repair pass: 10.96.0.5 wrong-parent default/h-7-12 (its IPAddress names services/history/ipaddressonly-1-0-9-40)"},
		},
		{
			name:    "two Services hold one address",
			pass:    report(repair.Finding{IP: "10.96.0.6", Class: repair.DuplicateOwner, Service: "default/h-7-12", Detail: "10.96.0.6 is held by 2 Services: default/h-7-12, default/h-8-3."}),
			parents: map[string]string{"10.96.0.6": "services/default/h-7-12"},
			after:   report(repair.Finding{IP: "10.96.0.6", Class: repair.DuplicateOwner, Service: "default/h-7-12", Detail: "10.96.0.6 is held by 2 Services: default/h-7-12, default/h-8-3."}),
			want: []string{
				"two owners before the repair pass: 10.96.0.6 duplicate-owner default/h-7-12 (10.96.0.6 is held by 2 Services: default/h-7-12, default/h-8-3.)",
				"after one repair pass: 10.96.0.6 duplicate-owner default/h-7-12: 10.96.0.6 is held by 2 Services: default/h-7-12, default/h-8-3.",
			},
		},
		{
			name: "the Service's own IPAddress with wrong labels is one owner",
			pass: report(repair.Finding{IP: "10.96.0.7", Class: repair.WrongParent, Service: "default/h-7-12",
				Detail: "IPAddress 10.96.0.7 of Service default/h-7-12 is labelled …"}),
			parents: map[string]string{"10.96.0.7": "services/default/h-7-12"},
			after:   consistent,
		},
		{
			name: "leaks and stale bits the pass frees are one owner or none",
			pass: report(
				repair.Finding{IP: "10.96.0.8", Class: repair.Leaked, Detail: "IPAddress 10.96.0.8 (parent services/history/dualwrite-0-0-3-7) is held by no Service."},
				repair.Finding{IP: "10.96.0.9", Class: repair.BitmapOnly, Detail: "10.96.0.9 is set in the bitmap of 10.96.0.0/25 with neither an IPAddress nor a Service."},
				repair.Finding{IP: "10.96.0.10", Class: repair.Missing, Service: "default/h-8-4", Detail: "Service default/h-8-4 holds 10.96.0.10 but there is no IPAddress object for it."},
			),
			parents: map[string]string{"10.96.0.8": "services/history/dualwrite-0-0-3-7"},
			after:   consistent,
		},
		{
			name:  "a finding the pass leaves",
			pass:  report(repair.Finding{IP: "10.96.0.9", Class: repair.BitmapOnly, Detail: "stale"}),
			after: report(repair.Finding{IP: "10.96.0.9", Class: repair.BitmapOnly, Detail: "stale"}),
			want:  []string{"after one repair pass: 10.96.0.9 bitmap-only : stale"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := repairFailures(tt.pass, tt.parents, tt.after)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("repairFailures() (-want +got):\n%s", diff)
			}
		})
	}
}
