package repair

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// identityLease returns the identity Lease kube-apiserver identity keeps, renewed renewedAgo
// ago for an hour, as kube-apiserver writes it, with peer as its peer address ("" for none).
func identityLease(identity, peer string, renewedAgo time.Duration) *coordinationv1.Lease {
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: identity,
			Labels: map[string]string{identityLabel: identityValue, corev1.LabelHostname: "host-" + identity}},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(identity + "_8d7b5a0e"),
			LeaseDurationSeconds: ptr.To[int32](3600),
			RenewTime:            &metav1.MicroTime{Time: time.Now().Add(-renewedAgo)},
		},
	}
	if peer != "" {
		l.Annotations = map[string]string{corev1.AnnotationPeerAdvertiseAddress: peer}
	}
	return l
}

// at returns the version of kube-apiserver gitVersion emulating emulated ("" for none, as before
// 1.31) as read at endpoint.
func at(endpoint, gitVersion, emulated string) ServerVersion {
	v := ServerVersion{Endpoint: endpoint, Info: version.Info{GitVersion: gitVersion}}
	if major, minor, ok := strings.Cut(emulated, "."); ok {
		v.Info.EmulationMajor, v.Info.EmulationMinor = major, minor
	}
	return v
}

// TestBitmapsAreLeftWhileAServerMayWriteThem is the accounting rule of CheckBitmapWriters, from
// the identity Leases (through LiveAPIServers) and the versions the servers reported: every live
// server must be accounted for by a version that emulates 1.35 or later, read at its peer
// address when every Lease has one, else at as many endpoints, named by the operator, as there
// are live servers.
func TestBitmapsAreLeftWhileAServerMayWriteThem(t *testing.T) {
	const (
		peerA, peerB = "10.0.0.1:6443", "10.0.0.2:6443"
		urlA, urlB   = "https://10.0.0.1:6443", "https://10.0.0.2:6443"
		fresh        = 10 * time.Second
	)
	tests := []struct {
		name     string
		leases   []runtime.Object
		versions []ServerVersion
		// want is the refusal, its Reason a part of the one expected; nil: allowed.
		want *BitmapWriterError
	}{
		{
			name:     "every server read at its peer address emulates 1.35 or later: allowed",
			leases:   []runtime.Object{identityLease("apiserver-a", peerA, fresh), identityLease("apiserver-b", peerB, fresh)},
			versions: []ServerVersion{at(peerA, "v1.37.2", "1.37"), at(peerB, "v1.37.2", "1.35")},
		},
		{
			name:     "a server emulating 1.34: refused, naming it",
			leases:   []runtime.Object{identityLease("apiserver-a", peerA, fresh), identityLease("apiserver-b", peerB, fresh)},
			versions: []ServerVersion{at(peerA, "v1.37.2", "1.37"), at(peerB, "v1.37.2", "1.34")},
			want:     &BitmapWriterError{Server: peerB, Reason: "kube-apiserver v1.37.2 emulating 1.34: below 1.35 it can run DualWrite (with --feature-gates=DisableAllocatorDualWrite=false)"},
		},
		{
			name:     "a v1.38 server is never a bitmap writer, whatever it emulates: allowed",
			leases:   []runtime.Object{identityLease("apiserver-a", peerA, fresh), identityLease("apiserver-b", peerB, fresh)},
			versions: []ServerVersion{at(peerA, "v1.38.0-beta.0", "1.35"), at(peerB, "v1.38.0-beta.0", "1.34")},
		},
		{
			name:     "a v1.38 server beside a v1.33 one: refused, naming the v1.33 one",
			leases:   []runtime.Object{identityLease("apiserver-a", peerA, fresh), identityLease("apiserver-b", peerB, fresh)},
			versions: []ServerVersion{at(peerA, "v1.38.0-beta.0", "1.38"), at(peerB, "v1.33.13", "1.33")},
			want:     &BitmapWriterError{Server: peerB, Reason: "kube-apiserver v1.33.13 emulating 1.33: below 1.35 it can run Legacy"},
		},
		{
			name:     "a server whose version was not read at its peer address: refused, naming it",
			leases:   []runtime.Object{identityLease("apiserver-a", peerA, fresh), identityLease("apiserver-b", peerB, fresh)},
			versions: []ServerVersion{at(peerA, "v1.37.2", "1.37")},
			want:     &BitmapWriterError{Server: "apiserver-b", Reason: "its version was not read at its peer address 10.0.0.2:6443"},
		},
		{
			name:     "an expired Lease is no server",
			leases:   []runtime.Object{identityLease("apiserver-a", peerA, fresh), identityLease("apiserver-old", "", 61*time.Minute)},
			versions: []ServerVersion{at(peerA, "v1.37.2", "1.37")},
		},
		{
			name:     "a Lease without a peer address and no endpoints named: refused",
			leases:   []runtime.Object{identityLease("apiserver-a", peerA, fresh), identityLease("apiserver-b", "", fresh)},
			versions: nil,
			want:     &BitmapWriterError{Reason: "2 live kube-apiservers (apiserver-a, apiserver-b), versions read at 0 endpoints: the Leases of apiserver-b carry no peer address"},
		},
		{
			name:     "Leases without peer addresses, one endpoint per live server, all 1.35 or later: allowed",
			leases:   []runtime.Object{identityLease("apiserver-a", "", fresh), identityLease("apiserver-b", "", fresh)},
			versions: []ServerVersion{at(urlA, "v1.37.2", "1.37"), at(urlB, "v1.36.3", "1.36")},
		},
		{
			name:     "one endpoint per live server, one emulating 1.34: refused, naming it",
			leases:   []runtime.Object{identityLease("apiserver-a", "", fresh), identityLease("apiserver-b", "", fresh)},
			versions: []ServerVersion{at(urlA, "v1.37.2", "1.37"), at(urlB, "v1.37.2", "1.34")},
			want:     &BitmapWriterError{Server: urlB, Reason: "emulating 1.34"},
		},
		{
			name:     "fewer endpoints than live servers: refused",
			leases:   []runtime.Object{identityLease("apiserver-a", "", fresh), identityLease("apiserver-b", "", fresh)},
			versions: []ServerVersion{at(urlA, "v1.37.2", "1.37")},
			want:     &BitmapWriterError{Reason: "2 live kube-apiservers (apiserver-a, apiserver-b), versions read at 1 endpoint:"},
		},
		{
			name:     "more endpoints than live servers: refused",
			leases:   []runtime.Object{identityLease("apiserver-a", "", fresh)},
			versions: []ServerVersion{at(urlA, "v1.37.2", "1.37"), at(urlB, "v1.37.2", "1.37")},
			want:     &BitmapWriterError{Reason: "1 live kube-apiserver (apiserver-a), versions read at 2 endpoints"},
		},
		{
			name:     "an endpoint named twice: refused",
			leases:   []runtime.Object{identityLease("apiserver-a", "", fresh), identityLease("apiserver-b", "", fresh)},
			versions: []ServerVersion{at(urlA, "v1.37.2", "1.37"), at(urlA, "v1.37.2", "1.37")},
			want:     &BitmapWriterError{Server: urlA, Reason: "the endpoint is named twice"},
		},
		{
			name:     "endpoints named beside peer addresses are judged too",
			leases:   []runtime.Object{identityLease("apiserver-a", peerA, fresh)},
			versions: []ServerVersion{at(peerA, "v1.37.2", "1.37"), at(urlB, "v1.33.13", "1.33")},
			want:     &BitmapWriterError{Server: urlB, Reason: "emulating 1.33"},
		},
		{
			name:     "two live Leases advertising one peer address: refused",
			leases:   []runtime.Object{identityLease("apiserver-a", peerA, fresh), identityLease("apiserver-b", peerA, 30*time.Minute)},
			versions: []ServerVersion{at(peerA, "v1.37.2", "1.37")},
			want:     &BitmapWriterError{Server: "apiserver-b", Reason: "it and apiserver-a both advertise the peer address 10.0.0.1:6443"},
		},
		{
			name:     "no live Lease: refused, the servers cannot be counted",
			leases:   []runtime.Object{identityLease("apiserver-old", peerA, 2*time.Hour)},
			versions: []ServerVersion{at(peerA, "v1.37.2", "1.37")},
			want:     &BitmapWriterError{Reason: "no live identity Lease of kube-apiserver in kube-system"},
		},
		{
			name: "a Lease without renewTime counts as live",
			leases: []runtime.Object{identityLease("apiserver-a", peerA, fresh), func() runtime.Object {
				l := identityLease("apiserver-b", "", 0)
				l.Spec.RenewTime = nil
				return l
			}()},
			versions: []ServerVersion{at(peerA, "v1.37.2", "1.37")},
			want:     &BitmapWriterError{Reason: "2 live kube-apiservers (apiserver-a, apiserver-b)"},
		},
		{
			name: "Leases of other components, or elsewhere, are no kube-apiservers",
			leases: []runtime.Object{identityLease("apiserver-a", peerA, fresh), func() runtime.Object {
				l := identityLease("kube-controller-manager", "", fresh) // a leader-election Lease
				l.Labels = nil
				return l
			}(), func() runtime.Object {
				l := identityLease("apiserver-c", "", fresh)
				l.Namespace = "default"
				return l
			}()},
			versions: []ServerVersion{at(peerA, "v1.37.2", "1.37")},
		},
		{
			name:     "a server before 1.31 reports no emulation: judged by its own version",
			leases:   []runtime.Object{identityLease("apiserver-a", "", fresh)},
			versions: []ServerVersion{at(urlA, "v1.30.14", "")},
			want:     &BitmapWriterError{Server: urlA, Reason: "kube-apiserver v1.30.14: below 1.35"},
		},
		{
			name:     "a version that does not parse: refused",
			leases:   []runtime.Object{identityLease("apiserver-a", "", fresh)},
			versions: []ServerVersion{at(urlA, "", "")},
			want:     &BitmapWriterError{Server: urlA, Reason: "does not say which version it emulates"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			live, err := LiveAPIServers(t.Context(), fake.NewClientset(tt.leases...))
			if err != nil {
				t.Fatalf("LiveAPIServers() error = %v", err)
			}
			err = CheckBitmapWriters(live, tt.versions)
			var got *BitmapWriterError
			switch {
			case tt.want == nil && err != nil:
				t.Fatalf("CheckBitmapWriters() = %v, want nil", err)
			case tt.want == nil:
			case !errors.As(err, &got):
				t.Fatalf("CheckBitmapWriters() = %v, want a *BitmapWriterError", err)
			case got.Server != tt.want.Server || !strings.Contains(got.Reason, tt.want.Reason):
				t.Errorf("CheckBitmapWriters() refused %q: %q; want %q: ...%q...", got.Server, got.Reason, tt.want.Server, tt.want.Reason)
			}
		})
	}
}

