package multiprocess

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/kube-ipam/clusterip/test/integration/internal/clustertest"
)

// TestFairnessThreeDualWriteProcesses runs three DualWrite allocator processes of 4 workers each
// on one bitmap key (and a real kube-apiserver's IPAddress objects), each calling AllocateNext as
// fast as it can for 8 s, and reports each process's share of the allocations and its p50/p99.
// The targets (each process ½×–2× its fair share, its p99 ≤ 3× its p50) are measured, not
// asserted; the test asserts only that no address is handed out twice and that every process gets
// at least 5% of the allocations (a process starved outright).
func TestFairnessThreeDualWriteProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping kube-apiserver test in -short mode")
	}
	const (
		flag     = "10.96.0.0/17"
		procs    = 3
		duration = 8 * time.Second
	)
	etcd, _, api := clustertest.StartOwnCluster(t, flag)
	var ps []*proc
	for i := range procs {
		ps = append(ps, startProc(t, procSpec{Name: fmt.Sprintf("apiserver-%d", i), Mode: "DualWrite", Ranges: []string{flag}, Op: opSaturate, Workers: 4, Duration: duration}, etcd, api))
	}
	for _, p := range ps {
		p.start()
	}
	results := make([]procResult, procs)
	total := 0
	for i, p := range ps {
		results[i] = p.wait()
		total += len(results[i].Allocated)
	}
	seen := map[netip.Addr]int{}
	for i, r := range results {
		for _, s := range r.Allocated {
			seen[netip.MustParseAddr(s)]++
		}
		share := float64(len(r.Allocated)) / float64(max(total, 1))
		t.Logf("process %d: %d allocations (%.1f%% of %d; fair share %.1f%%), %d failed %v, p50 %v, p99 %v (p99/p50 %.1f)",
			i, len(r.Allocated), 100*share, total, 100.0/procs, r.failed(), r.Failures, r.P50.Round(10*time.Microsecond), r.P99.Round(10*time.Microsecond),
			float64(r.P99)/float64(max(r.P50, 1)))
		if share < 0.05 {
			t.Errorf("process %d got %.1f%% of the allocations, want at least 5%%", i, 100*share)
		}
	}
	t.Logf("%d allocations in %v by %d processes × 4 workers: %.0f/s", total, duration, procs, float64(total)/duration.Seconds())
	if len(seen) != total {
		t.Errorf("%d allocations, %d distinct addresses: duplicates", total, len(seen))
	}
}
