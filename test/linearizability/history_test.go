package linearizability

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/localcluster"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/repair"
)

var (
	historyDuration = flag.Duration("history.duration", 36*time.Second,
		"how long each recorded history runs; faults are injected in turn for as long as it lasts")
	historyOut = flag.String("history.out", "",
		"directory for the histories and the timelines of failing ones; defaults to a new temporary directory, removed when every history passes")
	historyCheck = flag.String("history.check", "",
		"a history written by an earlier run (DIR/finish.json): check it again, with the current model, instead of recording one; what fails is explained beside it")
)

const (
	// historyRange is the --service-cluster-ip-range of the kube-apiserver and the range of every
	// allocator process: 126 addresses, small enough that processes contend for them.
	historyRange   = "10.96.0.0/25"
	opTimeout      = 2 * time.Second // of each allocator operation: shorter than every fault
	serviceTimeout = 4 * time.Second // of each Service create or delete through kube-apiserver
	workersPerProc = 2
	serviceWorkers = 2
	faultLength    = 3 * time.Second // how long a partition, a pause or a stopped etcd member lasts
	faultGap       = 750 * time.Millisecond
	checkTimeout   = 2 * time.Minute
	// partTimeout bounds the check of one address when the history is searched for the addresses
	// that fail; one that runs out counts as failing.
	partTimeout = 2 * time.Second
)

// A window is the set of modes allocators run in side by side while a cluster moves between
// modes: Legacy beside DualWrite while the apiservers are upgraded, DualWrite beside
// IPAddressOnly while dual write is turned off. Legacy and IPAddressOnly never run side by side:
// they share no store, so they would hand out the same address by design.
type window struct {
	name  string
	modes []featuregate.Mode
}

var windows = []window{
	{name: "upgrade", modes: []featuregate.Mode{featuregate.Legacy, featuregate.DualWrite, featuregate.Legacy}},
	{name: "finish", modes: []featuregate.Mode{featuregate.DualWrite, featuregate.IPAddressOnly, featuregate.DualWrite}},
}

// historyStats is what one history did, for the test log.
type historyStats struct {
	ops      int
	outcomes map[Outcome]int
	faults   map[string]int
	check    Result
	leftBits int // addresses where a refusal left a bit behind
	// reservations counts the reservation operations by kind (a Release that Retains as
	// "Retain"), and their outcomes.
	reservations map[string]map[Outcome]int
}

// countReservations returns the reservation operations of history by kind (a Release that
// Retains as "Retain") and outcome.
func countReservations(history []Op) map[string]map[Outcome]int {
	m := map[string]map[Outcome]int{}
	for _, op := range history {
		k := op.Kind.String()
		switch {
		case op.Kind == Release && op.Retains:
			k = "Retain"
		case op.Kind != Reserve && op.Kind != Unreserve && op.Kind != Claim:
			continue
		}
		if m[k] == nil {
			m[k] = map[Outcome]int{}
		}
		m[k][op.Outcome]++
	}
	return m
}

// reservationString writes counts as "Reserve=ok/refused/unknown ...", in a fixed order, or
// "none" when there are none (the upgrade window has no IPAddressOnly process).
func reservationString(m map[string]map[Outcome]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range []string{"Reserve", "Unreserve", "Claim", "Retain"} {
		c := m[k]
		parts = append(parts, fmt.Sprintf("%s=%d/%d/%d", k, c[OK], c[Refused], c[Unknown]))
	}
	return "{" + strings.Join(parts, " ") + "} (ok/refused/unknown)"
}

