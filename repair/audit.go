package repair

import (
	"time"

	"context"
	"fmt"
	"maps"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/ipaddress"
)

// listPageSize is the Limit of each List call: the API server answers a paginated List from one
// consistent snapshot without holding every object in one response.
const listPageSize = 500

// Audit reads the cluster's ClusterIP state and returns a Report of every address that needs
// attention, judged by cfg.Mode. It writes nothing.
//
// It lists Services (every mode), ServiceCIDRs and IPAddress objects (DualWrite and
// IPAddressOnly) from the API server with cfg.Client, in pages and never from a cache, and in
// Legacy and DualWrite mode reads the bitmaps of cfg.Ranges from the stores cfg.Bitmaps gives for
// their order (with etcdstore.Stores, the first range at <prefix>/ranges/serviceips, the second
// at <prefix>/ranges/secondaryserviceips); a missing bitmap counts as empty. cfg.Informers is
// not used.
//
// The reads are not one transaction: ServiceCIDRs and IPAddress objects first, then the bitmaps,
// then the Services. An allocator writes its records (the bit, then the IPAddress object) before
// the Service and releases them after the Service is deleted, so a release running meanwhile
// can only show up as a leak or a stale bit, which repair holds off. An allocation that
// completes meanwhile, its records written after they were read and its Service before the
// Services were listed, would show up as a missing record on a cluster consistent at every
// instant; so every missing finding is confirmed with live reads after the Services List before
// it is reported: the IPAddress object read again (a Get by name, or one more List when there
// are more than 64 missing findings), the bitmaps read again, and, if the record is still absent,
// the Service read again (a Service deleted or changed meanwhile holds nothing to report). A
// record that appeared is judged afresh, and the finding dropped if the address is now
// consistent.
//
// A Config without what the mode needs gives a *clusterip.ConfigError naming the field (Client
// is required in every mode); API and etcd errors are wrapped. A bitmap stored for another range
// than its flag range (the flag changed; allocations through it fail until repair rewrites it) is
// judged as the bits of that range the flag range serves, which is what the rewrite keeps, and
// counted in Counts["bitmapsOfOtherRange"].
func Audit(ctx context.Context, cfg clusterip.Config) (*Report, error) {
	_, res, err := audit(ctx, &cfg)
	if err != nil {
		return nil, err
	}
	return res.report(cfg.Mode), nil
}

// audit reads the world cfg describes, judges it, and confirms its missing findings: what Audit
// reports and a Controller's pass acts on.
func audit(ctx context.Context, cfg *clusterip.Config) (*world, result, error) {
	w, err := read(ctx, cfg)
	if err != nil {
		return nil, result{}, err
	}
	res, err := confirmMissing(ctx, cfg, w, classify(w))
	if err != nil {
		return nil, result{}, err
	}
	if w.otherRanges > 0 {
		res.counts["bitmapsOfOtherRange"] = w.otherRanges
	}
	res.stale = w.stale
	now := time.Now()
	res.reservations = reservationFindings(w, now)
	res.caps = capsOf(w, now)
	return w, res, nil
}

// checkConfig returns what Audit needs of cfg that it lacks: what Config.Validate checks, then
// the clients.
func checkConfig(cfg *clusterip.Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	switch {
	case cfg.Client == nil:
		return &clusterip.ConfigError{Field: "Client", Reason: "required to audit: Services are read from the API server"}
	case cfg.Mode != featuregate.IPAddressOnly && cfg.Bitmaps == nil:
		return &clusterip.ConfigError{Field: "Bitmaps", Reason: "required in " + cfg.Mode.String() + " mode, to read the bitmaps (etcdstore.Stores for kube-apiserver's, in its etcd)"}
	}
	return nil
}

// read reads the world cfg describes, in the order Audit documents.
func read(ctx context.Context, cfg *clusterip.Config) (*world, error) {
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
	w := &world{mode: cfg.Mode, managedBy: cfg.ManagedBy}
	var err error
	if cfg.Mode != featuregate.Legacy {
		if w.cidrs, err = listServiceCIDRs(ctx, cfg.Client); err != nil {
			return nil, err
		}
		if w.ipAddresses, err = listIPAddresses(ctx, cfg.Client); err != nil {
			return nil, err
		}
		if w.namespaces, err = listNamespaces(ctx, cfg.Client); err != nil {
			return nil, err
		}
	}
	if cfg.Mode == featuregate.IPAddressOnly && cfg.Bitmaps != nil {
		if w.stale, err = readStaleBitmaps(ctx, cfg); err != nil {
			return nil, err
		}
	}
	if cfg.Mode != featuregate.IPAddressOnly {
		for i, r := range cfg.Ranges {
			b, rev, other, err := readBitmap(ctx, cfg.Bitmaps.Store(i), r)
			if err != nil {
				return nil, err
			}
			if other {
				w.otherRanges++
			}
			w.bitmaps = append(w.bitmaps, b)
			w.revs = append(w.revs, rev)
		}
	}
	if w.services, err = listServices(ctx, cfg.Client); err != nil {
		return nil, err
	}
	return w, nil
}

