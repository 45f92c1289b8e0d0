// Package metricstest writes the Prometheus exposition text of the allocator metrics that tests
// compare a registry against. It keeps each metric's HELP and TYPE lines, as kube-apiserver
// v1.33 and this module expose them, written out once here and independently of
// internal/metrics, so a test states only its samples and a changed help text still fails it.
// Tests only.
package metricstest

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// headers maps each metric family to its HELP and TYPE lines.
var headers = map[string]string{
	"kube_apiserver_clusterip_allocator_allocated_ips": `# HELP kube_apiserver_clusterip_allocator_allocated_ips Gauge measuring the number of allocated IPs for Services
# TYPE kube_apiserver_clusterip_allocator_allocated_ips gauge`,
	"kube_apiserver_clusterip_allocator_available_ips": `# HELP kube_apiserver_clusterip_allocator_available_ips Gauge measuring the number of available IPs for Services
# TYPE kube_apiserver_clusterip_allocator_available_ips gauge`,
	"kube_apiserver_clusterip_allocator_allocation_total": `# HELP kube_apiserver_clusterip_allocator_allocation_total Number of Cluster IPs allocations
# TYPE kube_apiserver_clusterip_allocator_allocation_total counter`,
	"kube_apiserver_clusterip_allocator_allocation_errors_total": `# HELP kube_apiserver_clusterip_allocator_allocation_errors_total Number of errors trying to allocate Cluster IPs
# TYPE kube_apiserver_clusterip_allocator_allocation_errors_total counter`,
	"kube_apiserver_clusterip_allocator_allocation_duration_seconds": `# HELP kube_apiserver_clusterip_allocator_allocation_duration_seconds Duration in seconds to allocate a Cluster IP by ServiceCIDR
# TYPE kube_apiserver_clusterip_allocator_allocation_duration_seconds histogram`,
	"clusterip_allocator_not_ready_total": `# HELP clusterip_allocator_not_ready_total Number of Cluster IP allocations refused because the allocator was not ready (allocator.ErrNotReady)
# TYPE clusterip_allocator_not_ready_total counter`,
	"clusterip_allocator_dualwrite_undo_total": `# HELP clusterip_allocator_dualwrite_undo_total Number of first writes of a dual write (a bit or an IPAddress) undone because the second failed
# TYPE clusterip_allocator_dualwrite_undo_total counter`,
	"clusterip_allocator_dualwrite_undo_errors_total": `# HELP clusterip_allocator_dualwrite_undo_errors_total Number of dual-write undos that failed, each leaving an address in one store only until repair frees it
# TYPE clusterip_allocator_dualwrite_undo_errors_total counter`,
	"clusterip_allocator_bitmap_batches_total": `# HELP clusterip_allocator_bitmap_batches_total Number of batches of concurrent bitmap operations committed, each with one or more compare-and-swap writes
# TYPE clusterip_allocator_bitmap_batches_total counter`,
	"clusterip_allocator_bitmap_cas_writes_total": `# HELP clusterip_allocator_bitmap_cas_writes_total Number of compare-and-swap writes of the bitmap the store accepted
# TYPE clusterip_allocator_bitmap_cas_writes_total counter`,
	"clusterip_allocator_bitmap_cas_conflicts_total": `# HELP clusterip_allocator_bitmap_cas_conflicts_total Number of compare-and-swap writes of the bitmap refused because another writer changed it first
# TYPE clusterip_allocator_bitmap_cas_conflicts_total counter`,
	"clusterip_allocator_bitmap_cas_retries_total": `# HELP clusterip_allocator_bitmap_cas_retries_total Number of compare-and-swap conflicts of the bitmap after which the batch was written again
# TYPE clusterip_allocator_bitmap_cas_retries_total counter`,
}

// Exposition returns samples, one sample line each and grouped by metric family, with each
// family's HELP and TYPE lines before its first sample. Blank lines are dropped. A sample of a
// family it does not know gets no header, so the comparison fails on it.
func Exposition(samples string) string {
	var b strings.Builder
	b.WriteString("\n")
	last := ""
	for _, line := range strings.Split(samples, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		if f := family(line); f != last {
			if h, ok := headers[f]; ok {
				b.WriteString(h + "\n")
			}
			last = f
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

// family returns the metric family of a sample line: its name, less a histogram's
// _bucket, _sum or _count suffix.
func family(sample string) string {
	name, _, _ := strings.Cut(sample, "{")
	name, _, _ = strings.Cut(name, " ")
	if _, ok := headers[name]; ok {
		return name
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if f, ok := strings.CutSuffix(name, suffix); ok {
			if _, known := headers[f]; known {
				return f
			}
		}
	}
	return name
}

// Compare gathers the metric families names from reg and fails t with the difference if they
// are not Exposition(samples).
func Compare(t testing.TB, reg prometheus.Gatherer, samples string, names ...string) {
	t.Helper()
	if err := testutil.GatherAndCompare(reg, strings.NewReader(Exposition(samples)), names...); err != nil {
		t.Error(err)
	}
}
