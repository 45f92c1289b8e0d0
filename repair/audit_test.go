package repair

import (
	"errors"
	"net/netip"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// storeBitmap writes b at key, as kube-apiserver would.
func storeBitmap(t testing.TB, cli *clientv3.Client, key string, b *bitmap.Allocator) {
	t.Helper()
	s := etcdstore.New(cli, key)
	_, rev, err := s.Get(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Update(t.Context(), rev, b.Snapshot()); err != nil {
		t.Fatalf("store bitmap at %s: %v", key, err)
	}
}

// etcdRevision returns the current revision of the etcd cli talks to.
func etcdRevision(t testing.TB, cli *clientv3.Client) int64 {
	t.Helper()
	r, err := cli.Get(t.Context(), "/")
	if err != nil {
		t.Fatal(err)
	}
	return r.Header.Revision
}

func TestAuditRejectsConfigWithoutWhatTheModeNeeds(t *testing.T) {
	ranges := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}
	client := fake.NewClientset()
	cli := &clientv3.Client{} // never dialled: the check fails first or does not need it
	tests := []struct {
		name      string
		cfg       clusterip.Config
		wantField string
	}{
		{"no ranges", clusterip.Config{Mode: featuregate.IPAddressOnly, Client: client}, "Ranges"},
		{"two ranges of one family", clusterip.Config{Mode: featuregate.IPAddressOnly, Client: client,
			Ranges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("10.1.0.0/24")}}, "Ranges[1]"},
		{"a range with host bits", clusterip.Config{Mode: featuregate.IPAddressOnly, Client: client,
			Ranges: []netip.Prefix{netip.MustParsePrefix("10.0.0.1/24")}}, "Ranges[0]"},
		{"no client in Legacy", clusterip.Config{Mode: featuregate.Legacy, Ranges: ranges, Bitmaps: etcdstore.Stores{Client: cli}}, "Client"},
		{"no client in IPAddressOnly", clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: ranges}, "Client"},
		{"no bitmaps in Legacy", clusterip.Config{Mode: featuregate.Legacy, Ranges: ranges, Client: client}, "Bitmaps"},
		{"no bitmaps in DualWrite", clusterip.Config{Mode: featuregate.DualWrite, Ranges: ranges, Client: client}, "Bitmaps"},
		{"unknown mode", clusterip.Config{Mode: featuregate.Mode(7), Ranges: ranges, Client: client}, "Mode"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Audit(t.Context(), tt.cfg)
			var ce *clusterip.ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("Audit() error = %v, want a *clusterip.ConfigError", err)
			}
			if ce.Field != tt.wantField {
				t.Errorf("ConfigError.Field = %q, want %q", ce.Field, tt.wantField)
			}
		})
	}
}

