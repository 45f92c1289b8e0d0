// Package servicematrix loads, builds the Services of, and writes the Service ClusterIP matrix,
// one file per kube-apiserver release, testdata/services-<release>.yaml at the module's root
// (testdata/README.md documents its schema). The tests of package allocator/service and the gate
// × Service matrix of test/integration/gates share them, so that one file per release drives
// both.
package servicematrix

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/featuregate"
)

// Releases are the kube-apiserver releases a matrix is recorded for, oldest first: each has the
// file PathFor names. The last is v1.38's build (featuregate.NewestKubeVersion, its beta for now),
// so that v1.38.0's matrix is a version bump: move that name, record the file again.
var Releases = []string{"v1.33.13", "v1.35.4", "v1.36.3", "v1.37.2", "v" + featuregate.NewestKubeVersion}

// PathFor returns the matrix file of release (such as "v1.37.2") in testdata, the module's
// testdata folder.
func PathFor(testdata, release string) string {
	return filepath.Join(testdata, "services-"+release+".yaml")
}

// File is the whole matrix. The zero File has no clusters and no cases.
type File struct {
	Clusters []Cluster `json:"clusters"`
	Cases    []Case    `json:"cases"`
}

// Cluster is one cluster shape: its --service-cluster-ip-range, primary first.
type Cluster struct {
	Name   string   `json:"name"`
	Ranges []string `json:"ranges"`
}

// Spec is the ClusterIP part of a Service spec. In a create, a nil field is unset. In an update, a
// nil field keeps the created Service's value, and "$0"/"$1" in clusterIP(s) stand for the created
// Service's clusterIPs[0]/[1].
type Spec struct {
	Type           corev1.ServiceType `json:"type,omitempty"`
	NoSelector     bool               `json:"noSelector,omitempty"`
	IPFamilyPolicy *string            `json:"ipFamilyPolicy,omitempty"`
	IPFamilies     *[]string          `json:"ipFamilies,omitempty"`
	ClusterIP      *string            `json:"clusterIP,omitempty"`
	ClusterIPs     *[]string          `json:"clusterIPs,omitempty"`
}

// Case is one Service created, and optionally updated, with the expected result per cluster.
type Case struct {
	Name   string            `json:"name"`
	Taken  []string          `json:"taken,omitempty"`
	Create Spec              `json:"create"`
	Update *Spec             `json:"update,omitempty"`
	Expect map[string]Expect `json:"expect,omitempty"`
}

// Expect is what one cluster answers to a case's create and update.
type Expect struct {
	Create Result  `json:"create"`
	Update *Result `json:"update,omitempty"`
	// CreateText and UpdateText are the texts of Create's and Update's errors; nil when the call
	// succeeded. They are kept apart from the results because the results are the same in every
	// feature-gate mode and the texts are not all.
	CreateText *Text `json:"createText,omitempty"`
	UpdateText *Text `json:"updateText,omitempty"`
}

// Text is what the Status of a failed call says: its message and each cause's message, in
// kube-apiserver's order. An address of the case is written as in Result.ClusterIPs when it is
// quoted ("$0" for the created Service's first address, "IPv4" for a fresh one); addresses the
// case chose stay as they are.
type Text struct {
	Message string   `json:"message"`
	Causes  []string `json:"causes,omitempty"`
	// Legacy is the text of a kube-apiserver in Legacy mode (MultiCIDRServiceAllocator off) when
	// it differs, as it does for a chosen address outside the range: its bitmap names the range
	// where the default mode's ServiceCIDRs answer "the provided network does not match the
	// current range".
	Legacy *Text `json:"legacy,omitempty"`
}

// In returns the text of the mode: t.Legacy when legacy is set and t has one, else t without its
// Legacy. A nil Text gives nil.
func (t *Text) In(legacy bool) *Text {
	if t == nil {
		return nil
	}
	if legacy && t.Legacy != nil {
		return t.Legacy
	}
	out := *t
	out.Legacy = nil
	return &out
}

// Result is a Service's ClusterIP fields after the call, or its error. In ClusterIPs a literal
// address is one the case chose, "$0"/"$1" the created Service's, "IPv4"/"IPv6" a fresh address of
// that family from the cluster's range, and "None" itself.
type Result struct {
	ClusterIPs     []string `json:"clusterIPs,omitempty"`
	IPFamilies     []string `json:"ipFamilies,omitempty"`
	IPFamilyPolicy string   `json:"ipFamilyPolicy,omitempty"`
	Error          *Error   `json:"error,omitempty"`
}

// Error is the Status of a failed call.
type Error struct {
	Code   int32   `json:"code"`
	Reason string  `json:"reason"`
	Causes []Cause `json:"causes,omitempty"`
}

// Cause is one cause of an Error: a field path and a field.ErrorType.
type Cause struct {
	Field string `json:"field"`
	Type  string `json:"type"`
}

