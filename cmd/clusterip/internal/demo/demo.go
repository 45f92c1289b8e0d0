package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/repair"
)

// Options configures [Run]. The zero Options runs the demo with every default.
type Options struct {
	// Ranges are the Service ranges, as kube-apiserver's --service-cluster-ip-range: one, or two
	// of different families, primary first. As in kube-apiserver, the first range's bitmap is
	// stored at ranges/serviceips and the second's at ranges/secondaryserviceips, whatever their
	// families. Defaults to 10.96.0.0/20 and fd00:10:96::/112.
	Ranges []netip.Prefix
	// Hold is about how many Services the workload keeps: below it, a worker creates a Service
	// more often than it deletes one. Defaults to 1000.
	Hold int
	// Workers is how many goroutines create and delete Services through each of the two
	// kube-apiservers the demo plays. Defaults to 4.
	Workers int
	// PhaseDuration is how long each of the three phases creates and deletes Services.
	// Defaults to 15 seconds.
	PhaseDuration time.Duration
	// EtcdEndpoints names an etcd to use. Defaults to starting an embedded one on 127.0.0.1 in a
	// temporary directory, removed afterwards.
	EtcdEndpoints []string
	// Prefix is the etcd key prefix of the bitmaps, as kube-apiserver's --etcd-prefix. Defaults
	// to /registry.
	Prefix string
	// KubeAPIServer is the path of a kube-apiserver v1.33 binary to store the Services,
	// ServiceCIDRs and IPAddress objects in. Defaults to the binary the tests use if it is
	// already built ($CLUSTERIP_KUBE_APISERVER, or the cache in the repository's .cache/),
	// else client-go's fake clientset. It needs the embedded etcd.
	KubeAPIServer string
	// FakeAPI uses client-go's fake clientset even if a kube-apiserver binary is there.
	FakeAPI bool
	// Out receives the report, as lines of text and a table. Defaults to io.Discard.
	Out io.Writer
	// Progress receives the progress bars. Nil means plain progress lines on Out.
	Progress io.Writer
}

