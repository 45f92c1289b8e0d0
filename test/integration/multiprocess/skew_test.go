package multiprocess

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kube-ipam/clusterip/test/integration/internal/clustertest"
)

// TestSkewLegacyAndDualWriteProcesses runs a Legacy-mode allocator and a DualWrite-mode allocator
// in separate OS processes on one etcd and one bitmap key (kube-apiserver's own, at /registry,
// beside a real kube-apiserver v1.33 in its default dual-write mode), as during an upgrade with
// old and new apiservers side by side. Both Allocate the same 100 chosen addresses at once:
// exactly 100 calls fail and each address is won once. Then both AllocateNext 10000 addresses
// each at once from a /17 (32766 addresses): no address is handed out twice, every one is set in
// the bitmap, and the DualWrite process's have IPAddress objects.
func TestSkewLegacyAndDualWriteProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping kube-apiserver test in -short mode")
	}
	const flag = "10.96.0.0/17"
	const perProcess = 10000 // AllocateNext calls of each process
	etcd, ec, api := clustertest.StartOwnCluster(t, flag)
	rg := netip.MustParsePrefix(flag)
	key, baseBits, baseObjs := clustertest.APIServerBaseline(t, ec, api.Client, rg)

	// run runs op in both processes at once; the DualWrite process takes ips in reverse order, so
	// that the two meet in the middle whichever is faster.
	run := func(t *testing.T, op string, ips []string, count int) (legacy, dual procResult) {
		t.Helper()
		reversed := slices.Clone(ips)
		slices.Reverse(reversed)
		l := startProc(t, procSpec{Name: "legacy", Mode: "Legacy", Ranges: []string{flag}, Op: op, IPs: ips, Count: count, Workers: 4}, etcd, nil)
		// The addresses are held for no Service: a managed-by of our own keeps the kube-apiserver's
		// repair loop from deleting their IPAddress objects 60 s after they were created.
		d := startProc(t, procSpec{Name: "dualwrite", Mode: "DualWrite", Ranges: []string{flag}, Op: op, IPs: reversed, Count: count, Workers: 4, ManagedBy: testManagedBy}, etcd, api)
		l.start()
		d.start()
		return l.wait(), d.wait()
	}
	// owners maps each address handed out to the processes that got it.
	owners := map[netip.Addr][]string{}
	dualIPs := sets.New[netip.Addr]()
	collect := func(name string, r procResult) {
		for _, s := range r.Allocated {
			ip := netip.MustParseAddr(s)
			owners[ip] = append(owners[ip], name)
			if name == "dualwrite" {
				dualIPs.Insert(ip)
			}
		}
	}
	checkStores := func(t *testing.T) {
		t.Helper()
		dup := 0
		for ip, who := range owners {
			if len(who) > 1 {
				dup++
				if dup <= 10 {
					t.Errorf("%s handed out %d times: %v", ip, len(who), who)
				}
			}
		}
		if dup > 0 {
			t.Errorf("%d addresses handed out more than once", dup)
		}
		bits, _ := clustertest.EtcdBits(t, ec, key, rg)
		objs := clustertest.APIIPAddresses(t, api.Client)
		missingBits, missingObjs := 0, 0
		for ip := range owners {
			if !bits.Has(ip) {
				missingBits++
			}
		}
		for ip := range dualIPs {
			if !objs.Has(ip) {
				missingObjs++
			}
		}
		extraBits := len(bits) - len(baseBits) - len(owners)
		extraObjs := len(objs) - len(baseObjs) - len(dualIPs)
		t.Logf("stores: %d bits (%d before), %d IPAddress objects (%d before); handed out %d, %d of them by DualWrite",
			len(bits), len(baseBits), len(objs), len(baseObjs), len(owners), len(dualIPs))
		if missingBits != 0 || missingObjs != 0 || extraBits != 0 || extraObjs != 0 {
			t.Errorf("stores disagree with what was handed out: %d without a bit, %d DualWrite ones without an IPAddress object, %d bits and %d objects more than handed out; want all 0",
				missingBits, missingObjs, extraBits, extraObjs)
		}
	}

	t.Run("same 100 chosen addresses", func(t *testing.T) {
		var ips []string
		for i := range 100 {
			ips = append(ips, fmt.Sprintf("10.96.1.%d", 10+i))
		}
		legacy, dual := run(t, opAllocate, ips, 0)
		collect("legacy", legacy)
		collect("dualwrite", dual)
		failures := legacy.failed() + dual.failed()
		t.Logf("Legacy: %d allocated, failures %v; DualWrite: %d allocated, failures %v; %d failures in total",
			len(legacy.Allocated), legacy.Failures, len(dual.Allocated), dual.Failures, failures)
		if failures != 100 || legacy.Failures["allocated"]+dual.Failures["allocated"] != 100 {
			t.Errorf("failures = %d (Legacy %v, DualWrite %v), want exactly 100, all ErrAllocated", failures, legacy.Failures, dual.Failures)
		}
		if len(legacy.Allocated) == 0 || len(dual.Allocated) == 0 {
			t.Logf("one process won every address: the race was not exercised this run")
		}
		if len(owners) != 100 {
			t.Errorf("%d distinct addresses allocated, want 100", len(owners))
		}
		checkStores(t)
	})
	t.Run("AllocateNext 10000 each", func(t *testing.T) {
		legacy, dual := run(t, opNext, nil, perProcess)
		collect("legacy", legacy)
		collect("dualwrite", dual)
		t.Logf("Legacy: %d allocated, failures %v, p50 %v, p99 %v; DualWrite: %d allocated, failures %v, p50 %v, p99 %v",
			len(legacy.Allocated), legacy.Failures, legacy.P50, legacy.P99, len(dual.Allocated), dual.Failures, dual.P50, dual.P99)
		if got := len(legacy.Allocated) + len(dual.Allocated); got != 2*perProcess {
			t.Errorf("%d AllocateNext calls succeeded, want %d", got, 2*perProcess)
		}
		checkStores(t)
	})
}
