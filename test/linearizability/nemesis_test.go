package linearizability

import (
	"context"
	"syscall"
	"time"

	"github.com/kube-ipam/clusterip/featuregate"
)

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
