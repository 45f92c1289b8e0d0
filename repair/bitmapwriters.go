package repair

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	k8sfeaturegate "k8s.io/component-base/featuregate"

	"github.com/kube-ipam/clusterip/featuregate"
)

// kube-apiserver's identity Leases (KEP-1965, the APIServerIdentity gate, on by default since
// 1.26): each server keeps one in kube-system, labelled with the identity of its kind of server,
// renews it every 10 s with a duration of an hour, and deletes expired ones hourly.
const (
	identityLabel = "apiserver.kubernetes.io/identity"
	identityValue = "kube-apiserver"
)

// APIServer is a kube-apiserver that its identity Lease says is alive. The zero APIServer names
// no server. An APIServer is a plain value.
type APIServer struct {
	// Identity is the name of its Lease, which kube-apiserver derives from its host name: the same
	// across restarts on one host, so that two servers on one host share one Lease.
	Identity string
	// Holder is the Lease's holderIdentity: the Identity and an ID of the server's current run.
	Holder string
	// Hostname is the host it runs on, the Lease's label kubernetes.io/hostname.
	Hostname string
	// PeerAddress is the "ip:port" its peers reach it at, the Lease's annotation
	// kubernetes.io/peer-advertise-address, which kube-apiserver writes only with its
	// UnknownVersionInteroperabilityProxy gate on (beta, on by default from 1.36, at the
	// server's emulated version); empty otherwise.
	PeerAddress string
	// RenewTime is when it last renewed its Lease; zero if the Lease does not say.
	RenewTime time.Time
	// Expires is RenewTime plus the Lease's duration; zero if the Lease lacks either.
	Expires time.Time
}

// LiveAPIServers returns the kube-apiservers of the cluster client reaches, one per identity
// Lease (namespace kube-system, label apiserver.kubernetes.io/identity=kube-apiserver) whose
// renewTime plus leaseDurationSeconds is after now, sorted by Identity. A Lease that lacks either
// field is counted as live too: what wrote it may be a server, and refusing is the safe side.
//
// kube-apiserver renews its Lease every 10 s for an hour, so a server stopped less than an hour
// ago is still listed, until its Lease expires (or is deleted); and none is listed on a cluster
// whose servers run with the APIServerIdentity gate off. The Leases carry no version: see
// CheckBitmapWriters. It reads the Leases from the API server, a page at a time; API errors are
// wrapped.
func LiveAPIServers(ctx context.Context, client kubernetes.Interface) ([]APIServer, error) {
	leases := client.CoordinationV1().Leases(metav1.NamespaceSystem)
	list := func(ctx context.Context, opts metav1.ListOptions) (*coordinationv1.LeaseList, error) {
		opts.LabelSelector = identityLabel + "=" + identityValue
		return leases.List(ctx, opts)
	}
	all, err := listPages(ctx, "the identity Leases of kube-apiserver in "+metav1.NamespaceSystem, list,
		func(l *coordinationv1.LeaseList) []coordinationv1.Lease { return l.Items })
	if err != nil {
		return nil, err
	}
	now := time.Now()
	var out []APIServer
	for _, l := range all {
		s := APIServer{Identity: l.Name, Hostname: l.Labels[corev1.LabelHostname], PeerAddress: l.Annotations[corev1.AnnotationPeerAdvertiseAddress]}
		if h := l.Spec.HolderIdentity; h != nil {
			s.Holder = *h
		}
		if r := l.Spec.RenewTime; r != nil {
			s.RenewTime = r.Time
			if d := l.Spec.LeaseDurationSeconds; d != nil {
				s.Expires = r.Add(time.Duration(*d) * time.Second)
			}
		}
		if s.Expires.IsZero() || s.Expires.After(now) {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b APIServer) int { return cmp.Compare(a.Identity, b.Identity) })
	return out, nil
}

// ServerVersion is a kube-apiserver's answer to GET /version, and where it was read. The zero
// ServerVersion has no version, which CheckBitmapWriters refuses. A ServerVersion is a plain
// value.
type ServerVersion struct {
	// Endpoint is where it was read: an APIServer's PeerAddress, as the Lease gives it, or an
	// endpoint the operator named, such as "https://10.0.0.2:6443".
	Endpoint string
	// Info is the answer: GitVersion and, from 1.31, EmulationMajor and EmulationMinor.
	Info version.Info
}

