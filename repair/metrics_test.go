package repair

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// The HELP and TYPE lines of the repair metrics: kube-apiserver's for its two (its
// pkg/registry/core/service/ipallocator/controller/metrics.go), ours for the drift gauge.
const (
	ipErrorsHeader = `# HELP apiserver_clusterip_repair_ip_errors_total Number of errors detected on clusterips by the repair loop broken down by type of error: leak, repair, full, outOfRange, duplicate, unknown, invalid
# TYPE apiserver_clusterip_repair_ip_errors_total counter
`
	reconcileErrorsHeader = `# HELP apiserver_clusterip_repair_reconcile_errors_total Number of reconciliation failures on the clusterip repair reconcile loop
# TYPE apiserver_clusterip_repair_reconcile_errors_total counter
`
	driftHeader = `# HELP clusterip_repair_drift_addresses Number of addresses the last repair audit found in one store only, by IP family: kind bitmap-only is a bit set with neither an IPAddress nor a Service, kind ipaddress-only a Service's IP and IPAddress whose bit is clear
# TYPE clusterip_repair_drift_addresses gauge
`
)

// ipErrors returns the ip_errors_total samples: leak, repair, full, outOfRange, duplicate,
// unknown and invalid, in that order of arguments.
func ipErrors(leak, repair, full, outOfRange, duplicate, unknown, invalid int) string {
	return ipErrorsHeader + fmt.Sprintf(`apiserver_clusterip_repair_ip_errors_total{type="duplicate"} %d
apiserver_clusterip_repair_ip_errors_total{type="full"} %d
apiserver_clusterip_repair_ip_errors_total{type="invalid"} %d
apiserver_clusterip_repair_ip_errors_total{type="leak"} %d
apiserver_clusterip_repair_ip_errors_total{type="outOfRange"} %d
apiserver_clusterip_repair_ip_errors_total{type="repair"} %d
apiserver_clusterip_repair_ip_errors_total{type="unknown"} %d
`, duplicate, full, invalid, leak, outOfRange, repair, unknown)
}

func reconcileErrors(n int) string {
	return reconcileErrorsHeader + fmt.Sprintf("apiserver_clusterip_repair_reconcile_errors_total %d\n", n)
}

// drift returns the drift samples of IPv4 and, if v6 is not nil, IPv6: bitmap-only then
// ipaddress-only.
func drift(v4 [2]int, v6 *[2]int) string {
	s := driftHeader + fmt.Sprintf(`clusterip_repair_drift_addresses{family="IPv4",kind="bitmap-only"} %d
clusterip_repair_drift_addresses{family="IPv4",kind="ipaddress-only"} %d
`, v4[0], v4[1])
	if v6 != nil {
		s += fmt.Sprintf(`clusterip_repair_drift_addresses{family="IPv6",kind="bitmap-only"} %d
clusterip_repair_drift_addresses{family="IPv6",kind="ipaddress-only"} %d
`, v6[0], v6[1])
	}
	return s
}

const (
	metricIPErrors        = "apiserver_clusterip_repair_ip_errors_total"
	metricReconcileErrors = "apiserver_clusterip_repair_reconcile_errors_total"
	metricDrift           = "clusterip_repair_drift_addresses"
)

// scrape compares the repair metrics of reg with want.
func scrape(t *testing.T, reg *prometheus.Registry, when, want string) {
	t.Helper()
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), metricIPErrors, metricReconcileErrors, metricDrift); err != nil {
		t.Errorf("metrics %s:\n%v", when, err)
	}
}

