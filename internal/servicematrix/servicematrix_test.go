package servicematrix

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

var matrixPath = filepath.Join("..", "..", "testdata", "services-v1.33.13.yaml")

// The module's matrix loads, and writing it back and loading again gives the same File.
func TestWriteThenLoadRoundTrips(t *testing.T) {
	m, err := Load(matrixPath)
	if err != nil {
		t.Fatalf("Load(%s) = %v", matrixPath, err)
	}
	out := filepath.Join(t.TempDir(), "services.yaml")
	if err := Write(out, m, "a test"); err != nil {
		t.Fatalf("Write() = %v", err)
	}
	got, err := Load(out)
	if err != nil {
		t.Fatalf("Load(written) = %v", err)
	}
	if diff := cmp.Diff(m, got); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
}

func TestLoadRejectsEmptyAndUnknownFields(t *testing.T) {
	for _, tt := range []struct{ name, body string }{
		{name: "empty", body: "clusters: []\ncases: []\n"},
		{name: "unknown field", body: "clusters: [{name: a, ranges: [10.0.0.0/24]}]\ncases: [{name: x, create: {}, bogus: 1}]\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "m.yaml")
			if err := writeFile(p, tt.body); err != nil {
				t.Fatal(err)
			}
			if _, err := Load(p); err == nil {
				t.Errorf("Load(%q) = nil error, want one", tt.body)
			}
		})
	}
}

func TestApplySubstitutesCreatedAddresses(t *testing.T) {
	created := Service("s", Spec{})
	created.Spec.ClusterIPs = []string{"10.96.0.5", "fd00::5"}
	upd := created.DeepCopy()
	ips := []string{"$1", "$0"}
	Apply(upd, Spec{ClusterIPs: &ips}, created)
	if diff := cmp.Diff([]string{"fd00::5", "10.96.0.5"}, upd.Spec.ClusterIPs); diff != "" {
		t.Errorf("clusterIPs (-want +got):\n%s", diff)
	}
}

func TestResultOf(t *testing.T) {
	ranges := []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}
	chosen := "10.96.1.3"
	tc := Case{Create: Spec{ClusterIP: &chosen}}
	svc := func(ips ...string) *corev1.Service {
		s := Service("s", Spec{})
		s.Spec.ClusterIPs = ips
		if len(ips) > 0 {
			s.Spec.ClusterIP = ips[0]
		}
		return s
	}
	invalid := apierrors.NewInvalid(schema.GroupKind{Kind: "Service"}, "s", field.ErrorList{field.Invalid(field.NewPath("spec", "clusterIPs").Index(0), "x", "bad")})
	tests := []struct {
		name    string
		svc     *corev1.Service
		callErr error
		want    Result
		wantErr bool
	}{
		{name: "chosen and fresh", svc: svc("10.96.1.3"), want: Result{ClusterIPs: []string{"10.96.1.3"}}},
		{name: "fresh", svc: svc("10.96.7.7"), want: Result{ClusterIPs: []string{"IPv4"}}},
		{name: "headless", svc: svc("None"), want: Result{ClusterIPs: []string{"None"}}},
		{name: "outside the ranges", svc: svc("10.97.0.1"), want: Result{ClusterIPs: []string{"10.97.0.1"}}, wantErr: true},
		{name: "422", callErr: invalid, want: Result{Error: &Error{Code: 422, Reason: "Invalid", Causes: []Cause{{Field: "spec.clusterIPs[0]", Type: "FieldValueInvalid"}}}}},
		{name: "not a StatusError", callErr: errors.New("boom"), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ResultOf(tc, ranges, tt.svc, nil, tt.callErr)
			if (err != nil) != tt.wantErr {
				t.Fatalf("ResultOf() error = %v, want error %v", err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ResultOf() (-want +got):\n%s", diff)
			}
		})
	}
}

func writeFile(path, body string) error { return os.WriteFile(path, []byte(body), 0o644) }

// TextOf writes the quoted addresses of a message as the results do, and In picks a mode's text.
func TestTextOfSymbolizesAddressesAndInPicksTheMode(t *testing.T) {
	ranges := []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00::/112")}
	created := Service("s", Spec{})
	created.Spec.ClusterIPs = []string{"10.96.0.5"}
	chosen := "10.96.7.7"
	tc := Case{Create: Spec{}, Update: &Spec{ClusterIP: &chosen, ClusterIPs: &[]string{chosen, "fd00::9"}}}
	msg := `Service "s" is invalid: spec.clusterIPs: Invalid value: []string{"10.96.7.7", "fd00::9"}: failed to allocate IP 10.96.7.7: x`
	cause := `Invalid value: []string{"10.96.0.5", "fd00::1234", "10.200.0.1", "10.96.00.5"}: may not change once set`
	err := &apierrors.StatusError{ErrStatus: metav1.Status{Code: 422, Reason: metav1.StatusReasonInvalid, Message: msg,
		Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Message: cause}}}}}
	got, terr := TextOf(tc, ranges, created, err)
	if terr != nil {
		t.Fatal(terr)
	}
	want := &Text{
		// The chosen addresses stay, the created Service's is "$0", a fresh one in a range its
		// family, and what is in no range or does not parse as netip does stays.
		Message: msg,
		Causes:  []string{`Invalid value: []string{"$0", "IPv6", "10.200.0.1", "10.96.00.5"}: may not change once set`},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("TextOf() (-want +got):\n%s", diff)
	}
	if got, err := TextOf(tc, ranges, created, nil); got != nil || err != nil {
		t.Errorf("TextOf(nil error) = %v, %v; want nil, nil", got, err)
	}

	legacy := &Text{Message: "legacy"}
	both := &Text{Message: "default", Legacy: legacy}
	if got := both.In(true); got != legacy {
		t.Errorf("In(true) = %v, want the Legacy text", got)
	}
	if got := both.In(false); got.Message != "default" || got.Legacy != nil {
		t.Errorf("In(false) = %+v, want the default text without its Legacy", got)
	}
	if got := (&Text{Message: "one"}).In(true); got.Message != "one" {
		t.Errorf("In(true) of a text without a Legacy = %+v, want it", got)
	}
}