// Emulated returns the version whose behaviour the server has: the version it emulates as
// "major.minor" (its --emulated-version, by default its own minor), which /version reports from
// 1.31, else its GitVersion, such as "v1.30.4".
func (v ServerVersion) Emulated() string {
	if v.Info.EmulationMajor != "" && v.Info.EmulationMinor != "" {
		return v.Info.EmulationMajor + "." + v.Info.EmulationMinor
	}
	return v.Info.GitVersion
}

// Binary returns the release of the server's binary as "major.minor", such as "1.37" for
// GitVersion "v1.37.2" and "1.38" for "v1.38.0-beta.0", whatever version it emulates; "" if its
// GitVersion does not parse.
func (v ServerVersion) Binary() string {
	bin, err := utilversion.ParseGeneric(v.Info.GitVersion)
	if err != nil {
		return ""
	}
	return utilversion.MajorMinor(bin.Major(), bin.Minor()).String()
}

// CanWriteBitmaps reports whether the server can run in a Mode that writes the bitmaps, Legacy or
// DualWrite, by default or with some --feature-gates (/version does not say which gates it
// runs with): never for a 1.38 or later binary, which has no bitmaps whatever it emulates
// (featuregate.HasAllocatorGates); otherwise as its binary and emulated version let the gates
// that select such a Mode (featuregate.GatesAt) be set, neither locked against them nor unknown
// in the specs featuregate.NewGate gives it, which they are only below 1.35. A
// binary whose release the library does not model (1.34, or before 1.33) is judged by the
// version it emulates alone (featuregate.CanWriteBitmaps). It returns an error if the GitVersion
// or the emulated version does not parse.
func (v ServerVersion) CanWriteBitmaps() (bool, error) {
	w, err := v.bitmapWriting()
	if err != nil {
		return false, err
	}
	return w.can, nil
}

// bitmapWriting is what a server's version says of its writing the bitmaps.
type bitmapWriting struct {
	can bool
	// removed: the binary is 1.38 or later, which has no bitmaps.
	removed bool
	// modes are the Modes that write the bitmaps which the server can run, each with the
	// --feature-gates that select it ("" for its default); nil when the binary's release is
	// not modelled and can says only that some can.
	modes []writerMode
}

// writerMode is a Mode that writes the bitmaps and the --feature-gates that select it.
type writerMode struct {
	mode  featuregate.Mode
	gates string // "DisableAllocatorDualWrite=false", or "" for the default
}

// bitmapWriting judges v: see CanWriteBitmaps.
func (v ServerVersion) bitmapWriting() (bitmapWriting, error) {
	bin, err := utilversion.ParseGeneric(v.Info.GitVersion)
	if err != nil {
		return bitmapWriting{}, fmt.Errorf("gitVersion %q: %w", v.Info.GitVersion, err)
	}
	if !featuregate.HasAllocatorGates(bin) {
		return bitmapWriting{removed: true}, nil
	}
	emulated := ""
	if v.Info.EmulationMajor != "" || v.Info.EmulationMinor != "" {
		emulated = v.Emulated()
		if _, err := utilversion.ParseGeneric(emulated); err != nil {
			return bitmapWriting{}, fmt.Errorf("emulation version %q.%q: %w", v.Info.EmulationMajor, v.Info.EmulationMinor, err)
		}
	}
	ev, err := featuregate.KubeVersion(v.Info.GitVersion, emulated)
	if err != nil {
		// A release the library does not model: its emulated version decides, by the gates'
		// versioned specs, which every release up to 1.37 shares.
		can, err := featuregate.CanWriteBitmaps(v.Emulated())
		return bitmapWriting{can: can}, err
	}
	// The gates as v runs them by default, with the specs its binary declares at the version it
	// emulates. Each Mode's gates are checked against those specs rather than set, as NewGate
	// would set them: component-base logs a warning for every GA gate set off its default.
	defaults, err := featuregate.NewGate(ev, nil)
	if err != nil {
		return bitmapWriting{}, err
	}
	def, err := featuregate.ModeAt(ev, defaults)
	if err != nil {
		return bitmapWriting{}, err
	}
	specs := defaults.DeepCopy().GetAll()
	var w bitmapWriting
	for _, m := range []featuregate.Mode{featuregate.Legacy, featuregate.DualWrite} {
		gates, err := featuregate.GatesAt(ev, m)
		if err != nil {
			return bitmapWriting{}, err
		}
		wm, ok := writerMode{mode: m}, true
		var set []string
		for _, name := range slices.Sorted(maps.Keys(gates)) {
			spec, known := specs[k8sfeaturegate.Feature(name)]
			switch {
			case !known, spec.LockToDefault && spec.Default != gates[name]:
				ok = false // refused at start-up: a gate it does not have, or a lock
			case defaults.Enabled(k8sfeaturegate.Feature(name)) != gates[name]:
				set = append(set, fmt.Sprintf("%s=%t", name, gates[name]))
			}
		}
		if !ok {
			continue
		}
		if def != m {
			wm.gates = strings.Join(set, ",")
		}
		w.modes = append(w.modes, wm)
	}
	w.can = len(w.modes) > 0
	return w, nil
}

