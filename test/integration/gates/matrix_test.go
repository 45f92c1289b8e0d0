package gates

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/kubernetes"
	"k8s.io/component-base/compatibility"
	basefeaturegate "k8s.io/component-base/featuregate"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/allocator/service"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/servicematrix"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/test/integration/internal/clustertest"
)

// gateCombination is one setting of the two feature gates and the Mode it selects.
type gateCombination struct {
	multiCIDR, disableDualWrite bool
	want                        featuregate.Mode
}

func (g gateCombination) String() string {
	return fmt.Sprintf("%s=%v,%s=%v", featuregate.MultiCIDRServiceAllocator, g.multiCIDR, featuregate.DisableAllocatorDualWrite, g.disableDualWrite)
}

var gateCombinations = []gateCombination{
	{multiCIDR: false, disableDualWrite: false, want: featuregate.Legacy},
	{multiCIDR: false, disableDualWrite: true, want: featuregate.Legacy}, // as kube-apiserver 1.31–1.34 run it
	{multiCIDR: true, disableDualWrite: false, want: featuregate.DualWrite},
	{multiCIDR: true, disableDualWrite: true, want: featuregate.IPAddressOnly},
}

// modeOfGates sets the gates of a kube-apiserver 1.33 feature gate as g says and returns ModeOf.
func modeOfGates(t testing.TB, g gateCombination) (featuregate.Mode, error) {
	t.Helper()
	gate := basefeaturegate.NewVersionedFeatureGate(version.MajorMinor(1, 33))
	if err := featuregate.Add(gate); err != nil {
		t.Fatalf("Add() = %v", err)
	}
	if err := gate.SetFromMap(map[string]bool{
		string(featuregate.MultiCIDRServiceAllocator): g.multiCIDR,
		string(featuregate.DisableAllocatorDualWrite): g.disableDualWrite,
	}); err != nil {
		t.Fatalf("SetFromMap(%v) = %v", g, err)
	}
	return featuregate.ModeOf(gate)
}

// matrixCluster is one cluster shape of the matrix with a real kube-apiserver serving its ranges.
type matrixCluster struct {
	name   string
	ranges []netip.Prefix
	etcd   *clientv3.Client
	api    kubernetes.Interface
}

// matrixRun runs the cases of the matrix through one Mode's allocators on a matrixCluster and
// checks the stores after each.
type matrixRun struct {
	cl       matrixCluster
	mode     featuregate.Mode
	prefix   string // EtcdPrefix of the allocators' bitmaps
	allocs   *clusterip.Allocators
	sa       *service.Allocator
	baseBits []sets.Set[netip.Addr] // per range, the bits before the first case
	baseObjs sets.Set[netip.Addr]   // the IPAddress objects before the first case
}

// testdata is the library module's testdata folder, which holds the Service matrices.
var testdata = filepath.Join("..", "..", "..", "testdata")

// releaseRun is one way a release runs: a Mode at an emulation version ("" for the binary's own).
type releaseRun struct {
	mode     featuregate.Mode
	emulated string
	gates    map[string]bool // Config.FeatureGates
}

// releaseRuns are the modes the library replays each release's matrix in: every mode for
// v1.33.13 (the four gate combinations select three), and for the later releases their default
// IPAddressOnly and the older mode each still reaches: Legacy for v1.35 and v1.36 emulating 1.33,
// DualWrite for v1.37 emulating 1.34 (with StrictIPCIDRValidation on where the release has it
// on by default, as the matrix recorded it). v1.38 (featuregate.NewestKubeVersion, its beta for
// now) runs IPAddressOnly only: it has no bitmap, and the versions it emulates (1.35 to 1.37)
// have no dual write it could reach.
var releaseRuns = map[string][]releaseRun{
	"v1.33.13": {{mode: featuregate.Legacy}, {mode: featuregate.DualWrite}, {mode: featuregate.IPAddressOnly}},
	"v1.35.4":  {{mode: featuregate.IPAddressOnly}, {mode: featuregate.Legacy, emulated: "1.33"}},
	"v1.36.3":  {{mode: featuregate.IPAddressOnly}, {mode: featuregate.Legacy, emulated: "1.33", gates: map[string]bool{"StrictIPCIDRValidation": true}}},
	"v1.37.2":  {{mode: featuregate.IPAddressOnly}, {mode: featuregate.DualWrite, emulated: "1.34", gates: map[string]bool{"StrictIPCIDRValidation": true}}},

	"v" + featuregate.NewestKubeVersion: {{mode: featuregate.IPAddressOnly}},
}

