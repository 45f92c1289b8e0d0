package repair

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/ipmath"
	"github.com/kube-ipam/clusterip/ipaddress"
	"github.com/kube-ipam/clusterip/servicecidr"
)

// world is everything an audit judges, read at one moment: the pure input of classify.
type world struct {
	mode featuregate.Mode
	// managedBy is Config.ManagedBy: besides ipaddress.DefaultManagedBy, the managed-by label
	// of IPAddress objects a Service IP allocator made. Empty means the default alone.
	managedBy   string
	services    []*corev1.Service
	cidrs       []*networkingv1.ServiceCIDR
	ipAddresses []*networkingv1.IPAddress
	// namespaces are the Namespaces that exist, read where IPAddress objects are (not in Legacy
	// mode): a reservation kept for a Service of another namespace is reported.
	namespaces []*corev1.Namespace
	// bitmaps holds one bitmap per flag range, in the order of Config.Ranges; an absent bitmap
	// object is an empty allocator. Read only in Legacy and DualWrite mode.
	bitmaps []*bitmap.Allocator
	// revs holds the etcd revision each bitmap was read at, 0 if absent: repair writes back with
	// a compare-and-swap on it.
	revs []int64
	// otherRanges counts the bitmaps stored for another range than their flag range, read as
	// the bits of it their flag range serves.
	otherRanges int
	// stale are the bitmaps found in IPAddressOnly mode, which no allocator of that mode reads or
	// writes: what a Legacy or DualWrite era left behind.
	stale []StaleBitmap
}

// finding is a Finding with the objects it concerns, for the repair controller.
type finding struct {
	Finding
	addr netip.Addr              // the parsed IP; invalid for Invalid findings
	svc  *corev1.Service         // the Service concerned, if any
	ipa  *networkingv1.IPAddress // the IPAddress object of the IP, if any
	bm   int                     // index in world.bitmaps of the bitmap whose range holds addr, or -1
	bit  bool                    // whether that bitmap has addr's bit set
	// inBitmap reports whether addr has a bit in that bitmap at all (see bitmapOf).
	inBitmap bool
	// holders is how many Services hold the IP (for Invalid: the string).
	holders int
	// labels reports, for WrongParent, that the parentRef is right and only the labels are
	// wrong: repair updates them in place instead of recreating the object.
	labels bool
}

// entry gathers what holds one address: the Services whose ClusterIPs parse to it in any
// spelling, the IPAddress object named after it, its bit.
type entry struct {
	owner  *corev1.Service   // the first Service holding the IP
	extra  []*corev1.Service // further Services holding it (duplicates)
	ipa    *networkingv1.IPAddress
	hasBit bool
}

// invalidEntry gathers what refers to one string that is no address: Services whose ClusterIP it
// is and which allocator.ParseClusterIP rejects, and IPAddress objects it names, which are not
// in canonical form.
type invalidEntry struct {
	services    []*corev1.Service
	ipAddresses []*networkingv1.IPAddress
}

// result is the outcome of classify.
type result struct {
	findings     []finding // sorted as Report.Findings
	counts       map[string]int
	stale        []StaleBitmap
	reservations []ReservationFinding
	caps         *Caps
}

