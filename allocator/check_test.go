package allocator_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-ipam/clusterip/allocator"
)

func TestParsePrefix(t *testing.T) {
	tests := []struct {
		in   string
		want string // "" means an error
	}{
		{"10.96.0.0/12", "10.96.0.0/12"},
		{"fd00::/108", "fd00::/108"},
		{"10.0.0.0/30", "10.0.0.0/30"},
		{"fd00::/127", "fd00::/127"},
		{"10.0.0.0/31", ""},
		{"10.0.0.1/32", ""},
		{"fd00::1/128", ""},
		{"10.96.0.1/12", ""}, // host bits set
		{"::ffff:10.0.0.0/104", ""},
		{"fe80::%eth0/64", ""},
		{"10.96.0.0", ""},
		{"10.96.0.0/33", ""},
		{"", ""},
		{"010.96.0.0/12", ""},
	}
	for _, tt := range tests {
		p, err := allocator.ParsePrefix(tt.in)
		if tt.want == "" {
			var pe *allocator.PrefixError
			if !errors.As(err, &pe) || pe.Input != tt.in || !errors.Is(err, allocator.ErrInvalid) || p.IsValid() {
				t.Errorf("ParsePrefix(%q) = %v, %v; want a *PrefixError keeping the input", tt.in, p, err)
			}
			continue
		}
		if err != nil || p.String() != tt.want {
			t.Errorf("ParsePrefix(%q) = %v, %v; want %s", tt.in, p, err, tt.want)
		}
	}
}

func TestParseAddr(t *testing.T) {
	tests := []struct {
		in string
		ok bool
	}{
		{"10.96.0.1", true},
		{"fd00::1", true},
		{"::ffff:10.96.0.1", false},
		{"fe80::1%eth0", false},
		{"10.96.0.256", false},
		{"", false},
		{"10.96.0.1/32", false},
	}
	for _, tt := range tests {
		ip, err := allocator.ParseAddr(tt.in)
		if tt.ok != (err == nil) {
			t.Errorf("ParseAddr(%q) = %v, %v; want ok=%v", tt.in, ip, err, tt.ok)
		}
		var ae *allocator.AddrError
		if err != nil && (!errors.As(err, &ae) || ae.Input != tt.in) {
			t.Errorf("ParseAddr(%q) error %v is not an *AddrError keeping the input", tt.in, err)
		}
	}
}

func TestNotInRangeErrorWithoutRangeIsMismatchedNetwork(t *testing.T) {
	ip := netip.MustParseAddr("10.0.0.1")
	if err := error(&allocator.NotInRangeError{IP: ip}); !errors.Is(err, allocator.ErrMismatchedNetwork) {
		t.Errorf("range-less NotInRangeError does not match ErrMismatchedNetwork")
	}
	if err := error(&allocator.NotInRangeError{IP: ip, Range: netip.MustParsePrefix("10.1.0.0/16")}); errors.Is(err, allocator.ErrMismatchedNetwork) {
		t.Errorf("NotInRangeError with a range matches ErrMismatchedNetwork")
	}
}

// FuzzParse checks that no input makes the parsers panic, that whatever they accept is canonical
// and passes the checks, and that what they reject is a typed error.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"10.96.0.0/12", "fd00::/108", "::ffff:1.2.3.4", "fe80::1%eth0", "10.0.0.1/32", "1.2.3.4", "::/0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if p, err := allocator.ParsePrefix(s); err == nil {
			if allocator.CheckPrefix(p) != nil || p.Masked() != p || p.Overlaps(netip.MustParsePrefix("::ffff:0:0/96")) {
				t.Fatalf("ParsePrefix(%q) accepted %v, which fails CheckPrefix", s, p)
			}
			if q, err := allocator.ParsePrefix(p.String()); err != nil || q != p {
				t.Fatalf("ParsePrefix(%q) does not round-trip: %v, %v", p.String(), q, err)
			}
		} else if !errors.Is(err, allocator.ErrInvalid) {
			t.Fatalf("ParsePrefix(%q) error %v is not ErrInvalid", s, err)
		}
		if ip, err := allocator.ParseAddr(s); err == nil {
			if ip.Zone() != "" || ip.Is4In6() || !ip.IsValid() {
				t.Fatalf("ParseAddr(%q) accepted %v", s, ip)
			}
		} else if !errors.Is(err, allocator.ErrInvalid) {
			t.Fatalf("ParseAddr(%q) error %v is not ErrInvalid", s, err)
		}
	})
}