// TestGateServiceMatrix runs every case of each release's Service matrix
// (testdata/services-<release>.yaml, recorded from stock kube-apiservers of that release) through
// service.Allocator over the Allocators that New builds with Config.Version set to the release,
// in the modes releaseRuns lists, against a real etcd and a real kube-apiserver v1.33 per
// cluster shape (which serves the ServiceCIDR and IPAddress API and creates the kubernetes
// ServiceCIDR of the shape's ranges). Each answer must be the release's: results, codes, field
// paths and texts (Legacy mode's where the release answered differently in it). After each
// create, update and release it checks that the bitmaps read from etcd and the IPAddress objects
// listed from the API server hold exactly the addresses the case's Services hold, besides those
// held before the first case: Legacy sets bits only, DualWrite sets bits (of each family's own
// range, at the key its flag position chooses: kubernetes#127588) and creates IPAddress objects,
// IPAddressOnly creates IPAddress objects only. Of v1.33's four gate combinations the off/on one
// selects Legacy, as kube-apiserver 1.31 to 1.34 run it (no dependency between the gates;
// upstream's own integration tests start servers so), and its Mode runs once.
func TestGateServiceMatrix(t *testing.T) {
	for _, g := range gateCombinations {
		mode, err := modeOfGates(t, g)
		if err != nil || mode != g.want {
			t.Fatalf("ModeOf(%v) = %v, %v; want %v", g, mode, err, g.want)
		}
	}
	files := map[string]*servicematrix.File{}
	for _, release := range servicematrix.Releases {
		if len(releaseRuns[release]) == 0 {
			t.Fatalf("%s has a matrix but no runs in releaseRuns", release)
		}
		m, err := servicematrix.Load(servicematrix.PathFor(testdata, release))
		if err != nil {
			t.Fatal(err)
		}
		if first := files[servicematrix.Releases[0]]; first != nil && !cmp.Equal(m.Clusters, first.Clusters) {
			t.Fatalf("%s: the matrix's cluster shapes differ from %s's", release, servicematrix.Releases[0])
		}
		files[release] = m
	}
	if testing.Short() {
		t.Skip("skipping the kube-apiserver part in -short mode")
	}
	etcd := testenv.NewEtcd(t)
	ec := etcd.TestClient(t)
	counts := map[string]int{}
	for _, shape := range files[servicematrix.Releases[0]].Clusters {
		t.Run(shape.Name, func(t *testing.T) {
			ranges, err := shape.Prefixes()
			if err != nil {
				t.Fatal(err)
			}
			api := testenv.NewKubeAPIServer(t, etcd, testenv.KubeAPIServerOptions{
				ServiceClusterIPRange: strings.Join(shape.Ranges, ","),
				EtcdPrefix:            "/registry-" + shape.Name,
				FeatureGates:          clustertest.ListsFromEtcd,
			})
			clustertest.WaitForKubernetesService(t, api.Client)
			cl := matrixCluster{name: shape.Name, ranges: ranges, etcd: ec, api: api.Client}
			for _, release := range servicematrix.Releases {
				m := files[release]
				for _, run := range releaseRuns[release] {
					name := release + "/" + run.mode.String()
					if run.emulated != "" {
						name += "@" + run.emulated
					}
					t.Run(name, func(t *testing.T) {
						v, err := featuregate.KubeVersion(release, run.emulated)
						if err != nil {
							t.Fatal(err)
						}
						r := newMatrixRun(t, cl, run.mode, v, run.gates)
						for i, tc := range m.Cases {
							want, ok := tc.Expect[shape.Name]
							if !ok {
								t.Fatalf("%s: no expectation for cluster %s", tc.Name, shape.Name)
							}
							r.runCase(t, fmt.Sprintf("m%d", i), tc, want)
							counts[name]++
							if t.Failed() {
								t.Fatalf("stopping after the first failed case")
							}
						}
					})
				}
			}
		})
	}
	t.Logf("case runs checked per release and mode: %v", counts)
}