// classify judges w: each IP with a problem gets one finding, of the first Class that applies
// for w.mode. Its cost is linear in the number of objects and bits (times the few ServiceCIDRs
// for the range check); it never changes w.
func classify(w *world) result {
	useBits := w.mode != featuregate.IPAddressOnly
	useIPAs := w.mode != featuregate.Legacy

	nbits := 0
	if useBits {
		for _, b := range w.bitmaps {
			nbits += int(b.Used())
		}
	}
	n := nbits
	for _, svc := range w.services {
		n += len(allocator.RawClusterIPs(svc))
	}
	if useIPAs {
		n += len(w.ipAddresses)
	}
	byIP := make(map[netip.Addr]*entry, n)
	pool := make([]entry, 0, n)
	get := func(ip netip.Addr) *entry {
		e := byIP[ip]
		if e == nil {
			pool = append(pool, entry{})
			e = &pool[len(pool)-1]
			byIP[ip] = e
		}
		return e
	}
	invalid := map[string]*invalidEntry{}
	getInvalid := func(s string) *invalidEntry {
		e := invalid[s]
		if e == nil {
			e = &invalidEntry{}
			invalid[s] = e
		}
		return e
	}

	var held []netip.Addr // the addresses of one Service, reused
	for _, svc := range w.services {
		held = held[:0]
		for _, s := range allocator.RawClusterIPs(svc) {
			ip, err := allocator.ParseClusterIP(s)
			if err != nil {
				if e := getInvalid(s); len(e.services) == 0 || e.services[len(e.services)-1] != svc {
					e.services = append(e.services, svc)
				}
				continue
			}
			if slices.Contains(held, ip) {
				continue // one Service listing an address twice, in any spelling, still holds it once
			}
			held = append(held, ip)
			e := get(ip)
			if e.owner == nil {
				e.owner = svc
			} else {
				e.extra = append(e.extra, svc)
			}
		}
	}
	if useIPAs {
		for _, ipa := range w.ipAddresses {
			ip, ok := parseCanonical(ipa.Name)
			if !ok {
				e := getInvalid(ipa.Name)
				e.ipAddresses = append(e.ipAddresses, ipa)
				continue
			}
			get(ip).ipa = ipa // names are unique: at most one object per IP
		}
	}
	if useBits {
		for _, b := range w.bitmaps {
			for ip := range b.All() {
				get(ip).hasBit = true
			}
		}
	}

	var inRange []netip.Prefix
	if useIPAs {
		inRange = cidrPrefixes(w.cidrs)
	}

	var out []finding
	for ip, e := range byIP {
		if f, ok := judge(w, inRange, ip, e); ok {
			f.IP = ip.String() // only for findings: most IPs have none
			out = append(out, f)
		}
	}
	for s, e := range invalid {
		out = append(out, judgeInvalid(s, e))
	}
	counts := map[string]int{
		CountServices:    len(w.services),
		CountIPAddresses: len(w.ipAddresses),
		CountBitmapBits:  nbits,
	}
	for _, f := range out {
		counts[string(f.Class)]++
	}
	sortFindings(out, func(f *finding) *Finding { return &f.Finding })
	return result{findings: out, counts: counts}
}

// judge returns the finding of one address, if it has a problem.
func judge(w *world, inRange []netip.Prefix, ip netip.Addr, e *entry) (finding, bool) {
	f := finding{addr: ip, svc: e.owner, ipa: e.ipa, bm: -1} // IP is set by the caller
	if e.owner != nil {
		f.holders = 1 + len(e.extra)
	}
	var inBitmap bool
	if w.mode != featuregate.IPAddressOnly {
		f.bm, inBitmap = bitmapOf(w.bitmaps, ip)
		f.bit, f.inBitmap = e.hasBit, inBitmap
	}
	switch {
	case len(e.extra) > 0:
		owners := append([]*corev1.Service{e.owner}, e.extra...)
		keys := make([]string, len(owners))
		for i, s := range owners {
			keys[i] = serviceKey(s)
		}
		slices.Sort(keys)
		f.Class, f.Service = DuplicateOwner, keys[0]
		for _, s := range owners {
			if serviceKey(s) == keys[0] {
				f.svc = s
			}
		}
		f.Detail = fmt.Sprintf("%s is held by %d Services: %s.", ip, len(keys), strings.Join(keys, ", "))
		return f, true
	case e.owner != nil:
		return judgeHeld(w, inRange, f, e, inBitmap)
	case w.mode == featuregate.Legacy:
		if e.hasBit {
			f.Class = Leaked
			f.Detail = fmt.Sprintf("%s is set in the bitmap of %s but no Service holds it.", ip, w.bitmaps[f.bm].CIDR())
			return f, true
		}
	case e.ipa != nil && !w.managedByAllocator(e.ipa):
		// Another controller's object: kube-apiserver's repair leaves those alone, and so do we.
		return finding{}, false
	case e.ipa != nil:
		f.Class = Leaked
		f.Detail = fmt.Sprintf("IPAddress %s (parent %s) is held by no Service.", ip, parentString(e.ipa))
		if w.mode == featuregate.DualWrite && e.hasBit {
			f.Detail = fmt.Sprintf("IPAddress %s (parent %s) and its bit are held by no Service.", ip, parentString(e.ipa))
		}
		return f, true
	case w.mode == featuregate.DualWrite && e.hasBit:
		f.Class = BitmapOnly
		f.Detail = fmt.Sprintf("%s is set in the bitmap of %s with neither an IPAddress nor a Service.", ip, w.bitmaps[f.bm].CIDR())
		return f, true
	}
	return finding{}, false
}

// managedByAllocator reports whether ipa was made by a Service IP allocator: its managed-by label
// is [ipaddress.DefaultManagedBy], as kube-apiserver's and ours set it by default, or the
// Config.ManagedBy of the audit. Objects other controllers manage are never reported leaked, so
// repair never deletes them.
func (w *world) managedByAllocator(ipa *networkingv1.IPAddress) bool {
	return isAllocatorManagedBy(ipa.Labels[networkingv1.LabelManagedBy], w.managedBy)
}