// TestHistoriesAreLinearizable records, for each window, a history of three allocator
// processes in the window's modes and kube-apiserver v1.33.13 (default gates: dual write)
// creating and deleting Services, on one range and a three-member etcd, while faults are
// injected in turn, each healed before the next: a process cut off from every etcd member, a
// process SIGKILLed and restarted, kube-apiserver SIGKILLed and restarted, etcd's leader stopped
// and restarted, a process (and every other round the Service workers) cut off from
// kube-apiserver, and a process stopped with SIGSTOP for longer than its deadlines. Every history
// must be linearizable (see Model); the test logs the addresses where it is so only because
// a refusal left a bit set (see Op.RefusalLeavesBit).
// In the finish window the IPAddressOnly process runs with Config.Reservations and also reserves,
// claims, retains and releases addresses (reservations_test.go): no Service but the one a
// reservation is kept for may ever hold its address, and that one gets it (see Claim).
// Then one pass of the repair controller, in DualWrite mode with no leak hold-off, must find no
// address with two owners (a duplicate that lasts to the end, which the pass would otherwise
// fix as a wrong parent) and must leave the audit consistent.
//
// The audit runs in DualWrite mode because that is where the cluster stands at the end of each
// history: kube-apiserver runs dual write throughout, and DualWrite is the mode whose audit reads
// both stores, so it finds a leak whichever mode's process left it.
func TestHistoriesAreLinearizable(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping kube-apiserver test in -short mode")
	}
	bin, err := localcluster.KubeAPIServerBinary(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := *historyOut
	if out == "" {
		if out, err = os.MkdirTemp("", "clusterip-history-"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if !t.Failed() {
				os.RemoveAll(out)
			}
		})
	} else if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	runs := 0
	totals := historyStats{outcomes: map[Outcome]int{}, faults: map[string]int{}, reservations: map[string]map[Outcome]int{}}
	for _, w := range windows {
		t.Run(w.name, func(t *testing.T) {
			s := runHistory(t, bin, w, *historyDuration, out)
			totals.ops += s.ops
			for k, v := range s.outcomes {
				totals.outcomes[k] += v
			}
			for k, v := range s.faults {
				totals.faults[k] += v
			}
			totals.check.Elapsed += s.check.Elapsed
			totals.leftBits += s.leftBits
			for k, byOutcome := range s.reservations {
				if totals.reservations[k] == nil {
					totals.reservations[k] = map[Outcome]int{}
				}
				for o, n := range byOutcome {
					totals.reservations[k][o] += n
				}
			}
			runs++
		})
	}
	t.Logf("%d histories, %d operations checked (%d ok, %d refused, %d unknown), faults %s, checker %v; addresses where a refusal left a bit behind: %d; reservations %s",
		runs, totals.ops, totals.outcomes[OK], totals.outcomes[Refused], totals.outcomes[Unknown],
		faultString(totals.faults), totals.check.Elapsed.Round(time.Millisecond), totals.leftBits, reservationString(totals.reservations))
}

func faultString(m map[string]int) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(parts)
	return "{" + strings.Join(parts, " ") + "}"
}

// harness is one history being recorded.
type harness struct {
	t        *testing.T
	w        window
	rg       netip.Prefix
	bin      string
	token    string
	etcd     *localcluster.EtcdCluster
	rec      *recorder
	out      string // where the goroutines of a process that does not stop go
	deadline time.Time
	procs    []*procSlot
	svcProxy *Proxy // between the Service workers and kube-apiserver

	mu         sync.Mutex // guards api, nextClient, faults, apiLogs
	api        *localcluster.KubeAPIServer
	nextClient int
	faults     map[string]int
	apiLogs    int // kube-apiserver logs kept
}

// keepLog copies the log of api, which is about to be closed, to the output directory as
// WINDOW-kube-apiserver-N.log, so that what kube-apiserver did (its repair loop's deletions
// among them) can be read beside a failing history.
func (h *harness) keepLog(api *localcluster.KubeAPIServer) {
	h.mu.Lock()
	n := h.apiLogs
	h.apiLogs++
	h.mu.Unlock()
	b, err := os.ReadFile(api.LogPath)
	if err == nil {
		err = os.WriteFile(filepath.Join(h.out, fmt.Sprintf("%s-kube-apiserver-%d.log", h.w.name, n)), b, 0o644)
	}
	if err != nil {
		h.t.Logf("keep the kube-apiserver log: %v", err)
	}
}

// procSlot is one allocator process, across its incarnations.
type procSlot struct {
	name        string
	mode        featuregate.Mode
	etcdProxies []*Proxy // one per etcd member
	apiProxy    *Proxy

	mu          sync.Mutex // guards incarnation, child
	incarnation int
	child       *testenv.Child
}

