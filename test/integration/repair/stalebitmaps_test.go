package repair_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/repair"
)

// TestStaleBitmapsAreRemovedOnlyOnceNoServerCanWriteThem walks a cluster through the end of its
// dual-write era on one etcd, with a real kube-apiserver v1.37.2 at each step:
//
//   - emulating 1.34 with DisableAllocatorDualWrite=false, it runs DualWrite and writes the
//     bitmap; an IPAddressOnly audit reports that bitmap as stale, and the check, given the
//     server's URL (its Lease advertises no peer address), refuses to remove it, naming the
//     server and its emulated 1.34, so it stays in etcd;
//   - at its own 1.37, where both allocator gates are locked on, the check finds its version at
//     the peer address its identity Lease now advertises, and the bitmap is removed: the etcd key
//     is gone;
//   - a bitmap written after the audit read it is left, with an error matching
//     bitmap.ErrConflict.
func TestStaleBitmapsAreRemovedOnlyOnceNoServerCanWriteThem(t *testing.T) {
	t.Parallel()
	const flag = "10.96.0.0/24"
	e := testenv.NewEtcd(t)
	cli := e.TestClient(t)
	key := etcdstore.ServiceIPsKey("")
	// A stale bitmap with one bit, as a DualWrite era leaves it; the first server adopts it.
	seedBit(t, etcdstore.New(cli, key), flag, "10.96.0.200")

	old := testenv.NewKubeAPIServer(t, e, testenv.KubeAPIServerOptions{Release: "v1.37.2", ServiceClusterIPRange: flag,
		FeatureGates: "DisableAllocatorDualWrite=false", ExtraArgs: []string{"--emulated-version=1.34"}})
	testenv.WaitForKubernetesService(t, old.Client)
	cfg := clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: []netip.Prefix{netip.MustParsePrefix(flag)},
		Client: old.Client, Bitmaps: etcdstore.Stores{Client: cli}}

	live := waitForLease(t, cfg, func(repair.APIServer) bool { return true })
	t.Run("a server emulating 1.34 may write the bitmap: refused", func(t *testing.T) {
		stale := staleBitmaps(t, cfg)
		if stale[0].Bits != 2 {
			t.Errorf("the stale bitmap holds %d addresses, want 2: the seeded one and the kubernetes Service's, which the DualWrite server wrote", stale[0].Bits)
		}
		if live[0].PeerAddress != "" {
			t.Errorf("the Lease of a server emulating 1.34 advertises %q, want none (UnknownVersionInteroperabilityProxy is off at 1.34)", live[0].PeerAddress)
		}
		versions, err := repair.ReadServerVersions(t.Context(), old.Config, live, []string{old.Config.Host})
		if err != nil {
			t.Fatal(err)
		}
		err = repair.CheckBitmapWriters(live, versions)
		var bwe *repair.BitmapWriterError
		if !errors.As(err, &bwe) || bwe.Server != old.Config.Host || !strings.Contains(bwe.Reason, "emulating 1.34") {
			t.Fatalf("CheckBitmapWriters() = %v, want a *BitmapWriterError naming %s, emulating 1.34", err, old.Config.Host)
		}
		if rev := modRevision(t, cli, key); rev == 0 || rev < stale[0].Revision {
			t.Errorf("%s after the refusal: mod revision %d, want the bitmap kept (at %d or later)", key, rev, stale[0].Revision)
		}
	})
	if t.Failed() {
		return
	}
	old.Stop()

	// The same host, upgraded: its Lease (named after the host) is renewed by the new server.
	cur := testenv.NewKubeAPIServer(t, e, testenv.KubeAPIServerOptions{Release: "v1.37.2", ServiceClusterIPRange: flag})
	cfg.Client = cur.Client
	oldHolder := live[0].Holder
	live = waitForLease(t, cfg, func(s repair.APIServer) bool { return s.Holder != oldHolder })

	t.Run("every server emulates 1.35 or later: removed", func(t *testing.T) {
		stale := staleBitmaps(t, cfg)
		if want := strings.TrimPrefix(cur.Config.Host, "https://"); live[0].PeerAddress != want {
			t.Errorf("the Lease of a server at its own 1.37 advertises %q, want %q (UnknownVersionInteroperabilityProxy is on from 1.36)", live[0].PeerAddress, want)
		}
		versions, err := repair.ReadServerVersions(t.Context(), cur.Config, live, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := repair.CheckBitmapWriters(live, versions); err != nil {
			t.Fatalf("CheckBitmapWriters() = %v, want nil", err)
		}
		removed, err := repair.RemoveStaleBitmaps(t.Context(), cfg, stale)
		if err != nil || len(removed) != 1 || removed[0].Key != key {
			t.Fatalf("RemoveStaleBitmaps() = %+v, %v; want %s removed", removed, err, key)
		}
		if rev := modRevision(t, cli, key); rev != 0 {
			t.Errorf("%s is still in etcd (mod revision %d) after its removal", key, rev)
		}
		if rep, err := repair.Audit(t.Context(), cfg); err != nil || len(rep.StaleBitmaps) != 0 {
			t.Errorf("Audit() after the removal: stale bitmaps %+v, %v; want none", rep.StaleBitmaps, err)
		}
	})

	t.Run("a bitmap written since the audit is left", func(t *testing.T) {
		seedBit(t, etcdstore.New(cli, key), flag, "10.96.0.201")
		stale := staleBitmaps(t, cfg)
		seedBit(t, etcdstore.New(cli, key), flag, "10.96.0.202") // after the audit read it
		written := modRevision(t, cli, key)
		removed, err := repair.RemoveStaleBitmaps(t.Context(), cfg, stale)
		var sbe *repair.StaleBitmapError
		if !errors.Is(err, bitmap.ErrConflict) || !errors.As(err, &sbe) || len(removed) != 0 {
			t.Fatalf("RemoveStaleBitmaps() = %+v, %v; want none removed, a *StaleBitmapError matching bitmap.ErrConflict", removed, err)
		}
		if rev := modRevision(t, cli, key); rev != written {
			t.Errorf("%s after the refused removal: mod revision %d, want %d, as written", key, rev, written)
		}
	})
}

// staleBitmaps audits cfg and returns its stale bitmaps, failing t unless there is exactly one.
func staleBitmaps(t *testing.T, cfg clusterip.Config) []repair.StaleBitmap {
	t.Helper()
	rep, err := repair.Audit(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.StaleBitmaps) != 1 {
		t.Fatalf("Audit() stale bitmaps %+v, want the one at %s", rep.StaleBitmaps, etcdstore.ServiceIPsKey(""))
	}
	return rep.StaleBitmaps
}

// waitForLease waits until the one live kube-apiserver of cfg's cluster satisfies ok, and returns
// it: a server writes its identity Lease shortly after it is ready.
func waitForLease(t *testing.T, cfg clusterip.Config, ok func(repair.APIServer) bool) []repair.APIServer {
	t.Helper()
	var live []repair.APIServer
	testenv.WaitFor(t, "the identity Lease of the new kube-apiserver", func() bool {
		var err error
		live, err = repair.LiveAPIServers(t.Context(), cfg.Client)
		return err == nil && len(live) == 1 && ok(live[0])
	})
	return live
}

// modRevision returns the ModRevision of key in the etcd cli reaches, 0 if it does not exist.
func modRevision(t *testing.T, cli *clientv3.Client, key string) int64 {
	t.Helper()
	resp, err := cli.Get(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return 0
	}
	return resp.Kvs[0].ModRevision
}
