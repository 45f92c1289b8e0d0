package linearizability

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/repair"
)

// repairOnce runs one pass of the repair controller in DualWrite mode with no leak hold-off,
// then audits, and fails the history on what [repairFailures] finds: two owners of an address
// before the pass, or any finding after it.
func (h *harness) repairOnce(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	ec, err := clientv3.New(clientv3.Config{Endpoints: h.etcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		h.t.Fatal(err)
	}
	defer ec.Close()
	cfg := clusterip.Config{Mode: featuregate.DualWrite, Ranges: []netip.Prefix{h.rg}, Bitmaps: etcdstore.Stores{Client: ec},
		Client: h.currentAPI().Client, ManagedBy: testManagedBy}
	ipas, err := cfg.Client.NetworkingV1().IPAddresses().List(ctx, metav1.ListOptions{})
	if err != nil {
		h.t.Fatalf("list the IPAddresses before the repair pass: %v", err)
	}
	parents := make(map[string]string, len(ipas.Items))
	for _, ipa := range ipas.Items {
		parents[ipa.Name] = parentOf(&ipa)
	}
	ctrl, err := repair.NewController(cfg, repair.Options{LeakGrace: -1})
	if err != nil {
		h.t.Fatal(err)
	}
	pass, err := ctrl.RunOnce(ctx)
	if err != nil {
		h.t.Errorf("repair pass: %v", err)
	}
	rep, err := repair.Audit(ctx, cfg)
	if err != nil {
		h.t.Fatalf("audit after the repair pass: %v", err)
	}
	if pass != nil {
		h.t.Logf("%s: the repair pass found %v; the audit after it: consistent=%v %v", h.w.name, pass.Counts, rep.Consistent, rep.Counts)
	}
	for _, f := range repairFailures(pass, parents, rep) {
		h.t.Error(f)
	}
}

// parentOf returns an IPAddress object's parentRef as "resource/namespace/name", the
// resource with its group after a dot when it has one.
func parentOf(ipa *networkingv1.IPAddress) string {
	p := ipa.Spec.ParentRef
	if p == nil {
		return "(no parent)"
	}
	res := p.Resource
	if p.Group != "" {
		res += "." + p.Group
	}
	return res + "/" + p.Namespace + "/" + p.Name
}

// repairFailures returns why a history fails on the repair pass that follows it: each finding
// of the pass (nil if it could not read) that means two owners of one address, and each
// finding of the audit after the pass. Two owners are two Services (DuplicateOwner), or a
// Service and an IPAddress object naming another parent (WrongParent unless the object, as
// parents had it before the pass, names the Service itself and only its labels are wrong):
// the pass recreates such an object for the Service, so the audit after it never sees the
// duplicate. parents holds the parentRef of each IPAddress object, by name, as [parentOf]
// writes it; a WrongParent finding whose object is not in it counts as two owners.
func repairFailures(pass *repair.Report, parents map[string]string, after *repair.Report) []string {
	var out []string
	if pass != nil {
		for _, f := range pass.Findings {
			switch f.Class {
			case repair.DuplicateOwner:
				out = append(out, fmt.Sprintf("two owners before the repair pass: %s %s %s (%s)", f.IP, f.Class, f.Service, f.Detail))
			case repair.WrongParent:
				p, ok := parents[f.IP]
				switch {
				case !ok:
					out = append(out, fmt.Sprintf("two owners before the repair pass: %s %s %s (its IPAddress was not read before the pass: %s)", f.IP, f.Class, f.Service, f.Detail))
				case p != "services/"+f.Service:
					out = append(out, fmt.Sprintf("two owners before the repair pass: %s %s %s (its IPAddress names %s)", f.IP, f.Class, f.Service, p))
				}
			}
		}
	}
	if after != nil && !after.Consistent {
		for _, f := range after.Findings {
			out = append(out, fmt.Sprintf("after one repair pass: %s %s %s: %s", f.IP, f.Class, f.Service, f.Detail))
		}
	}
	return out
}

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