func (o *Options) setDefaults() {
	if len(o.Ranges) == 0 {
		o.Ranges = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/20"), netip.MustParsePrefix("fd00:10:96::/112")}
	}
	if o.Hold <= 0 {
		o.Hold = 1000
	}
	if o.Workers <= 0 {
		o.Workers = 4
	}
	if o.PhaseDuration <= 0 {
		o.PhaseDuration = 15 * time.Second
	}
	if o.Prefix == "" {
		o.Prefix = etcdstore.DefaultPrefix
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
}

// checkRanges applies kube-apiserver's rules for --service-cluster-ip-range: one range, or two
// of different families, each with room for a bitmap.
func checkRanges(ranges []netip.Prefix) error {
	switch {
	case len(ranges) > 2:
		return fmt.Errorf("demo: %d Service ranges, want one, or two of different IP families", len(ranges))
	case len(ranges) == 2 && ranges[0].Addr().Is4() == ranges[1].Addr().Is4():
		return fmt.Errorf("demo: Service ranges %v and %v are of the same IP family, want one of each", ranges[0], ranges[1])
	}
	for _, r := range ranges {
		if _, err := bitmap.New(r); err != nil {
			return err
		}
	}
	return nil
}

// bitmapKey returns the etcd key of the bitmap of the range at index i of
// --service-cluster-ip-range. kube-apiserver chooses it by flag order, not by family.
func bitmapKey(prefix string, i int) string {
	if i == 0 {
		return etcdstore.ServiceIPsKey(prefix)
	}
	return etcdstore.SecondaryServiceIPsKey(prefix)
}

// ErrCheckFailed is returned (wrapped) by [Run] when the demo ran but what it saw breaks a rule:
// an address handed out twice, or a cluster left inconsistent after the repair pass.
var ErrCheckFailed = errors.New("demo: check failed")

// Summary is what the demo saw, the --json output. Its JSON form is stable.
type Summary struct {
	// Etcd and API say what the demo ran against.
	Etcd string `json:"etcd"`
	API  string `json:"api"`
	// Ranges are the flag ranges, in flag order.
	Ranges []string `json:"ranges"`
	// Phases are the three phases, in order.
	Phases []PhaseSummary `json:"phases"`
	// Duplicates is how many times an address was handed out while another Service held it:
	// always 0 unless the demo fails. DuplicateAddresses says which.
	Duplicates         int      `json:"duplicates"`
	DuplicateAddresses []string `json:"duplicateAddresses,omitempty"`
	// Seconds is the demo's wall time, start-up included.
	Seconds float64 `json:"seconds"`
}

// PhaseSummary is what one phase did.
type PhaseSummary struct {
	// Name is the phase: "Legacy", "DualWrite beside Legacy" or "IPAddressOnly".
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
	// Allocators has one row per kube-apiserver played and IP family.
	Allocators []AllocatorSummary `json:"allocators"`
	// Repair is, in the IPAddressOnly phase, the audit that the repair pass acted on before the
	// phase began: its counts say what it migrated ("missing": IPAddress objects created for
	// Services that had only a bit) and what else it fixed.
	Repair *AuditSummary `json:"repair,omitempty"`
	// Audit is repair.Audit's view of the cluster at the end of the phase, in the phase's newest
	// mode.
	Audit AuditSummary `json:"audit"`
	// Services is how many Services the cluster holds at the end of the phase.
	Services int `json:"services"`
	// Duplicates is how many addresses two Services held at once during the phase, or two of the
	// Services stored at its end.
	Duplicates int `json:"duplicates"`
}

// AllocatorSummary is what one kube-apiserver played by the demo did in one IP family.
type AllocatorSummary struct {
	Allocator string `json:"allocator"`
	Mode      string `json:"mode"`
	Family    string `json:"family"`
	// Allocations and Releases count Services created and deleted.
	Allocations uint64 `json:"allocations"`
	Releases    uint64 `json:"releases"`
	// Conflicts counts the conflicts the allocators met and retried: bitmap compare-and-swaps
	// that lost to another writer, and in DualWrite mode addresses taken in the bitmap and given
	// back because their IPAddress object still existed.
	Conflicts uint64 `json:"conflictsRetried"`
	// Undos counts writes undone: dual-write first writes undone after the second failed, and
	// allocations reverted because the API server refused the Service.
	Undos uint64 `json:"undos"`
	// Refused counts Services the API server refused because it holds their ClusterIP already.
	Refused uint64 `json:"refused"`
	// Errors counts failed operations; FirstError is the first.
	Errors     uint64 `json:"errors"`
	FirstError string `json:"firstError,omitempty"`
	// P50Ms and P99Ms are the latencies of allocating one Service's ClusterIP, in milliseconds.
	P50Ms float64 `json:"p50Ms"`
	P99Ms float64 `json:"p99Ms"`
}

// AuditSummary is the gist of a repair.Report.
type AuditSummary struct {
	Mode       string         `json:"mode"`
	Consistent bool           `json:"consistent"`
	Counts     map[string]int `json:"counts"`
}

func auditSummary(r *repair.Report) AuditSummary {
	return AuditSummary{Mode: r.Mode, Consistent: r.Consistent, Counts: r.Counts}
}

// Run walks a cluster through the upgrade of its allocators and reports what it saw, as [Measure]
// does.
func Run(ctx context.Context, opts Options) error {
	_, err := Measure(ctx, opts)
	return err
}

// Measure walks one cluster through the upgrade of its Service IP allocators, with two
// kube-apiservers played by this process, each with its own allocators and etcd client:
//
//  1. Legacy: both allocate from the bitmaps in etcd.
//  2. DualWrite beside Legacy: one is upgraded (the ServiceCIDR it creates from its flag
//     appears), and writes IPAddress objects as well as bits, while the other still writes bits
//     only: the version-skew window of an upgrade.
//  3. IPAddressOnly: a repair pass migrates the addresses that only the bitmaps record (the
//     Services allocated in Legacy mode) to IPAddress objects, and both allocate IPAddress
//     objects only.
//
// In each phase their workers create and delete Services concurrently, each ClusterIP from
// [clusterip.Allocators.Services]. Measure checks every address handed out against what the other
// Services hold, and the Services stored at the end of each phase; it returns what it saw, and an
// error wrapping [ErrCheckFailed] if an address was handed out twice or the cluster is not
// consistent after the last phase.
func Measure(ctx context.Context, opts Options) (*Summary, error) {
	opts.setDefaults()
	if err := checkRanges(opts.Ranges); err != nil {
		return nil, err
	}
	start := time.Now()
	c, err := startCluster(ctx, &opts)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	etcd, err := clientv3.New(clientv3.Config{Endpoints: c.endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	defer etcd.Close()

	sum := &Summary{Etcd: c.etcdDesc, API: c.apiDesc}
	out := opts.Out
	fmt.Fprintf(out, "clusterip demo: bitmaps in %s; Services, ServiceCIDRs and IPAddress objects in %s\n", c.etcdDesc, c.apiDesc)
	for i, r := range opts.Ranges {
		sum.Ranges = append(sum.Ranges, r.String())
		fmt.Fprintf(out, "range %s: bitmap at %s\n", r, bitmapKey(opts.Prefix, i))
	}
	d := &driver{opts: &opts, c: c, etcd: etcd, ledger: newLedger(), sum: sum, prog: newProgress(&opts)}

	// Phase 1: two Legacy kube-apiservers.
	a, err := newMember(ctx, "apiserver-a", featuregate.Legacy, c, &opts)
	if err != nil {
		return nil, err
	}
	defer func() { a.stop() }()
	b, err := newMember(ctx, "apiserver-b", featuregate.Legacy, c, &opts)
	if err != nil {
		return nil, err
	}
	defer func() { b.stop() }()
	if err := d.adopt(ctx, a); err != nil {
		return nil, err
	}
	if err := d.phase(ctx, "Legacy", featuregate.Legacy, nil, a, b); err != nil {
		return nil, err
	}

	// Phase 2: apiserver-a is upgraded to DualWrite; apiserver-b still runs Legacy.
	a.stop()
	if err := createDefaultServiceCIDR(ctx, c, opts.Ranges); err != nil {
		return nil, err
	}
	if a, err = newMember(ctx, "apiserver-a", featuregate.DualWrite, c, &opts); err != nil {
		return nil, err
	}
	if err := d.phase(ctx, "DualWrite beside Legacy", featuregate.DualWrite, nil, a, b); err != nil {
		return nil, err
	}

	// Phase 3: the repair pass migrates, then both run IPAddressOnly.
	a.stop()
	b.stop()
	cfg := clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: opts.Ranges, Client: c.client}
	ctrl, err := repair.NewController(cfg, repair.Options{LeakGrace: -1})
	if err != nil {
		return nil, err
	}
	rep, err := ctrl.RunOnce(ctx)
	if err != nil {
		return nil, fmt.Errorf("demo: repair pass: %w", err)
	}
	migrated := auditSummary(rep)
	fmt.Fprintf(out, "repair pass (IPAddressOnly): %s\n", describeRepair(migrated))
	if a, err = newMember(ctx, "apiserver-a", featuregate.IPAddressOnly, c, &opts); err != nil {
		return nil, err
	}
	if b, err = newMember(ctx, "apiserver-b", featuregate.IPAddressOnly, c, &opts); err != nil {
		return nil, err
	}
	if err := d.phase(ctx, "IPAddressOnly", featuregate.IPAddressOnly, &migrated, a, b); err != nil {
		return nil, err
	}

	sum.DuplicateAddresses = d.ledger.duplicateList()
	for _, p := range sum.Phases {
		sum.Duplicates += p.Duplicates
	}
	sum.Seconds = time.Since(start).Seconds()
	writeTable(out, sum)
	last := sum.Phases[len(sum.Phases)-1].Audit
	switch {
	case sum.Duplicates > 0:
		return sum, fmt.Errorf("%w: %d addresses handed out twice: %s", ErrCheckFailed, sum.Duplicates, strings.Join(sum.DuplicateAddresses, "; "))
	case !last.Consistent:
		return sum, fmt.Errorf("%w: the cluster is not consistent after the repair pass and the IPAddressOnly phase: %v", ErrCheckFailed, last.Counts)
	}
	return sum, nil
}

// driver runs the phases of one demo.
type driver struct {
	opts   *Options
	c      *cluster
	etcd   *clientv3.Client
	ledger *ledger
	sum    *Summary
	prog   progress
}

// adopt records the ClusterIPs of the Services already in the cluster (a real kube-apiserver's
// kubernetes Service) in m's bitmaps, as the cluster's existing state.
func (d *driver) adopt(ctx context.Context, m *member) error {
	list, err := d.c.client.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("demo: list Services: %w", err)
	}
	for i := range list.Items {
		svc := &list.Items[i]
		ips := addrs(svc)
		if !d.ledger.hold(svc.Namespace+"/"+svc.Name, ips) {
			continue
		}
		for _, ip := range ips {
			a := m.allocs.For(familyOf(ip))
			if a == nil {
				continue
			}
			if err := a.Allocate(ctx, ip, allocator.ServiceOwner(svc)); err != nil && !errors.Is(err, allocator.ErrAllocated) {
				return fmt.Errorf("demo: record %s of Service %s/%s: %w", ip, svc.Namespace, svc.Name, err)
			}
		}
	}
	return nil
}

// phase runs one phase with members and audits the cluster in mode afterwards.
func (d *driver) phase(ctx context.Context, name string, mode featuregate.Mode, repaired *AuditSummary, members ...*member) error {
	n := len(d.sum.Phases) + 1
	var who []string
	for _, m := range members {
		who = append(who, fmt.Sprintf("%s (%s)", m.name, m.mode))
	}
	fmt.Fprintf(d.opts.Out, "phase %d/3 %s: %s create and delete Services, %d workers each, for %v\n",
		n, name, strings.Join(who, " and "), d.opts.Workers, d.opts.PhaseDuration)
	// Counters that outlive a phase (a member kept from the one before) count from here.
	type base struct{ cas, skipped, undone uint64 }
	bases := make([]map[corev1.IPFamily]base, len(members))
	for i, m := range members {
		bases[i] = map[corev1.IPFamily]base{}
		for _, f := range m.allocs.Families() {
			dw := dualWriteStats(m, f)
			bases[i][f] = base{cas: m.conflicts[f].Load(), skipped: dw.Skipped, undone: dw.Undone}
		}
	}
	w := newWorkload(d.c, d.ledger, d.opts.Hold, members)
	dupsBefore := len(d.ledger.duplicateList())
	start := time.Now()
	done := d.prog.start(fmt.Sprintf("phase %d/3 %s", n, name), d.opts.PhaseDuration, func() string {
		var al, rel uint64
		for _, s := range w.stats {
			for _, c := range s {
				al += c.allocated.Load()
				rel += c.released.Load()
			}
		}
		return fmt.Sprintf("%d created, %d deleted, %d held", al, rel, d.ledger.liveCount())
	})
	w.run(ctx, d.opts.Workers, start.Add(d.opts.PhaseDuration))
	done()
	if err := ctx.Err(); err != nil {
		return err
	}
	ps := PhaseSummary{Name: name, Seconds: time.Since(start).Seconds(), Repair: repaired}
	for i, m := range members {
		for _, f := range m.allocs.Families() {
			st := w.stats[i][f]
			dw := dualWriteStats(m, f)
			b := bases[i][f]
			row := AllocatorSummary{
				Allocator: m.name, Mode: m.mode.String(), Family: string(f),
				Allocations: st.allocated.Load(), Releases: st.released.Load(),
				Conflicts: m.conflicts[f].Load() - b.cas + dw.Skipped - b.skipped,
				Undos:     dw.Undone - b.undone + st.undone.Load(),
				Refused:   st.refused.Load(), Errors: st.errors.Load(),
			}
			if st.firstErr != nil {
				row.FirstError = st.firstErr.Error()
			}
			row.P50Ms, row.P99Ms = percentile(st.latencies, 0.50), percentile(st.latencies, 0.99)
			ps.Allocators = append(ps.Allocators, row)
		}
	}
	stored, dups, err := d.checkStored(ctx)
	if err != nil {
		return err
	}
	ps.Services = stored
	ps.Duplicates = len(d.ledger.duplicateList()) - dupsBefore + dups
	cfg := clusterip.Config{Mode: mode, Ranges: d.opts.Ranges, Client: d.c.client}
	if mode != featuregate.IPAddressOnly {
		cfg.Bitmaps = etcdstore.Stores{Client: d.etcd, Prefix: d.opts.Prefix}
	}
	rep, err := repair.Audit(ctx, cfg)
	if err != nil {
		return fmt.Errorf("demo: audit after phase %d: %w", n, err)
	}
	ps.Audit = auditSummary(rep)
	fmt.Fprintf(d.opts.Out, "phase %d/3 %s: %d Services, %s\n", n, name, ps.Services, describeAudit(ps.Audit))
	d.sum.Phases = append(d.sum.Phases, ps)
	return nil
}

// checkStored lists the Services stored in the API server and checks them against the ledger:
// every ClusterIP held by one Service only, and each the ledger's. It returns how many Services
// there are and how many addresses are held twice.
func (d *driver) checkStored(ctx context.Context) (services, dups int, err error) {
	list, err := d.c.client.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, 0, fmt.Errorf("demo: list Services: %w", err)
	}
	held := d.ledger.held()
	seen := map[netip.Addr]string{}
	for i := range list.Items {
		svc := &list.Items[i]
		name := svc.Namespace + "/" + svc.Name
		for _, ip := range addrs(svc) {
			if other, ok := seen[ip]; ok {
				dups++
				d.ledger.mu.Lock()
				d.ledger.duplicates = append(d.ledger.duplicates, fmt.Sprintf("%s stored for %s and %s", ip, other, name))
				d.ledger.mu.Unlock()
			}
			seen[ip] = name
			if owner, ok := held[ip]; !ok || (owner != svc.Name && owner != name) {
				return 0, 0, fmt.Errorf("%w: Service %s holds %s, which the demo's ledger gives to %q", ErrCheckFailed, name, ip, owner)
			}
		}
	}
	if len(seen) != len(held) {
		return 0, 0, fmt.Errorf("%w: the Services stored hold %d addresses, the demo's ledger %d", ErrCheckFailed, len(seen), len(held))
	}
	return len(list.Items), dups, nil
}