// why says, after "kube-apiserver <version>: ", why w can or cannot write the bitmaps.
func (w bitmapWriting) why() string {
	switch {
	case w.removed:
		return "1.38 and later have no bitmaps: MultiCIDRServiceAllocator and DisableAllocatorDualWrite are gone, and it runs IPAddressOnly only, whatever it emulates"
	case !w.can:
		return "from 1.35 both allocator gates are locked on: it runs IPAddressOnly, whatever its flags say"
	case w.modes == nil:
		return "below 1.35 it can run Legacy or DualWrite, which write the bitmaps"
	}
	ms := make([]string, len(w.modes))
	for i, m := range w.modes {
		ms[i] = m.mode.String()
		if m.gates == "" {
			ms[i] += " (its default)"
		} else {
			ms[i] += " (with --feature-gates=" + m.gates + ")"
		}
	}
	verb := "writes"
	if len(ms) > 1 {
		verb = "write"
	}
	return fmt.Sprintf("below 1.35 it can run %s, which %s the bitmaps", strings.Join(ms, " or "), verb)
}

// String describes v for messages: "v1.37.2 emulating 1.34 at 10.0.0.2:6443".
func (v ServerVersion) String() string { return v.version() + " at " + v.Endpoint }

// version describes the version of v: "v1.37.2 emulating 1.34", or "v1.30.14" before 1.31.
func (v ServerVersion) version() string {
	s := v.Info.GitVersion
	if e := v.Emulated(); e != s {
		s += " emulating " + e
	}
	return s
}

// ReadServerVersions reads GET /version of the servers CheckBitmapWriters accounts live by: at
// the PeerAddress of each server of live if every one has one, and at each of endpoints (URLs
// such as "https://10.0.0.2:6443", named by the operator) in any case, in that order. Each is
// reached with base's credentials and TLS settings, its Host replaced (a peer address "ip:port"
// as https://ip:port), one at a time. It returns the first error, naming where it was reading.
func ReadServerVersions(ctx context.Context, base *rest.Config, live []APIServer, endpoints []string) ([]ServerVersion, error) {
	at := versionEndpoints(live, endpoints)
	out := make([]ServerVersion, 0, len(at))
	for _, endpoint := range at {
		info, err := readVersion(ctx, base, endpoint)
		if err != nil {
			return nil, fmt.Errorf("repair: read the version of the kube-apiserver at %s: %w", endpoint, err)
		}
		out = append(out, ServerVersion{Endpoint: endpoint, Info: *info})
	}
	return out, nil
}

// VersionReadError reports a kube-apiserver whose /version could not be read. Test for it with
// errors.As.
type VersionReadError struct {
	// Endpoint is where it was read, as ServerVersion.Endpoint.
	Endpoint string
	// Err is why it could not be.
	Err error
}