// Load reads and strictly parses the matrix at path. It fails if the file has no clusters or no
// cases.
func Load(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("servicematrix: %w", err)
	}
	var m File
	if err := yaml.UnmarshalStrict(data, &m); err != nil {
		return nil, fmt.Errorf("servicematrix: parse %s: %w", path, err)
	}
	if len(m.Clusters) == 0 || len(m.Cases) == 0 {
		return nil, fmt.Errorf("servicematrix: %s: no clusters or no cases", path)
	}
	return &m, nil
}

// Prefixes parses the cluster's ranges, primary first.
func (c Cluster) Prefixes() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, r := range c.Ranges {
		p, err := netip.ParsePrefix(r)
		if err != nil {
			return nil, fmt.Errorf("servicematrix: cluster %s: %w", c.Name, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// Service builds the Service a case creates, named name in namespace default: one TCP port, a
// selector unless the spec has none, and an external name for ExternalName.
func Service(name string, s Spec) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Type:  s.Type,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(80)}},
		},
	}
	if svc.Spec.Type == "" {
		svc.Spec.Type = corev1.ServiceTypeClusterIP
	}
	if !s.NoSelector {
		svc.Spec.Selector = map[string]string{"app": name}
	}
	Apply(svc, s, nil)
	return svc
}

// Apply sets on svc the ClusterIP fields s gives, replacing "$i" with created's clusterIPs[i]
// (created may be nil in a create).
func Apply(svc *corev1.Service, s Spec, created *corev1.Service) {
	sub := func(v string) string {
		if created != nil && strings.HasPrefix(v, "$") {
			var i int
			if _, err := fmt.Sscanf(v, "$%d", &i); err == nil && i < len(created.Spec.ClusterIPs) {
				return created.Spec.ClusterIPs[i]
			}
		}
		return v
	}
	if s.Type != "" {
		svc.Spec.Type = s.Type
	}
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		svc.Spec.ExternalName = "example.com"
	} else {
		svc.Spec.ExternalName = ""
	}
	if s.IPFamilyPolicy != nil {
		if *s.IPFamilyPolicy == "" {
			svc.Spec.IPFamilyPolicy = nil
		} else {
			p := corev1.IPFamilyPolicy(*s.IPFamilyPolicy)
			svc.Spec.IPFamilyPolicy = &p
		}
	}
	if s.IPFamilies != nil {
		svc.Spec.IPFamilies = nil
		for _, f := range *s.IPFamilies {
			svc.Spec.IPFamilies = append(svc.Spec.IPFamilies, corev1.IPFamily(f))
		}
	}
	if s.ClusterIP != nil {
		svc.Spec.ClusterIP = sub(*s.ClusterIP)
	}
	if s.ClusterIPs != nil {
		svc.Spec.ClusterIPs = nil
		for _, v := range *s.ClusterIPs {
			svc.Spec.ClusterIPs = append(svc.Spec.ClusterIPs, sub(v))
		}
	}
}

// Literals returns the addresses a spec names literally; none for a nil spec.
func Literals(s *Spec) []string {
	if s == nil {
		return nil
	}
	var out []string
	if s.ClusterIP != nil {
		out = append(out, *s.ClusterIP)
	}
	if s.ClusterIPs != nil {
		out = append(out, *s.ClusterIPs...)
	}
	return out
}

// ResultOf turns a Service, or the error of the call that made it, into a Result. created is the
// Service before an update (nil for a create). The error reports what makes the answer
// unrecordable: a call error that is not an *errors.StatusError, a fresh address outside the
// cluster's ranges, or spec.clusterIP other than clusterIPs[0]; the Result is still filled in.
func ResultOf(tc Case, ranges []netip.Prefix, svc, created *corev1.Service, callErr error) (Result, error) {
	if callErr != nil {
		var se *apierrors.StatusError
		if !errors.As(callErr, &se) {
			return Result{}, fmt.Errorf("servicematrix: error %v is a %T, want a *errors.StatusError", callErr, callErr)
		}
		st := se.Status()
		me := &Error{Code: st.Code, Reason: string(st.Reason)}
		if st.Details != nil {
			for _, c := range st.Details.Causes {
				if c.Field == "" {
					continue
				}
				me.Causes = append(me.Causes, Cause{Field: c.Field, Type: string(c.Type)})
			}
		}
		return Result{Error: me}, nil
	}
	var r Result
	var errs []error
	lits := append(Literals(&tc.Create), Literals(tc.Update)...)
	for _, ip := range svc.Spec.ClusterIPs {
		sym, err := symbolOf(ip, lits, ranges, created)
		errs = append(errs, err)
		r.ClusterIPs = append(r.ClusterIPs, sym)
	}
	for _, f := range svc.Spec.IPFamilies {
		r.IPFamilies = append(r.IPFamilies, string(f))
	}
	if svc.Spec.IPFamilyPolicy != nil {
		r.IPFamilyPolicy = string(*svc.Spec.IPFamilyPolicy)
	}
	want := ""
	if len(svc.Spec.ClusterIPs) > 0 {
		want = svc.Spec.ClusterIPs[0]
	}
	if svc.Spec.ClusterIP != want {
		errs = append(errs, fmt.Errorf("servicematrix: spec.clusterIP = %q, want clusterIPs[0] %q", svc.Spec.ClusterIP, want))
	}
	return r, errors.Join(errs...)
}