// newMatrixRun starts the Allocators of mode behaving as kube-apiserver v (nil: the default
// release of the mode) with the feature gates gates on cl, with their bitmaps under a prefix of their own.
func newMatrixRun(t *testing.T, cl matrixCluster, mode featuregate.Mode, v compatibility.EffectiveVersion, gates map[string]bool) *matrixRun {
	t.Helper()
	prefix := "/clusterip-" + cl.name + "-" + strings.ToLower(mode.String())
	if v != nil {
		prefix += "-" + v.BinaryVersion().String() + "-" + v.EmulationVersion().String()
	}
	r := &matrixRun{cl: cl, mode: mode, prefix: prefix}
	r.allocs = clustertest.StartAllocators(t, clusterip.Config{Mode: mode, Version: v, FeatureGates: gates, Ranges: cl.ranges, Bitmaps: etcdstore.Stores{Client: cl.etcd, Prefix: r.prefix}, Client: cl.api})
	r.sa = r.allocs.Services()
	r.baseObjs = clustertest.APIIPAddresses(t, cl.api)
	for i, key := range clustertest.BitmapKeys(r.prefix, cl.ranges) {
		bits, ok := clustertest.EtcdBits(t, cl.etcd, key, cl.ranges[i])
		if mode == featuregate.IPAddressOnly {
			if ok {
				t.Fatalf("IPAddressOnly: a bitmap exists at %s", key)
			}
			continue
		}
		if !ok {
			t.Fatalf("%v: no bitmap at %s after New", mode, key)
		}
		if mode == featuregate.DualWrite {
			// Bootstrapped from the IPAddress objects in its window: the kubernetes Service's.
			if diff := cmp.Diff(clustertest.Sorted(clustertest.Within(r.baseObjs, cl.ranges[i])), clustertest.Sorted(bits)); diff != "" {
				t.Errorf("DualWrite: the new bitmap at %s is not that of the IPAddress objects (-want +got):\n%s", key, diff)
			}
		}
		r.baseBits = append(r.baseBits, bits)
	}
	return r
}

// owner of the Services a case's taken addresses stand for.
func takenOwner(name string, i int) allocator.Owner {
	return allocator.Owner{Resource: "services", Namespace: "default", Name: fmt.Sprintf("%s-taken-%d", name, i)}
}

