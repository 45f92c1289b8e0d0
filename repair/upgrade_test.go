package repair

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/client-go/rest"
)

// TestServerVersionCanWriteBitmapsFollowsBinaryAndEmulation: a server can write the bitmaps when
// its binary has the allocator gates (below 1.38) and its emulated version lets them select
// Legacy or DualWrite (below 1.35); a 1.38 binary never can, whatever it emulates.
func TestServerVersionCanWriteBitmapsFollowsBinaryAndEmulation(t *testing.T) {
	tests := []struct {
		name       string
		v          ServerVersion
		wantBinary string
		want       bool
		wantWhy    string // a part of the reason CheckUpgrade gives
		wantErr    bool
	}{
		{
			name: "v1.33.13: DualWrite by default, Legacy with a gate", v: at("a", "v1.33.13", "1.33"), wantBinary: "1.33", want: true,
			wantWhy: "kube-apiserver v1.33.13 emulating 1.33: below 1.35 it can run Legacy (with --feature-gates=MultiCIDRServiceAllocator=false) or DualWrite (its default), which write the bitmaps",
		},
		{
			name: "v1.37.2 emulating 1.34: DualWrite with DisableAllocatorDualWrite=false", v: at("a", "v1.37.2", "1.34"), wantBinary: "1.37", want: true,
			wantWhy: "kube-apiserver v1.37.2 emulating 1.34: below 1.35 it can run DualWrite (with --feature-gates=DisableAllocatorDualWrite=false), which writes the bitmaps",
		},
		{
			name: "v1.37.2 at 1.37: the gates are locked on", v: at("a", "v1.37.2", "1.37"), wantBinary: "1.37",
			wantWhy: "from 1.35 both allocator gates are locked on",
		},
		{
			name: "v1.34.3, a release not modelled, at 1.34: judged by its emulated version", v: at("a", "v1.34.3", "1.34"), wantBinary: "1.34", want: true,
			wantWhy: "kube-apiserver v1.34.3 emulating 1.34: below 1.35 it can run Legacy or DualWrite",
		},
		{
			name: "v1.30.14 emulates nothing: judged by its own version", v: at("a", "v1.30.14", ""), wantBinary: "1.30", want: true,
			wantWhy: "below 1.35 it can run Legacy or DualWrite",
		},
		{name: "unknown: no version", v: ServerVersion{Endpoint: "a"}, wantErr: true},
		{name: "unknown: an emulation that does not parse", v: at("a", "v1.37.2", "1.x"), wantBinary: "1.37", wantErr: true},
	}
	for _, emulated := range []string{"1.35", "1.36", "1.37", "1.38"} {
		tests = append(tests, struct {
			name       string
			v          ServerVersion
			wantBinary string
			want       bool
			wantWhy    string
			wantErr    bool
		}{
			name: "v1.38.0-beta.0 emulating " + emulated + ": no bitmaps", v: at("a", "v1.38.0-beta.0", emulated), wantBinary: "1.38",
			wantWhy: "1.38 and later have no bitmaps",
		})
	}
	// One that no v1.38 server reports (it emulates 1.35 at the lowest), judged by its binary all
	// the same.
	tests = append(tests, struct {
		name       string
		v          ServerVersion
		wantBinary string
		want       bool
		wantWhy    string
		wantErr    bool
	}{name: "v1.38.0-beta.0 claiming 1.34: its binary decides", v: at("a", "v1.38.0-beta.0", "1.34"), wantBinary: "1.38", wantWhy: "1.38 and later have no bitmaps"})

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.v.Binary(); got != tt.wantBinary {
				t.Errorf("Binary() = %q, want %q", got, tt.wantBinary)
			}
			got, err := tt.v.CanWriteBitmaps()
			if (err != nil) != tt.wantErr {
				t.Fatalf("CanWriteBitmaps() error = %v, want error %t", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("CanWriteBitmaps() = %t, want %t", got, tt.want)
			}
			c := CheckUpgrade(UpgradeEvidence{Versions: []ServerVersion{tt.v}})
			if len(c.Servers) != 1 {
				t.Fatalf("CheckUpgrade() judged %d servers, want 1: %+v", len(c.Servers), c.Servers)
			}
			s := c.Servers[0]
			if s.CanWriteBitmaps != tt.want || s.Unknown != tt.wantErr || !strings.Contains(s.Reason, tt.wantWhy) {
				t.Errorf("CheckUpgrade() judged %+v, want canWriteBitmaps %t, unknown %t, a reason with %q", s, tt.want, tt.wantErr, tt.wantWhy)
			}
		})
	}
}