// TextOf returns the text of callErr, the error of a case's create (created nil) or update, with
// the case's addresses written as Text says; nil for a nil error. It fails for an error that is
// not an *errors.StatusError.
func TextOf(tc Case, ranges []netip.Prefix, created *corev1.Service, callErr error) (*Text, error) {
	if callErr == nil {
		return nil, nil
	}
	var se *apierrors.StatusError
	if !errors.As(callErr, &se) {
		return nil, fmt.Errorf("servicematrix: error %v is a %T, want a *errors.StatusError", callErr, callErr)
	}
	st := se.Status()
	lits := append(Literals(&tc.Create), Literals(tc.Update)...)
	sym := func(msg string) string { return symbolizeText(msg, lits, ranges, created) }
	t := &Text{Message: sym(st.Message)}
	if st.Details != nil {
		for _, c := range st.Details.Causes {
			t.Causes = append(t.Causes, sym(c.Message))
		}
	}
	return t, nil
}

// quotedAddr matches a quoted address in a Status message.
var quotedAddr = regexp.MustCompile(`"([0-9A-Fa-f:.]+)"`)

// symbolizeText writes the quoted addresses of msg as symbolOf names them, keeping those the case
// chose and those it cannot name.
func symbolizeText(msg string, lits []string, ranges []netip.Prefix, created *corev1.Service) string {
	return quotedAddr.ReplaceAllStringFunc(msg, func(q string) string {
		ip := q[1 : len(q)-1]
		if _, err := netip.ParseAddr(ip); err != nil {
			return q
		}
		sym, err := symbolOf(ip, lits, ranges, created)
		if err != nil {
			return q
		}
		return `"` + sym + `"`
	})
}

// Addrs returns the addresses svc holds, read as kube-apiserver v1.33 reads a ClusterIP: it is
// allocator.ClusterIPs (the matrix writes some ClusterIPs in non-canonical spellings).
func Addrs(svc *corev1.Service) []netip.Addr { return allocator.ClusterIPs(svc) }

// symbolOf names an address of a result as the matrix does.
func symbolOf(ip string, lits []string, ranges []netip.Prefix, created *corev1.Service) (string, error) {
	if ip == corev1.ClusterIPNone {
		return ip, nil
	}
	if created != nil {
		for i, v := range created.Spec.ClusterIPs {
			if v == ip {
				return fmt.Sprintf("$%d", i), nil
			}
		}
	}
	for _, v := range lits {
		if v == ip {
			return ip, nil
		}
	}
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return ip, fmt.Errorf("servicematrix: allocated address %q does not parse", ip)
	}
	for _, p := range ranges {
		if p.Contains(a) {
			if a.Is4() {
				return string(corev1.IPv4Protocol), nil
			}
			return string(corev1.IPv6Protocol), nil
		}
	}
	return ip, fmt.Errorf("servicematrix: allocated address %s is in none of the ranges %v", ip, ranges)
}

// Write writes m to path as YAML, one line per spec and result, with a header pointing at the
// README and naming source, where the expectations come from. YAML is a superset of JSON, so each
// line is a JSON object.
func Write(path string, m *File, source string) error {
	var b bytes.Buffer
	var encErr error
	line := func(v any) string {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil && encErr == nil {
			encErr = err
		}
		return strings.TrimSuffix(buf.String(), "\n")
	}
	b.WriteString("# The Service ClusterIP matrix: see README.md in this folder for the schema.\n")
	b.WriteString("# Expectations recorded from " + source + ".\n")
	b.WriteString("# Regenerate: go test ./allocator/service -run TestServiceMatrixKubeAPIServer/<release> -update-matrix\n")
	b.WriteString("clusters:\n")
	for _, c := range m.Clusters {
		fmt.Fprintf(&b, "  - %s\n", line(c))
	}
	b.WriteString("cases:\n")
	for _, c := range m.Cases {
		fmt.Fprintf(&b, "  - name: %s\n", line(c.Name))
		if len(c.Taken) > 0 {
			fmt.Fprintf(&b, "    taken: %s\n", line(c.Taken))
		}
		fmt.Fprintf(&b, "    create: %s\n", line(c.Create))
		if c.Update != nil {
			fmt.Fprintf(&b, "    update: %s\n", line(c.Update))
		}
		b.WriteString("    expect:\n")
		for _, cl := range m.Clusters {
			e, ok := c.Expect[cl.Name]
			if !ok {
				continue
			}
			fmt.Fprintf(&b, "      %s:\n", cl.Name)
			fmt.Fprintf(&b, "        create: %s\n", line(e.Create))
			if e.CreateText != nil {
				fmt.Fprintf(&b, "        createText: %s\n", line(e.CreateText))
			}
			if e.Update != nil {
				fmt.Fprintf(&b, "        update: %s\n", line(e.Update))
			}
			if e.UpdateText != nil {
				fmt.Fprintf(&b, "        updateText: %s\n", line(e.UpdateText))
			}
		}
	}
	if encErr != nil {
		return fmt.Errorf("servicematrix: %w", encErr)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("servicematrix: %w", err)
	}
	return nil
}