// TestAuditReadsEveryStoreAndWritesNothing seeds a fake API server and a real etcd with one
// problem of each class the mode knows and checks that Audit finds each once, using only List
// calls and no etcd write.
func TestAuditReadsEveryStoreAndWritesNothing(t *testing.T) {
	e := testenv.NewEtcd(t)
	cli := e.TestClient(t)
	const prefix = "/audit"
	ranges := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("fd00::/64")}
	storeBitmap(t, cli, etcdstore.ServiceIPsKey(prefix), bits(t, "10.0.0.0/24", "10.0.0.10", "10.0.0.11", "10.0.0.30", "10.0.0.40"))
	storeBitmap(t, cli, etcdstore.SecondaryServiceIPsKey(prefix), bits(t, "fd00::/64", "fd00::a", "fd00::c"))

	objects := []runtime.Object{
		testenv.ServiceCIDR("kubernetes", "10.0.0.0/24", "fd00::/64"),
		svc("a/ok", "10.0.0.10", "fd00::a"), ipAddr("10.0.0.10", "a/ok"), ipAddr("fd00::a", "a/ok"),
		svc("a/missing", "10.0.0.11"),                               // bit, no IPAddress
		svc("a/nobit", "10.0.0.12"), ipAddr("10.0.0.12", "a/nobit"), // IPAddress, no bit
		ipAddr("10.0.0.30", "a/gone"), // leaked IPAddress and bit
		svc("a/wrong", "10.0.0.50"), ipAddr("10.0.0.50", "a/other"),
		svc("a/dup1", "10.0.0.60"), svc("a/dup2", "10.0.0.60"),
		svc("a/far", "10.9.0.1"),
		svc("a/bad", "10.0.0.700"),
		svc("a/headless", "None"),
	}
	tests := []struct {
		mode featuregate.Mode
		want []Finding
		// counts of what was read
		services, ipAddresses, bitmapBits int
	}{
		{mode: featuregate.Legacy, services: 9, ipAddresses: 0, bitmapBits: 6, want: []Finding{
			f("10.0.0.12", Missing, "a/nobit"),
			f("10.0.0.30", Leaked, ""),
			f("10.0.0.40", Leaked, ""),
			f("10.0.0.50", Missing, "a/wrong"),
			f("10.0.0.60", DuplicateOwner, "a/dup1"),
			f("10.9.0.1", OutOfRange, "a/far"),
			f("fd00::c", Leaked, ""),
			f("10.0.0.700", Invalid, "a/bad"),
		}},
		{mode: featuregate.IPAddressOnly, services: 9, ipAddresses: 5, bitmapBits: 0, want: []Finding{
			f("10.0.0.11", Missing, "a/missing"),
			f("10.0.0.30", Leaked, ""),
			f("10.0.0.50", WrongParent, "a/wrong"),
			f("10.0.0.60", DuplicateOwner, "a/dup1"),
			f("10.9.0.1", OutOfRange, "a/far"),
			f("10.0.0.700", Invalid, "a/bad"),
		}},
		{mode: featuregate.DualWrite, services: 9, ipAddresses: 5, bitmapBits: 6, want: []Finding{
			f("10.0.0.11", Missing, "a/missing"),
			f("10.0.0.12", IPAddressOnly, "a/nobit"),
			f("10.0.0.30", Leaked, ""),
			f("10.0.0.40", BitmapOnly, ""),
			f("10.0.0.50", WrongParent, "a/wrong"),
			f("10.0.0.60", DuplicateOwner, "a/dup1"),
			f("10.9.0.1", OutOfRange, "a/far"),
			f("fd00::c", BitmapOnly, ""),
			f("10.0.0.700", Invalid, "a/bad"),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.mode.String(), func(t *testing.T) {
			client := fake.NewClientset(objects...)
			rev := etcdRevision(t, cli)
			rep, err := Audit(t.Context(), clusterip.Config{Mode: tt.mode, Ranges: ranges, Client: client, Bitmaps: etcdstore.Stores{Client: cli, Prefix: prefix}})
			if err != nil {
				t.Fatalf("Audit() error = %v", err)
			}
			if diff := cmp.Diff(tt.want, rep.Findings, ignoreDetail); diff != "" {
				t.Errorf("findings (-want +got):\n%s", diff)
			}
			for k, want := range map[string]int{CountServices: tt.services, CountIPAddresses: tt.ipAddresses, CountBitmapBits: tt.bitmapBits} {
				if got := rep.Counts[k]; got != want {
					t.Errorf("Counts[%q] = %d, want %d", k, got, want)
				}
			}
			if rep.Mode != tt.mode.String() || rep.Consistent {
				t.Errorf("Mode, Consistent = %q, %v; want %q, false", rep.Mode, rep.Consistent, tt.mode)
			}
			for _, a := range client.Actions() {
				if v := a.GetVerb(); v != "list" && v != "get" {
					t.Errorf("Audit made a %s call on %s; it must only read (lists, and gets that confirm a missing record)", v, a.GetResource().Resource)
				}
			}
			if got := etcdRevision(t, cli); got != rev {
				t.Errorf("etcd revision moved from %d to %d: Audit wrote to etcd", rev, got)
			}
		})
	}
}

