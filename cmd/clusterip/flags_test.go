package main

import (
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kube-ipam/clusterip/reservation"
)

// kubectlFlags are the connection flags every verb that talks to kube-apiserver takes, as
// kubectl names them.
var kubectlFlags = []string{"kubeconfig", "context", "cluster", "user", "server", "tls-server-name", "certificate-authority",
	"client-certificate", "client-key", "token", "as", "as-group", "as-uid", "insecure-skip-tls-verify", "disable-compression", "request-timeout"}

// apiVerbs are the verbs that talk to kube-apiserver.
var apiVerbs = [][]string{{"check"}, {"repair"}, {"reservations", "list"}, {"reservations", "create"}, {"reservations", "delete"}, {"reservations", "webhook"}}

// TestConnectionFlagsAreKubectlsOnEveryVerb: every verb that talks to kube-apiserver has each of
// kubectl's connection flags, with the same type, default and help everywhere.
func TestConnectionFlagsAreKubectlsOnEveryVerb(t *testing.T) {
	root := newRootCommand("clusterip", io.Discard, io.Discard)
	type flag struct{ Shorthand, Type, Default, Usage string }
	var first map[string]flag
	for _, path := range apiVerbs {
		cmd, _, err := root.Find(path)
		if err != nil {
			t.Fatalf("find %q: %v", path, err)
		}
		got := map[string]flag{}
		for _, name := range kubectlFlags {
			f := cmd.Flags().Lookup(name)
			if f == nil {
				f = cmd.InheritedFlags().Lookup(name)
			}
			if f == nil {
				t.Errorf("clusterip %s has no --%s", strings.Join(path, " "), name)
				continue
			}
			got[name] = flag{f.Shorthand, f.Value.Type(), f.DefValue, f.Usage}
		}
		if first == nil {
			first = got
			continue
		}
		if diff := cmp.Diff(first, got); diff != "" {
			t.Errorf("clusterip %s: connection flags differ from clusterip %s's (-check +this):\n%s", strings.Join(path, " "), strings.Join(apiVerbs[0], " "), diff)
		}
	}
	if f := first["request-timeout"]; f.Default != "10s" {
		t.Errorf("--request-timeout defaults to %q, want 10s", f.Default)
	}
	if f := first["server"]; f.Shorthand != "s" {
		t.Errorf("--server has shorthand %q, want kubectl's s", f.Shorthand)
	}
}

func TestRequestTimeoutIsReadAsKubectlReadsIt(t *testing.T) {
	tests := []struct {
		value   string
		want    time.Duration
		wantErr bool
	}{
		{value: "0", want: 0}, // none
		{value: "10s", want: 10 * time.Second},
		{value: "5", want: 5 * time.Second}, // whole seconds
		{value: "1m30s", want: 90 * time.Second},
		{value: "soon", wantErr: true},
		{value: "-1s", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			kube := newKubeFlags()
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			kube.addFlags(fs)
			if err := fs.Parse([]string{"--request-timeout", tt.value}); err != nil {
				t.Fatal(err)
			}
			got, err := requestTimeout(kube)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("requestTimeout(%q) = %v, %v; want %v, error %v", tt.value, got, err, tt.want, tt.wantErr)
			}
		})
	}
}

