package linearizability

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/localcluster"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

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

func runHistory(t *testing.T, bin, stock string, w window, d time.Duration, out string) historyStats {
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
	j, err := Judge(ops, JudgeOptions{Stock: stock, Timeout: checkTimeout, PartTimeout: partTimeout, AttributeTimeout: attributeTimeout, HTML: filepath.Join(out, w.name+".html")})
	if err != nil {
		t.Error(err)
	}
	res := j.Result
	s.check = res
	t.Logf("%s: %d operations on %d addresses (%d ok, %d refused, %d unknown) in %v; faults %s; reservations %s; checker: %s in %v",
		w.name, len(ops), res.Addresses, s.outcomes[OK], s.outcomes[Refused], s.outcomes[Unknown],
		time.Duration(end-t0.UnixNano()).Round(time.Second), faultString(h.faults), reservationString(s.reservations), res.Verdict, res.Elapsed.Round(time.Millisecond))
	if res.Verdict != porcupine.Ok {
		report(t, fmt.Sprintf("the %s history (%s)", w.name, filepath.Join(out, w.name+".json")), j, ops, filepath.Join(out, w.name))
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