func (r *matrixRun) runCase(t *testing.T, name string, tc servicematrix.Case, want servicematrix.Expect) {
	t.Helper()
	ctx := context.Background()
	var taken []netip.Addr
	for i, s := range tc.Taken {
		ip := netip.MustParseAddr(s)
		a := r.allocs.For(clustertest.FamilyOf(ip))
		if a == nil {
			continue
		}
		if err := a.Allocate(ctx, ip, takenOwner(name, i)); err != nil {
			t.Fatalf("%s: take %s: %v", tc.Name, ip, err)
		}
		taken = append(taken, ip)
	}
	svc := servicematrix.Service(name, tc.Create)
	txn, err := r.sa.Allocate(ctx, svc, false)
	if got := r.result(t, tc, svc, nil, err); !cmp.Equal(want.Create, got) {
		t.Fatalf("%s: Allocate: result (-want +got):\n%s", tc.Name, cmp.Diff(want.Create, got))
	}
	if got, wantText := r.text(t, tc, nil, err), want.CreateText.In(r.mode == featuregate.Legacy); !cmp.Equal(wantText, got) {
		t.Fatalf("%s: Allocate: error text (-want +got):\n%s", tc.Name, cmp.Diff(wantText, got))
	}
	current := svc
	if err != nil {
		r.check(t, tc.Name+": after a failed Allocate", taken)
	} else {
		if err := txn.Commit(ctx); err != nil {
			t.Fatalf("Commit() = %v", err)
		}
		r.check(t, tc.Name+": after Allocate", append(servicematrix.Addrs(svc), taken...))
		if tc.Update != nil {
			if want.Update == nil {
				t.Fatalf("%s: the case has an update but no expected update result", tc.Name)
			}
			upd := svc.DeepCopy()
			servicematrix.Apply(upd, *tc.Update, svc)
			utxn, err := r.sa.Update(ctx, svc, upd, false)
			if got := r.result(t, tc, upd, svc, err); !cmp.Equal(*want.Update, got) {
				t.Fatalf("%s: Update: result (-want +got):\n%s", tc.Name, cmp.Diff(*want.Update, got))
			}
			if got, wantText := r.text(t, tc, svc, err), want.UpdateText.In(r.mode == featuregate.Legacy); !cmp.Equal(wantText, got) {
				t.Fatalf("%s: Update: error text (-want +got):\n%s", tc.Name, cmp.Diff(wantText, got))
			}
			if err != nil {
				r.check(t, tc.Name+": after a failed Update", append(servicematrix.Addrs(svc), taken...))
			} else {
				if err := utxn.Commit(ctx); err != nil {
					t.Fatalf("Commit() = %v", err)
				}
				current = upd
				r.check(t, tc.Name+": after Update", append(servicematrix.Addrs(upd), taken...))
			}
		}
		if err := r.sa.Release(ctx, current); err != nil {
			t.Fatalf("%s: Release: %v", tc.Name, err)
		}
	}
	for _, ip := range taken {
		if err := r.allocs.For(clustertest.FamilyOf(ip)).Release(ctx, ip); err != nil {
			t.Fatalf("%s: release taken %s: %v", tc.Name, ip, err)
		}
	}
	r.check(t, tc.Name+": after Release", nil)
}

func (r *matrixRun) result(t *testing.T, tc servicematrix.Case, svc, created *corev1.Service, callErr error) servicematrix.Result {
	t.Helper()
	got, err := servicematrix.ResultOf(tc, r.cl.ranges, svc, created, callErr)
	if err != nil {
		t.Fatalf("%s: %v", tc.Name, err)
	}
	return got
}

// text is servicematrix.TextOf, failing t on an error that is not a StatusError.
func (r *matrixRun) text(t *testing.T, tc servicematrix.Case, created *corev1.Service, callErr error) *servicematrix.Text {
	t.Helper()
	got, err := servicematrix.TextOf(tc, r.cl.ranges, created, callErr)
	if err != nil {
		t.Fatalf("%s: %v", tc.Name, err)
	}
	return got
}

// check fails t unless the stores hold exactly the baseline and held, as the mode says.
func (r *matrixRun) check(t *testing.T, when string, held []netip.Addr) {
	t.Helper()
	objs := clustertest.APIIPAddresses(t, r.cl.api)
	wantObjs := r.baseObjs.Clone().Insert(held...)
	if r.mode == featuregate.Legacy {
		wantObjs = r.baseObjs
	}
	if diff := cmp.Diff(clustertest.Sorted(wantObjs), clustertest.Sorted(objs)); diff != "" {
		t.Errorf("%s: %v: IPAddress objects (-want +got):\n%s", when, r.mode, diff)
	}
	for i, key := range clustertest.BitmapKeys(r.prefix, r.cl.ranges) {
		rg := r.cl.ranges[i]
		bits, ok := clustertest.EtcdBits(t, r.cl.etcd, key, rg)
		if r.mode == featuregate.IPAddressOnly {
			if ok {
				t.Errorf("%s: IPAddressOnly: a bitmap exists at %s", when, key)
			}
			continue
		}
		if !ok {
			t.Fatalf("%s: %v: the bitmap at %s is gone", when, r.mode, key)
		}
		wantBits := clustertest.Within(r.baseBits[i].Clone().Insert(held...), rg)
		if diff := cmp.Diff(clustertest.Sorted(wantBits), clustertest.Sorted(bits)); diff != "" {
			t.Errorf("%s: %v: bits of %s at %s (-want +got):\n%s", when, r.mode, rg, key, diff)
		}
	}
}

