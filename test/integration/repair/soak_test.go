package repair_test

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/repair"
	"github.com/kube-ipam/clusterip/test/integration/internal/clustertest"
)

// TestSoakMixedModes is the soak test of issue 11. Three allocator processes, one per mode
// (Legacy, DualWrite, IPAddressOnly), share one etcd and one real kube-apiserver v1.33 (in its
// default dual-write mode, with its own bitmap, its "kubernetes" ServiceCIDR and its own
// IPAddress repair loop running) and create and delete Services at random for a fixed number of
// operations each. Midway etcd is stopped and restarted under them, and the DualWrite process is
// killed with SIGKILL in the middle of a create: after its allocation (bit and IPAddress object
// written) and before its Service is stored. Then, once kube-apiserver's own repair loop has
// caught up, one audit, one repair pass with no leak hold-off and a second audit: the second
// reports nothing at all (no leaked, missing or duplicate address, no stale bit, no IPAddress
// without its bit), and no two Services ever held one address at once.
//
// What "allocated" means here. The audit calls an address leaked unless a Service holds it, so the
// processes allocate for real Services: each is a small Service registry, as a kube-apiserver that
// imports this library would be (soakproc_test.go). A create fills the Service's ClusterIP with
// Allocators.Services().Allocate, stores the Service in etcd at kube-apiserver's key and in its
// storage encoding, and then commits, or reverts if it was not stored; a delete removes the
// Service from etcd and then releases its address. Creating the Services through the kube-apiserver
// instead would make it allocate each ClusterIP a second time (and refuse it as taken); stored
// directly, the kube-apiserver serves them as its own, so the audit and its own repair loop see
// them as any Service. A create asks for any free address or for a chosen one, drawn from two small
// pools so that the processes collide on chosen addresses (they get 422 Invalid, as from
// kube-apiserver).
//
// Which modes may meet on which addresses. Legacy and DualWrite share the bitmap of the flag
// range, and DualWrite and IPAddressOnly share the IPAddress objects; Legacy and IPAddressOnly
// share no record, so on one address they would hand it out twice, which is why kube-apiserver
// never runs them side by side (the upgrade goes through dual write). So the Legacy process asks
// only for chosen addresses of the static band (the first 64 of the /22; docs/design.md §5), which
// AllocateNext does not touch while the dynamic band has room (958 addresses; the processes keep
// at most 120 Services at once), and the IPAddressOnly process takes only the dynamic band:
// AllocateNext, and chosen addresses at its top. DualWrite does all three and meets each of the
// others.
//
// Expected findings of the first audit, judged in DualWrite mode (the one that checks both
// stores): the IPAddressOnly process's Services have no bit (ipaddress-only); the killed
// allocation is held by no Service (leaked); calls that failed while etcd was away leave stale
// bits and objects (bitmap-only, leaked); and the IPAddress objects that kube-apiserver's own
// repair loop creates for the Legacy process's Services (it runs on informer events, so a Legacy
// Service is seldom still missing its object by then) are leaked once the Service is deleted, until
// kube-apiserver deletes them 60 s later. Never a duplicate, an invalid or an out-of-range
// address. The test also checks that the audit saw every Service stored in etcd, and, from the
// processes' own reports, that no two Services ever held one address at the same time.
func TestSoakMixedModes(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping kube-apiserver test in -short mode")
	}
	const flag = "10.96.0.0/22"
	const ops = 150 // per process
	etcd := testenv.NewEtcd(t)
	api := testenv.NewKubeAPIServer(t, etcd, testenv.KubeAPIServerOptions{ServiceClusterIPRange: flag})
	ec := etcd.TestClient(t)
	// Deadlines start once the environment is up.
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	began := time.Now()
	phase := func(what string) {
		t.Helper()
		t.Logf("%-36s at %6.1fs", what, time.Since(began).Seconds())
	}
	clustertest.WaitForKubernetesService(t, api.Client)

	low := soakPool(netip.MustParseAddr("10.96.0.2"), 63)    // the static band is 10.96.0.1-10.96.0.64; .1 is kubernetes
	high := soakPool(netip.MustParseAddr("10.96.3.192"), 63) // the top of the dynamic band
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	base := soakSpec{Range: flag, Etcd: etcd.Endpoints(), APIHost: api.Config.Host, APIToken: api.Config.BearerToken, Ops: ops, Workers: 4, MaxLive: 40}
	with := func(name, mode string, next, fromLow, fromHigh, killAt int) soakSpec {
		s := base
		s.Name, s.Mode, s.Seed = name, mode, seed+uint64(len(name))
		s.Next, s.FromLow, s.FromHigh, s.KillAt = next, fromLow, fromHigh, killAt
		if fromLow > 0 {
			s.Low = low
		}
		if fromHigh > 0 {
			s.High = high
		}
		return s
	}
	const victim = "dualwrite"
	specs := []soakSpec{
		with("legacy", featuregate.Legacy.String(), 0, 1, 0, 0),
		with(victim, featuregate.DualWrite.String(), 2, 1, 1, ops*2/3),
		with("ipaddressonly", featuregate.IPAddressOnly.String(), 3, 0, 2, 0),
	}

	run := &soakRun{open: map[string]int{}, stats: map[string]*soakStats{}}
	procs := make([]*soakChild, len(specs))
	for i, s := range specs {
		procs[i] = startSoakChild(t, s, run)
	}
	for _, p := range procs {
		p.waitReady(t)
	}
	phase("processes ready")
	for _, p := range procs {
		p.child.Start()
	}

	// Restart etcd once a third of all operations are done.
	testenv.WaitFor(t, "a third of the operations", func() bool { return run.totalOps() >= len(specs)*ops/3 })
	phase(fmt.Sprintf("etcd stopping after %d operations", run.totalOps()))
	etcd.Stop()
	phase("etcd stopped")
	time.Sleep(time.Second)
	if err := etcd.Restart(ctx); err != nil {
		t.Fatalf("restart etcd: %v", err)
	}
	phase(fmt.Sprintf("etcd restarted after %d operations", run.totalOps()))

	// Kill the victim where it stopped, between its allocation and its Service.
	var killedIP netip.Addr
	for _, p := range procs {
		if p.spec.Name != victim {
			continue
		}
		select {
		case ip := <-p.paused:
			killedIP = netip.MustParseAddr(ip)
		case <-p.child.Done():
			_ = p.child.Wait()
			t.Fatalf("%s finished without stopping mid-create; its output:\n%s", victim, p.child.Output())
		case <-ctx.Done():
			t.Fatalf("%s did not stop mid-create: %v", victim, ctx.Err())
		}
		p.kill(t)
		phase(fmt.Sprintf("%s killed holding %s", victim, killedIP))
	}
	for _, p := range procs {
		if p.spec.Name != victim {
			p.wait(t)
		}
	}
	phase(fmt.Sprintf("processes done, %d operations", run.totalOps()))
	for _, s := range specs {
		t.Logf("%-13s %-13s %s", s.Name, s.Mode, run.summary(s.Name))
	}

	holds, overlaps, bad := run.overlaps()
	t.Logf("%d holds of an address by a Service; %d held by two Services at once", holds, len(overlaps))
	for i, o := range overlaps {
		if i < 10 {
			t.Errorf("held twice at once: %s", o)
		}
	}
	if len(bad) > 0 {
		t.Errorf("%d lines from the processes did not parse, such as %q", len(bad), bad[0])
	}

	cfg := clusterip.Config{Mode: featuregate.DualWrite, Ranges: []netip.Prefix{netip.MustParsePrefix(flag)}, Client: api.Client, Bitmaps: etcdstore.Stores{Client: ec}}
	// kube-apiserver's own repair loop (dual write) creates the IPAddress of a Service that has
	// none and recreates one whose parent is gone, on informer events and without preconditions.
	// Let it catch up first, so that it does not race the repair pass below (a delete of its
	// between our create and the second audit would show a missing object for a moment). Every
	// parent it could find gone is gone: no process creates a Service under the same name twice.
	var first *repair.Report
	audits := 0
	testenv.WaitFor(t, "an audit with no missing or wrong-parent finding, which kube-apiserver heals itself", func() bool {
		rep, err := repair.Audit(ctx, cfg)
		if err != nil {
			return false // the API server is not back from the etcd restart yet
		}
		if audits++; audits == 1 && (rep.Counts[string(repair.Missing)] > 0 || rep.Counts[string(repair.WrongParent)] > 0) {
			t.Logf("audit before kube-apiserver caught up: %s", soakCounts(rep))
		}
		first = rep
		return rep.Counts[string(repair.Missing)] == 0 && rep.Counts[string(repair.WrongParent)] == 0
	})
	phase(fmt.Sprintf("first audit (audit no. %d)", audits))
	t.Logf("first audit:  %s", soakCounts(first))
	// The audit sees the Services the processes stored in etcd, all of them.
	stored, err := ec.Get(ctx, soakServicesPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatalf("count the Services in etcd: %v", err)
	}
	if got := first.Counts[repair.CountServices]; int64(got) != stored.Count {
		t.Errorf("first audit: Counts[%s] = %d, but etcd holds %d Services", repair.CountServices, got, stored.Count)
	}
	for _, c := range []repair.Class{repair.DuplicateOwner, repair.Invalid, repair.OutOfRange} {
		if n := first.Counts[string(c)]; n != 0 {
			t.Errorf("first audit: %d %s findings, want 0: %+v", n, c, soakFindingsOf(first, c))
		}
	}
	if i := slices.IndexFunc(first.Findings, func(f repair.Finding) bool { return f.IP == killedIP.String() }); i < 0 {
		t.Errorf("first audit: no finding for %s, the allocation of the killed process", killedIP)
	} else if f := first.Findings[i]; f.Class != repair.Leaked && f.Class != repair.BitmapOnly {
		t.Errorf("first audit: %s, the allocation of the killed process, is %s, want %s or %s", killedIP, f.Class, repair.Leaked, repair.BitmapOnly)
	}

	c, err := repair.NewController(cfg, repair.Options{LeakGrace: -1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RunOnce(ctx); err != nil {
		t.Errorf("RunOnce() error = %v", err)
	}
	passes := 1
	if n := c.HeldOff(); n != 0 {
		t.Errorf("after one repair pass with no hold-off: HeldOff() = %d, want 0", n)
	}
	for ; c.HeldOff() > 0 && passes < 5; passes++ {
		if _, err := c.RunOnce(ctx); err != nil {
			t.Errorf("RunOnce() pass %d error = %v", passes+1, err)
		}
	}
	phase(fmt.Sprintf("repaired in %d pass(es)", passes))

	second, err := repair.Audit(ctx, cfg)
	if err != nil {
		t.Fatalf("second Audit() error = %v", err)
	}
	phase("second audit")
	t.Logf("second audit: %s", soakCounts(second))
	if !second.Consistent {
		t.Errorf("second audit after repair: %d findings, want none: %+v", len(second.Findings), second.Findings)
	}
	if dups := soakDuplicateClusterIPs(t, ctx, api.Client); len(dups) != 0 {
		t.Errorf("Services holding one ClusterIP: %v", dups)
	}
}

// soakCounts formats the counts of rep: what was read, then every class, found or not.
func soakCounts(rep *repair.Report) string {
	s := fmt.Sprintf("%d Services, %d IPAddress objects, %d bits;", rep.Counts[repair.CountServices], rep.Counts[repair.CountIPAddresses], rep.Counts[repair.CountBitmapBits])
	for _, c := range repair.Classes() {
		s += fmt.Sprintf(" %s %d", c, rep.Counts[string(c)])
	}
	return s
}

// soakFindingsOf returns the findings of class c in rep.
func soakFindingsOf(rep *repair.Report, c repair.Class) []repair.Finding {
	var out []repair.Finding
	for _, f := range rep.Findings {
		if f.Class == c {
			out = append(out, f)
		}
	}
	return out
}

// soakDuplicateClusterIPs lists the Services from the API server and returns, for each ClusterIP held
// by more than one, a line naming them.
func soakDuplicateClusterIPs(t *testing.T, ctx context.Context, c kubernetes.Interface) []string {
	t.Helper()
	l, err := c.CoreV1().Services(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list Services: %v", err)
	}
	by := map[string][]string{}
	for i := range l.Items {
		for _, ip := range allocator.RawClusterIPs(&l.Items[i]) {
			by[ip] = append(by[ip], l.Items[i].Namespace+"/"+l.Items[i].Name)
		}
	}
	var out []string
	for ip, who := range by {
		if len(who) > 1 {
			out = append(out, fmt.Sprintf("%s: %v", ip, who))
		}
	}
	slices.Sort(out)
	return out
}

// soakPool returns n consecutive addresses from first, as strings.
func soakPool(first netip.Addr, n int) []string {
	out := make([]string, 0, n)
	for ip := first; len(out) < n; ip = ip.Next() {
		out = append(out, ip.String())
	}
	return out
}

// soakRun gathers what the soak processes report. It is safe for concurrent use.
type soakRun struct {
	mu    sync.Mutex // guards everything below
	holds []soakHoldOf
	open  map[string]int        // "service ip" → index in holds of its open hold
	stats map[string]*soakStats // by process
	bad   []string              // lines that did not parse
}

// soakStats counts what one soak process did.
type soakStats struct {
	ops, created, deleted, taken int
	failed                       map[string]int // by kind
	errors                       []string       // the first few, "kind: error"
}

// soakHoldOf is the time a Service held an address, as its process saw it: from just after the
// allocation returned to just before the release was called (math.MaxInt64 while held).
type soakHoldOf struct {
	ip       netip.Addr
	service  string
	from, to int64 // Unix ns
}

// line records one line of process name, without soakMarker.
func (r *soakRun) line(name, line string) {
	kind, f := parseSoakLine(line)
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.stats[name]
	if st == nil {
		st = &soakStats{failed: map[string]int{}}
		r.stats[name] = st
	}
	switch {
	case kind == soakOp:
		st.ops++
		return
	case kind == soakCreated:
		st.created++
		return
	case kind == soakDeleted:
		st.deleted++
		return
	case kind == soakTaken:
		st.taken++
		return
	case kind == soakFail && len(f) == 2:
		st.failed[f[0]]++
		if len(st.errors) < 4 {
			st.errors = append(st.errors, f[0]+": "+f[1])
		}
		return
	case (kind == soakHold || kind == soakFree) && len(f) == 3:
		ip, err1 := netip.ParseAddr(f[1])
		at, err2 := strconv.ParseInt(f[2], 10, 64)
		if err1 != nil || err2 != nil {
			break
		}
		key := f[0] + " " + f[1]
		if kind == soakHold {
			r.open[key] = len(r.holds)
			r.holds = append(r.holds, soakHoldOf{ip: ip, service: f[0], from: at, to: math.MaxInt64})
			return
		}
		if i, ok := r.open[key]; ok {
			r.holds[i].to = at
			delete(r.open, key)
			return
		}
	}
	r.bad = append(r.bad, name+": "+line)
}

// summary describes what process name did.
func (r *soakRun) summary(name string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.stats[name]
	if st == nil {
		return "nothing"
	}
	return fmt.Sprintf("%d operations: created %d, deleted %d, %d Services left; chosen address taken %d; failed %v %q",
		st.ops, st.created, st.deleted, st.created-st.deleted, st.taken, st.failed, st.errors)
}

func (r *soakRun) totalOps() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, st := range r.stats {
		n += st.ops
	}
	return n
}