// TestCheckUpgradeNamesWhatBlocksA138Server is the pre-flight's rule: blocked while a server can
// write the bitmaps (with a hazard if a 1.38 server is already live beside it), unknown while a
// server's version is unknown or not every live server is accounted for, ready otherwise.
func TestCheckUpgradeNamesWhatBlocksA138Server(t *testing.T) {
	const (
		peerA, peerB = "10.0.0.1:6443", "10.0.0.2:6443"
		urlA, urlB   = "https://10.0.0.1:6443", "https://10.0.0.2:6443"
	)
	a, b := APIServer{Identity: "apiserver-a", PeerAddress: peerA}, APIServer{Identity: "apiserver-b", PeerAddress: peerB}
	noPeerA, noPeerB := APIServer{Identity: "apiserver-a"}, APIServer{Identity: "apiserver-b"}
	reached := func(gitVersion, emulated string) *ServerVersion {
		v := at("https://lb.example:6443", gitVersion, emulated)
		return &v
	}
	tests := []struct {
		name       string
		ev         UpgradeEvidence
		want       UpgradeStatus
		wantDetail string // a part of Detail
		wantHazard string // a part of Hazard; "" for none
	}{
		{
			name: "every server at its peer address emulates 1.35 or later: ready",
			ev:   UpgradeEvidence{Live: []APIServer{a, b}, Versions: []ServerVersion{at(peerA, "v1.37.2", "1.37"), at(peerB, "v1.37.2", "1.35")}},
			want: UpgradeReady, wantDetail: "no kube-apiserver can write the legacy bitmaps: 2 live kube-apiservers by identity Lease",
		},
		{
			name: "a server emulating 1.34: blocked, naming it and why",
			ev:   UpgradeEvidence{Live: []APIServer{a, b}, Versions: []ServerVersion{at(peerA, "v1.37.2", "1.37"), at(peerB, "v1.37.2", "1.34")}},
			want: UpgradeBlocked, wantDetail: "1 kube-apiserver can still write the legacy bitmaps: apiserver-b at 10.0.0.2:6443 (v1.37.2 emulating 1.34)",
		},
		{
			name: "v1.33 servers: blocked, naming both",
			ev:   UpgradeEvidence{Live: []APIServer{noPeerA, noPeerB}, Versions: []ServerVersion{at(urlA, "v1.33.13", "1.33"), at(urlB, "v1.33.13", "1.33")}},
			want: UpgradeBlocked, wantDetail: "2 kube-apiservers can still write the legacy bitmaps: https://10.0.0.1:6443 (v1.33.13 emulating 1.33), https://10.0.0.2:6443 (v1.33.13 emulating 1.33)",
		},
		{
			name: "a 1.38 server live beside a 1.34 one: blocked, and a hazard",
			ev:   UpgradeEvidence{Live: []APIServer{a, b}, Versions: []ServerVersion{at(peerA, "v1.38.0-beta.0", "1.38"), at(peerB, "v1.37.2", "1.34")}},
			want: UpgradeBlocked, wantDetail: "apiserver-b at 10.0.0.2:6443 (v1.37.2 emulating 1.34)",
			wantHazard: "apiserver-a at 10.0.0.1:6443 (v1.38.0-beta.0) already runs beside apiserver-b at 10.0.0.2:6443 (v1.37.2 emulating 1.34)",
		},
		{
			name: "1.38 servers beside 1.37 ones at 1.37: ready, no hazard",
			ev:   UpgradeEvidence{Live: []APIServer{a, b}, Versions: []ServerVersion{at(peerA, "v1.38.0-beta.0", "1.37"), at(peerB, "v1.37.2", "1.37")}},
			want: UpgradeReady,
		},
		{
			name: "a server whose /version could not be read: unknown, naming it",
			ev: UpgradeEvidence{Live: []APIServer{a, b}, Versions: []ServerVersion{at(peerA, "v1.37.2", "1.37")},
				Unread: []*VersionReadError{{Endpoint: peerB, Err: errors.New("connection refused")}}},
			want: UpgradeUnknown, wantDetail: "the version of 1 kube-apiserver is unknown: apiserver-b at 10.0.0.2:6443",
		},
		{
			name: "an unread server does not hide a writer: blocked",
			ev: UpgradeEvidence{Live: []APIServer{a, b}, Versions: []ServerVersion{at(peerA, "v1.33.13", "1.33")},
				Unread: []*VersionReadError{{Endpoint: peerB, Err: errors.New("connection refused")}}},
			want: UpgradeBlocked,
		},
		{
			name: "a version that does not parse: unknown",
			ev:   UpgradeEvidence{Live: []APIServer{noPeerA}, Versions: []ServerVersion{at(urlA, "", "")}},
			want: UpgradeUnknown, wantDetail: "the version of 1 kube-apiserver is unknown: https://10.0.0.1:6443",
		},
		{
			name: "a Lease without a peer address and no endpoint named: unknown",
			ev:   UpgradeEvidence{Live: []APIServer{a, noPeerB}},
			want: UpgradeUnknown, wantDetail: "not every live kube-apiserver is accounted for: 2 live kube-apiservers (apiserver-a, apiserver-b), versions read at 0 endpoints",
		},
		{
			name: "... but the kubeconfig's server can write the bitmaps: blocked, naming it",
			ev:   UpgradeEvidence{Live: []APIServer{noPeerA}, Reached: reached("v1.37.2", "1.34")},
			want: UpgradeBlocked, wantDetail: "https://lb.example:6443 (v1.37.2 emulating 1.34)",
		},
		{
			name: "the kubeconfig's server, a writer, beside a counted writer: named once, as the counted one",
			ev:   UpgradeEvidence{Live: []APIServer{a}, Versions: []ServerVersion{at(peerA, "v1.33.13", "1.33")}, Reached: reached("v1.33.13", "1.33")},
			want: UpgradeBlocked, wantDetail: "1 kube-apiserver can still write the legacy bitmaps: apiserver-a at 10.0.0.1:6443 (v1.33.13 emulating 1.33);",
		},
		{
			name: "the kubeconfig's server alone, which cannot: not counted, unknown",
			ev:   UpgradeEvidence{Live: []APIServer{noPeerA}, Reached: reached("v1.37.2", "1.37")},
			want: UpgradeUnknown, wantDetail: "versions read at 0 endpoints",
		},
		{
			name: "one endpoint named per live server: ready",
			ev:   UpgradeEvidence{Live: []APIServer{noPeerA, noPeerB}, Versions: []ServerVersion{at(urlA, "v1.37.2", "1.37"), at(urlB, "v1.36.3", "1.36")}},
			want: UpgradeReady,
		},
		{
			name: "no Lease read, endpoints named: ready, on the operator's word",
			ev:   UpgradeEvidence{Versions: []ServerVersion{at(urlA, "v1.37.2", "1.37")}},
			want: UpgradeReady, wantDetail: "no identity Lease was read to count the servers: if these are all of them",
		},
		{
			name: "nothing to judge: unknown",
			ev:   UpgradeEvidence{},
			want: UpgradeUnknown, wantDetail: "the servers cannot be counted; name each one with --apiserver-endpoints",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := CheckUpgrade(tt.ev)
			if c.Target != "1.38" || c.Status != tt.want || !strings.Contains(c.Detail, tt.wantDetail) {
				t.Errorf("CheckUpgrade() = %s %s: %q; want %s, with %q", c.Target, c.Status, c.Detail, tt.want, tt.wantDetail)
			}
			if (c.Hazard == "") != (tt.wantHazard == "") || !strings.Contains(c.Hazard, tt.wantHazard) {
				t.Errorf("CheckUpgrade() hazard = %q, want %q", c.Hazard, tt.wantHazard)
			}
		})
	}
}

