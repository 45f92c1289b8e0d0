package repair_test

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp/cmpopts"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/repair"
)

// legacyLeakPasses is how many passes a bit must be seen leaked on before Legacy repair frees it,
// as kube-apiserver does (numRepairsBeforeLeakCleanup); repair.Options documents the 3.
const legacyLeakPasses = 3

// f is a Finding without its Detail, for the tables.
func f(ip string, c repair.Class, service string) repair.Finding {
	return repair.Finding{IP: ip, Class: c, Service: service}
}

var ignoreDetail = cmpopts.IgnoreFields(repair.Finding{}, "Detail")

// sortFindings orders fs as a Report orders its Findings (repair.Report.Findings): by address,
// IPv4 first, then by class precedence (repair.Classes). Every IP of fs must be an address.
func sortFindings(fs []repair.Finding) {
	classes := repair.Classes()
	slices.SortFunc(fs, func(a, b repair.Finding) int {
		if c := netip.MustParseAddr(a.IP).Compare(netip.MustParseAddr(b.IP)); c != 0 {
			return c
		}
		return slices.Index(classes, a.Class) - slices.Index(classes, b.Class)
	})
}

// recorder keeps the Events a test's Controller emits.
type recorder = testenv.EventRecorder

// withMode returns a copy of cfg for mode.
func withMode(cfg clusterip.Config, mode featuregate.Mode) clusterip.Config {
	cfg.Mode = mode
	return cfg
}

// auditConsistent fails t unless cfg's cluster audits consistent in every mode.
func auditConsistent(t *testing.T, cfg clusterip.Config, when string) {
	t.Helper()
	for _, mode := range []featuregate.Mode{featuregate.DualWrite, featuregate.Legacy, featuregate.IPAddressOnly} {
		rep, err := repair.Audit(t.Context(), withMode(cfg, mode))
		if err != nil {
			t.Fatalf("Audit(%s) %s: %v", mode, when, err)
		}
		if !rep.Consistent {
			t.Errorf("Audit(%s) %s: findings %+v, want none", mode, when, rep.Findings)
		}
	}
}

// seedBit sets ip in the bitmap of cidr at store with a compare-and-swap.
func seedBit(t *testing.T, store *etcdstore.Store, cidr, ip string) {
	t.Helper()
	err := bitmap.Modify(t.Context(), store, netip.MustParsePrefix(cidr), func(b *bitmap.Allocator) (bool, error) {
		return true, b.Allocate(t.Context(), netip.MustParseAddr(ip), allocator.Owner{})
	})
	if err != nil {
		t.Fatalf("seed stale bit %s: %v", ip, err)
	}
}

// unheld returns the first n addresses from first on that are not in held. Tests seed leaked
// objects and stale bits at them: kube-apiserver picks its Services' addresses at random, and a
// fixed address would now and then be one of them.
func unheld(first string, held []string, n int) []string {
	var free []string
	for a := netip.MustParseAddr(first); len(free) < n; a = a.Next() {
		if !slices.Contains(held, a.String()) {
			free = append(free, a.String())
		}
	}
	return free
}