// TestLiveAPIServersReadsWhatTheLeasesSay: each live identity Lease gives one APIServer, sorted
// by identity, with its holder, host, peer address and times as the Lease has them.
func TestLiveAPIServersReadsWhatTheLeasesSay(t *testing.T) {
	b := identityLease("apiserver-b", "10.0.0.2:6443", 5*time.Second)
	a := identityLease("apiserver-a", "", 20*time.Second)
	live, err := LiveAPIServers(t.Context(), fake.NewClientset(b, a))
	if err != nil {
		t.Fatal(err)
	}
	want := []APIServer{
		{Identity: "apiserver-a", Holder: "apiserver-a_8d7b5a0e", Hostname: "host-apiserver-a",
			RenewTime: a.Spec.RenewTime.Time, Expires: a.Spec.RenewTime.Add(time.Hour)},
		{Identity: "apiserver-b", Holder: "apiserver-b_8d7b5a0e", Hostname: "host-apiserver-b", PeerAddress: "10.0.0.2:6443",
			RenewTime: b.Spec.RenewTime.Time, Expires: b.Spec.RenewTime.Add(time.Hour)},
	}
	if diff := cmp.Diff(want, live); diff != "" {
		t.Errorf("LiveAPIServers() (-want +got):\n%s", diff)
	}
}