// Error implements error.
func (e *VersionReadError) Error() string {
	return fmt.Sprintf("repair: read the version of the kube-apiserver at %s: %v", e.Endpoint, e.Err)
}

// Unwrap returns Err.
func (e *VersionReadError) Unwrap() error { return e.Err }

// ReadEachServerVersion reads GET /version where ReadServerVersions does, in the same order and
// with the same credentials, but goes on past a server that does not answer: it returns the
// versions read and a *VersionReadError for each endpoint that could not be, in order. It is for
// a report that names every server it could not read (CheckUpgrade); a decision that needs every
// answer uses ReadServerVersions.
func ReadEachServerVersion(ctx context.Context, base *rest.Config, live []APIServer, endpoints []string) ([]ServerVersion, []*VersionReadError) {
	at := versionEndpoints(live, endpoints)
	var (
		out    = make([]ServerVersion, 0, len(at))
		failed []*VersionReadError
	)
	for _, endpoint := range at {
		info, err := readVersion(ctx, base, endpoint)
		if err != nil {
			failed = append(failed, &VersionReadError{Endpoint: endpoint, Err: err})
			continue
		}
		out = append(out, ServerVersion{Endpoint: endpoint, Info: *info})
	}
	return out, failed
}

// versionEndpoints returns where the versions of the servers are read: the PeerAddress of each
// of live if every one has one, then each of endpoints.
func versionEndpoints(live []APIServer, endpoints []string) []string {
	var at []string
	if len(live) > 0 && !slices.ContainsFunc(live, func(s APIServer) bool { return s.PeerAddress == "" }) {
		for _, s := range live {
			at = append(at, s.PeerAddress)
		}
	}
	return append(at, endpoints...)
}