// overlaps returns how many holds there were, a line for each that began while another Service
// still held the same address, and the lines from the processes that did not parse.
func (r *soakRun) overlaps() (holds int, overlaps, bad []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	by := map[netip.Addr][]soakHoldOf{}
	for _, h := range r.holds {
		by[h.ip] = append(by[h.ip], h)
	}
	var out []string
	for ip, hs := range by {
		slices.SortFunc(hs, func(a, b soakHoldOf) int { return cmp.Compare(a.from, b.from) })
		last := hs[0]
		for _, h := range hs[1:] {
			if h.from < last.to {
				out = append(out, fmt.Sprintf("%s by %s from %d and by %s from %d to %d", ip, last.service, last.from, h.service, h.from, last.to))
			}
			if h.to > last.to {
				last = h
			}
		}
	}
	slices.Sort(out)
	return len(r.holds), out, slices.Clone(r.bad)
}

// soakChild is a running soak process.
type soakChild struct {
	spec   soakSpec
	child  *testenv.Child
	ready  chan struct{} // closed when it is ready
	paused chan string   // receives the address the victim stopped holding
}

// startSoakChild starts a soak process for spec, whose lines go to run. It kills the process when
// t ends, if it is still running.
func startSoakChild(t *testing.T, spec soakSpec, run *soakRun) *soakChild {
	t.Helper()
	p := &soakChild{spec: spec, ready: make(chan struct{}), paused: make(chan string, 1)}
	p.child = testenv.StartChild(t, spec.Name, "TestSoakProcess", soakSpecEnv, spec, func(text string) bool {
		line, ok := strings.CutPrefix(text, soakMarker+" ")
		switch {
		case !ok:
			return false
		case line == "ready":
			close(p.ready)
		case strings.HasPrefix(line, soakPaused+" "):
			p.paused <- strings.TrimPrefix(line, soakPaused+" ")
		default:
			run.line(spec.Name, line)
		}
		return true
	})
	return p
}

// waitReady waits until the process is ready, and fails t if it exits first or takes over two
// minutes.
func (p *soakChild) waitReady(t *testing.T) {
	t.Helper()
	select {
	case <-p.ready:
	case <-p.child.Done():
		_ = p.child.Wait()
		t.Fatalf("%s exited before it was ready; its output:\n%s", p.spec.Name, p.child.Output())
	case <-time.After(2 * time.Minute):
		t.Fatalf("%s not ready after two minutes", p.spec.Name)
	}
}

// kill sends SIGKILL and waits for the process to exit.
func (p *soakChild) kill(t *testing.T) {
	t.Helper()
	if err := p.child.Kill(); err != nil {
		t.Fatalf("kill %s: %v", p.spec.Name, err)
	}
}

// wait waits for the process to exit and fails t unless it succeeded.
func (p *soakChild) wait(t *testing.T) {
	t.Helper()
	if err := p.child.Wait(); err != nil {
		t.Fatalf("%s: %v; its output:\n%s", p.spec.Name, err, p.child.Output())
	}
}