// isAllocatorManagedBy reports whether the managed-by label value v is a Service IP allocator's:
// [ipaddress.DefaultManagedBy], or managedBy (Config.ManagedBy) when that is not empty.
func isAllocatorManagedBy(v, managedBy string) bool {
	return v == ipaddress.DefaultManagedBy || (managedBy != "" && v == managedBy)
}

// hasAllocatorLabels reports whether ipa carries the labels a Service IP allocator gives the
// IPAddress of ip: its IP family and a managed-by of a Service IP allocator, as kube-apiserver's
// repair checks them (verifyIPAddressLabels).
func (w *world) hasAllocatorLabels(ipa *networkingv1.IPAddress, ip netip.Addr) bool {
	return ipa.Labels[networkingv1.LabelIPAddressFamily] == string(allocator.FamilyOf(ip)) && w.managedByAllocator(ipa)
}

// managedByOrDefault returns managedBy, or [ipaddress.DefaultManagedBy] when that is empty: the
// managed-by label repair gives the objects it writes, and a finding asks for.
func managedByOrDefault(managedBy string) string {
	if managedBy != "" {
		return managedBy
	}
	return ipaddress.DefaultManagedBy
}

// judgeHeld returns the finding of an IP held by exactly one Service, if it has a problem. It
// decides the class before it formats anything: most IPs have none.
func judgeHeld(w *world, inRange []netip.Prefix, f finding, e *entry, inBitmap bool) (finding, bool) {
	switch {
	case w.mode == featuregate.Legacy && !inBitmap:
		f.Class = OutOfRange
	case w.mode == featuregate.Legacy && !e.hasBit:
		f.Class = Missing
	case w.mode == featuregate.Legacy:
		return finding{}, false
	case !containedIn(inRange, f.addr):
		f.Class = OutOfRange
	case e.ipa != nil && !isParent(e.ipa, e.owner):
		f.Class = WrongParent
	case e.ipa != nil && !w.hasAllocatorLabels(e.ipa, f.addr):
		f.Class, f.labels = WrongParent, true
	case e.ipa == nil:
		f.Class = Missing
	case w.mode == featuregate.DualWrite && inBitmap && !e.hasBit:
		f.Class = IPAddressOnly
	default:
		return finding{}, false
	}
	ip := f.addr
	f.Service = serviceKey(e.owner)
	switch {
	case f.Class == OutOfRange && w.mode == featuregate.Legacy:
		f.Detail = fmt.Sprintf("Service %s holds %s, outside the ranges %s.", f.Service, ip, rangesString(w.bitmaps))
	case f.Class == OutOfRange:
		f.Detail = fmt.Sprintf("Service %s holds %s, in no ServiceCIDR.", f.Service, ip)
	case f.Class == Missing && w.mode == featuregate.Legacy:
		f.Detail = fmt.Sprintf("Service %s holds %s but its bit in %s is clear.", f.Service, ip, w.bitmaps[f.bm].CIDR())
	case f.Class == Missing:
		f.Detail = fmt.Sprintf("Service %s holds %s but there is no IPAddress object for it.", f.Service, ip)
	case f.labels:
		f.Detail = fmt.Sprintf("IPAddress %s of Service %s is labelled %s=%q, %s=%q; want %q and %q.", ip, f.Service,
			networkingv1.LabelIPAddressFamily, e.ipa.Labels[networkingv1.LabelIPAddressFamily],
			networkingv1.LabelManagedBy, e.ipa.Labels[networkingv1.LabelManagedBy],
			allocator.FamilyOf(ip), managedByOrDefault(w.managedBy))
	case f.Class == WrongParent:
		f.Detail = fmt.Sprintf("IPAddress %s names %s as its parent but Service %s holds it.", ip, parentString(e.ipa), f.Service)
	case f.Class == IPAddressOnly:
		f.Detail = fmt.Sprintf("Service %s holds %s and its IPAddress, but its bit in %s is clear.", f.Service, ip, w.bitmaps[f.bm].CIDR())
	}
	return f, true
}