// TestAuditReportsTheBitmapsIPAddressOnlyLeftBehind: on a cluster that moved to IPAddressOnly,
// the bitmaps a Legacy or DualWrite era kept are still in etcd, and no kube-apiserver release
// removes them. An IPAddressOnly audit given Config.Bitmaps reports each as stale, not as a
// finding; without Bitmaps it reads no bitmap, and the other modes, which use them, report none.
func TestAuditReportsTheBitmapsIPAddressOnlyLeftBehind(t *testing.T) {
	e := testenv.NewEtcd(t)
	cli := e.TestClient(t)
	ranges := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("fd00::/64")}
	storeBitmap(t, cli, etcdstore.ServiceIPsKey(""), bits(t, "10.0.0.0/24", "10.0.0.10", "10.0.0.11"))
	objects := []runtime.Object{testenv.ServiceCIDR("kubernetes", "10.0.0.0/24", "fd00::/64"),
		svc("a/ok", "10.0.0.10"), ipAddr("10.0.0.10", "a/ok")}
	stores := etcdstore.Stores{Client: cli}
	tests := []struct {
		name    string
		mode    featuregate.Mode
		bitmaps bitmap.Stores
		want    []StaleBitmap
	}{
		{name: "IPAddressOnly with the bitmaps' store", mode: featuregate.IPAddressOnly, bitmaps: stores, want: []StaleBitmap{
			{Range: "10.0.0.0/24", Key: "/registry/ranges/serviceips", StoredRange: "10.0.0.0/24", Bits: 2}}},
		{name: "IPAddressOnly without it", mode: featuregate.IPAddressOnly},
		{name: "DualWrite, which uses them", mode: featuregate.DualWrite, bitmaps: stores},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rev := etcdRevision(t, cli)
			rep, err := Audit(t.Context(), clusterip.Config{Mode: tt.mode, Ranges: ranges, Client: fake.NewClientset(objects...), Bitmaps: tt.bitmaps})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, rep.StaleBitmaps, cmpopts.IgnoreFields(StaleBitmap{}, "Revision"), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("StaleBitmaps (-want +got):\n%s", diff)
			}
			for _, b := range rep.StaleBitmaps {
				if b.Revision <= 0 {
					t.Errorf("stale bitmap at %s has revision %d, want its etcd mod revision", b.Key, b.Revision)
				}
			}
			if tt.mode == featuregate.IPAddressOnly && !rep.Consistent {
				t.Errorf("a stale bitmap made the report inconsistent: %+v", rep.Findings)
			}
			if got := etcdRevision(t, cli); got != rev {
				t.Errorf("etcd revision moved from %d to %d: Audit wrote to etcd", rev, got)
			}
		})
	}
}

// TestAuditReadsABitmapOfAnotherRangeAsItsRewrite: after the flag range changed, the stored
// bitmap is of the old range until the first repair pass rewrites it, keeping the bits the new
// range serves. The audit judges it as that rewrite (a Service of the new range without its bit
// is missing) and counts it, rather than failing.
func TestAuditReadsABitmapOfAnotherRangeAsItsRewrite(t *testing.T) {
	e := testenv.NewEtcd(t)
	cli := e.TestClient(t)
	storeBitmap(t, cli, etcdstore.ServiceIPsKey(""), bits(t, "10.0.0.0/23", "10.0.0.7", "10.0.1.1"))
	client := fake.NewClientset(svc("a/kept", "10.0.0.7"), svc("a/new", "10.0.0.9"))
	rep, err := Audit(t.Context(), clusterip.Config{Mode: featuregate.Legacy, Ranges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")},
		Client: client, Bitmaps: etcdstore.Stores{Client: cli}})
	if err != nil {
		t.Fatalf("Audit() = %v, want a report", err)
	}
	var got []string
	for _, f := range rep.Findings {
		got = append(got, f.IP+" "+string(f.Class))
	}
	if diff := cmp.Diff([]string{"10.0.0.9 missing"}, got); diff != "" {
		t.Errorf("findings (-want +got):\n%s", diff)
	}
	if n := rep.Counts["bitmapsOfOtherRange"]; n != 1 {
		t.Errorf(`Counts["bitmapsOfOtherRange"] = %d, want 1`, n)
	}
}

// TestAuditFollowsListPages serves Services three to a page, as an API server honouring Limit
// would, and checks that Audit reads every page.
func TestAuditFollowsListPages(t *testing.T) {
	var all []corev1.Service
	objects := []runtime.Object{testenv.ServiceCIDR("kubernetes", "10.0.0.0/24")}
	for i := range 8 {
		s := svc("a/s"+strconv.Itoa(i), "10.0.0."+strconv.Itoa(10+i))
		all = append(all, *s)
		objects = append(objects, s) // for the Gets that confirm each missing IPAddress
	}
	client := fake.NewClientset(objects...)
	var pages int
	client.PrependReactor("list", "services", func(action k8stesting.Action) (bool, runtime.Object, error) {
		opts := action.(k8stesting.ListActionImpl).ListOptions
		start := 0
		if opts.Continue != "" {
			start, _ = strconv.Atoi(opts.Continue)
		}
		end := min(start+3, len(all))
		l := &corev1.ServiceList{Items: all[start:end]}
		if end < len(all) {
			l.Continue = strconv.Itoa(end)
		}
		pages++
		return true, l, nil
	})
	rep, err := Audit(t.Context(), clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, Client: client})
	if err != nil {
		t.Fatal(err)
	}
	if got := rep.Counts[CountServices]; got != len(all) {
		t.Errorf("Counts[services] = %d, want %d", got, len(all))
	}
	if got := rep.Counts[string(Missing)]; got != len(all) {
		t.Errorf("Counts[missing] = %d, want %d", got, len(all))
	}
	if pages != 3 {
		t.Errorf("Audit listed %d pages of Services, want 3", pages)
	}
}
