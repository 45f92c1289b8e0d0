package repair

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// UpgradeTarget is the kube-apiserver release the upgrade pre-flight (CheckUpgrade) is for: the
// first without the bitmaps and dual write, which emulates only 1.35 to 1.38.
const UpgradeTarget = "1.38"

// UpgradeStatus is the outcome of CheckUpgrade. Its values are stable: they appear in the JSON
// form of a Report.
type UpgradeStatus string

// The outcomes of CheckUpgrade.
const (
	// UpgradeReady: every live kube-apiserver is accounted for and none can write the bitmaps, so
	// a 1.38 server may join.
	UpgradeReady UpgradeStatus = "ready"
	// UpgradeBlocked: a kube-apiserver can still write the bitmaps (it runs, or can be started in,
	// Legacy or DualWrite): it must leave them, by emulating 1.35 or later, before a 1.38 server
	// joins.
	UpgradeBlocked UpgradeStatus = "blocked"
	// UpgradeUnknown: none of the servers read can write the bitmaps, but a server's version could
	// not be read, or the live servers could not all be accounted for.
	UpgradeUnknown UpgradeStatus = "unknown"
)

// UpgradeCheck is the pre-flight of an upgrade to kube-apiserver 1.38: whether any kube-apiserver
// of the cluster can still write the legacy bitmaps, and which. The zero UpgradeCheck is not
// produced by CheckUpgrade; an UpgradeCheck is a plain value, safe to read concurrently.
type UpgradeCheck struct {
	// Target is the release it is for, UpgradeTarget.
	Target string `json:"target"`
	// Status is the outcome.
	Status UpgradeStatus `json:"status"`
	// Detail says why, in one sentence for a person.
	Detail string `json:"detail"`
	// Hazard, when not empty, says that a 1.38 or later kube-apiserver is already live beside a
	// server that can write the bitmaps, and what that risks. Status is then UpgradeBlocked;
	// "clusterip check" counts it as a finding (exit 1).
	Hazard string `json:"hazard,omitempty"`
	// Servers are the servers judged, in the order their versions were read (the kubeconfig's
	// server last, if it was not among them).
	Servers []UpgradeServer `json:"servers"`
}

// UpgradeServer is one kube-apiserver as CheckUpgrade judged it. The zero UpgradeServer names no
// server.
type UpgradeServer struct {
	// Identity is the name of its identity Lease, when its version was read at the Lease's peer
	// address; empty otherwise.
	Identity string `json:"identity,omitempty"`
	// Endpoint is where its version was read (ServerVersion.Endpoint).
	Endpoint string `json:"endpoint"`
	// GitVersion is its binary's version, such as "v1.37.2"; empty if it could not be read.
	GitVersion string `json:"gitVersion,omitempty"`
	// Emulated is the version it emulates, as ServerVersion.Emulated gives it.
	Emulated string `json:"emulated,omitempty"`
	// CanWriteBitmaps reports whether it can run Legacy or DualWrite (ServerVersion.CanWriteBitmaps).
	CanWriteBitmaps bool `json:"canWriteBitmaps"`
	// Reason says why, or why its version is unknown.
	Reason string `json:"reason"`
	// Unknown reports whether its version could not be read or does not parse.
	Unknown bool `json:"unknown,omitempty"`
	// Counted reports whether it is one of the servers the identity Leases (or the endpoints
	// named) account for; false for the kube-apiserver the kubeconfig reaches, which may be any
	// of them behind a load balancer, and is judged only as a possible bitmap writer.
	Counted bool `json:"counted"`
}

// UpgradeEvidence is what CheckUpgrade judges. The zero UpgradeEvidence has no server, which
// CheckUpgrade finds UpgradeUnknown.
type UpgradeEvidence struct {
	// Live are the servers of the identity Leases (LiveAPIServers); nil if the Leases could not
	// be read, in which case the versions read at the endpoints the operator named stand for
	// every server.
	Live []APIServer
	// Versions and Unread are what ReadEachServerVersion returned for Live and the endpoints
	// named.
	Versions []ServerVersion
	Unread   []*VersionReadError
	// Reached, if not nil, is the version of the kube-apiserver the kubeconfig reaches (at its
	// server URL). It is not counted, as it may be any server behind a load balancer, but a
	// bitmap writer there blocks the upgrade all the same.
	Reached *ServerVersion
}