// createDefaultServiceCIDR creates the ServiceCIDR that an upgraded kube-apiserver creates from
// its --service-cluster-ip-range, named kubernetes.
func createDefaultServiceCIDR(ctx context.Context, c *cluster, ranges []netip.Prefix) error {
	var cidrs []string
	for _, r := range ranges {
		cidrs = append(cidrs, r.String())
	}
	_, err := c.client.NetworkingV1().ServiceCIDRs().Create(ctx, &networkingv1.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: cidrs},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("demo: create the default ServiceCIDR: %w", err)
	}
	return nil
}

// percentile returns the q-quantile of ds in milliseconds, or 0 if ds is empty.
func percentile(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	i = max(0, min(i, len(s)-1))
	return float64(s[i].Microseconds()) / 1000
}

// describeAudit says what an audit found in one line.
func describeAudit(a AuditSummary) string {
	state := "consistent"
	if !a.Consistent {
		state = "inconsistent"
	}
	return fmt.Sprintf("audit (%s): %s; %s", a.Mode, state, describeCounts(a.Counts))
}

// describeRepair says what a repair pass did, from the audit it acted on.
func describeRepair(a AuditSummary) string {
	parts := []string{
		fmt.Sprintf("%d IPAddress objects created for Services that had only a bit (missing)", a.Counts[string(repair.Missing)]),
	}
	if n := a.Counts[string(repair.Leaked)]; n > 0 {
		parts = append(parts, fmt.Sprintf("%d leaked IPAddress objects deleted", n))
	}
	if n := a.Counts[string(repair.WrongParent)]; n > 0 {
		parts = append(parts, fmt.Sprintf("%d IPAddress objects recreated with the right parent", n))
	}
	return strings.Join(parts, ", ") + "; the audit it acted on: " + describeCounts(a.Counts)
}

// describeCounts lists an audit's counts, what was read first.
func describeCounts(counts map[string]int) string {
	var keys []string
	for k := range counts {
		keys = append(keys, k)
	}
	first := map[string]int{repair.CountServices: 0, repair.CountIPAddresses: 1, repair.CountBitmapBits: 2}
	sort.Slice(keys, func(i, j int) bool {
		fi, oki := first[keys[i]]
		fj, okj := first[keys[j]]
		switch {
		case oki && okj:
			return fi < fj
		case oki != okj:
			return oki
		}
		return keys[i] < keys[j]
	})
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, counts[k]))
	}
	return strings.Join(parts, ", ")
}

// probe fails within 5 seconds if etcd at endpoints does not answer, where the allocators
// would wait for it for as long as ctx allows.
func probe(ctx context.Context, endpoints []string) error {
	client, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return fmt.Errorf("etcd client: %w", err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := client.Get(ctx, "/", clientv3.WithCountOnly()); err != nil {
		return fmt.Errorf("demo: etcd at %v unreachable: %w", endpoints, err)
	}
	return nil
}