// TestKubeClientTakesEveryFlag: the client's config is the kubeconfig's, overridden by the flags
// given, and --request-timeout 0 leaves its calls unbounded.
func TestKubeClientTakesEveryFlag(t *testing.T) {
	kubeconfig := writeTwoContextKubeconfig(t, "https://first.example:6443", "https://second.example:6443")
	tests := []struct {
		name  string
		args  []string
		check func(t *testing.T, host, token, as string, groups []string, timeout time.Duration)
	}{
		{"current context", []string{"--kubeconfig", kubeconfig}, func(t *testing.T, host, token, _ string, _ []string, timeout time.Duration) {
			if host != "https://first.example:6443" || token != "first-token" || timeout != 10*time.Second {
				t.Errorf("host %q, token %q, timeout %v; want the first context's, 10s", host, token, timeout)
			}
		}},
		{"--context", []string{"--kubeconfig", kubeconfig, "--context", "second"}, func(t *testing.T, host, token, _ string, _ []string, _ time.Duration) {
			if host != "https://second.example:6443" || token != "second-token" {
				t.Errorf("host %q, token %q; want the second context's", host, token)
			}
		}},
		{"--server, --token, --as, --as-group, --request-timeout 0", []string{"--kubeconfig", kubeconfig, "-s", "https://third.example:6443", "--token", "t3", "--as", "alice", "--as-group", "g1", "--as-group", "g2", "--request-timeout", "0"},
			func(t *testing.T, host, token, as string, groups []string, timeout time.Duration) {
				if host != "https://third.example:6443" || token != "t3" || as != "alice" || !slices.Equal(groups, []string{"g1", "g2"}) || timeout != 0 {
					t.Errorf("host %q, token %q, as %q %q, timeout %v; want the flags', no timeout", host, token, as, groups, timeout)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kube := newKubeFlags()
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			kube.addFlags(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			_, cfg, err := kubeClient(kube)
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, cfg.Host, cfg.BearerToken, cfg.Impersonate.UserName, cfg.Impersonate.Groups, cfg.Timeout)
		})
	}
}

// writeTwoContextKubeconfig writes a kubeconfig with the contexts "first" (current) and
// "second", at the two servers, with the tokens first-token and second-token.
func writeTwoContextKubeconfig(t *testing.T, first, second string) string {
	t.Helper()
	const kubeconfig = `apiVersion: v1
kind: Config
current-context: first
clusters:
- {name: first-cluster, cluster: {server: %FIRST%}}
- {name: second-cluster, cluster: {server: %SECOND%}}
users:
- {name: first-user, user: {token: first-token}}
- {name: second-user, user: {token: second-token}}
contexts:
- {name: first, context: {cluster: first-cluster, user: first-user}}
- {name: second, context: {cluster: second-cluster, user: second-user}}
`
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(strings.NewReplacer("%FIRST%", first, "%SECOND%", second).Replace(kubeconfig)), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// recordingServer is an API server (HTTPS with tls) that records the requests it is sent and
// answers each with an empty IPAddressList.
type recordingServer struct {
	*httptest.Server
	mu       sync.Mutex // guards requests
	requests []*http.Request
}

func newRecordingServer(t *testing.T, tls bool) *recordingServer {
	t.Helper()
	s := &recordingServer{}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.requests = append(s.requests, r.Clone(r.Context()))
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(networkingv1.IPAddressList{TypeMeta: metav1.TypeMeta{Kind: "IPAddressList", APIVersion: "networking.k8s.io/v1"}})
	}))
	if tls {
		s.StartTLS()
	} else {
		s.Start()
	}
	t.Cleanup(s.Close)
	return s
}

func (s *recordingServer) recorded() []*http.Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// TestUnknownOutputIsRefusedBeforeAnyRequest: an -o a verb cannot print exits 2 with kubectl's
// message, naming those it can, and nothing is sent to the API server.
func TestUnknownOutputIsRefusedBeforeAnyRequest(t *testing.T) {
	srv := newRecordingServer(t, false)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"check", "-o", "xml"}, `unable to match a printer suitable for the output format "xml", allowed formats are: json,table,yaml`},
		{[]string{"repair", "-o", "wide"}, `unable to match a printer suitable for the output format "wide", allowed formats are: json,table,yaml`},
		{[]string{"reservations", "list", "-o", "xml"}, `unable to match a printer suitable for the output format "xml", allowed formats are: json,name,table,wide,yaml`},
		{[]string{"reservations", "list", "-o", "jsonpath={.items}"}, `unable to match a printer suitable for the output format "jsonpath={.items}"`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			checkCouldNotRun(t, append(tt.args, "--server", srv.URL), tt.want)
		})
	}
	// version has no connection flags; the others were given --server.
	t.Run("version", func(t *testing.T) {
		checkCouldNotRun(t, []string{"version", "-o", "name"}, `unable to match a printer suitable for the output format "name", allowed formats are: json,yaml`)
	})
	if got := srv.recorded(); len(got) != 0 {
		t.Errorf("the API server was sent %d requests, the first %s %s; want none", len(got), got[0].Method, got[0].URL)
	}
}