// readVersion reads GET /version at endpoint, a URL or "host:port", with base's credentials.
func readVersion(ctx context.Context, base *rest.Config, endpoint string) (*version.Info, error) {
	cfg := rest.CopyConfig(base)
	cfg.Host = endpoint
	if !strings.Contains(endpoint, "://") {
		cfg.Host = "https://" + endpoint
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	body, err := dc.RESTClient().Get().AbsPath("/version").Do(ctx).Raw()
	if err != nil {
		return nil, err
	}
	var info version.Info
	if err := json.Unmarshal(body, &info); err != nil {
		return nil, fmt.Errorf("not a version: %w", err)
	}
	return &info, nil
}

// BitmapWriterError is why CheckBitmapWriters refuses: a kube-apiserver may still write the
// bitmaps, or not every live one is accounted for. Test for it with errors.As.
type BitmapWriterError struct {
	// Server names the server concerned: its Identity, or the Endpoint its version was read at.
	// Empty when the refusal concerns no one server (the count of servers, say).
	Server string
	// Reason says why, for a person.
	Reason string
}

// Error implements error.
func (e *BitmapWriterError) Error() string {
	if e.Server == "" {
		return "repair: a kube-apiserver may still write the bitmaps: " + e.Reason
	}
	return fmt.Sprintf("repair: a kube-apiserver may still write the bitmaps: %s: %s", e.Server, e.Reason)
}

// CheckBitmapWriters returns nil if no kube-apiserver of the cluster can write the bitmaps again:
// if every live server (see LiveAPIServers) is accounted for by a version in versions, and every
// version in versions cannot write them (ServerVersion.CanWriteBitmaps): a 1.38 or later binary,
// which has no bitmaps, or one that emulates 1.35 or later, at which both allocator gates are
// locked on and kube-apiserver runs IPAddressOnly whatever its flags say. Otherwise it returns a *BitmapWriterError naming the server and why. It makes no call.
//
// The Leases carry no version, so versions are read from the servers, and accounted for so:
//
//   - If every live server has a PeerAddress, versions must hold one read at each PeerAddress
//     (Endpoint equal to it). Two live servers at one address are refused: one answer cannot
//     stand for both, and a server stopped less than an hour ago keeps its Lease.
//   - Otherwise the operator names the servers' endpoints, and versions must hold as many
//     answers, at distinct endpoints, as there are live servers. That is the operator vouching
//     that the list is complete and that each endpoint is one server, not a load balancer that
//     answers for several (which would let a server go unread).
//
// Versions beyond those are judged too: any that can write the bitmaps refuses. No live server
// at all is refused: without identity Leases (the APIServerIdentity gate off) the servers cannot
// be counted. Servers on one host share one Lease, and so count as one: the rule assumes one
// kube-apiserver per host, as control planes run them.
//
// The answer holds for the moment the versions were read: a server started, or downgraded, later
// is not seen. RemoveStaleBitmaps deletes each bitmap only at the revision the audit read, so a
// bitmap written since is kept.
func CheckBitmapWriters(live []APIServer, versions []ServerVersion) error {
	if len(live) == 0 {
		return &BitmapWriterError{Reason: fmt.Sprintf("no live identity Lease of kube-apiserver in %s (label %s=%s): the servers cannot be counted (is the APIServerIdentity feature gate off?)",
			metav1.NamespaceSystem, identityLabel, identityValue)}
	}
	for _, v := range versions {
		w, err := v.bitmapWriting()
		switch {
		case err != nil:
			return &BitmapWriterError{Server: v.Endpoint, Reason: fmt.Sprintf("its /version (gitVersion %q, emulation %q.%q) does not say which version it emulates: %v",
				v.Info.GitVersion, v.Info.EmulationMajor, v.Info.EmulationMinor, err)}
		case w.can:
			return &BitmapWriterError{Server: v.Endpoint, Reason: fmt.Sprintf("kube-apiserver %s: %s", v.version(), w.why())}
		}
	}
	if slices.ContainsFunc(live, func(s APIServer) bool { return s.PeerAddress == "" }) {
		return countEndpoints(live, versions)
	}
	return coverPeers(live, versions)
}

// coverPeers returns a *BitmapWriterError unless versions holds a version read at the
// PeerAddress of each server of live, every one of which has one, at distinct addresses.
func coverPeers(live []APIServer, versions []ServerVersion) error {
	at := map[string]string{} // peer address → the Identity advertising it
	for _, s := range live {
		if other, ok := at[s.PeerAddress]; ok {
			return &BitmapWriterError{Server: s.Identity, Reason: fmt.Sprintf("it and %s both advertise the peer address %s: one answer cannot account for two servers (a Lease stays live for an hour after its server stops; delete one that is stale)",
				other, s.PeerAddress)}
		}
		at[s.PeerAddress] = s.Identity
		if !slices.ContainsFunc(versions, func(v ServerVersion) bool { return v.Endpoint == s.PeerAddress }) {
			return &BitmapWriterError{Server: s.Identity, Reason: fmt.Sprintf("its version was not read at its peer address %s", s.PeerAddress)}
		}
	}
	return nil
}

// countEndpoints returns a *BitmapWriterError unless versions were read at as many distinct
// endpoints as there are servers in live, some of which advertise no peer address.
func countEndpoints(live []APIServer, versions []ServerVersion) error {
	var without []string
	for _, s := range live {
		if s.PeerAddress == "" {
			without = append(without, s.Identity)
		}
	}
	seen := map[string]bool{}
	for _, v := range versions {
		if seen[v.Endpoint] {
			return &BitmapWriterError{Server: v.Endpoint, Reason: "the endpoint is named twice: each endpoint must be one server"}
		}
		seen[v.Endpoint] = true
	}
	if len(versions) != len(live) {
		return &BitmapWriterError{Reason: fmt.Sprintf("%s (%s), versions read at %s: the Leases of %s carry no peer address, so name one endpoint per server, each one server and not a load balancer",
			plural(len(live), "live kube-apiserver"), identities(live), plural(len(versions), "endpoint"), strings.Join(without, ", "))}
	}
	return nil
}

// identities lists the Identity of each server of live, comma-separated.
func identities(live []APIServer) string {
	ids := make([]string, len(live))
	for i, s := range live {
		ids[i] = s.Identity
	}
	return strings.Join(ids, ", ")
}

// plural returns "1 thing" or "n things".
func plural(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}
