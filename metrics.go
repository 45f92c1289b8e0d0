package clusterip

import (
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/kube-ipam/clusterip/internal/ipmath"
	"github.com/kube-ipam/clusterip/internal/metrics"
	"github.com/kube-ipam/clusterip/reservation"
	"github.com/kube-ipam/clusterip/servicecidr"
)

// instrument wraps the allocator of every family in one that records its metrics on reg
// (Config.Registerer). It must run before the service.Allocator is built over the allocators.
//
// The cidr label follows kube-apiserver, which labels each per-ServiceCIDR allocator with its
// prefix:
//
//   - Legacy: every metric under the bitmap's range, the flag range, as kube-apiserver's bitmap
//     allocator does.
//   - DualWrite and IPAddressOnly: the allocated and available gauges have one series per
//     ServiceCIDR prefix of the family (servicecidr.Allocator.Usage), as kube-apiserver has one
//     allocator per prefix: each counts the addresses its prefix contains, so an address in two
//     overlapping prefixes counts in both, and a prefix's series appear when its allocator is
//     created and go when the last ServiceCIDR holding it does. The counters and the histogram
//     are labelled, as in kube-apiserver, with the prefix that served the address
//     (servicecidr.Allocator.PrefixOf); an AllocateNext that failed, which has no address, and
//     an address in no known prefix count under the family's flag range, the prefix of the
//     default ServiceCIDR ("kubernetes") that kube-apiserver creates from the flag.
//
// Where there is a bitmap (Legacy, and DualWrite's mirror) its group-commit counters, CAS
// conflicts and retries among them, are read from bitmap.Persistent.Stats; in DualWrite mode the
// dual-write undo counters are read from DualWriteAllocator.Stats.
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
		if sc := a.cidrs[f]; sc != nil {
			src.CIDRs = func() []metrics.CIDRGauges { return a.withReserved(cidrGauges(sc.Usage())) }
			src.LabelOf = func(ip netip.Addr) string {
				if p, ok := sc.PrefixOf(ip); ok {
					return p.String()
				}
				return ""
			}
		}
		if bm := a.bitmaps[f]; bm != nil {
			src.Bitmap = bm.Stats
		}
		if dw := a.dual[f]; dw != nil {
			src.Undos = func() (uint64, uint64) {
				s := dw.Stats()
				return s.Undone, s.UndoFailed
			}
		}
		a.allocs[f] = rec.Wrap(al, src)
	}
	return nil
}

// cidrGauges returns the gauge values of each prefix of us.
func cidrGauges(us []servicecidr.PrefixUsage) []metrics.CIDRGauges {
	gs := make([]metrics.CIDRGauges, len(us))
	for i, u := range us {
		gs[i] = metrics.CIDRGauges{Label: u.Prefix.String(), Used: u.Used, Free: u.Free}
	}
	return gs
}

// withReserved adds to gs, with Config.Reservations, the number of each prefix's addresses that
// reservations hold, counted in the IPAddress informer's cache at scrape time.
func (a *Allocators) withReserved(gs []metrics.CIDRGauges) []metrics.CIDRGauges {
	if a.expiry == nil || a.ipInformer == nil {
		return gs
	}
	var held []netip.Addr
	for _, obj := range a.ipInformer.GetStore().List() {
		if ipa, ok := obj.(*networkingv1.IPAddress); ok && reservation.IsReservation(ipa) {
			if ip, err := netip.ParseAddr(ipa.Name); err == nil {
				held = append(held, ip)
			}
		}
	}
	for i := range gs {
		p, err := netip.ParsePrefix(gs[i].Label)
		if err != nil {
			continue
		}
		var n uint64
		for _, ip := range held {
			if ipmath.Usable(p, ip) {
				n++
			}
		}
		gs[i].Reserved = &n
	}
	return gs
}