// readBitmap reads the bitmap of r from store and returns it with its revision; a missing one is
// empty, at revision 0. A bitmap stored for another range (the flag range changed) is read as
// what the repair pass will rewrite it to (see bitmap.Project), and other reports so.
func readBitmap(ctx context.Context, store bitmap.Store, r netip.Prefix) (b *bitmap.Allocator, rev int64, other bool, err error) {
	snap, rev, err := store.Get(ctx)
	if err != nil {
		return nil, 0, false, fmt.Errorf("repair: read the bitmap of %s at %s: %w", r, storeName(store), err)
	}
	if rev == 0 {
		snap = bitmap.Snapshot{}
	}
	b, other, err = bitmap.Project(snap, r)
	if err != nil {
		return nil, 0, false, fmt.Errorf("repair: the bitmap at %s: %w", storeName(store), err)
	}
	return b, rev, other, nil
}

// readStaleBitmaps returns the bitmaps cfg.Bitmaps holds for cfg.Ranges, which no allocator
// reads or writes in IPAddressOnly mode: a DualWrite or Legacy era left them behind, and
// kube-apiserver never removes them.
func readStaleBitmaps(ctx context.Context, cfg *clusterip.Config) ([]StaleBitmap, error) {
	var out []StaleBitmap
	for i, r := range cfg.Ranges {
		store := cfg.Bitmaps.Store(i)
		snap, rev, err := store.Get(ctx)
		if err != nil {
			return nil, fmt.Errorf("repair: read the bitmap of %s at %s: %w", r, storeName(store), err)
		}
		if rev == 0 {
			continue
		}
		sb := StaleBitmap{Range: r.String(), Key: storeName(store), Revision: rev, StoredRange: snap.Range}
		if b, _, err := bitmap.Project(snap, r); err == nil {
			sb.Bits = int(b.Used())
		}
		out = append(out, sb)
	}
	return out, nil
}

// listNamespaces lists every Namespace, a page at a time.
func listNamespaces(ctx context.Context, c kubernetes.Interface) ([]*corev1.Namespace, error) {
	return listPages(ctx, "Namespaces", c.CoreV1().Namespaces().List, func(l *corev1.NamespaceList) []corev1.Namespace { return l.Items })
}

// listServices lists every Service, a page at a time.
func listServices(ctx context.Context, c kubernetes.Interface) ([]*corev1.Service, error) {
	return listPages(ctx, "Services", c.CoreV1().Services(metav1.NamespaceAll).List, func(l *corev1.ServiceList) []corev1.Service { return l.Items })
}

