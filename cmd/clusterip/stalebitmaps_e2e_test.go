package main

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// TestRepairRemovesStaleBitmapsOnlyOnceNoServerCanWriteThem runs "clusterip repair
// --remove-stale-bitmaps" on one etcd through the end of a dual-write era, with a real
// kube-apiserver v1.37.2 at each step. Emulating 1.34 with DisableAllocatorDualWrite=false it
// writes the bitmap, yet --mode auto audits it as IPAddressOnly, the default at 1.34: repair
// refuses, with and without --dry-run, naming why (no peer address in its Lease, then its
// emulated 1.34 at --apiserver-endpoints), and changes nothing. At its own 1.37 --dry-run says
// what it would remove and why it may, and repair removes it; check reads the Service CIDRs from
// the ServiceCIDR once no bitmap is left.
func TestRepairRemovesStaleBitmapsOnlyOnceNoServerCanWriteThem(t *testing.T) {
	const flag = "10.96.0.0/24"
	e := testenv.NewEtcd(t)
	key := etcdstore.ServiceIPsKey("")
	seed, err := bitmap.New(netip.MustParsePrefix(flag))
	if err != nil {
		t.Fatal(err)
	}
	if err := seed.Allocate(t.Context(), netip.MustParseAddr("10.96.0.200"), allocator.Owner{}); err != nil {
		t.Fatal(err)
	}
	if _, err := etcdstore.New(e.TestClient(t), key).Update(t.Context(), 0, seed.Snapshot()); err != nil {
		t.Fatalf("seed the bitmap: %v", err)
	}

	old := testenv.NewKubeAPIServer(t, e, testenv.KubeAPIServerOptions{Release: "v1.37.2", ServiceClusterIPRange: flag,
		FeatureGates: "DisableAllocatorDualWrite=false", ExtraArgs: []string{"--emulated-version=1.34"}})
	waitForDefaultServiceCIDR(t, old.Client)
	waitForIdentityLease(t, old.Client, func(peer string) bool { return true })
	remove := []string{"repair", "--kubeconfig", writeKubeconfigWithToken(t, old.Config.Host, old.Config.BearerToken),
		"--etcd-servers", strings.Join(e.Endpoints(), ","), "--remove-stale-bitmaps", "--leak-grace", "0"}

	t.Run("refused while a server emulates 1.34", func(t *testing.T) {
		tests := []struct {
			name string
			args []string
			want []string // on stderr, the last line the refusal
		}{
			{"its Lease advertises no peer address", nil, []string{
				"clusterip: repair: a kube-apiserver may still write the bitmaps: 1 live kube-apiserver (apiserver-",
				"versions read at 0 endpoints: the Leases of apiserver-"}},
			{"its endpoint named", []string{"--apiserver-endpoints", old.Config.Host}, []string{
				"clusterip: repair: a kube-apiserver may still write the bitmaps: " + old.Config.Host + ": kube-apiserver v1.37.2 emulating 1.34: below 1.35 it can run DualWrite (with --feature-gates=DisableAllocatorDualWrite=false), which writes the bitmaps"}},
			{"--dry-run says so", []string{"--dry-run", "--apiserver-endpoints", old.Config.Host}, []string{
				"clusterip: dry run: repair would not remove the stale bitmap /registry/ranges/serviceips (range 10.96.0.0/24, revision ",
				", 2 bits set)\n", // the seeded one and the kubernetes Service's, which the server wrote
				"clusterip: repair: a kube-apiserver may still write the bitmaps: " + old.Config.Host + ": kube-apiserver v1.37.2 emulating 1.34"}},
			{"--mode dualwrite: the bitmaps are in use", []string{"--mode", "dualwrite"}, []string{
				"clusterip: --remove-stale-bitmaps needs an IPAddressOnly audit, and kube-apiserver v1.37.2 with --mode DualWrite is audited in DualWrite mode"}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				before := modRevision(t, e, key)
				r := clusterip(t, slices.Concat(remove, tt.args)...)
				if r.code != exitCouldNotRun {
					t.Fatalf("repair %q: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", tt.args, r.code, exitCouldNotRun, r.stdout, r.stderr)
				}
				for _, w := range tt.want {
					if !strings.Contains(r.stderr, w) {
						t.Errorf("repair %q: stderr lacks %q:\n%s", tt.args, w, r.stderr)
					}
				}
				lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
				if last := lines[len(lines)-1]; !strings.Contains(last, tt.want[len(tt.want)-1]) {
					t.Errorf("repair %q: the last line on stderr is %q, want the refusal", tt.args, last)
				}
				if after := modRevision(t, e, key); after == 0 || after != before {
					t.Errorf("repair %q changed the bitmap at %s: mod revision %d, then %d", tt.args, key, before, after)
				}
			})
		}
	})
	if t.Failed() {
		return
	}
	old.Stop()

	// The same host, upgraded: its identity Lease, renewed by the new server, advertises it.
	cur := testenv.NewKubeAPIServer(t, e, testenv.KubeAPIServerOptions{Release: "v1.37.2", ServiceClusterIPRange: flag})
	peer := strings.TrimPrefix(cur.Config.Host, "https://")
	waitForIdentityLease(t, cur.Client, func(p string) bool { return p == peer })
	kubeconfig := writeKubeconfigWithToken(t, cur.Config.Host, cur.Config.BearerToken)
	remove[2] = kubeconfig

	t.Run("--dry-run says what it would remove and why it may", func(t *testing.T) {
		before := modRevision(t, e, key)
		r := clusterip(t, slices.Concat(remove, []string{"--dry-run"})...)
		if r.code != exitProblem {
			t.Fatalf("repair --dry-run: exit %d, want %d (a stale bitmap to remove)\nstdout:\n%s\nstderr:\n%s", r.code, exitProblem, r.stdout, r.stderr)
		}
		for _, w := range []string{
			"clusterip: dry run: nothing was changed; without --dry-run, repair would remove 1 stale bitmap, if no kube-apiserver can write them\n",
			"clusterip: dry run: repair would remove the stale bitmap /registry/ranges/serviceips (range 10.96.0.0/24, revision ",
			", 2 bits set); no kube-apiserver can write it: 1 live kube-apiserver by identity Lease, each 1.35 or later: v1.37.2 emulating 1.37 at " + peer + "\n",
		} {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("repair --dry-run: stderr lacks %q:\n%s", w, r.stderr)
			}
		}
		if after := modRevision(t, e, key); after != before {
			t.Errorf("repair --dry-run changed the bitmap at %s: mod revision %d, then %d", key, before, after)
		}
	})

	t.Run("removed once every server emulates 1.35 or later", func(t *testing.T) {
		r := clusterip(t, remove...)
		if r.code != exitOK {
			t.Fatalf("repair: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, exitOK, r.stdout, r.stderr)
		}
		want := "clusterip: removed the stale bitmap /registry/ranges/serviceips (range 10.96.0.0/24, revision "
		if !strings.Contains(r.stderr, want) {
			t.Errorf("repair: stderr lacks %q:\n%s", want, r.stderr)
		}
		if strings.Contains(r.stdout, "Stale bitmaps") || !strings.Contains(r.stdout, "Mode IPAddressOnly: consistent") {
			t.Errorf("repair printed %q, want the table of a consistent audit without stale bitmaps", r.stdout)
		}
		if rev := modRevision(t, e, key); rev != 0 {
			t.Errorf("%s is still in etcd (mod revision %d) after repair removed it", key, rev)
		}
	})

	t.Run("with no bitmap left, check reads the Service CIDRs from the ServiceCIDR", func(t *testing.T) {
		rep := checkJSON(t, exitOK, "check", "--kubeconfig", kubeconfig, "--etcd-servers", strings.Join(e.Endpoints(), ","), "-o", "json")
		if len(rep.StaleBitmaps) != 0 {
			t.Errorf("check after the removal lists stale bitmaps %+v", rep.StaleBitmaps)
		}
		r := clusterip(t, remove...)
		if r.code != exitOK || !strings.Contains(r.stderr, "clusterip: no stale bitmap to remove\n") {
			t.Errorf("repair again: exit %d, stderr %q; want %d, no stale bitmap to remove", r.code, r.stderr, exitOK)
		}
	})
}

// waitForIdentityLease waits until kube-apiserver's one identity Lease in kube-system has a peer
// address (the annotation kubernetes.io/peer-advertise-address, "" if none) that ok accepts: a
// server writes its Lease shortly after it is ready.
func waitForIdentityLease(t *testing.T, client kubernetes.Interface, ok func(peer string) bool) {
	t.Helper()
	poll(t, "the identity Lease of kube-apiserver", func() bool {
		l, err := client.CoordinationV1().Leases(metav1.NamespaceSystem).List(t.Context(), metav1.ListOptions{LabelSelector: "apiserver.kubernetes.io/identity=kube-apiserver"})
		return err == nil && len(l.Items) == 1 && ok(l.Items[0].Annotations["kubernetes.io/peer-advertise-address"])
	})
}
