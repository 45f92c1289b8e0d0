package clusterip

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kube-ipam/clusterip/internal/metrics"
)

// instrument wraps the allocator of every family in one that records its metrics on reg
// (Config.Registerer). It must run before the ServiceAllocator is built over the allocators.
//
// The cidr label follows kube-apiserver, which labels each per-ServiceCIDR allocator with its
// prefix:
//
//   - Legacy: the bitmap's range, the flag range, as kube-apiserver's bitmap allocator does.
//   - DualWrite and IPAddressOnly: the family's flag range, which is the prefix of the default
//     ServiceCIDR ("kubernetes") that kube-apiserver creates from the flag. The gauges are the
//     family's Used and Free, which count every address of every ServiceCIDR of the family once,
//     however many overlapping prefixes contain it. In a cluster with the default ServiceCIDR
//     alone (the common case) this scrapes as kube-apiserver does; with extra ServiceCIDRs their
//     addresses are counted under the flag range's label rather than under series of their own,
//     which would need each prefix's Used and Free from package servicecidr.
//
// In DualWrite mode the dual-write undo counters are read from DualWriteAllocator.Stats.
func (a *Allocators) instrument(reg prometheus.Registerer) error {
	rec, err := metrics.New(reg)
	if err != nil {
		return &ConfigError{Field: "Registerer", Reason: "cannot register the allocator metrics", Err: err}
	}
	for _, f := range a.families {
		al := a.allocs[f]
		src := metrics.Source{Label: al.CIDR().String()}
		if !al.CIDR().IsValid() {
			src.Label = a.ranges[f].String()
		}
		if dw, ok := al.(*DualWriteAllocator); ok {
			src.Undos = func() (uint64, uint64) {
				s := dw.Stats()
				return s.Undone, s.UndoFailed
			}
		}
		a.allocs[f] = rec.Wrap(al, src)
	}
	return nil
}