// TestConnectionFlagsReachTheAPIServer runs "reservations list" with no kubeconfig at all,
// only flags: the API server named by --server is asked with the token and the impersonation
// the flags give.
func TestConnectionFlagsReachTheAPIServer(t *testing.T) {
	t.Setenv("HOME", t.TempDir())
	t.Setenv("KUBECONFIG", "")
	srv := newRecordingServer(t, true)
	ca := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	// client-go sends a token over TLS only.
	r := clusterip(t, "reservations", "list", "-o", "json", "--server", srv.URL, "--certificate-authority", ca,
		"--token", "secret", "--as", "alice", "--as-group", "devs", "--request-timeout", "0")
	if r.code != exitOK {
		t.Fatalf("exit %d, want 0; stderr %q", r.code, r.stderr)
	}
	var list networkingv1.IPAddressList
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || list.Kind != "IPAddressList" {
		t.Errorf("stdout %q: %v; want an IPAddressList", r.stdout, err)
	}
	reqs := srv.recorded()
	if len(reqs) != 1 {
		t.Fatalf("the API server was sent %d requests, want 1 (the list)", len(reqs))
	}
	req := reqs[0]
	got := []string{req.URL.Path, req.Header.Get("Authorization"), req.Header.Get("Impersonate-User"), req.Header.Get("Impersonate-Group")}
	want := []string{"/apis/networking.k8s.io/v1/ipaddresses", "Bearer secret", "alice", "devs"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the request (path, Authorization, Impersonate-User, Impersonate-Group) (-want +got):\n%s", diff)
	}
	if q := req.URL.Query().Get("labelSelector"); q != "ipaddress.kubernetes.io/managed-by="+reservation.ManagedBy {
		t.Errorf("labelSelector %q, want the reservations' managed-by label", q)
	}
	if q := req.URL.Query().Get("timeout"); q != "" {
		t.Errorf("with --request-timeout 0 the request carries timeout=%s, want none", q)
	}
}

// TestReservationsPrintAsKubectlGet prints one list in every -o form of "reservations list".
func TestReservationsPrintAsKubectlGet(t *testing.T) {
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	var objs []networkingv1.IPAddress
	for _, r := range []reservation.Reservation{
		{Addr: mustAddr(t, "10.96.0.20"), For: types.NamespacedName{Namespace: "default", Name: "web"}, Reason: "clients pin it"},
		{Addr: mustAddr(t, "10.96.0.21"), Name: "cooldown-a", Expires: now.Add(10 * time.Minute)},
		{Addr: mustAddr(t, "10.96.0.22"), Name: "old", Expires: now.Add(-time.Hour)},
	} {
		obj, err := reservation.ObjectFor(r)
		if err != nil {
			t.Fatal(err)
		}
		obj.CreationTimestamp = metav1.NewTime(now.Add(-5 * time.Hour))
		obj.SetGroupVersionKind(ipAddressGVK)
		objs = append(objs, *obj)
	}
	list := &networkingv1.IPAddressList{Items: objs}
	list.SetGroupVersionKind(ipAddressListGVK)
	tests := []struct {
		format string
		want   string
	}{
		{"table", `ADDRESS      FOR           NAME         EXPIRES                        REASON           AGE
10.96.0.20   default/web   -            never                          clients pin it   5h
10.96.0.21   -             cooldown-a   2030-01-01T12:10:00Z           -                5h
10.96.0.22   -             old          2030-01-01T11:00:00Z (ended)   -                5h
`},
		{"wide", `ADDRESS      FOR           NAME         EXPIRES                        REASON           AGE   ENDS-IN   PARENTREF
10.96.0.20   default/web   -            never                          clients pin it   5h    -         services/default/web
10.96.0.21   -             cooldown-a   2030-01-01T12:10:00Z           -                5h    10m       reservations.clusterip.kube-ipam.io/cooldown-a
10.96.0.22   -             old          2030-01-01T11:00:00Z (ended)   -                5h    ended     reservations.clusterip.kube-ipam.io/old
`},
		{"name", `ipaddress.networking.k8s.io/10.96.0.20
ipaddress.networking.k8s.io/10.96.0.21
ipaddress.networking.k8s.io/10.96.0.22
`},
	}
	for _, tt := range tests {
		t.Run(tt.format, func(t *testing.T) {
			var out, errOut strings.Builder
			p, err := reservationsPrinter(tt.format, &errOut)
			if err != nil {
				t.Fatal(err)
			}
			if err := p(&out, list, now); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, out.String()); diff != "" {
				t.Errorf("-o %s (-want +got):\n%s", tt.format, diff)
			}
		})
	}
	for _, format := range []string{"json", "yaml"} {
		t.Run(format, func(t *testing.T) {
			var out strings.Builder
			p, err := reservationsPrinter(format, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if err := p(&out, list, now); err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{"IPAddressList", "networking.k8s.io/v1", "10.96.0.21", reservation.ManagedBy} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("-o %s:\n%s\nwant it to hold %q", format, out.String(), want)
				}
			}
		})
	}
	t.Run("no reservations", func(t *testing.T) {
		var out, errOut strings.Builder
		p, _ := reservationsPrinter("table", &errOut)
		empty := &networkingv1.IPAddressList{}
		if err := p(&out, empty, now); err != nil || out.String() != "" || errOut.String() != "No reservations found.\n" {
			t.Errorf("an empty list: stdout %q, stderr %q, %v; want nothing on stdout and kubectl's note on stderr", out.String(), errOut.String(), err)
		}
	})
}