func runHistory(t *testing.T, bin string, w window, d time.Duration, out string) historyStats {
	h := &harness{t: t, w: w, rg: netip.MustParsePrefix(historyRange), bin: bin, rec: newRecorder(), out: out, faults: map[string]int{}}
	ctx := context.Background()
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var err error
	if h.etcd, err = localcluster.StartEtcdCluster(startCtx, localcluster.EtcdClusterOptions{UnsafeNoFsync: true}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.etcd.Close() })
	h.token = fmt.Sprintf("history-%d", rand.Int63())
	if err := h.startAPIServer(startCtx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if api := h.currentAPI(); api != nil {
			if t.Failed() {
				t.Logf("--- end of %s:\n%s", api.LogPath, api.LogTail(60))
			}
			h.keepLog(api)
			api.Close()
		}
	})
	if h.svcProxy, err = NewProxy(hostOf(h.currentAPI())); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.svcProxy.Close() })
	t0 := time.Now()
	h.recordInitial(startCtx, t0)

	for i, m := range w.modes {
		slot := &procSlot{name: fmt.Sprintf("%s-%d", strings.ToLower(m.String()), i), mode: m}
		for j := range h.etcd.Members() {
			p, err := NewProxy(strings.TrimPrefix(h.etcd.MemberEndpoint(j), "http://"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			slot.etcdProxies = append(slot.etcdProxies, p)
		}
		if slot.apiProxy, err = NewProxy(hostOf(h.currentAPI())); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { slot.apiProxy.Close() })
		h.procs = append(h.procs, slot)
	}
	// Start the processes (each waits for its informers) before the clock of the history runs.
	h.deadline = time.Now().Add(d + 10*time.Second)
	var started []*testenv.Child
	for _, slot := range h.procs {
		started = append(started, h.startProc(slot, false))
	}
	h.deadline = time.Now().Add(d)
	for _, c := range started {
		if c != nil {
			c.Start()
		}
	}
	var wg sync.WaitGroup
	for i := range serviceWorkers {
		wg.Add(1)
		client := h.newClients(1)
		go func() {
			defer wg.Done()
			h.serviceWorker(client, rand.New(rand.NewSource(int64(i)+time.Now().UnixNano())))
		}()
	}
	h.nemesis()
	wg.Wait()
	for _, slot := range h.procs {
		slot.mu.Lock()
		c := slot.child
		slot.mu.Unlock()
		if c == nil {
			continue
		}
		select {
		case <-c.Done():
		case <-time.After(time.Minute):
			t.Errorf("%s did not stop within a minute of the history's end; its goroutines follow", slot.name)
			c.Signal(syscall.SIGQUIT)
			select {
			case <-c.Done():
			case <-time.After(10 * time.Second):
				c.Kill()
			}
		}
		if err := c.Wait(); err != nil {
			t.Errorf("%s: %v; its output:\n%s\n(goroutines, if it hung: %s)", slot.name, err, c.Output(), filepath.Join(out, slot.name+"#*.goroutines"))
		}
	}
	end := time.Now().UnixNano()
	ops := h.rec.history(end)
	stored, err := h.storedServices()
	if err != nil {
		t.Fatal(err)
	}
	lost := countUnknown(ops)
	if ops, err = withStoredServices(ops, stored); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %d creates whose answer was lost had stored their Service", w.name, lost-countUnknown(ops))

	s := historyStats{ops: len(ops), outcomes: map[Outcome]int{}, faults: h.faults, reservations: countReservations(ops)}
	for _, op := range ops {
		s.outcomes[op.Outcome]++
	}
	if raw, err := json.Marshal(ops); err == nil {
		os.WriteFile(filepath.Join(out, w.name+".json"), raw, 0o644)
	}
	res, err := Check(ops, checkTimeout, filepath.Join(out, w.name+".html"))
	if err != nil {
		t.Error(err)
	}
	s.check = res
	t.Logf("%s: %d operations on %d addresses (%d ok, %d refused, %d unknown) in %v; faults %s; reservations %s; checker: %s in %v",
		w.name, len(ops), res.Addresses, s.outcomes[OK], s.outcomes[Refused], s.outcomes[Unknown],
		time.Duration(end-t0.UnixNano()).Round(time.Second), faultString(h.faults), reservationString(s.reservations), res.Verdict, res.Elapsed.Round(time.Millisecond))
	if res.Verdict != porcupine.Ok {
		bad := IllegalAddresses(Model, ops, partTimeout)
		t.Errorf("the %s history is %s, want linearizable; timeline: %s (history %s); not linearizable at %v, explained in %s",
			w.name, res.Verdict, res.HTML, filepath.Join(out, w.name+".json"), bad, explainAll(t, ops, bad, filepath.Join(out, w.name)))
	} else if left := IllegalAddresses(StrictModel, ops, partTimeout); len(left) > 0 {
		s.leftBits = len(left)
		t.Logf("%s: a refusal left its bit set (kube-apiserver v1.33, or a DualWrite create whose answer was lost) at %d addresses %v: the history is linearizable only with those bits (Op.RefusalLeavesBit)",
			w.name, len(left), left)
	}
	h.repairOnce(ctx)
	return s
}

// hostOf returns the "127.0.0.1:port" of a kube-apiserver.
func hostOf(api *localcluster.KubeAPIServer) string {
	return strings.TrimPrefix(api.Config.Host, "https://")
}

