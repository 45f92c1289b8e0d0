package repair

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// f is a Finding without its Detail, for the tables.
func f(ip string, c Class, service string) Finding {
	return Finding{IP: ip, Class: c, Service: service}
}

var ignoreDetail = cmpopts.IgnoreFields(Finding{}, "Detail")

func TestClassifyFindsOneClassPerIP(t *testing.T) {
	const flag4, flag6 = "10.0.0.0/24", "fd00::/64"
	kubernetes := func() []*networkingv1.ServiceCIDR {
		return []*networkingv1.ServiceCIDR{testenv.ServiceCIDR("kubernetes", flag4, flag6)}
	}
	tests := []struct {
		name      string
		mode      featuregate.Mode
		services  []*corev1.Service
		ipas      []*networkingv1.IPAddress
		cidrs     []*networkingv1.ServiceCIDR // defaults to kubernetes()
		bits4     []string                    // bits set in flag4
		bits6     []string                    // bits set in flag6
		managedBy string                      // Config.ManagedBy
		want      []Finding
	}{
		// Legacy: bits against Services.
		{name: "legacy/consistent", mode: featuregate.Legacy,
			services: []*corev1.Service{svc("a/x", "10.0.0.10"), svc("a/y", "10.0.0.11", "fd00::b"), svc("a/headless", "None"), svc("a/external")},
			bits4:    []string{"10.0.0.10", "10.0.0.11"}, bits6: []string{"fd00::b"}},
		{name: "legacy/invalid ClusterIP", mode: featuregate.Legacy,
			services: []*corev1.Service{svc("a/x", "10.0.0.700")},
			want:     []Finding{f("10.0.0.700", Invalid, "a/x")}},
		{name: "legacy/a ClusterIP with a leading zero holds the address it reads as", mode: featuregate.Legacy,
			services: []*corev1.Service{svc("a/x", "10.0.0.010")}, bits4: []string{"10.0.0.10"}},
		{name: "legacy/duplicate owner", mode: featuregate.Legacy,
			services: []*corev1.Service{svc("b/y", "10.0.0.10"), svc("a/x", "10.0.0.10")}, bits4: []string{"10.0.0.10"},
			want: []Finding{f("10.0.0.10", DuplicateOwner, "a/x")}},
		{name: "legacy/out of range outside the flag range", mode: featuregate.Legacy,
			services: []*corev1.Service{svc("a/x", "10.1.0.10")},
			want:     []Finding{f("10.1.0.10", OutOfRange, "a/x")}},
		{name: "legacy/out of range at the network and broadcast addresses", mode: featuregate.Legacy,
			services: []*corev1.Service{svc("a/x", "10.0.0.0"), svc("a/y", "10.0.0.255")},
			want:     []Finding{f("10.0.0.0", OutOfRange, "a/x"), f("10.0.0.255", OutOfRange, "a/y")}},
		{name: "legacy/out of range beyond the IPv6 bitmap's 65535 slots", mode: featuregate.Legacy,
			services: []*corev1.Service{svc("a/x", "fd00::1:0")},
			want:     []Finding{f("fd00::1:0", OutOfRange, "a/x")}},
		{name: "legacy/missing bit", mode: featuregate.Legacy,
			services: []*corev1.Service{svc("a/x", "10.0.0.10", "fd00::a")}, bits6: []string{"fd00::a"},
			want: []Finding{f("10.0.0.10", Missing, "a/x")}},
		{name: "legacy/leaked bit", mode: featuregate.Legacy,
			bits4: []string{"10.0.0.20"},
			want:  []Finding{f("10.0.0.20", Leaked, "")}},
		{name: "legacy/ignores IPAddress objects and ServiceCIDRs", mode: featuregate.Legacy,
			ipas:  []*networkingv1.IPAddress{ipAddr("10.0.0.30", "a/gone"), ipAddr("10.0.0.030", "")},
			cidrs: []*networkingv1.ServiceCIDR{}},

		// IPAddressOnly: IPAddress objects against Services and ServiceCIDRs (every one, ready or not, as v1.33).
		{name: "ipaddress/another controller's IPAddress held by no Service is not ours to judge", mode: featuregate.IPAddressOnly,
			ipas: []*networkingv1.IPAddress{foreign(ipAddr("10.0.0.40", ""))}},
		{name: "ipaddress/an IPAddress labelled with Config.ManagedBy held by no Service is leaked", mode: featuregate.IPAddressOnly,
			managedBy: "clusterip-test", ipas: []*networkingv1.IPAddress{managedBy(ipAddr("10.0.0.41", "a/gone"), "clusterip-test")},
			want: []Finding{f("10.0.0.41", Leaked, "")}},
		{name: "ipaddress/an IPAddress labelled with Config.ManagedBy is well labelled", mode: featuregate.IPAddressOnly,
			managedBy: "clusterip-test", services: []*corev1.Service{svc("a/x", "10.0.0.10")},
			ipas: []*networkingv1.IPAddress{managedBy(ipAddr("10.0.0.10", "a/x"), "clusterip-test")}},
		{name: "ipaddress/an IPAddress of its Service labelled with another managed-by than Config.ManagedBy gets its labels fixed", mode: featuregate.IPAddressOnly,
			services: []*corev1.Service{svc("a/x", "10.0.0.10")},
			ipas:     []*networkingv1.IPAddress{managedBy(ipAddr("10.0.0.10", "a/x"), "clusterip-test")},
			want:     []Finding{f("10.0.0.10", WrongParent, "a/x")}},
		{name: "dualwrite/another controller's IPAddress with its bit is left alone", mode: featuregate.DualWrite,
			ipas: []*networkingv1.IPAddress{foreign(ipAddr("10.0.0.40", "gw/x"))}, bits4: []string{"10.0.0.40"}},
		{name: "ipaddress/consistent", mode: featuregate.IPAddressOnly,
			services: []*corev1.Service{svc("a/x", "10.0.0.10", "fd00::1:0:a"), svc("a/headless", "None")},
			ipas:     []*networkingv1.IPAddress{ipAddr("10.0.0.10", "a/x"), ipAddr("fd00::1:0:a", "a/x")}},
		{name: "ipaddress/invalid IPAddress name and ClusterIP", mode: featuregate.IPAddressOnly,
			services: []*corev1.Service{svc("a/x", "fd00::g")},
			ipas:     []*networkingv1.IPAddress{ipAddr("fd00:0::b", "a/y"), ipAddr("::ffff:10.0.0.1", "a/z")},
			want:     []Finding{f("::ffff:10.0.0.1", Invalid, ""), f("fd00:0::b", Invalid, ""), f("fd00::g", Invalid, "a/x")}},
		{name: "ipaddress/a ClusterIP in upper case holds the address it reads as", mode: featuregate.IPAddressOnly,
			services: []*corev1.Service{svc("a/x", "FD00::A")},
			ipas:     []*networkingv1.IPAddress{ipAddr("fd00::a", "a/x")}},
		{name: "ipaddress/duplicate owner", mode: featuregate.IPAddressOnly,
			services: []*corev1.Service{svc("a/x", "10.0.0.10"), svc("a/y", "10.0.0.10")},
			ipas:     []*networkingv1.IPAddress{ipAddr("10.0.0.10", "a/x")},
			want:     []Finding{f("10.0.0.10", DuplicateOwner, "a/x")}},
		{name: "ipaddress/out of range in no ServiceCIDR", mode: featuregate.IPAddressOnly,
			services: []*corev1.Service{svc("a/x", "10.1.0.10")},
			want:     []Finding{f("10.1.0.10", OutOfRange, "a/x")}},
		{name: "ipaddress/in range in a ServiceCIDR not ready or being deleted, as v1.33 counts every ServiceCIDR", mode: featuregate.IPAddressOnly,
			services: []*corev1.Service{svc("a/x", "10.1.0.10"), svc("a/y", "10.2.0.10"), svc("a/z", "10.3.0.10")},
			ipas:     []*networkingv1.IPAddress{ipAddr("10.1.0.10", "a/x"), ipAddr("10.2.0.10", "a/y"), ipAddr("10.3.0.10", "a/z")},
			cidrs: append(kubernetes(), notReady(testenv.ServiceCIDR("extra", "10.1.0.0/24")), deleting(testenv.ServiceCIDR("gone", "10.2.0.0/24")),
				deleting(notReady(testenv.ServiceCIDR("terminating", "10.3.0.0/24"))))},
		{name: "ipaddress/missing in a terminating ServiceCIDR", mode: featuregate.IPAddressOnly,
			services: []*corev1.Service{svc("a/x", "10.3.0.10")},
			cidrs:    append(kubernetes(), deleting(notReady(testenv.ServiceCIDR("terminating", "10.3.0.0/24")))),
			want:     []Finding{f("10.3.0.10", Missing, "a/x")}},
		{name: "ipaddress/out of range at the network and broadcast addresses of a terminating ServiceCIDR", mode: featuregate.IPAddressOnly,
			services: []*corev1.Service{svc("a/x", "10.3.0.0"), svc("a/y", "10.3.0.255")},
			ipas:     []*networkingv1.IPAddress{ipAddr("10.3.0.0", "a/x"), ipAddr("10.3.0.255", "a/y")},
			cidrs:    append(kubernetes(), deleting(notReady(testenv.ServiceCIDR("terminating", "10.3.0.0/24")))),
			want:     []Finding{f("10.3.0.0", OutOfRange, "a/x"), f("10.3.0.255", OutOfRange, "a/y")}},
		{name: "ipaddress/in range in a second ready ServiceCIDR", mode: featuregate.IPAddressOnly,
			services: []*corev1.Service{svc("a/x", "10.1.0.10")},
			ipas:     []*networkingv1.IPAddress{ipAddr("10.1.0.10", "a/x")},
			cidrs:    append(kubernetes(), testenv.ServiceCIDR("extra", "10.1.0.0/24"))},
		{name: "ipaddress/wrong parent", mode: featuregate.IPAddressOnly,
			services: []*corev1.Service{svc("a/x", "10.0.0.10"), svc("a/y", "10.0.0.11")},
			ipas:     []*networkingv1.IPAddress{ipAddr("10.0.0.10", "a/other"), ipAddr("10.0.0.11", "")},
			want:     []Finding{f("10.0.0.10", WrongParent, "a/x"), f("10.0.0.11", WrongParent, "a/y")}},
		{name: "ipaddress/right parent, wrong or missing labels", mode: featuregate.IPAddressOnly,
			services: []*corev1.Service{svc("a/x", "10.0.0.10", "fd00::a"), svc("a/y", "10.0.0.11")},
			ipas: []*networkingv1.IPAddress{
				withLabel(ipAddr("10.0.0.10", "a/x"), networkingv1.LabelIPAddressFamily, ""),
				withLabel(ipAddr("fd00::a", "a/x"), networkingv1.LabelIPAddressFamily, "IPv4"),
				withLabel(ipAddr("10.0.0.11", "a/y"), networkingv1.LabelManagedBy, ""),
			},
			want: []Finding{f("10.0.0.10", WrongParent, "a/x"), f("10.0.0.11", WrongParent, "a/y"), f("fd00::a", WrongParent, "a/x")}},
		{name: "ipaddress/a held IPAddress another controller labelled is the holder's, as upstream", mode: featuregate.IPAddressOnly,
			services: []*corev1.Service{svc("a/x", "10.0.0.10")},
			ipas:     []*networkingv1.IPAddress{foreign(ipAddr("10.0.0.10", "a/x"))},
			want:     []Finding{f("10.0.0.10", WrongParent, "a/x")}},
		{name: "ipaddress/missing", mode: featuregate.IPAddressOnly,
			services: []*corev1.Service{svc("a/x", "10.0.0.10")},
			want:     []Finding{f("10.0.0.10", Missing, "a/x")}},
		{name: "ipaddress/leaked", mode: featuregate.IPAddressOnly,
			ipas: []*networkingv1.IPAddress{ipAddr("10.0.0.10", "a/gone")},
			want: []Finding{f("10.0.0.10", Leaked, "")}},
		{name: "ipaddress/ignores bitmaps", mode: featuregate.IPAddressOnly,
			bits4: []string{"10.0.0.10"}},

		// DualWrite: both, plus the bitmap's own drift.
		{name: "dualwrite/consistent", mode: featuregate.DualWrite,
			services: []*corev1.Service{svc("a/x", "10.0.0.10", "fd00::a")},
			ipas:     []*networkingv1.IPAddress{ipAddr("10.0.0.10", "a/x"), ipAddr("fd00::a", "a/x")},
			bits4:    []string{"10.0.0.10"}, bits6: []string{"fd00::a"}},
		{name: "dualwrite/consistent without bits outside the flag ranges", mode: featuregate.DualWrite,
			services: []*corev1.Service{svc("a/x", "10.1.0.10", "fd00::1:0:a")},
			ipas:     []*networkingv1.IPAddress{ipAddr("10.1.0.10", "a/x"), ipAddr("fd00::1:0:a", "a/x")},
			cidrs:    append(kubernetes(), testenv.ServiceCIDR("extra", "10.1.0.0/24"))},
		{name: "dualwrite/invalid", mode: featuregate.DualWrite,
			services: []*corev1.Service{svc("a/x", "not-an-ip")},
			want:     []Finding{f("not-an-ip", Invalid, "a/x")}},
		{name: "dualwrite/duplicate owner before missing", mode: featuregate.DualWrite,
			services: []*corev1.Service{svc("a/x", "10.0.0.10"), svc("a/y", "10.0.0.10")},
			want:     []Finding{f("10.0.0.10", DuplicateOwner, "a/x")}},
		{name: "dualwrite/out of range before missing", mode: featuregate.DualWrite,
			services: []*corev1.Service{svc("a/x", "10.1.0.10")},
			want:     []Finding{f("10.1.0.10", OutOfRange, "a/x")}},
		{name: "dualwrite/wrong parent before ipaddress-only", mode: featuregate.DualWrite,
			services: []*corev1.Service{svc("a/x", "10.0.0.10")},
			ipas:     []*networkingv1.IPAddress{ipAddr("10.0.0.10", "a/y")},
			want:     []Finding{f("10.0.0.10", WrongParent, "a/x")}},
		{name: "dualwrite/missing IPAddress with or without its bit", mode: featuregate.DualWrite,
			services: []*corev1.Service{svc("a/x", "10.0.0.10"), svc("a/y", "10.0.0.11")},
			bits4:    []string{"10.0.0.11"},
			want:     []Finding{f("10.0.0.10", Missing, "a/x"), f("10.0.0.11", Missing, "a/y")}},
		{name: "dualwrite/leaked IPAddress with or without its bit", mode: featuregate.DualWrite,
			ipas:  []*networkingv1.IPAddress{ipAddr("10.0.0.10", "a/gone"), ipAddr("10.0.0.11", "a/gone")},
			bits4: []string{"10.0.0.11"},
			want:  []Finding{f("10.0.0.10", Leaked, ""), f("10.0.0.11", Leaked, "")}},
		{name: "dualwrite/bitmap-only", mode: featuregate.DualWrite,
			bits4: []string{"10.0.0.12"}, bits6: []string{"fd00::c"},
			want: []Finding{f("10.0.0.12", BitmapOnly, ""), f("fd00::c", BitmapOnly, "")}},
		{name: "dualwrite/ipaddress-only", mode: featuregate.DualWrite,
			services: []*corev1.Service{svc("a/x", "10.0.0.10", "fd00::a")},
			ipas:     []*networkingv1.IPAddress{ipAddr("10.0.0.10", "a/x"), ipAddr("fd00::a", "a/x")},
			want:     []Finding{f("10.0.0.10", IPAddressOnly, "a/x"), f("fd00::a", IPAddressOnly, "a/x")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cidrs := tt.cidrs
			if cidrs == nil {
				cidrs = kubernetes()
			}
			w := &world{mode: tt.mode, managedBy: tt.managedBy, services: tt.services, cidrs: cidrs, ipAddresses: tt.ipas,
				bitmaps: []*bitmap.Allocator{bits(t, flag4, tt.bits4...), bits(t, flag6, tt.bits6...)}}
			got := classify(w).report(tt.mode)
			if diff := cmp.Diff(tt.want, got.Findings, ignoreDetail, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("findings (-want +got):\n%s", diff)
			}
			for _, f := range got.Findings {
				if f.Detail == "" {
					t.Errorf("finding %s %s has no Detail", f.IP, f.Class)
				}
			}
			if got.Consistent != (len(tt.want) == 0) {
				t.Errorf("Consistent = %v, want %v", got.Consistent, len(tt.want) == 0)
			}
		})
	}
}

