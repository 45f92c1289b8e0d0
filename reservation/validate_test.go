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
		{"ends in just under ten years", reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.10"), Name: "a", Expires: time.Now().Add(10*365*24*time.Hour - time.Minute)}},
		{"a reason with emoji and a non-breaking space", reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.10"), Name: "a", Reason: "pinned 📌\u00a0by ops"}},
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
	overTenYears := time.Now().Add(10*365*24*time.Hour + time.Minute)
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
		{"an end in 9999, which a release policy could not give", with(func(r *reservation.Reservation) { r.Expires = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC) }), "Expires", "9999-01-01 00:00:00 +0000 UTC", "ten years"},
		{"an end just over ten years from now", with(func(r *reservation.Reservation) { r.Expires = overTenYears }), "Expires", overTenYears.UTC().String(), "ten years"},
		{"a reason on two lines", with(func(r *reservation.Reservation) { r.Reason = "one\ntwo" }), "Reason", `"one\ntwo"`, "U+000A"},
		{"a reason with a tab", with(func(r *reservation.Reservation) { r.Reason = "a\tb" }), "Reason", `"a\tb"`, "U+0009"},
		{"a reason with a right-to-left override", with(func(r *reservation.Reservation) { r.Reason = "ok \u202egnp.exe" }), "Reason", `"ok \u202egnp.exe"`, "U+202E"},
		{"a reason with a first-strong isolate", with(func(r *reservation.Reservation) { r.Reason = "a\u2068b" }), "Reason", `"a\u2068b"`, "U+2068"},
		{"a reason with a zero-width space", with(func(r *reservation.Reservation) { r.Reason = "db\u200bprod" }), "Reason", `"db\u200bprod"`, "U+200B"},
		{"a reason with a zero-width joiner", with(func(r *reservation.Reservation) { r.Reason = "a\u200db" }), "Reason", `"a\u200db"`, "U+200D"},
		{"a reason with a byte-order mark", with(func(r *reservation.Reservation) { r.Reason = "\ufeffa" }), "Reason", `"\ufeffa"`, "U+FEFF"},
		{"a reason with a line separator", with(func(r *reservation.Reservation) { r.Reason = "a\u2028b" }), "Reason", `"a\u2028b"`, "U+2028"},
		{"a reason with a paragraph separator", with(func(r *reservation.Reservation) { r.Reason = "a\u2029b" }), "Reason", `"a\u2029b"`, "U+2029"},
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