func (h *harness) currentAPI() *localcluster.KubeAPIServer {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.api
}

func (h *harness) fault(kind string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.faults[kind]++
}

// newClients reserves n Op.Client numbers and returns the first.
func (h *harness) newClients(n int) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.nextClient
	h.nextClient += n
	return c
}

// startAPIServer starts kube-apiserver on the etcd members with the harness's token.
func (h *harness) startAPIServer(ctx context.Context) error {
	api, err := localcluster.StartKubeAPIServer(ctx, h.etcd, localcluster.KubeAPIServerOptions{
		Binary: h.bin, ServiceClusterIPRange: historyRange, Token: h.token,
	})
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.api = api
	h.mu.Unlock()
	return nil
}

// recordInitial records what the cluster holds before the history starts (the kubernetes
// Service's address) as allocations that returned before it.
func (h *harness) recordInitial(ctx context.Context, t0 time.Time) {
	c := h.currentAPI().Client
	var list *corev1.ServiceList
	for {
		l, err := c.CoreV1().Services("").List(ctx, metav1.ListOptions{})
		if err == nil && len(l.Items) > 0 {
			list = l
			break
		}
		if ctx.Err() != nil {
			h.t.Fatalf("list the Services before the history: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	client := h.newClients(1)
	for i, svc := range list.Items {
		ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
		if err != nil || !h.rg.Contains(ip) {
			continue
		}
		key := fmt.Sprintf("before/%d", i)
		op := Op{Client: client, Process: "before", Kind: Allocate, Addr: ip, Owner: svc.Namespace + "/" + svc.Name,
			Call: t0.UnixNano() - 2, Return: t0.UnixNano() - 1, Outcome: OK, Bitmap: true}
		h.rec.call(key, op)
		h.rec.ret(key, op)
	}
}

// startProc starts a new incarnation of slot's process and waits until it is ready; with run
// it lets it go at once, else the caller calls Start. It returns nil, after logging why, if the
// process did not get ready: a restart under faults may fail, the history goes on without it.
func (h *harness) startProc(slot *procSlot, run bool) *testenv.Child {
	slot.mu.Lock()
	inc := slot.incarnation
	slot.incarnation++
	slot.mu.Unlock()
	name := fmt.Sprintf("%s#%d", slot.name, inc)
	var eps []string
	for _, p := range slot.etcdProxies {
		eps = append(eps, "http://"+p.Addr())
	}
	spec := procSpec{
		Name: name, Owner: fmt.Sprintf("%s-%d", slot.name, inc), Mode: slot.mode.String(), Range: historyRange,
		Etcd: eps, APIHost: "https://" + slot.apiProxy.Addr(), APIToken: h.token,
		ClientBase: h.newClients(workersPerProc), Workers: workersPerProc,
		Deadline: h.deadline, OpTimeout: opTimeout, Seed: rand.Int63(),
		Dump: filepath.Join(h.out, name+".goroutines"),
	}
	ready := make(chan struct{})
	var once sync.Once
	child := testenv.StartChild(h.t, name, "TestHistoryProcess", procSpecEnv, spec, func(line string) bool {
		if line == procReady {
			once.Do(func() { close(ready) })
			return true
		}
		raw, ok := strings.CutPrefix(line, procMarker)
		if !ok {
			return false
		}
		var pl procLine
		if err := json.Unmarshal([]byte(raw), &pl); err != nil {
			return false
		}
		key := fmt.Sprintf("%s/%d", name, pl.ID)
		if pl.Op.Return == 0 {
			h.rec.call(key, pl.Op)
		} else {
			h.rec.ret(key, pl.Op)
		}
		return true
	})
	select {
	case <-ready:
	case <-child.Done():
		h.t.Logf("%s exited before it was ready:\n%s", name, child.Output())
		return nil
	case <-time.After(90 * time.Second):
		child.Kill()
		h.t.Logf("%s not ready after 90 s:\n%s", name, child.Output())
		return nil
	}
	slot.mu.Lock()
	slot.child = child
	slot.mu.Unlock()
	if run {
		child.Start()
	}
	return child
}

// serviceWorker creates and deletes Services through kube-apiserver until the deadline, as one
// sequential client: Services that name a ClusterIP are Allocates, the others AllocateNexts,
// deletes Releases.
func (h *harness) serviceWorker(client int, rng *rand.Rand) {
	rc := &rest.Config{Host: "https://" + h.svcProxy.Addr(), BearerToken: h.token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true}, QPS: 1000, Burst: 2000}
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		h.t.Error(err)
		return
	}
	type svc struct {
		name string
		ip   netip.Addr
	}
	var held []svc
	for seq := 0; time.Now().Before(h.deadline); seq++ {
		key := fmt.Sprintf("kube-apiserver/%d/%d", client, seq)
		op := Op{Client: client, Process: "kube-apiserver", Bitmap: true, LeavesBit: true, RefusalLeavesBit: true, ClearsBitFirst: true, RepairFrees: true, FallsBackToObjects: true, SetsBitFirst: true}
		ctx, cancel := context.WithTimeout(context.Background(), serviceTimeout)
		r := rng.Float64()
		if len(held) >= 3 || (len(held) > 0 && r < 0.35) {
			i := rng.Intn(len(held))
			s := held[i]
			held = append(held[:i], held[i+1:]...)
			op.Kind, op.Addr = Release, s.ip
			op.Call = time.Now().UnixNano()
			h.rec.call(key, op)
			err := c.CoreV1().Services(metav1.NamespaceDefault).Delete(ctx, s.name, metav1.DeleteOptions{})
			op.Return = time.Now().UnixNano()
			op.Outcome = OK
			if err != nil {
				op.Outcome, op.Err = Unknown, err.Error()
			}
		} else {
			name := fmt.Sprintf("h-%d-%d", client, seq)
			op.Kind, op.Owner, op.Range = AllocateNext, metav1.NamespaceDefault+"/"+name, h.rg
			want := ""
			if r < 0.7 {
				op.Kind, op.Addr = Allocate, pickAddr(rng, h.rg)
				want = op.Addr.String()
			}
			op.Call = time.Now().UnixNano()
			h.rec.call(key, op)
			got, err := c.CoreV1().Services(metav1.NamespaceDefault).Create(ctx, testenv.ClusterIPService(name, want), metav1.CreateOptions{})
			op.Return = time.Now().UnixNano()
			op.Outcome = serviceOutcome(op.Kind, err)
			if err != nil {
				op.Err = err.Error()
			} else if op.Addr, err = netip.ParseAddr(got.Spec.ClusterIP); err != nil {
				h.t.Errorf("Service %s created with ClusterIP %q: %v", name, got.Spec.ClusterIP, err)
			}
			if op.Kind == AllocateNext && op.Outcome != OK {
				op.Addr = netip.Addr{}
			}
			if op.Outcome == OK {
				held = append(held, svc{name: name, ip: op.Addr})
			}
		}
		cancel()
		h.rec.ret(key, op)
		pause := time.Duration(10+rng.Intn(30)) * time.Millisecond
		if op.Outcome == Unknown {
			pause = unknownBackoff
		}
		time.Sleep(pause)
	}
}

// countUnknown returns how many operations of history have an unknown outcome.
func countUnknown(history []Op) int {
	n := 0
	for _, op := range history {
		if op.Outcome == Unknown {
			n++
		}
	}
	return n
}

// storedServices returns the address of each Service in the default namespace, by
// "namespace/name", read once the history has ended; it retries for a minute while
// kube-apiserver does not answer.
func (h *harness) storedServices() (map[string]netip.Addr, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var list *corev1.ServiceList
	for {
		l, err := h.currentAPI().Client.CoreV1().Services(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
		if err == nil {
			list = l
			break
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("list the Services after the history: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	stored := make(map[string]netip.Addr, len(list.Items))
	for _, svc := range list.Items {
		ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
		if err != nil {
			return nil, fmt.Errorf("Service %s/%s: ClusterIP %q: %w", svc.Namespace, svc.Name, svc.Spec.ClusterIP, err)
		}
		stored[svc.Namespace+"/"+svc.Name] = ip
	}
	return stored, nil
}

// withStoredServices returns history with each Service create through kube-apiserver whose
// outcome is unknown and whose Service exists after the history (stored, by Op.Owner) recorded
// as taken effect: OK, at the Service's address, at some instant before the end of the
// history. Such a create stored its Service and only its answer was lost, so kube-apiserver's
// repair loop never frees its address (Op.RepairFrees keeps applying only to creates whose
// Service does not exist), and a lost AllocateNext that stored its Service is no longer merged
// with the others ([mergeLost]). Nothing deletes a Service whose create was not acknowledged,
// so a Service that does not exist was never stored. It fails if such a Service holds another
// address than the one its create asked for.
func withStoredServices(history []Op, stored map[string]netip.Addr) ([]Op, error) {
	out := make([]Op, 0, len(history))
	for _, op := range history {
		addr, ok := stored[op.Owner]
		if ok && op.Process == "kube-apiserver" && op.Outcome == Unknown && (op.Kind == Allocate || op.Kind == AllocateNext) {
			if op.Kind == Allocate && addr != op.Addr {
				return nil, fmt.Errorf("Service %s holds %v, but its create asked for %v", op.Owner, addr, op.Addr)
			}
			op.Addr, op.Outcome = addr, OK
			op.Err += " (its Service exists after the history)"
		}
		out = append(out, op)
	}
	return out, nil
}

// serviceOutcome classifies kube-apiserver's answer to a Service create: refusals the model
// checks are its 422 for a ClusterIP already allocated and for a full range.
func serviceOutcome(k Kind, err error) Outcome {
	switch {
	case err == nil:
		return OK
	case !apierrors.IsInvalid(err):
		return Unknown
	case k == Allocate && strings.Contains(err.Error(), "provided IP is already allocated"):
		return Refused
	case k == AllocateNext && strings.Contains(err.Error(), "range is full"):
		return Refused
	}
	return Unknown
}

// nemesis injects the faults in turn until the history's deadline, each one healed before the
// next, and then makes sure everything runs again.
func (h *harness) nemesis() {
	type fault struct {
		kind string
		do   func(round int)
	}
	faults := []fault{
		{"partition-etcd", h.partitionEtcd},
		{"sigkill-allocator", h.killProc},
		{"sigkill-apiserver", h.killAPIServer},
		{"etcd-leader-stop", h.stopEtcdLeader},
		{"partition-apiserver", h.partitionAPI},
		{"sigstop-allocator", h.pauseProc},
	}
	time.Sleep(faultGap)
	for i := 0; time.Until(h.deadline) > faultLength+faultGap; i++ {
		f := faults[i%len(faults)]
		f.do(i / len(faults))
		h.fault(f.kind)
		time.Sleep(faultGap)
	}
	time.Sleep(time.Until(h.deadline))
}

// victim returns the process a fault of round round hits: each in turn, among those whose mode
// matches ok.
func (h *harness) victim(round int, ok func(featuregate.Mode) bool) *procSlot {
	var slots []*procSlot
	for _, s := range h.procs {
		if ok(s.mode) {
			slots = append(slots, s)
		}
	}
	return slots[round%len(slots)]
}

func anyMode(featuregate.Mode) bool { return true }

func (h *harness) partitionEtcd(round int) {
	s := h.victim(round, anyMode)
	for _, p := range s.etcdProxies {
		p.Blackhole()
	}
	time.Sleep(faultLength)
	for _, p := range s.etcdProxies {
		p.Heal()
	}
}

func (h *harness) partitionAPI(round int) {
	s := h.victim(round, func(m featuregate.Mode) bool { return m != featuregate.Legacy })
	proxies := []*Proxy{s.apiProxy}
	if round%2 == 1 {
		proxies = append(proxies, h.svcProxy) // the Service workers too
	}
	for _, p := range proxies {
		p.Blackhole()
	}
	time.Sleep(faultLength)
	for _, p := range proxies {
		p.Heal()
	}
}

func (h *harness) killProc(round int) {
	s := h.victim(round+1, anyMode)
	s.mu.Lock()
	c := s.child
	s.mu.Unlock()
	if c != nil {
		c.Kill()
	}
	time.Sleep(time.Second)
	h.startProc(s, true)
}

func (h *harness) pauseProc(round int) {
	s := h.victim(round+2, anyMode)
	s.mu.Lock()
	c := s.child
	s.mu.Unlock()
	if c == nil {
		return
	}
	c.Signal(syscall.SIGSTOP)
	time.Sleep(faultLength)
	c.Signal(syscall.SIGCONT)
}

func (h *harness) stopEtcdLeader(int) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lead, err := h.etcd.WaitLeader(ctx)
	if err != nil {
		h.t.Errorf("etcd leader: %v", err)
		return
	}
	h.etcd.StopMember(lead)
	time.Sleep(faultLength)
	if err := h.etcd.RestartMember(ctx, lead); err != nil {
		h.t.Errorf("restart etcd member %d: %v", lead, err)
	}
}

func (h *harness) killAPIServer(int) {
	old := h.currentAPI()
	old.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := h.startAPIServer(ctx); err != nil {
		h.t.Errorf("restart kube-apiserver: %v", err)
		return
	}
	h.keepLog(old)
	old.Close()
	target := hostOf(h.currentAPI())
	for _, p := range append([]*Proxy{h.svcProxy}, apiProxies(h.procs)...) {
		p.SetTarget(target)
		p.Cut()
	}
}

func apiProxies(slots []*procSlot) []*Proxy {
	var ps []*Proxy
	for _, s := range slots {
		ps = append(ps, s.apiProxy)
	}
	return ps
}

// repairOnce runs one pass of the repair controller in DualWrite mode with no leak hold-off,
// then audits, and fails the history on what [repairFailures] finds: two owners of an address
// before the pass, or any finding after it.
func (h *harness) repairOnce(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	ec, err := clientv3.New(clientv3.Config{Endpoints: h.etcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		h.t.Fatal(err)
	}
	defer ec.Close()
	cfg := clusterip.Config{Mode: featuregate.DualWrite, Ranges: []netip.Prefix{h.rg}, Bitmaps: etcdstore.Stores{Client: ec},
		Client: h.currentAPI().Client, ManagedBy: testManagedBy}
	ipas, err := cfg.Client.NetworkingV1().IPAddresses().List(ctx, metav1.ListOptions{})
	if err != nil {
		h.t.Fatalf("list the IPAddresses before the repair pass: %v", err)
	}
	parents := make(map[string]string, len(ipas.Items))
	for _, ipa := range ipas.Items {
		parents[ipa.Name] = parentOf(&ipa)
	}
	ctrl, err := repair.NewController(cfg, repair.Options{LeakGrace: -1})
	if err != nil {
		h.t.Fatal(err)
	}
	pass, err := ctrl.RunOnce(ctx)
	if err != nil {
		h.t.Errorf("repair pass: %v", err)
	}
	rep, err := repair.Audit(ctx, cfg)
	if err != nil {
		h.t.Fatalf("audit after the repair pass: %v", err)
	}
	if pass != nil {
		h.t.Logf("%s: the repair pass found %v; the audit after it: consistent=%v %v", h.w.name, pass.Counts, rep.Consistent, rep.Counts)
	}
	for _, f := range repairFailures(pass, parents, rep) {
		h.t.Error(f)
	}
}

// parentOf returns an IPAddress object's parentRef as "resource/namespace/name", the
// resource with its group after a dot when it has one.
func parentOf(ipa *networkingv1.IPAddress) string {
	p := ipa.Spec.ParentRef
	if p == nil {
		return "(no parent)"
	}
	res := p.Resource
	if p.Group != "" {
		res += "." + p.Group
	}
	return res + "/" + p.Namespace + "/" + p.Name
}

// repairFailures returns why a history fails on the repair pass that follows it: each finding
// of the pass (nil if it could not read) that means two owners of one address, and each
// finding of the audit after the pass. Two owners are two Services (DuplicateOwner), or a
// Service and an IPAddress object naming another parent (WrongParent unless the object, as
// parents had it before the pass, names the Service itself and only its labels are wrong):
// the pass recreates such an object for the Service, so the audit after it never sees the
// duplicate. parents holds the parentRef of each IPAddress object, by name, as [parentOf]
// writes it; a WrongParent finding whose object is not in it counts as two owners.
func repairFailures(pass *repair.Report, parents map[string]string, after *repair.Report) []string {
	var out []string
	if pass != nil {
		for _, f := range pass.Findings {
			switch f.Class {
			case repair.DuplicateOwner:
				out = append(out, fmt.Sprintf("two owners before the repair pass: %s %s %s (%s)", f.IP, f.Class, f.Service, f.Detail))
			case repair.WrongParent:
				p, ok := parents[f.IP]
				switch {
				case !ok:
					out = append(out, fmt.Sprintf("two owners before the repair pass: %s %s %s (its IPAddress was not read before the pass: %s)", f.IP, f.Class, f.Service, f.Detail))
				case p != "services/"+f.Service:
					out = append(out, fmt.Sprintf("two owners before the repair pass: %s %s %s (its IPAddress names %s)", f.IP, f.Class, f.Service, p))
				}
			}
		}
	}
	if after != nil && !after.Consistent {
		for _, f := range after.Findings {
			out = append(out, fmt.Sprintf("after one repair pass: %s %s %s: %s", f.IP, f.Class, f.Service, f.Detail))
		}
	}
	return out
}

// explainAll writes [Explain] of each address of bad to prefix-ADDR.txt and returns the pattern
// of their names.
func explainAll(t *testing.T, history []Op, bad []netip.Addr, prefix string) string {
	for _, a := range bad {
		path := fmt.Sprintf("%s-%s.txt", prefix, a)
		f, err := os.Create(path)
		if err != nil {
			t.Error(err)
			continue
		}
		if err := Explain(f, Model, history, a, partTimeout); err != nil {
			t.Error(err)
		}
		if err := f.Close(); err != nil {
			t.Error(err)
		}
	}
	return prefix + "-*.txt"
}

// TestSavedHistoryIsLinearizable checks again, under the current model, a history an earlier run
// wrote (-history.check=DIR/finish.json), and explains each address where it is not
// linearizable in DIR/finish-ADDR.txt. It skips without the flag.
func TestSavedHistoryIsLinearizable(t *testing.T) {
	if *historyCheck == "" {
		t.Skip("no -history.check")
	}
	raw, err := os.ReadFile(*historyCheck)
	if err != nil {
		t.Fatal(err)
	}
	var ops []Op
	if err := json.Unmarshal(raw, &ops); err != nil {
		t.Fatal(err)
	}
	ops = withCallerFlags(ops)
	prefix := strings.TrimSuffix(*historyCheck, ".json")
	res, err := Check(ops, checkTimeout, prefix+".html")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %d operations on %d addresses (%d unknown); checker: %s in %v",
		*historyCheck, res.Ops, res.Addresses, res.Unknown, res.Verdict, res.Elapsed.Round(time.Millisecond))
	if res.Verdict != porcupine.Ok {
		bad := IllegalAddresses(Model, ops, partTimeout)
		t.Errorf("the history is %s, want linearizable; timeline: %s; not linearizable at %v, explained in %s",
			res.Verdict, res.HTML, bad, explainAll(t, ops, bad, prefix))
	}
}

// withCallerFlags returns a history written by an earlier harness with the flags the harness
// sets now: Op.ClearsBitLast and Op.RepairFrees from who called, when the history has neither
// (with the Undos of the releases that gives), Op.ClearsBitFirst for kube-apiserver's
// operations when no operation has it (with the Deletes of its releases), Op.FallsBackToObjects
// for kube-apiserver's operations when no operation has it, Op.Range for
// AllocateNexts that have none, and
// Op.RefusalLeavesBit instead of Op.TransientBit (and no Undo) for a DualWrite refusal that
// kept its bit, and Op.SetsBitFirst for the dual writers' operations when no operation has it
// (with the Creates of their allocations).
func withCallerFlags(history []Op) []Op {
	old, noClearsBitFirst, noFallback, noSetsBitFirst := true, true, true, true
	type key struct {
		client int
		call   int64
	}
	keptBit := map[key]bool{}
	for _, op := range history {
		if op.ClearsBitLast || op.RepairFrees {
			old = false
		}
		if op.ClearsBitFirst {
			noClearsBitFirst = false
		}
		if op.FallsBackToObjects {
			noFallback = false
		}
		if op.SetsBitFirst {
			noSetsBitFirst = false
		}
		if op.Kind == Allocate && op.TransientBit && strings.Contains(op.Err, keptBitRefusal) {
			keptBit[key{op.Client, op.Call}] = true
		}
	}
	out := make([]Op, 0, len(history))
	for _, op := range history {
		kept := keptBit[key{op.Client, op.Call}]
		switch {
		case op.Kind == Undo && (kept || !op.Addr.IsValid()):
			continue // an Undo of a refusal that kept its bit, or of an AllocateNext refused as full
		case kept:
			op.TransientBit, op.RefusalLeavesBit = false, true
		}
		if old {
			switch {
			case op.Kind == Undo:
			case strings.HasPrefix(op.Process, "dualwrite-"):
				op.ClearsBitLast = true
			case op.Process == "kube-apiserver":
				op.RepairFrees = true
			}
		}
		if noClearsBitFirst && op.Process == "kube-apiserver" && op.Kind != Undo {
			op.ClearsBitFirst = true
		}
		if noFallback && op.Process == "kube-apiserver" {
			op.FallsBackToObjects = true
		}
		if op.Kind == AllocateNext && !op.Range.IsValid() {
			op.Range = netip.MustParsePrefix(historyRange) // every history was recorded on it
		}
		if noSetsBitFirst && op.Bitmap && op.LeavesBit && op.Kind != Undo && op.Kind != Delete {
			op.SetsBitFirst = true
		}
		out = append(out, op)
		if noSetsBitFirst && setsBitFirst(op) {
			create := op
			create.Kind, create.Err = Create, ""
			out = append(out, create)
		}
		if old && op.Kind == Release && op.Outcome == OK && op.ClearsBitLast && op.Bitmap {
			undo := op
			undo.Kind = Undo
			out = append(out, undo)
		}
		if noClearsBitFirst && op.Kind == Release && op.Outcome != Refused && op.ClearsBitFirst && op.Bitmap {
			del := op
			del.Kind, del.Err = Delete, ""
			out = append(out, del)
		}
	}
	return out
}