// listIPAddresses lists every IPAddress object, a page at a time (ipaddress.List).
func listIPAddresses(ctx context.Context, c kubernetes.Interface) ([]*networkingv1.IPAddress, error) {
	var out []*networkingv1.IPAddress
	err := ipaddress.List(ctx, c, func(ipa *networkingv1.IPAddress) error {
		out = append(out, ipa)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("repair: list IPAddresses: %w", err)
	}
	return out, nil
}

// listServiceCIDRs lists every ServiceCIDR, a page at a time.
func listServiceCIDRs(ctx context.Context, c kubernetes.Interface) ([]*networkingv1.ServiceCIDR, error) {
	return listPages(ctx, "ServiceCIDRs", c.NetworkingV1().ServiceCIDRs().List, func(l *networkingv1.ServiceCIDRList) []networkingv1.ServiceCIDR { return l.Items })
}

// listPages calls list for pages of listPageSize until the last, and returns pointers to the
// items of every page; what names the resource in the error.
func listPages[L interface{ GetContinue() string }, T any](ctx context.Context, what string, list func(context.Context, metav1.ListOptions) (L, error), items func(L) []T) ([]*T, error) {
	var out []*T
	opts := metav1.ListOptions{Limit: listPageSize}
	for {
		l, err := list(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("repair: list %s: %w", what, err)
		}
		page := items(l)
		for i := range page {
			out = append(out, &page[i])
		}
		if l.GetContinue() == "" {
			return out, nil
		}
		opts.Continue = l.GetContinue()
	}
}

// confirmByGetLimit is how many missing findings an audit confirms with one Get each; past it, it
// lists the IPAddress objects (and the Services) again, which costs one read of each object
// however many findings there are.
const confirmByGetLimit = 64

// confirmMissing confirms the missing findings of res with live reads made after every read of
// w, as Audit documents, and returns res with each finding that is no longer missing judged
// again (dropped if the address is now consistent). It only reads.
func confirmMissing(ctx context.Context, cfg *clusterip.Config, w *world, res result) (result, error) {
	var missing []int
	for i := range res.findings {
		if res.findings[i].Class == Missing {
			missing = append(missing, i)
		}
	}
	if len(missing) == 0 {
		return res, nil
	}
	bulk := len(missing) > confirmByGetLimit

	// The records, read again.
	var ipas map[string]*networkingv1.IPAddress
	if w.mode != featuregate.Legacy {
		ipas = make(map[string]*networkingv1.IPAddress, len(missing))
		if bulk {
			all, err := listIPAddresses(ctx, cfg.Client)
			if err != nil {
				return result{}, fmt.Errorf("repair: confirm missing records: %w", err)
			}
			for _, ipa := range all {
				ipas[ipa.Name] = ipa
			}
		} else {
			for _, i := range missing {
				name := res.findings[i].IP
				ipa, err := cfg.Client.NetworkingV1().IPAddresses().Get(ctx, name, metav1.GetOptions{})
				switch {
				case apierrors.IsNotFound(err):
				case err != nil:
					return result{}, fmt.Errorf("repair: confirm missing IPAddress %s: %w", name, err)
				default:
					ipas[name] = ipa
				}
			}
		}
	}
	var bms []*bitmap.Allocator
	if w.mode != featuregate.IPAddressOnly {
		for i, r := range cfg.Ranges {
			store := cfg.Bitmaps.Store(i)
			b, _, err := bitmap.Load(ctx, store, r, bitmap.WithProjection())
			if err != nil {
				return result{}, fmt.Errorf("repair: confirm missing bits: the bitmap of %s at %s: %w", r, storeName(store), err)
			}
			bms = append(bms, b)
		}
	}
	var inRange []netip.Prefix
	if w.mode != featuregate.Legacy {
		inRange = cidrPrefixes(w.cidrs)
	}
	changed := map[int]*finding{} // index in res.findings → its new finding, nil if none
	var still []int
	for _, i := range missing {
		f := &res.findings[i]
		e := &entry{owner: f.svc, ipa: ipas[f.IP]}
		if f.bm >= 0 && f.bm < len(bms) {
			e.hasBit = bms[f.bm].Has(f.addr)
		}
		nf, ok := judge(w, inRange, f.addr, e)
		switch {
		case ok && nf.Class == Missing:
			still = append(still, i)
		case ok:
			nf.IP = f.IP
			changed[i] = &nf
			still = append(still, i)
		default:
			changed[i] = nil
		}
	}

	// The Services of the findings that remain, read again: one deleted or changed since the
	// List holds nothing now (and its address may already be another Service's).
	var services map[string]*corev1.Service
	if bulk && len(still) > 0 {
		all, err := listServices(ctx, cfg.Client)
		if err != nil {
			return result{}, fmt.Errorf("repair: confirm missing records: %w", err)
		}
		services = make(map[string]*corev1.Service, len(all))
		for _, svc := range all {
			services[serviceKey(svc)] = svc
		}
	}
	for _, i := range still {
		f := &res.findings[i]
		var live *corev1.Service
		if bulk {
			live = services[serviceKey(f.svc)]
		} else {
			svc, err := cfg.Client.CoreV1().Services(f.svc.Namespace).Get(ctx, f.svc.Name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
			case err != nil:
				return result{}, fmt.Errorf("repair: confirm the Service %s of missing %s: %w", serviceKey(f.svc), f.IP, err)
			default:
				live = svc
			}
		}
		if live == nil || live.UID != f.svc.UID || !holds(live, f.addr) {
			changed[i] = nil
		}
	}
	if len(changed) == 0 {
		return res, nil
	}

	out := result{findings: make([]finding, 0, len(res.findings)), counts: maps.Clone(res.counts)}
	for i, f := range res.findings {
		nf, ok := changed[i]
		if !ok {
			out.findings = append(out.findings, f)
			continue
		}
		out.counts[string(Missing)]--
		if out.counts[string(Missing)] == 0 {
			delete(out.counts, string(Missing))
		}
		if nf != nil {
			out.findings = append(out.findings, *nf)
			out.counts[string(nf.Class)]++
		}
	}
	return out, nil
}

// storeName names where store keeps its bitmap, for messages: its Key, such as an
// etcdstore.Store's etcd key, if it has one.
func storeName(store bitmap.Store) string {
	if k, ok := store.(interface{ Key() string }); ok {
		return k.Key()
	}
	return fmt.Sprintf("a %T", store)
}