// TestDualWriteSecondaryIPv6WiderThanBitmap covers kubernetes#127588 and kubernetes#129797 in one
// dual-stack cluster under DualWrite, against a real etcd and kube-apiserver: the secondary
// family's bitmap is of its own flag range (an IPv6 /108, not the primary's IPv4 /24) at
// ranges/secondaryserviceips, and of that /108 only the first 65535 addresses have bits; the
// addresses past them are held by IPAddress objects only.
func TestDualWriteSecondaryIPv6WiderThanBitmap(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping kube-apiserver test in -short mode")
	}
	etcd := testenv.NewEtcd(t)
	ec := etcd.TestClient(t)
	flags := []string{"10.96.0.0/24", "fd00:10:96::/108"}
	api := testenv.NewKubeAPIServer(t, etcd, testenv.KubeAPIServerOptions{ServiceClusterIPRange: strings.Join(flags, ",")})
	clustertest.WaitForKubernetesService(t, api.Client)
	cl := matrixCluster{name: "wide", ranges: []netip.Prefix{netip.MustParsePrefix(flags[0]), netip.MustParsePrefix(flags[1])}, etcd: ec, api: api.Client}
	r := newMatrixRun(t, cl, featuregate.DualWrite, nil, nil)
	ctx := context.Background()

	require := corev1.IPFamilyPolicyRequireDualStack
	single := corev1.IPFamilyPolicySingleStack
	tests := []struct {
		name       string
		clusterIPs []string
		policy     *corev1.IPFamilyPolicy
		families   []corev1.IPFamily
		wantBits   []string // of the IPv6 range
	}{
		{name: "last slot of the bitmap", clusterIPs: []string{"10.96.0.10", "fd00:10:96::ffff"}, policy: &require, wantBits: []string{"fd00:10:96::ffff"}},
		{name: "first address past the bitmap", clusterIPs: []string{"10.96.0.11", "fd00:10:96::1:0"}, policy: &require},
		{name: "far past the bitmap", clusterIPs: []string{"fd00:10:96::a:5"}, policy: &single, families: []corev1.IPFamily{corev1.IPv6Protocol}},
		{name: "any IPv6 address", policy: &single, families: []corev1.IPFamily{corev1.IPv6Protocol}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := servicematrix.Service(fmt.Sprintf("wide-%d", i), servicematrix.Spec{})
			svc.Spec.IPFamilyPolicy, svc.Spec.IPFamilies = tt.policy, tt.families
			if tt.clusterIPs != nil {
				svc.Spec.ClusterIP, svc.Spec.ClusterIPs = tt.clusterIPs[0], tt.clusterIPs
			}
			txn, err := r.sa.Allocate(ctx, svc, false)
			if err != nil {
				t.Fatalf("Allocate(%v) = %v", tt.clusterIPs, err)
			}
			if err := txn.Commit(ctx); err != nil {
				t.Fatalf("Commit() = %v", err)
			}
			held := servicematrix.Addrs(svc)
			r.check(t, "after Allocate", held)
			v6 := held[len(held)-1]
			bits, _ := clustertest.EtcdBits(t, ec, etcdstore.SecondaryServiceIPsKey(r.prefix), cl.ranges[1])
			if got, want := bits.Has(v6), clustertest.InBitmapWindow(cl.ranges[1], v6); got != want {
				t.Errorf("bit of %s set = %v, want %v", v6, got, want)
			}
			if tt.clusterIPs != nil {
				got := bits.Clone()
				for ip := range r.baseBits[1] {
					delete(got, ip)
				}
				if diff := cmp.Diff(clustertest.Sorted(sets.New(mustAddrs(tt.wantBits...)...)), clustertest.Sorted(got)); diff != "" {
					t.Errorf("bits of %s (-want +got):\n%s", cl.ranges[1], diff)
				}
			}
			if objs := clustertest.APIIPAddresses(t, api.Client); !objs.Has(v6) {
				t.Errorf("no IPAddress object for %s", v6)
			}
			if err := r.sa.Release(ctx, svc); err != nil {
				t.Fatalf("Release() = %v", err)
			}
			r.check(t, "after Release", nil)
		})
	}
}

func mustAddrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}
