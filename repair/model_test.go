package repair

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	netutils "k8s.io/utils/net"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/ipaddress"
)

// naiveClass states the table of classes for one key s in the plainest way, by scanning every
// object: the model TestClassifyMatchesNaiveModel holds classify to. A key is an address in
// canonical form, which Services hold in any spelling net.ParseIP accepted before Go 1.17
// (netutils.ParseIPSloppy, as kube-apiserver v1.33 reads a ClusterIP), or a string that is no
// address: a ClusterIP ParseIPSloppy rejects, or an IPAddress name that is not canonical. It
// returns "" for no finding.
func naiveClass(w *world, s string) (Class, string) {
	sloppy := func(c string) (netip.Addr, bool) {
		ip, ok := netip.AddrFromSlice(netutils.ParseIPSloppy(c))
		return ip.Unmap(), ok
	}
	canonical := func(n string) bool {
		ip, err := netip.ParseAddr(n)
		return err == nil && ip.String() == n && !ip.Is4In6() && ip.Zone() == ""
	}
	ip, err := netip.ParseAddr(s)
	isAddr := err == nil && canonical(s)
	var owners []string
	for _, svc := range w.services {
		for _, c := range allocator.RawClusterIPs(svc) {
			a, ok := sloppy(c)
			if ((isAddr && ok && a == ip) || (!isAddr && !ok && c == s)) && !slices.Contains(owners, serviceKey(svc)) {
				owners = append(owners, serviceKey(svc))
			}
		}
	}
	slices.Sort(owners)
	owner := ""
	if len(owners) > 0 {
		owner = owners[0]
	}
	var ipa *networkingv1.IPAddress
	if w.mode != featuregate.Legacy {
		for _, a := range w.ipAddresses {
			if a.Name == s {
				ipa = a
			}
		}
	}
	if !isAddr {
		if len(owners) > 0 || ipa != nil {
			return Invalid, owner
		}
		return "", ""
	}
	bit, inBitmap := false, false
	if w.mode != featuregate.IPAddressOnly {
		for _, b := range w.bitmaps {
			bit = bit || b.Has(ip)
			if b.CIDR().Contains(ip) && ip != b.CIDR().Addr() {
				for a := range allAddrs(b) {
					inBitmap = inBitmap || a == ip
				}
			}
		}
	}
	inCIDR := false
	for _, sc := range w.cidrs {
		for _, c := range sc.Spec.CIDRs {
			p := netip.MustParsePrefix(c)
			last := p.Addr()
			for range 1<<(p.Addr().BitLen()-p.Bits()) - 1 {
				last = last.Next()
			}
			if p.Contains(ip) && ip != p.Addr() && (ip.Is6() || ip != last) {
				inCIDR = true
			}
		}
	}
	switch {
	case len(owners) > 1:
		return DuplicateOwner, owner
	case len(owners) == 1 && w.mode == featuregate.Legacy:
		switch {
		case !inBitmap:
			return OutOfRange, owner
		case !bit:
			return Missing, owner
		}
	case len(owners) == 1:
		var svc *corev1.Service
		for _, x := range w.services {
			if serviceKey(x) == owner {
				svc = x
			}
		}
		switch {
		case !inCIDR:
			return OutOfRange, owner
		case ipa != nil && !isParent(ipa, svc):
			return WrongParent, owner
		case ipa != nil && (ipa.Labels[networkingv1.LabelIPAddressFamily] != string(allocator.FamilyOf(ip)) ||
			ipa.Labels[networkingv1.LabelManagedBy] != ipaddress.DefaultManagedBy):
			return WrongParent, owner // right parent, wrong labels
		case ipa == nil:
			return Missing, owner
		case w.mode == featuregate.DualWrite && inBitmap && !bit:
			return IPAddressOnly, owner
		}
	case w.mode == featuregate.Legacy && bit:
		return Leaked, ""
	case ipa != nil && ipa.Labels[networkingv1.LabelManagedBy] != ipaddress.DefaultManagedBy:
		return "", "" // another controller's object
	case ipa != nil:
		return Leaked, ""
	case w.mode == featuregate.DualWrite && bit:
		return BitmapOnly, ""
	}
	return "", ""
}

// allAddrs lists every address b has a bit for, set or not.
func allAddrs(b *bitmap.Allocator) map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	ip := b.CIDR().Addr()
	for range b.Size() {
		ip = ip.Next()
		out[ip] = true
	}
	return out
}

// TestClassifyMatchesNaiveModel builds random small worlds over a few addresses and compares
// classify with naiveClass for every address any object mentions.
func TestClassifyMatchesNaiveModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	universe := []string{"10.0.0.0", "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.7", "10.0.0.8", "10.0.0.9", "10.0.0.15",
		"10.0.1.1", "fd00::1", "fd00::2", "fd00::1:0", "010.0.0.1", "FD00::1", "::ffff:10.0.0.2", "fd00:0:0:0:0:0:0:2", "x"}
	pick := func() string { return universe[r.IntN(len(universe))] }
	for iter := range 2000 {
		mode := featuregate.Mode(r.IntN(3))
		w := &world{mode: mode}
		for i := range r.IntN(8) {
			ips := []string{pick()}
			if r.IntN(4) == 0 {
				ips = append(ips, pick())
			}
			w.services = append(w.services, svc(fmt.Sprintf("ns/s%d", i), ips...))
		}
		names := map[string]bool{}
		for range r.IntN(8) {
			n := pick()
			if names[n] {
				continue
			}
			names[n] = true
			parent := fmt.Sprintf("ns/s%d", r.IntN(9))
			ipa := ipAddr(n, parent)
			switch r.IntN(8) {
			case 0:
				delete(ipa.Labels, networkingv1.LabelIPAddressFamily)
			case 1:
				ipa.Labels[networkingv1.LabelIPAddressFamily] = "IPv6"
			case 2:
				ipa = foreign(ipa)
			}
			w.ipAddresses = append(w.ipAddresses, ipa)
		}
		for _, c := range []string{"10.0.0.0/29", "10.0.0.8/29", "fd00::/112"} {
			if r.IntN(2) == 0 {
				sc := testenv.ServiceCIDR(c, c)
				if r.IntN(4) == 0 {
					sc = notReady(sc)
				}
				w.cidrs = append(w.cidrs, sc)
			}
		}
		b4 := bits(t, "10.0.0.0/28")
		b6 := bits(t, "fd00::/120")
		for range r.IntN(5) {
			ip, err := netip.ParseAddr(pick())
			if err == nil {
				_ = b4.Allocate(t.Context(), ip, allocator.Owner{})
				_ = b6.Allocate(t.Context(), ip, allocator.Owner{})
			}
		}
		w.bitmaps = []*bitmap.Allocator{b4, b6}

		var want []Finding
		for _, s := range universe {
			if c, svcKey := naiveClass(w, s); c != "" {
				want = append(want, Finding{IP: s, Class: c, Service: svcKey})
			}
		}
		sortFindings(want, func(f *Finding) *Finding { return f })
		got := classify(w).report(mode).Findings
		if diff := cmp.Diff(want, got, ignoreDetail, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("iteration %d, %s: classify and the model differ (-model +classify):\n%s", iter, mode, diff)
		}
	}
}
