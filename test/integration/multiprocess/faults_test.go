package multiprocess

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/test/integration/internal/clustertest"
)

// TestFaultKillBetweenDualWrites kills (SIGKILL) a DualWrite allocator process between the two
// writes of a dual write, against a real etcd and kube-apiserver: after it has set an address's
// bit and before it creates the IPAddress object, and after it has deleted the IPAddress object
// of a Release and before it clears the bit. Either way the address is then held by the bitmap
// alone (a leak repair frees), and no allocator, DualWrite or Legacy, hands it out again.
func TestFaultKillBetweenDualWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping kube-apiserver test in -short mode")
	}
	for _, op := range []string{opPause, opPauseRelease} {
		t.Run(op, func(t *testing.T) { testKillBetweenDualWrites(t, op) })
	}
}

func testKillBetweenDualWrites(t *testing.T, op string) {
	const flag = "10.96.0.0/24"
	etcd, ec, api := clustertest.StartOwnCluster(t, flag)
	rg := netip.MustParsePrefix(flag)
	key, baseBits, baseObjs := clustertest.APIServerBaseline(t, ec, api.Client, rg)

	p := startProc(t, procSpec{Name: "victim", Mode: "DualWrite", Ranges: []string{flag}, Op: op, Count: 1}, etcd, api)
	p.start()
	line := p.next()
	if !strings.HasPrefix(line, procPaused) {
		t.Fatalf("the allocator process said %q, want %q<ip>", line, procPaused)
	}
	victim := netip.MustParseAddr(strings.TrimPrefix(line, procPaused))
	p.kill()
	t.Logf("%s: killed the allocator process between the two writes for %s", op, victim)

	bits, _ := clustertest.EtcdBits(t, ec, key, rg)
	objs := clustertest.APIIPAddresses(t, api.Client)
	if diff := cmp.Diff(clustertest.Sorted(baseBits.Clone().Insert(victim)), clustertest.Sorted(bits)); diff != "" {
		t.Errorf("bits after the kill (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(clustertest.Sorted(baseObjs), clustertest.Sorted(objs)); diff != "" {
		t.Errorf("IPAddress objects after the kill (-want +got):\n%s", diff)
	}

	ctx := context.Background()
	dual := clustertest.StartAllocators(t, clusterip.Config{Mode: featuregate.DualWrite, Ranges: []netip.Prefix{rg}, Bitmaps: etcdstore.Stores{Client: ec}, Client: api.Client})
	legacy := clustertest.StartAllocators(t, clusterip.Config{Mode: featuregate.Legacy, Ranges: []netip.Prefix{rg}, Bitmaps: etcdstore.Stores{Client: ec}})
	for name, a := range map[string]allocator.Interface{"DualWrite": dual.For("IPv4"), "Legacy": legacy.For("IPv4")} {
		if err := a.Allocate(ctx, victim, clustertest.Owner); !errors.Is(err, allocator.ErrAllocated) {
			t.Errorf("%s Allocate(%s) = %v, want ErrAllocated", name, victim, err)
		}
	}
	// Fill the rest of the range from both: the leaked address never comes out.
	var got []netip.Addr
	for i := 0; ; i++ {
		a := dual.For("IPv4")
		if i%2 == 1 {
			a = legacy.For("IPv4")
		}
		ip, err := a.AllocateNext(ctx, clustertest.Owner)
		if errors.Is(err, allocator.ErrFull) {
			break
		}
		if err != nil {
			t.Fatalf("AllocateNext() = %v", err)
		}
		if ip == victim {
			t.Fatalf("AllocateNext() handed out %s, whose bit the killed process holds", victim)
		}
		got = append(got, ip)
	}
	held := sets.New(got...)
	t.Logf("filled the range: %d more addresses handed out, %d distinct, none of them %s", len(got), len(held), victim)
	if len(held) != len(got) {
		t.Errorf("%d addresses handed out, %d distinct: duplicates", len(got), len(held))
	}
	bits, _ = clustertest.EtcdBits(t, ec, key, rg)
	if diff := cmp.Diff(clustertest.Sorted(baseBits.Clone().Insert(victim).Insert(got...)), clustertest.Sorted(bits)); diff != "" {
		t.Errorf("bits after filling the range (-want +got):\n%s", diff)
	}
}

// TestFaultEtcdRestartMidRun stops etcd while DualWrite allocators are allocating against it and a
// real kube-apiserver, and starts it again: no address that was handed out is missing from
// either store, none is handed out twice, and every IPAddress object has its bit. Calls fail while
// etcd is down; a failed call may leave its bit behind (a leak repair frees), never an IPAddress
// object without its bit.
func TestFaultEtcdRestartMidRun(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping kube-apiserver test in -short mode")
	}
	const flag = "10.96.0.0/20"
	etcd, ec, api := clustertest.StartOwnCluster(t, flag)
	rg := netip.MustParsePrefix(flag)
	key, baseBits, baseObjs := clustertest.APIServerBaseline(t, ec, api.Client, rg)
	a := clustertest.StartAllocators(t, clusterip.Config{Mode: featuregate.DualWrite, Ranges: []netip.Prefix{rg}, Bitmaps: etcdstore.Stores{Client: ec}, Client: api.Client}).For("IPv4")

	var mu sync.Mutex // guards handed, failures
	var handed []netip.Addr
	failures := 0
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				ip, err := a.AllocateNext(ctx, clustertest.Owner)
				cancel()
				mu.Lock()
				if err == nil {
					handed = append(handed, ip)
				} else {
					failures++
				}
				mu.Unlock()
				if err != nil {
					time.Sleep(50 * time.Millisecond)
				}
			}
		}()
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(handed) }
	time.Sleep(time.Second)
	before := count()
	etcd.Stop()
	time.Sleep(2 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := etcd.Restart(ctx); err != nil {
		t.Fatalf("restart etcd: %v", err)
	}
	restarted := count()
	testenv.WaitFor(t, "allocations to resume after the restart", func() bool { return count() > restarted+50 })
	close(stop)
	wg.Wait()

	held := sets.New(handed...)
	t.Logf("handed out %d addresses (%d before the stop, %d while etcd was down or restarting), %d distinct; %d calls failed",
		len(handed), before, restarted-before, len(held), failures)
	if len(held) != len(handed) {
		t.Errorf("%d addresses handed out, %d distinct: duplicates", len(handed), len(held))
	}
	bits, _ := clustertest.EtcdBits(t, ec, key, rg)
	objs := clustertest.APIIPAddresses(t, api.Client)
	lostBits, lostObjs, objsWithoutBit := 0, 0, 0
	for ip := range held {
		if !bits.Has(ip) {
			lostBits++
		}
		if !objs.Has(ip) {
			lostObjs++
		}
	}
	for ip := range objs {
		if !bits.Has(ip) && !baseObjs.Has(ip) {
			objsWithoutBit++
		}
	}
	leakedBits := len(bits) - len(baseBits) - len(held)
	leakedObjs := len(objs) - len(baseObjs) - len(held)
	t.Logf("stores: %d bits, %d IPAddress objects; lost: %d bits, %d objects; leaked by failed calls: %d bits, %d objects",
		len(bits), len(objs), lostBits, lostObjs, leakedBits, leakedObjs)
	if lostBits != 0 || lostObjs != 0 {
		t.Errorf("addresses handed out but missing: %d bits, %d IPAddress objects; want 0", lostBits, lostObjs)
	}
	if objsWithoutBit != 0 {
		t.Errorf("%d IPAddress objects without their bit, want 0", objsWithoutBit)
	}
}