// CheckUpgrade judges whether a kube-apiserver 1.38 may join the cluster that ev describes: 1.38
// has no bitmaps and no dual write, so every server must have left Legacy and DualWrite first.
// It makes no call.
//
//   - UpgradeBlocked if a server read (Versions, or Reached) can write the bitmaps
//     (ServerVersion.CanWriteBitmaps: a binary below 1.38 that emulates below 1.35), each such
//     server named with why; with a Hazard too if a 1.38 or later server is live beside one.
//   - UpgradeUnknown if, short of that, a server's version could not be read or does not parse
//     (each named), or the live servers are not all accounted for, by the rule CheckBitmapWriters
//     applies (a version at every Lease's peer address, else one endpoint named per live
//     server); or if there is no server to judge. Without Live, the endpoints named are taken as
//     every server.
//   - UpgradeReady otherwise.
//
// The answer holds for the moment the versions were read.
func CheckUpgrade(ev UpgradeEvidence) *UpgradeCheck {
	c := &UpgradeCheck{Target: UpgradeTarget, Servers: []UpgradeServer{}}
	identity := map[string]string{} // peer address → the Identity advertising it
	for _, s := range ev.Live {
		if s.PeerAddress != "" {
			identity[s.PeerAddress] = s.Identity
		}
	}
	var writers, removed, unknown []string
	judge := func(v ServerVersion, counted bool) {
		// The kubeconfig's server is named as a writer only when no counted server is: it is
		// likely one of them, reached again through a load balancer.
		nameWriter := counted || len(writers) == 0
		s := UpgradeServer{Identity: identity[v.Endpoint], Endpoint: v.Endpoint, GitVersion: v.Info.GitVersion, Emulated: v.Emulated(), Counted: counted}
		w, err := v.bitmapWriting()
		switch {
		case err != nil:
			s.Unknown = true
			s.Reason = fmt.Sprintf("its /version does not say which version it runs: %v", err)
			unknown = append(unknown, s.name())
		default:
			s.CanWriteBitmaps = w.can
			s.Reason = fmt.Sprintf("kube-apiserver %s: %s", v.version(), w.why())
			if w.can && nameWriter {
				writers = append(writers, fmt.Sprintf("%s (%s)", s.name(), v.version()))
			}
			if w.removed {
				removed = append(removed, fmt.Sprintf("%s (%s)", s.name(), v.Info.GitVersion))
			}
		}
		c.Servers = append(c.Servers, s)
	}
	for _, v := range ev.Versions {
		judge(v, true)
	}
	for _, e := range ev.Unread {
		s := UpgradeServer{Identity: identity[e.Endpoint], Endpoint: e.Endpoint, Unknown: true, Counted: true,
			Reason: fmt.Sprintf("its /version could not be read: %v", e.Err)}
		unknown = append(unknown, s.name())
		c.Servers = append(c.Servers, s)
	}
	if r := ev.Reached; r != nil && !slices.ContainsFunc(c.Servers, func(s UpgradeServer) bool { return sameHost(s.Endpoint, r.Endpoint) }) {
		judge(*r, false)
	}

	switch {
	case len(writers) > 0:
		c.Status = UpgradeBlocked
		c.Detail = fmt.Sprintf("%s can still write the legacy bitmaps: %s; each must emulate 1.35 or later (below it, feature gates can bring Legacy or DualWrite back) before a %s kube-apiserver joins",
			plural(len(writers), "kube-apiserver"), strings.Join(writers, ", "), UpgradeTarget)
		if len(removed) > 0 {
			c.Hazard = fmt.Sprintf("%s already runs beside %s: %s has no bitmaps, so a Legacy server beside it can hand out an address it gave (duplicate ClusterIPs) and a DualWrite server's bitmap falls behind; move the bitmap writers to 1.35 or later now",
				strings.Join(removed, ", "), strings.Join(writers, ", "), UpgradeTarget)
		}
	case len(unknown) > 0:
		c.Status = UpgradeUnknown
		c.Detail = fmt.Sprintf("the version of %s is unknown: %s; none of the others can write the legacy bitmaps", plural(len(unknown), "kube-apiserver"), strings.Join(unknown, ", "))
	default:
		c.Status, c.Detail = accountFor(ev)
	}
	return c
}

// accountFor returns UpgradeReady if ev's versions, none of which can write the bitmaps, account
// for every live server, else UpgradeUnknown, with a sentence saying why.
func accountFor(ev UpgradeEvidence) (UpgradeStatus, string) {
	var counted []string
	for _, v := range ev.Versions {
		counted = append(counted, v.String())
	}
	if len(ev.Live) == 0 {
		if len(ev.Versions) == 0 {
			return UpgradeUnknown, fmt.Sprintf("no live identity Lease of kube-apiserver was read in kube-system (label %s=%s) and no endpoint was named: the servers cannot be counted; name each one with --apiserver-endpoints",
				identityLabel, identityValue)
		}
		return UpgradeReady, fmt.Sprintf("no kube-apiserver named can write the legacy bitmaps (%s), and no identity Lease was read to count the servers: if these are all of them, a %s kube-apiserver may join",
			strings.Join(counted, ", "), UpgradeTarget)
	}
	var refusal *BitmapWriterError
	err := countEndpoints(ev.Live, ev.Versions)
	if !slices.ContainsFunc(ev.Live, func(s APIServer) bool { return s.PeerAddress == "" }) {
		err = coverPeers(ev.Live, ev.Versions)
	}
	if errors.As(err, &refusal) {
		reason := refusal.Reason
		if refusal.Server != "" {
			reason = refusal.Server + ": " + reason
		}
		return UpgradeUnknown, "none of the servers read can write the legacy bitmaps, but not every live kube-apiserver is accounted for: " + reason
	}
	return UpgradeReady, fmt.Sprintf("no kube-apiserver can write the legacy bitmaps: %s by identity Lease, %s: a %s kube-apiserver may join",
		plural(len(ev.Live), "live kube-apiserver"), strings.Join(counted, ", "), UpgradeTarget)
}

// name names s for a sentence: its Identity and Endpoint, or its Endpoint.
func (s UpgradeServer) name() string {
	if s.Identity != "" {
		return s.Identity + " at " + s.Endpoint
	}
	return s.Endpoint
}

// sameHost reports whether endpoints a and b (URLs, or "host:port" as peer addresses are) name
// one host and port.
func sameHost(a, b string) bool { return hostOf(a) == hostOf(b) }

// hostOf returns the "host:port" of endpoint, a URL or a "host:port" already.
func hostOf(endpoint string) string {
	if u, err := url.Parse(endpoint); err == nil && u.Host != "" {
		return u.Host
	}
	return endpoint
}