// TestCheckPrefixRejectsOverlapWithIPv4MappedBlock checks that no prefix that contains
// ::ffff:0:0/96, or lies inside it, is accepted: an allocator serving it could hand out an
// IPv4-mapped address that Release then rejects, leaking it forever.
func TestCheckPrefixRejectsOverlapWithIPv4MappedBlock(t *testing.T) {
	tests := []struct {
		name string
		in   string
		ok   bool
	}{
		{name: "contains the block, /95", in: "::fffe:0:0/95"},
		{name: "contains the block, /80", in: "::/80"},
		{name: "contains the block, /64", in: "::/64"},
		{name: "contains the block, /0", in: "::/0"},
		{name: "is the block", in: "::ffff:0:0/96"},
		{name: "inside the block", in: "::ffff:10.0.0.0/104"},
		{name: "inside the block, /127", in: "::ffff:10.0.0.0/127"},
		{name: "just below the block", in: "::fffe:0:0/96", ok: true},
		{name: "just above the block", in: "::1:0:0:0/96", ok: true},
		{name: "ULA", in: "fd00::/108", ok: true},
		{name: "IPv4 range", in: "0.0.0.0/1", ok: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := netip.MustParsePrefix(tt.in)
			err := allocator.CheckPrefix(p)
			if tt.ok {
				if err != nil {
					t.Errorf("CheckPrefix(%v) = %v, want nil", p, err)
				}
				return
			}
			var pe *allocator.PrefixError
			if !errors.As(err, &pe) || pe.Prefix != p || !errors.Is(err, allocator.ErrInvalid) {
				t.Fatalf("CheckPrefix(%v) = %v, want a *PrefixError for %v", p, err, p)
			}
			if !strings.Contains(pe.Reason, "::ffff:0:0/96") {
				t.Errorf("CheckPrefix(%v) reason = %q, want it to name the IPv4-mapped block ::ffff:0:0/96", p, pe.Reason)
			}
		})
	}
}

func TestCheckOwnerNeedsResourceAndName(t *testing.T) {
	tests := []struct {
		name       string
		owner      allocator.Owner
		wantReason string // "" means valid
	}{
		{"service", allocator.ServiceOwner(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "u"}}), ""},
		{"cluster-scoped, other group", allocator.Owner{Group: "example.com", Resource: "widgets", Name: "w"}, ""},
		{"zero", allocator.Owner{}, "resource and name are required"},
		{"nil Service", allocator.ServiceOwner(nil), "resource and name are required"},
		{"no resource", allocator.Owner{Namespace: "default", Name: "web"}, "resource is required"},
		{"no name", allocator.Owner{Group: "example.com", Resource: "widgets", Namespace: "default"}, "name is required"},
		{"UID only", allocator.Owner{UID: "u"}, "resource and name are required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := allocator.CheckOwner(tt.owner)
			if tt.wantReason == "" {
				if err != nil {
					t.Errorf("CheckOwner(%#v) = %v, want nil", tt.owner, err)
				}
				return
			}
			var oe *allocator.OwnerError
			if !errors.As(err, &oe) || !errors.Is(err, allocator.ErrInvalid) {
				t.Fatalf("CheckOwner(%#v) = %v, want an *OwnerError matching ErrInvalid", tt.owner, err)
			}
			if diff := cmp.Diff(&allocator.OwnerError{Owner: tt.owner, Reason: tt.wantReason}, oe); diff != "" {
				t.Errorf("CheckOwner(%#v) (-want +got):\n%s", tt.owner, diff)
			}
		})
	}
}

func TestParseClusterIP(t *testing.T) {
	tests := []struct {
		in   string
		want netip.Addr // the zero Addr: an error
	}{
		{"10.96.0.10", netip.MustParseAddr("10.96.0.10")},
		{"10.96.0.010", netip.MustParseAddr("10.96.0.10")}, // decimal, not octal
		{"010.096.000.001", netip.MustParseAddr("10.96.0.1")},
		{"::ffff:10.96.0.11", netip.MustParseAddr("10.96.0.11")},
		{"FD00:10:96::A", netip.MustParseAddr("fd00:10:96::a")},
		{"fd00:10:96:0:0:0:0:b", netip.MustParseAddr("fd00:10:96::b")},
		{"fd00::1%eth0", netip.Addr{}},
		{"10.96.0.0/24", netip.Addr{}},
		{"None", netip.Addr{}},
		{"", netip.Addr{}},
		{" 10.96.0.1", netip.Addr{}},
		{"10.96.0.256", netip.Addr{}},
	}
	for _, tt := range tests {
		got, err := allocator.ParseClusterIP(tt.in)
		if got != tt.want {
			t.Errorf("ParseClusterIP(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
		if !tt.want.IsValid() {
			var ae *allocator.AddrError
			if !errors.As(err, &ae) || ae.Input != tt.in || !errors.Is(err, allocator.ErrInvalid) {
				t.Errorf("ParseClusterIP(%q) error = %v, want an *AddrError keeping the input", tt.in, err)
			}
		}
	}
}
