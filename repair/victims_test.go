package repair

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// TestAuditReportsASlash64VictimOutOfRange: kube-apiserver v1.33's IPAddress allocator puts
// half its picks in an IPv6 /64 below the prefix (kubernetes#138374) and records each with an
// IPAddress object. Such a Service is out of range, reported once; its IPAddress is its own,
// neither leaked nor deleted, and repair only emits ClusterIPOutOfRange.
func TestAuditReportsASlash64VictimOutOfRange(t *testing.T) {
	const cidr = "fd00:10:96::/64"
	tests := []struct {
		name   string
		victim string // the ClusterIP v1.33 handed out
	}{
		{"below the prefix, as a negative offset lands", "fd00:10:95:ffff:9c3a:1b2e:44d0:7a10"},
		{"far below the prefix", "fd00:10:95:8000::5"},
		{"at the network address of the prefix", "fd00:10:96::"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset([]runtime.Object{
				testenv.ServiceCIDR("kubernetes", cidr),
				svc("a/ok", "fd00:10:96::a"), aged(ipAddr("fd00:10:96::a", "a/ok"), time.Hour),
				svc("a/victim", tt.victim), aged(ipAddr(tt.victim, "a/victim"), time.Hour),
			}...)
			cfg := clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: []netip.Prefix{netip.MustParsePrefix(cidr)}, Client: client}
			rep, err := Audit(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]Finding{f(tt.victim, OutOfRange, "a/victim")}, rep.Findings, ignoreDetail); diff != "" {
				t.Errorf("Audit() findings (-want +got):\n%s", diff)
			}
			rec := &recorder{}
			c, err := NewController(cfg, Options{LeakGrace: -1, Recorder: rec})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.RunOnce(t.Context()); err != nil {
				t.Fatalf("RunOnce() error = %v", err)
			}
			if diff := cmp.Diff([]string{"Warning ClusterIPOutOfRange victim"}, rec.Got(), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("Events (-want +got):\n%s", diff)
			}
			for _, a := range client.Actions() {
				if v := a.GetVerb(); v != "list" && v != "get" {
					t.Errorf("repair made a %s of %s; want reads only", v, a.GetResource().Resource)
				}
			}
		})
	}
}

// TestAuditReportsTheSlash64VictimsOfARealAPIServer lets a real kube-apiserver v1.33.13 in
// IPAddressOnly mode (DisableAllocatorDualWrite=true, which lifts the /108 limit on the flag
// range) allocate Services from an IPv6 /64: about half land outside it (kubernetes#138374),
// each with an IPAddress object. The audit must report exactly those out of range, and a repair
// pass with no hold-off must delete nothing.
func TestAuditReportsTheSlash64VictimsOfARealAPIServer(t *testing.T) {
	const cidr = "fd00:10:96::/64"
	prefix := netip.MustParsePrefix(cidr)
	e := testenv.NewEtcd(t)
	api := testenv.NewKubeAPIServer(t, e, testenv.KubeAPIServerOptions{ServiceClusterIPRange: cidr, FeatureGates: "DisableAllocatorDualWrite=true"})
	ctx := t.Context()
	services := api.Client.CoreV1().Services(metav1.NamespaceDefault)
	testenv.WaitForKubernetesService(t, api.Client)

	var want []Finding
	for i := range 24 {
		s, err := services.Create(ctx, testenv.ClusterIPService("s"+string(rune('a'+i)), ""), metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create Service: %v", err)
		}
		ip := netip.MustParseAddr(s.Spec.ClusterIP)
		if !prefix.Contains(ip) {
			want = append(want, f(ip.String(), OutOfRange, "default/"+s.Name))
		}
	}
	t.Logf("kube-apiserver %s put %d of 24 Services outside %s", testenv.KubeAPIServerVersion, len(want), cidr)
	if len(want) == 0 {
		t.Skipf("kube-apiserver %s put no Service outside %s: kubernetes#138374 is fixed in it, nothing to audit", testenv.KubeAPIServerVersion, cidr)
	}
	sortFindings(want, func(f *Finding) *Finding { return f })

	cfg := clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: []netip.Prefix{prefix}, Client: api.Client}
	rep, err := Audit(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, rep.Findings, ignoreDetail); diff != "" {
		t.Errorf("Audit() findings (-want +got):\n%s", diff)
	}
	before, err := api.Client.NetworkingV1().IPAddresses().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	c, err := NewController(cfg, Options{LeakGrace: -1, Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RunOnce(ctx); err != nil {
		t.Fatalf("RunOnce() error = %v", err)
	}
	for _, ev := range rec.Got() {
		if !strings.HasPrefix(ev, "Warning ClusterIPOutOfRange ") {
			t.Errorf("Event %q, want only ClusterIPOutOfRange", ev)
		}
	}
	after, err := api.Client.NetworkingV1().IPAddresses().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	uids := map[string]types.UID{}
	for _, ipa := range before.Items {
		uids[ipa.Name] = ipa.UID
	}
	for _, ipa := range after.Items {
		if uids[ipa.Name] != ipa.UID {
			t.Errorf("IPAddress %s created or recreated by repair", ipa.Name)
		}
		delete(uids, ipa.Name)
	}
	for name := range uids {
		t.Errorf("IPAddress %s deleted by repair", name)
	}
}
