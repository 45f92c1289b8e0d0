package reservation_test

import (
	"errors"
	"testing"
	"time"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/reservation"
)

// A Service's release policy annotation reads as one of three policies; anything else is bad
// input, refused with an *InvalidError naming the annotation.
func TestParseReleasePolicy(t *testing.T) {
	tests := []struct {
		value   string
		want    reservation.ReleasePolicy
		invalid bool
	}{
		{value: "Release", want: reservation.ReleasePolicy{}},
		{value: "Retain", want: reservation.ReleasePolicy{Retain: true}},
		{value: "Retain/10m", want: reservation.ReleasePolicy{Retain: true, For: 10 * time.Minute}},
		{value: "Retain/1s", want: reservation.ReleasePolicy{Retain: true, For: time.Second}},
		{value: "retain", invalid: true},
		{value: "", invalid: true},
		{value: "Keep", invalid: true},
		{value: "Retain/", invalid: true},
		{value: "Retain/ten minutes", invalid: true},
		{value: "Retain/500ms", invalid: true},
		{value: "Retain/-1m", invalid: true},
		{value: "Retain/100000h", invalid: true},
		{value: "Release/10m", invalid: true},
	}
	for _, tt := range tests {
		got, err := reservation.ParseReleasePolicy(tt.value)
		if tt.invalid {
			var ie *reservation.InvalidError
			if !errors.As(err, &ie) || !errors.Is(err, allocator.ErrInvalid) || ie.Field != "metadata.annotations["+reservation.AnnotationReleasePolicy+"]" {
				t.Errorf("ParseReleasePolicy(%q) = %v, %v; want an *InvalidError of the annotation", tt.value, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseReleasePolicy(%q) = %v, %v; want %v", tt.value, got, err, tt.want)
		}
		if back, err := reservation.ParseReleasePolicy(got.String()); err != nil || back != got {
			t.Errorf("ParseReleasePolicy(%q.String() = %q) = %v, %v", tt.value, got.String(), back, err)
		}
	}
	if p, err := reservation.ReleasePolicyOf(nil); err != nil || p.Retain {
		t.Errorf("ReleasePolicyOf(no annotations) = %v, %v; want Release", p, err)
	}
}