// TestCheckUpgradeReadsEachServerAndFindsTheHazard reads the versions as "clusterip check" does,
// from fake /version answers at the peer addresses of three Leases: a v1.38 server beside a
// v1.37.2 emulating 1.34 is a hazard, the server that does not answer is named, and every server
// is listed with what was read.
func TestCheckUpgradeReadsEachServerAndFindsTheHazard(t *testing.T) {
	serve := func(gitVersion, emulationMinor string) string {
		srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"major":"1","minor":"38","gitVersion":%q,"emulationMajor":"1","emulationMinor":%q}`, gitVersion, emulationMinor)
		}))
		t.Cleanup(srv.Close)
		return srv.Listener.Addr().String()
	}
	peer38, peer34 := serve("v1.38.0-beta.0", "38"), serve("v1.37.2", "34")
	live := []APIServer{{Identity: "a", PeerAddress: peer38}, {Identity: "b", PeerAddress: peer34}, {Identity: "c", PeerAddress: "127.0.0.1:1"}}
	base := &rest.Config{TLSClientConfig: rest.TLSClientConfig{Insecure: true}}

	versions, unread := ReadEachServerVersion(t.Context(), base, live, nil)
	if len(unread) != 1 || unread[0].Endpoint != "127.0.0.1:1" || !strings.HasPrefix(unread[0].Error(), "repair: read the version of the kube-apiserver at 127.0.0.1:1: ") {
		t.Errorf("ReadEachServerVersion() unread = %v, want one *VersionReadError at 127.0.0.1:1", unread)
	}
	c := CheckUpgrade(UpgradeEvidence{Live: live, Versions: versions, Unread: unread})
	if c.Status != UpgradeBlocked || c.Hazard == "" {
		t.Fatalf("CheckUpgrade() = %s, hazard %q; want blocked with a hazard", c.Status, c.Hazard)
	}
	type row struct {
		Identity, GitVersion, Emulated string
		CanWriteBitmaps, Unknown       bool
	}
	var got []row
	for _, s := range c.Servers {
		got = append(got, row{s.Identity, s.GitVersion, s.Emulated, s.CanWriteBitmaps, s.Unknown})
	}
	want := []row{
		{Identity: "a", GitVersion: "v1.38.0-beta.0", Emulated: "1.38"},
		{Identity: "b", GitVersion: "v1.37.2", Emulated: "1.34", CanWriteBitmaps: true},
		{Identity: "c", Unknown: true},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("CheckUpgrade() servers (-want +got):\n%s", diff)
	}
}