// TestRepairMetricsCountPerPassAsKubeAPIServer scrapes the metrics of an IPAddressOnly repair:
// every series is there at 0 from NewController; a pass counts each Service with an invalid
// ClusterIP, each Service after the first on a duplicate IP, each out-of-range IP, each record
// it writes for a held IP and each leak it frees (not the one it holds off); a failed pass counts
// one reconcile error.
func TestRepairMetricsCountPerPassAsKubeAPIServer(t *testing.T) {
	client := fake.NewClientset(
		testenv.ServiceCIDR("kubernetes", "10.0.0.0/24"),
		svc("a/ok", "10.0.0.10"), aged(ipAddr("10.0.0.10", "a/ok"), time.Hour),
		svc("a/bad", "10.0.0.700"),                                                                                                         // invalid: 1
		svc("a/dup1", "10.0.0.60"), svc("a/dup2", "10.0.0.60"), svc("a/dup3", "10.0.0.60"), aged(ipAddr("10.0.0.60", "a/dup1"), time.Hour), // duplicate: 2
		svc("a/far", "10.9.0.1"),                                                     // outOfRange: 1
		svc("a/missing", "10.0.0.11"),                                                // repair: created
		svc("a/wrong", "10.0.0.50"), aged(ipAddr("10.0.0.50", "a/other"), time.Hour), // repair: recreated
		svc("a/label", "10.0.0.51"), aged(withLabel(ipAddr("10.0.0.51", "a/label"), "ipaddress.kubernetes.io/ip-family", ""), time.Hour), // repair: labels
		aged(ipAddr("10.0.0.30", "a/gone"), time.Hour),   // leak: deleted
		aged(ipAddr("10.0.0.31", "a/gone"), time.Second), // held off: not counted
	)
	var mu sync.Mutex
	failList := false
	client.PrependReactor("list", "services", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if failList {
			return true, nil, fmt.Errorf("apiserver down")
		}
		return false, nil, nil
	})
	reg := prometheus.NewPedanticRegistry()
	c, err := NewController(clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, Client: client},
		Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	scrape(t, reg, "at creation", ipErrors(0, 0, 0, 0, 0, 0, 0)+reconcileErrors(0)+drift([2]int{}, nil))

	if _, err := c.RunOnce(t.Context()); err != nil {
		t.Fatalf("RunOnce() error = %v", err)
	}
	scrape(t, reg, "after one pass", ipErrors(1, 3, 0, 1, 2, 0, 1)+reconcileErrors(0)+drift([2]int{}, nil))

	mu.Lock()
	failList = true
	mu.Unlock()
	if _, err := c.RunOnce(t.Context()); err == nil {
		t.Fatal("RunOnce() with the Service list failing succeeded")
	}
	scrape(t, reg, "after a failed pass", ipErrors(1, 3, 0, 1, 2, 0, 1)+reconcileErrors(1)+drift([2]int{}, nil))

	// A second Controller on the same registry shares the metrics.
	if _, err := NewController(clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, Client: client},
		Options{Registerer: reg}); err != nil {
		t.Errorf("a second NewController on one registry: %v", err)
	}
}

// TestRepairMetricsNotOnTheConfigRegisterer checks that a Controller without Options.Registerer
// registers nothing, even on a Config that has a Registerer: repair takes its metrics' registry
// from Options alone.
func TestRepairMetricsNotOnTheConfigRegisterer(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	cfg := clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, Client: fake.NewClientset(), Registerer: reg}
	if _, err := NewController(cfg, Options{}); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 0 {
		t.Errorf("the Config's Registerer holds %d metric families, want none", len(mfs))
	}
}

// TestRepairMetricsDriftPerFamily scrapes the drift gauges of a dual-stack DualWrite repair
// against a real etcd: seeded at 0 for both families, set from the audit each pass acted on, and
// back at 0 once repair healed the drift; the stale bit counts as a leak, the clear bit of a held
// IP as a repair.
func TestRepairMetricsDriftPerFamily(t *testing.T) {
	e := testenv.NewEtcd(t)
	cli := e.TestClient(t)
	storeBitmap(t, cli, etcdstore.ServiceIPsKey(""), bits(t, "10.0.0.0/24", "10.0.0.10", "10.0.0.40"))
	storeBitmap(t, cli, etcdstore.SecondaryServiceIPsKey(""), bits(t, "fd00::/64", "fd00::c", "fd00::d"))
	client := fake.NewClientset(
		testenv.ServiceCIDR("kubernetes", "10.0.0.0/24", "fd00::/64"),
		svc("a/ok", "10.0.0.10"), aged(ipAddr("10.0.0.10", "a/ok"), time.Hour),
		svc("a/nobit", "10.0.0.12", "fd00::a"), aged(ipAddr("10.0.0.12", "a/nobit"), time.Hour), aged(ipAddr("fd00::a", "a/nobit"), time.Hour),
	)
	reg := prometheus.NewPedanticRegistry()
	cfg := clusterip.Config{Mode: featuregate.DualWrite, Ranges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("fd00::/64")}, Client: client, Bitmaps: etcdstore.Stores{Client: cli}}
	c, err := NewController(cfg, Options{LeakGrace: -1, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	scrape(t, reg, "at creation", ipErrors(0, 0, 0, 0, 0, 0, 0)+reconcileErrors(0)+drift([2]int{}, &[2]int{}))

	if _, err := c.RunOnce(t.Context()); err != nil {
		t.Fatalf("pass 1: RunOnce() error = %v", err)
	}
	// IPv4: 10.0.0.40 bitmap-only, 10.0.0.12 ipaddress-only; IPv6: fd00::c and fd00::d
	// bitmap-only, fd00::a ipaddress-only.
	scrape(t, reg, "after pass 1", ipErrors(3, 2, 0, 0, 0, 0, 0)+reconcileErrors(0)+drift([2]int{1, 1}, &[2]int{2, 1}))

	if _, err := c.RunOnce(t.Context()); err != nil {
		t.Fatalf("pass 2: RunOnce() error = %v", err)
	}
	scrape(t, reg, "after pass 2", ipErrors(3, 2, 0, 0, 0, 0, 0)+reconcileErrors(0)+drift([2]int{}, &[2]int{}))
}