// TestCompletion: the shells' scripts, the verbs, -o's values and --context from the
// kubeconfig are completed; a shell the command does not know exits 2.
func TestCompletion(t *testing.T) {
	kubeconfig := writeTwoContextKubeconfig(t, "https://first.example:6443", "https://second.example:6443")
	t.Setenv("KUBECONFIG", kubeconfig)
	t.Setenv("HOME", t.TempDir())
	tests := []struct {
		name string
		args []string // after __complete
		want []string // the candidates, before the directive line
	}{
		{"verbs", []string{""}, []string{"bench", "check", "completion", "demo", "help", "repair", "reservations", "version"}},
		{"verbs from a prefix", []string{"re"}, []string{"repair", "reservations"}},
		{"reservations verbs", []string{"reservations", ""}, []string{"create", "delete", "list", "webhook"}},
		{"--context from $KUBECONFIG", []string{"check", "--context", ""}, []string{"first", "second"}},
		{"--context from a prefix", []string{"reservations", "list", "--context", "s"}, []string{"second"}},
		{"--context from --kubeconfig", []string{"repair", "--kubeconfig", writeTwoContextKubeconfig(t, "https://a", "https://b"), "--context", "f"}, []string{"first"}},
		{"--cluster", []string{"check", "--cluster", ""}, []string{"first-cluster", "second-cluster"}},
		{"--user", []string{"check", "--user", ""}, []string{"first-user", "second-user"}},
		{"check -o", []string{"check", "-o", ""}, []string{"table", "json", "yaml"}},
		{"reservations list -o", []string{"reservations", "list", "-o", ""}, []string{"table", "wide", "name", "json", "yaml"}},
		{"version --output", []string{"version", "--output", ""}, []string{"json", "yaml"}},
		{"completion's shells", []string{"completion", ""}, []string{"bash", "fish", "powershell", "zsh"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := clusterip(t, append([]string{cobra.ShellCompRequestCmd}, tt.args...)...)
			if r.code != exitOK {
				t.Fatalf("exit %d, want 0; stderr %q", r.code, r.stderr)
			}
			var got []string
			for _, line := range strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n") {
				if strings.HasPrefix(line, ":") {
					break // the directive
				}
				name, _, _ := strings.Cut(line, "\t") // a description follows a tab
				got = append(got, name)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("__complete %q (-want +got):\n%s", tt.args, diff)
			}
		})
	}
	t.Run("completion badshell", func(t *testing.T) {
		checkCouldNotRun(t, []string{"completion", "badshell"}, `unknown command "badshell" for "clusterip completion"`)
	})
	t.Run("completion with no shell", func(t *testing.T) {
		checkCouldNotRun(t, []string{"completion"}, "no shell given: bash, zsh, fish or powershell")
	})
}

func mustAddr(t *testing.T, s string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestNoFlagsLeaveTheInClusterFallback: with no kubeconfig and no flag given, the merged config
// is client-go's default one, the condition on which it takes the in-cluster config (the
// reservations webhook in a Pod); the default --request-timeout must not spoil that.
func TestNoFlagsLeaveTheInClusterFallback(t *testing.T) {
	t.Setenv("HOME", t.TempDir())
	t.Setenv("KUBECONFIG", "")
	kube := newKubeFlags()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	kube.addFlags(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	merged, err := kube.ToRawKubeConfigLoader().ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.DefaultClientConfig = &clientcmd.DefaultClientConfig
	if !rules.IsDefaultConfig(merged) {
		t.Errorf("the merged config %+v is not client-go's default: the in-cluster config would not be taken", merged)
	}
	if _, _, err := kubeClient(kube); err == nil || err.Error() != errNoKubeconfig.Error() {
		t.Errorf("kubeClient out of a Pod with no kubeconfig: %v, want %v", err, errNoKubeconfig)
	}
}
