package reservation_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/reservation"
)

func TestValidateAccepts(t *testing.T) {
	tests := []struct {
		name string
		r    reservation.Reservation
	}{
		{"kept for a Service", reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.10"), For: web}},
		{"anonymous", reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.10"), Name: "block-a"}},
		{"IPv6", reservation.Reservation{Addr: netip.MustParseAddr("fd00::a"), Name: "block-a"}},
		{"a Service name starting with a digit, as v1.36 accepts", reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.10"), For: types.NamespacedName{Namespace: "ns", Name: "1web"}}},
		{"a 63-character name", reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.10"), Name: strings.Repeat("a", 63)}},
		{"ends at the epoch", reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.10"), Name: "a", Expires: time.Unix(0, 0)}},
		{"ends in the last nanosecond of 9999", reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.10"), Name: "a", Expires: time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)}},
		{"a reason of 1024 bytes, in any script", reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.10"), Name: "a", Reason: strings.Repeat("ü", 512)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := reservation.Validate(tt.r); err != nil {
				t.Errorf("Validate() = %v, want nil", err)
			}
		})
	}
}

func TestValidateRefuses(t *testing.T) {
	ok := reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.10"), Name: "block-a"}
	with := func(change func(*reservation.Reservation)) reservation.Reservation {
		r := ok
		change(&r)
		return r
	}
	tests := []struct {
		name      string
		r         reservation.Reservation
		wantField string
		wantValue string
		wantIn    string // a substring of the reason
	}{
		{"the zero Reservation", reservation.Reservation{}, "Addr", "", "invalid address"},
		{"no address", with(func(r *reservation.Reservation) { r.Addr = netip.Addr{} }), "Addr", "", "invalid address"},
		{"a zoned address", with(func(r *reservation.Reservation) { r.Addr = netip.MustParseAddr("fe80::1%eth0") }), "Addr", "fe80::1%eth0", "zoned"},
		{"an IPv4-mapped address", with(func(r *reservation.Reservation) { r.Addr = netip.MustParseAddr("::ffff:10.96.0.10") }), "Addr", "::ffff:10.96.0.10", "IPv4-mapped"},
		{"both For and Name", with(func(r *reservation.Reservation) { r.For = web }), "For", "default/web", "not both"},
		{"neither For nor Name", with(func(r *reservation.Reservation) { r.Name = "" }), "Name", "", "needs a name"},
		{"For without a namespace", with(func(r *reservation.Reservation) { r.Name, r.For = "", types.NamespacedName{Name: "web"} }), "For.Namespace", "", "required"},
		{"For without a name", with(func(r *reservation.Reservation) { r.Name, r.For = "", types.NamespacedName{Namespace: "default"} }), "For.Name", "", "required"},
		{"For with an upper-case namespace", with(func(r *reservation.Reservation) {
			r.Name, r.For = "", types.NamespacedName{Namespace: "Default", Name: "web"}
		}), "For.Namespace", "Default", "lower case"},
		{"For with a dotted name", with(func(r *reservation.Reservation) {
			r.Name, r.For = "", types.NamespacedName{Namespace: "default", Name: "web.v1"}
		}), "For.Name", "web.v1", "dots"},
		{"For with a 64-character name", with(func(r *reservation.Reservation) {
			r.Name, r.For = "", types.NamespacedName{Namespace: "default", Name: strings.Repeat("a", 64)}
		}), "For.Name", strings.Repeat("a", 64), "63"},
		{"a name with an underscore", with(func(r *reservation.Reservation) { r.Name = "block_a" }), "Name", "block_a", "RFC 1123"},
		{"a name ending in a dash", with(func(r *reservation.Reservation) { r.Name = "block-" }), "Name", "block-", "RFC 1123"},
		{"an end before the epoch", with(func(r *reservation.Reservation) { r.Expires = time.Unix(-1, 0) }), "Expires", "1969-12-31 23:59:59 +0000 UTC", "epoch"},
		{"an end after 9999", with(func(r *reservation.Reservation) { r.Expires = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }), "Expires", "10000-01-01 00:00:00 +0000 UTC", "9999"},
		{"a reason on two lines", with(func(r *reservation.Reservation) { r.Reason = "one\ntwo" }), "Reason", "one\ntwo", "control"},
		{"a reason with a tab", with(func(r *reservation.Reservation) { r.Reason = "a\tb" }), "Reason", "a\tb", "control"},
		{"a reason that is not UTF-8", with(func(r *reservation.Reservation) { r.Reason = "\xff" }), "Reason", "\xff", "UTF-8"},
		{"a reason of 1025 bytes", with(func(r *reservation.Reservation) { r.Reason = strings.Repeat("a", 1025) }), "Reason", strings.Repeat("a", 32) + "…", "1024"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := reservation.Validate(tt.r)
			if !errors.Is(err, allocator.ErrInvalid) {
				t.Fatalf("Validate() = %v, want an error matching allocator.ErrInvalid", err)
			}
			var ie *reservation.InvalidError
			if !errors.As(err, &ie) {
				t.Fatalf("Validate() = %T, want *InvalidError", err)
			}
			if ie.Field != tt.wantField || ie.Value != tt.wantValue || !strings.Contains(ie.Reason, tt.wantIn) {
				t.Errorf("Validate() = {Field %q, Value %q, Reason %q}, want Field %q, Value %q, Reason containing %q",
					ie.Field, ie.Value, ie.Reason, tt.wantField, tt.wantValue, tt.wantIn)
			}
		})
	}
}