func TestServerVersionEmulatedIsTheEmulationVersionElseTheBinarys(t *testing.T) {
	tests := []struct {
		v    ServerVersion
		want string
	}{
		{at("a", "v1.37.2", "1.34"), "1.34"},
		{at("a", "v1.37.2", "1.37"), "1.37"},
		{at("a", "v1.30.14", ""), "v1.30.14"},
		{ServerVersion{}, ""},
	}
	for _, tt := range tests {
		if got := tt.v.Emulated(); got != tt.want {
			t.Errorf("%+v.Emulated() = %q, want %q", tt.v.Info, got, tt.want)
		}
	}
}

// TestReadServerVersionsReadsWhereTheAccountingRuleLooks: the versions are read at the peer
// addresses when every live server has one, and at the endpoints named in any case; a server
// that does not answer is an error naming where it was read.
func TestReadServerVersionsReadsWhereTheAccountingRuleLooks(t *testing.T) {
	serve := func(gitVersion, minor string) string {
		srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/version" {
				http.NotFound(w, r)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"major":"1","minor":%q,"gitVersion":%q,"emulationMajor":"1","emulationMinor":%q}`, minor, gitVersion, minor)
		}))
		t.Cleanup(srv.Close)
		return srv.Listener.Addr().String()
	}
	peer37, peer35, endpoint36 := serve("v1.37.2", "37"), serve("v1.35.4", "35"), "https://"+serve("v1.36.3", "36")
	base := &rest.Config{TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
	tests := []struct {
		name      string
		live      []APIServer
		endpoints []string
		want      []ServerVersion
		wantErr   string
	}{
		{
			name: "every server has a peer address: read there",
			live: []APIServer{{Identity: "a", PeerAddress: peer37}, {Identity: "b", PeerAddress: peer35}},
			want: []ServerVersion{at(peer37, "v1.37.2", "1.37"), at(peer35, "v1.35.4", "1.35")},
		},
		{
			name:      "and at the endpoints named besides",
			live:      []APIServer{{Identity: "a", PeerAddress: peer37}},
			endpoints: []string{endpoint36},
			want:      []ServerVersion{at(peer37, "v1.37.2", "1.37"), at(endpoint36, "v1.36.3", "1.36")},
		},
		{
			name:      "a server without one: at the endpoints only",
			live:      []APIServer{{Identity: "a", PeerAddress: peer37}, {Identity: "b"}},
			endpoints: []string{endpoint36},
			want:      []ServerVersion{at(endpoint36, "v1.36.3", "1.36")},
		},
		{
			name:    "a peer address that does not answer: an error naming it",
			live:    []APIServer{{Identity: "a", PeerAddress: "127.0.0.1:1"}},
			wantErr: "repair: read the version of the kube-apiserver at 127.0.0.1:1: ",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ReadServerVersions(t.Context(), base, tt.live, tt.endpoints)
			if tt.wantErr != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tt.wantErr) {
					t.Fatalf("ReadServerVersions() = %v, want an error beginning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			ignoreMajorMinor := cmpopts.IgnoreFields(version.Info{}, "Major", "Minor")
			if diff := cmp.Diff(tt.want, got, ignoreMajorMinor); diff != "" {
				t.Errorf("ReadServerVersions() (-want +got):\n%s", diff)
			}
		})
	}
}
