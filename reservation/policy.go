package reservation

import (
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// AnnotationReleasePolicy is the Service annotation that chooses what happens to the Service's
// ClusterIPs (every family) when the Service is deleted: see [ReleasePolicy]. A Service without
// it releases them at once, as kube-apiserver does.
const AnnotationReleasePolicy = "clusterip.kube-ipam.io/release-policy"

// ReleasePolicy is what happens to a Service's ClusterIPs when the Service is deleted, read from
// its [AnnotationReleasePolicy] annotation by [ParseReleasePolicy]:
//   - "Release" (or no annotation): they are freed at once;
//   - "Retain": each becomes a reservation kept for the Service's namespace and name, until the
//     reservation is deleted, so the Service created again under that name gets them back;
//   - "Retain/<duration>", such as "Retain/10m": the same, for that long (a Go duration, at
//     least one second), after which the address is free again (a cooldown).
//
// The zero ReleasePolicy is "Release".
type ReleasePolicy struct {
	// Retain is whether the addresses become reservations.
	Retain bool
	// For is how long they are kept; 0 keeps them until the reservation is deleted.
	For time.Duration
}

// String returns the annotation's value for p.
func (p ReleasePolicy) String() string {
	switch {
	case !p.Retain:
		return "Release"
	case p.For == 0:
		return "Retain"
	}
	return "Retain/" + p.For.String()
}

// Expires returns when a reservation made at now under p ends: the zero Time for one that does
// not end.
func (p ReleasePolicy) Expires(now time.Time) time.Time {
	if p.For == 0 {
		return time.Time{}
	}
	return now.Add(p.For).UTC()
}

// ParseReleasePolicy reads the value of a Service's [AnnotationReleasePolicy] annotation. Any
// value but "Release", "Retain" and "Retain/<duration>" (a Go duration of at least one second and
// at most ten years) returns an [*InvalidError] for the annotation's field.
func ParseReleasePolicy(value string) (ReleasePolicy, error) {
	invalid := func(reason string) error {
		return &InvalidError{Field: "metadata.annotations[" + AnnotationReleasePolicy + "]", Value: value, Reason: reason}
	}
	switch value {
	case "Release":
		return ReleasePolicy{}, nil
	case "Retain":
		return ReleasePolicy{Retain: true}, nil
	}
	d, ok := strings.CutPrefix(value, "Retain/")
	if !ok {
		return ReleasePolicy{}, invalid(`must be "Release", "Retain" or "Retain/<duration>", such as "Retain/10m"`)
	}
	dur, err := time.ParseDuration(d)
	if err != nil {
		return ReleasePolicy{}, invalid(fmt.Sprintf("the duration after \"Retain/\" does not parse: %v", err))
	}
	if !validHold(dur) {
		return ReleasePolicy{}, invalid(holdBounds)
	}
	return ReleasePolicy{Retain: true, For: dur}, nil
}

// ReleasePolicyOf returns the release policy the annotations of a Service choose: "Release"
// without [AnnotationReleasePolicy], else [ParseReleasePolicy]'s.
func ReleasePolicyOf(annotations map[string]string) (ReleasePolicy, error) {
	v, ok := annotations[AnnotationReleasePolicy]
	if !ok {
		return ReleasePolicy{}, nil
	}
	return ParseReleasePolicy(v)
}

// CheckReleasePolicy returns the field error of svc's [AnnotationReleasePolicy] annotation if it
// does not parse (see [ParseReleasePolicy]), at metadata.annotations[<key>], so that a create or
// update carrying it is refused before anything is allocated; nil otherwise.
func CheckReleasePolicy(svc *corev1.Service) *field.Error {
	if _, err := ReleasePolicyOf(svc.Annotations); err != nil {
		var ie *InvalidError
		reason := err.Error()
		if errors.As(err, &ie) {
			reason = ie.Reason
		}
		return field.Invalid(field.NewPath("metadata", "annotations").Key(AnnotationReleasePolicy), svc.Annotations[AnnotationReleasePolicy], reason)
	}
	return nil
}