func TestClassifyLegacySingleStackReportsOtherFamilyOutOfRange(t *testing.T) {
	w := &world{mode: featuregate.Legacy, services: []*corev1.Service{svc("a/x", "fd00::1")},
		bitmaps: []*bitmap.Allocator{bits(t, "10.0.0.0/24")}}
	got := classify(w).report(w.mode).Findings
	if diff := cmp.Diff([]Finding{f("fd00::1", OutOfRange, "a/x")}, got, ignoreDetail); diff != "" {
		t.Errorf("findings (-want +got):\n%s", diff)
	}
}

func TestReportJSONIsStable(t *testing.T) {
	tests := []struct {
		name string
		w    *world
		want string
	}{
		{
			name: "consistent has empty findings, not null",
			w: &world{mode: featuregate.Legacy, services: []*corev1.Service{svc("a/x", "10.0.0.10")},
				bitmaps: []*bitmap.Allocator{bits(t, "10.0.0.0/24", "10.0.0.10")}},
			want: `{"mode":"Legacy","consistent":true,"counts":{"bitmapBits":1,"ipAddresses":0,"services":1},"findings":[]}`,
		},
		{
			name: "sorted by address, IPv4 first, then unparsable strings; counts per class",
			w: &world{mode: featuregate.DualWrite,
				services:    []*corev1.Service{svc("a/x", "10.0.0.10"), svc("a/y", "bogus")},
				ipAddresses: []*networkingv1.IPAddress{ipAddr("10.0.0.9", "a/gone"), ipAddr("10.0.0.10", "a/x")},
				cidrs:       []*networkingv1.ServiceCIDR{testenv.ServiceCIDR("kubernetes", "10.0.0.0/24", "fd00::/64")},
				bitmaps:     []*bitmap.Allocator{bits(t, "10.0.0.0/24", "10.0.0.10"), bits(t, "fd00::/64", "fd00::1")}},
			want: `{"mode":"DualWrite","consistent":false,"counts":{"bitmap-only":1,"bitmapBits":2,"invalid":1,"ipAddresses":2,"leaked":1,"services":2},"findings":[` +
				`{"ip":"10.0.0.9","class":"leaked","detail":"IPAddress 10.0.0.9 (parent services a/gone) is held by no Service."},` +
				`{"ip":"fd00::1","class":"bitmap-only","detail":"fd00::1 is set in the bitmap of fd00::/64 with neither an IPAddress nor a Service."},` +
				`{"ip":"bogus","class":"invalid","service":"a/y","detail":"\"bogus\" is not an IP address (held by Service a/y)."}]}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := json.Marshal(classify(tt.w).report(tt.w.mode))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, string(b)); diff != "" {
				t.Errorf("JSON (-want +got):\n%s", diff)
			}
		})
	}
}