// judgeInvalid returns the finding of a string that is no address: a ClusterIP that does not
// parse as kube-apiserver v1.33 parses it (allocator.ParseClusterIP), or an IPAddress name that
// is not an address in canonical form.
func judgeInvalid(s string, e *invalidEntry) finding {
	f := finding{bm: -1, holders: len(e.services)}
	f.IP, f.Class = s, Invalid
	var what []string
	if len(e.services) > 0 {
		slices.SortFunc(e.services, func(a, b *corev1.Service) int { return strings.Compare(serviceKey(a), serviceKey(b)) })
		f.svc = e.services[0]
		f.Service = serviceKey(f.svc)
		for _, s := range e.services {
			what = append(what, "Service "+serviceKey(s))
		}
	}
	if len(e.ipAddresses) > 0 {
		f.ipa = e.ipAddresses[0]
		what = append(what, "an IPAddress object")
	}
	if len(e.services) == 0 {
		f.Detail = fmt.Sprintf("%q is not an IP address in canonical form (the name of an IPAddress object).", s)
	} else {
		f.Detail = fmt.Sprintf("%q is not an IP address (held by %s).", s, strings.Join(what, " and "))
	}
	return f
}

// holds reports whether svc holds ip: whether one of its ClusterIPs, in any spelling
// kube-apiserver v1.33 accepts, is ip (allocator.ClusterIPs).
func holds(svc *corev1.Service, ip netip.Addr) bool {
	return slices.Contains(allocator.ClusterIPs(svc), ip)
}

// parseCanonical parses s and reports whether it is an address an allocator accepts, written in
// canonical form: the only form an IPAddress object's name may take.
func parseCanonical(s string) (netip.Addr, bool) {
	ip, err := allocator.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	var buf [64]byte
	return ip, string(ip.AppendTo(buf[:0])) == s
}

// cidrPrefixes returns the prefixes of every ServiceCIDR, ready or not, once each: an address is
// in range if one of them contains it. kube-apiserver v1.33's repair counts them all
// (repairip.go isIPOutOfRange, through pkg/api/servicecidr.ContainsIP over the whole lister): a
// ServiceCIDR being removed (deletionTimestamp set, Ready=False, held by its finalizer while an
// address in it is in no other) still holds its Services' addresses, which repair must keep and,
// when their IPAddress is missing, create.
func cidrPrefixes(cidrs []*networkingv1.ServiceCIDR) []netip.Prefix {
	var out []netip.Prefix
	for _, sc := range cidrs {
		for _, p := range servicecidr.Prefixes(sc) {
			if !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	return out
}

// containedIn reports whether ip is a usable address of one of ps (not its network address, nor
// its IPv4 broadcast address).
func containedIn(ps []netip.Prefix, ip netip.Addr) bool {
	for _, p := range ps {
		if _, ok := ipmath.Offset(p, ip); ok {
			return true
		}
	}
	return false
}

// bitmapOf returns the index of the bitmap of ip's family whose range contains it, or -1, and
// reports whether ip has a bit in it (it may not: the network address, the IPv4 broadcast, and
// IPv6 addresses beyond the bitmap's 65535 slots).
func bitmapOf(bms []*bitmap.Allocator, ip netip.Addr) (int, bool) {
	for i, b := range bms {
		if b.CIDR().Addr().Is4() != ip.Is4() {
			continue
		}
		off, ok := ipmath.Offset(b.CIDR(), ip)
		return i, ok && off < b.Size()
	}
	return -1, false
}

// isParent reports whether ipa's parentRef names svc.
func isParent(ipa *networkingv1.IPAddress, svc *corev1.Service) bool {
	return ipaddress.HasParent(ipa, allocator.ServiceOwner(svc))
}

// parentString describes ipa's parentRef.
func parentString(ipa *networkingv1.IPAddress) string {
	p := ipa.Spec.ParentRef
	if p == nil {
		return "none"
	}
	gr := p.Resource
	if p.Group != "" {
		gr += "." + p.Group
	}
	if p.Namespace == "" {
		return gr + " " + p.Name
	}
	return gr + " " + p.Namespace + "/" + p.Name
}

// serviceKey returns "namespace/name".
func serviceKey(svc *corev1.Service) string { return svc.Namespace + "/" + svc.Name }

// rangesString lists the bitmaps' ranges.
func rangesString(bms []*bitmap.Allocator) string {
	s := make([]string, len(bms))
	for i, b := range bms {
		s[i] = b.CIDR().String()
	}
	return strings.Join(s, ", ")
}

// report builds the public Report of r.
func (r result) report(mode featuregate.Mode) *Report {
	rep := &Report{Mode: mode.String(), Counts: r.counts, Findings: make([]Finding, len(r.findings)), StaleBitmaps: r.stale, Reservations: r.reservations, Caps: r.caps}
	for i, f := range r.findings {
		rep.Findings[i] = f.Finding
	}
	rep.Consistent = len(rep.Findings) == 0
	return rep
}
